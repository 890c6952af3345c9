//! tshark as oracle: for every capture in fixtures/, every CM frame tshark finds is one cm-trace
//! finds (and vice versa), and the fields of docs/framing.md §3.6 agree — minus the fields
//! Wireshark decodes wrongly (§3.7: REQ flow label and packet rate; reserved fields).
//!
//! Runs in CI (tshark installed, `IBCM_REQUIRE_TSHARK=1` makes a missing tshark a failure). On
//! a machine without tshark it skips with a loud message.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::frame::{self, Encap};
use ibcm_mad::{CmMessage, Gid, Mad};
use ibcm_tests::{all_captures, have_tshark};
use ibcm_trace::{CaptureReader, PcapFileWriter, TsResolution};

/// `path`, or for a LINKTYPE_INFINIBAND (247) capture, which tshark 4.0 cannot read (§3.7 bug
/// 9), a copy in `dir` with each record wrapped in an ERF InfiniBand record (type 21, what
/// tshark reads; frame numbers and packets unchanged).
fn tshark_readable(path: &Path, dir: &Path) -> PathBuf {
    use ibcm_mad::frame::link::erf;
    use ibcm_mad::frame::ErfRepr;
    let mut r = CaptureReader::open(path).unwrap();
    let first = r.next_record().map(|x| x.unwrap().link_type);
    if first != Some(247) {
        return path.to_path_buf();
    }
    std::fs::create_dir_all(dir).unwrap();
    let copy = dir.join(path.file_name().unwrap());
    let mut w = PcapFileWriter::new(
        std::fs::File::create(&copy).unwrap(),
        197,
        TsResolution::Nano,
    )
    .unwrap();
    let mut r = CaptureReader::open(path).unwrap();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        let t = rec.timestamp;
        let mut out = vec![0u8; 16];
        ErfRepr {
            timestamp: (t.as_secs() << 32) | ((u64::from(t.subsec_nanos()) << 32) / 1_000_000_000),
            erf_type: erf::TYPE_INFINIBAND,
            flags: 4,
            rlen: u16::try_from(16 + rec.data.len()).unwrap(),
            lctr: 0,
            wlen: u16::try_from(rec.data.len()).unwrap(),
            ext_headers: 0,
        }
        .emit(&mut erf::Packet::new_unchecked(&mut out[..]));
        out.extend_from_slice(rec.data);
        w.write(t, &out).unwrap();
    }
    w.into_inner().unwrap();
    copy
}

fn temp_dir(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ibcm-tshark-oracle-{test}-{}", std::process::id()))
}

/// A field value, compared by meaning rather than by tshark's formatting.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Val {
    Int(u64),
    Ip(IpAddr),
    Bytes(Vec<u8>),
}

impl Val {
    /// Parses tshark's text for a field of the same kind as `self`.
    fn parse_like(&self, s: &str) -> Option<Val> {
        match self {
            Val::Int(_) => {
                let v = if let Some(h) = s.strip_prefix("0x") {
                    u64::from_str_radix(h, 16).ok()?
                } else {
                    match s {
                        "True" => 1,
                        "False" => 0,
                        _ => s.parse().ok()?,
                    }
                };
                Some(Val::Int(v))
            }
            Val::Ip(_) => s.parse().ok().map(Val::Ip),
            Val::Bytes(_) => {
                let s = s.replace(':', "");
                (0..s.len())
                    .step_by(2)
                    .map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
                    .collect::<Option<Vec<u8>>>()
                    .map(Val::Bytes)
            }
        }
    }
}

fn int(v: impl Into<u64>) -> Option<Val> {
    Some(Val::Int(v.into()))
}

fn ipv6(g: Gid) -> Option<Val> {
    Some(Val::Ip(IpAddr::V6(g.to_ipv6())))
}

fn ipv4_tail(g: Gid) -> Option<Val> {
    let b = g.0;
    Some(Val::Ip(IpAddr::V4([b[12], b[13], b[14], b[15]].into())))
}

fn bytes(b: &[u8]) -> Option<Val> {
    Some(Val::Bytes(b.to_vec()))
}

/// Every field checked, in tshark's names.
const FIELDS: &[&str] = &[
    // MAD header
    "infiniband.mad.baseversion",
    "infiniband.mad.mgmtclass",
    "infiniband.mad.classversion",
    "infiniband.mad.method",
    "infiniband.mad.status",
    "infiniband.mad.classspecific",
    "infiniband.mad.transactionid",
    "infiniband.mad.attributeid",
    "infiniband.mad.attributemodifier",
    // transport
    "infiniband.bth.opcode",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.padcnt",
    "infiniband.bth.tver",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.invariant.crc",
    // REQ
    "infiniband.cm.req",
    "infiniband.cm.req.serviceid",
    "infiniband.cm.req.localcaguid",
    "infiniband.cm.req.localqkey",
    "infiniband.cm.req.localqpn",
    "infiniband.cm.req.responderres",
    "infiniband.cm.req.localeecn",
    "infiniband.cm.req.initdepth",
    "infiniband.cm.req.remoteeecn",
    "infiniband.cm.req.remoteresptout",
    "infiniband.cm.req.transpsvctype",
    "infiniband.cm.req.e2eflowctrl",
    "infiniband.cm.req.startpsn",
    "infiniband.cm.req.localresptout",
    "infiniband.cm.req.retrcount",
    "infiniband.cm.req.pkey",
    "infiniband.cm.req.pppmtu",
    "infiniband.cm.req.rdcexist",
    "infiniband.cm.req.rnrretrcount",
    "infiniband.cm.req.maxcmretr",
    "infiniband.cm.req.srq",
    "infiniband.cm.req.ext_transport",
    "infiniband.cm.req.prim_locallid",
    "infiniband.cm.req.prim_remotelid",
    "infiniband.cm.req.prim_localgid",
    "infiniband.cm.req.prim_remotegid",
    "infiniband.cm.req.prim_localgid_ipv4",
    "infiniband.cm.req.prim_remotegid_ipv4",
    "infiniband.cm.req.prim_tfcclass",
    "infiniband.cm.req.prim_hoplim",
    "infiniband.cm.req.prim_sl",
    "infiniband.cm.req.prim_subnetlocal",
    "infiniband.cm.req.prim_localacktout",
    "infiniband.cm.req.alt_locallid",
    "infiniband.cm.req.alt_remotelid",
    "infiniband.cm.req.alt_localgid",
    "infiniband.cm.req.alt_remotegid",
    "infiniband.cm.req.alt_tfcclass",
    "infiniband.cm.req.alt_hoplim",
    "infiniband.cm.req.alt_sl",
    "infiniband.cm.req.alt_subnetlocal",
    "infiniband.cm.req.alt_localacktout",
    "infiniband.cm.req.private",
    "infiniband.cm.req.ip_cm.majv",
    "infiniband.cm.req.ip_cm.minv",
    "infiniband.cm.req.ip_cm.ipv",
    "infiniband.cm.req.ip_cm.sport",
    "infiniband.cm.req.ip_cm.sip4",
    "infiniband.cm.req.ip_cm.dip4",
    "infiniband.cm.req.ip_cm.sip6",
    "infiniband.cm.req.ip_cm.dip6",
    "infiniband.cm.req.ip_cm.private",
    // REP
    "infiniband.cm.rep",
    "infiniband.cm.rep.remotecommid",
    "infiniband.cm.rep.localqkey",
    "infiniband.cm.rep.localqpn",
    "infiniband.cm.rep.localeecn",
    "infiniband.cm.rep.startpsn",
    "infiniband.cm.rep.respres",
    "infiniband.cm.rep.initdepth",
    "infiniband.cm.rep.tgtackdelay",
    "infiniband.cm.rep.failoveracc",
    "infiniband.cm.rep.e2eflowctrl",
    "infiniband.cm.rep.rnrretrcount",
    "infiniband.cm.rep.srq",
    "infiniband.cm.rep.localcaguid",
    "infiniband.cm.rep.private",
    // RTU
    "infiniband.cm.rtu.localcommid",
    "infiniband.cm.rtu.remotecommid",
    "infiniband.cm.rtu.private",
    // REJ
    "infiniband.cm.rej.localcommid",
    "infiniband.cm.rej.remotecommid",
    "infiniband.cm.rej.msgrej",
    "infiniband.cm.rej.rejinfolen",
    "infiniband.cm.rej.reason",
    "infiniband.cm.rej.ari",
    "infiniband.cm.rej.private",
    // DREQ (its Remote QPN/EECN is registered under the `req` name: §3.7 quirk 3)
    "infiniband.cm.dreq.localcommid",
    "infiniband.cm.dreq.remotecommid",
    "infiniband.cm.req.remoteqpneecn",
    "infiniband.cm.dreq.private",
    // DREP (`drsp`)
    "infiniband.cm.drsp.localcommid",
    "infiniband.cm.drsp.remotecommid",
    "infiniband.cm.drsp.private",
];

/// Our value for `field` in one CM frame (`None` = the field is absent).
fn ours(field: &str, encap: Encap, p: &frame::IbPacket<'_>, mad: &Mad) -> Option<Val> {
    let h = &mad.header;
    let is_ip_cm = |sid: u64| sid & 0xffff_ffff_ff00_0000 == 0x0000_0000_0100_0000;
    let roce_v4 = encap == Encap::RoceV2Ipv4;
    match field {
        "infiniband.mad.baseversion" => return int(h.base_version),
        "infiniband.mad.mgmtclass" => return int(h.mgmt_class.raw()),
        "infiniband.mad.classversion" => return int(h.class_version),
        "infiniband.mad.method" => return int(h.method.raw()),
        "infiniband.mad.status" => return int(h.status),
        "infiniband.mad.classspecific" => return int(h.class_specific),
        "infiniband.mad.transactionid" => return int(h.tid.0),
        "infiniband.mad.attributeid" => return int(h.attr_id.raw()),
        "infiniband.mad.attributemodifier" => return int(h.attr_mod),
        "infiniband.bth.opcode" => return int(p.bth.opcode.0),
        "infiniband.bth.p_key" => return int(p.bth.pkey.0),
        "infiniband.bth.destqp" => return int(p.bth.dest_qp.get()),
        "infiniband.bth.psn" => return int(p.bth.psn.get()),
        "infiniband.bth.padcnt" => return int(p.bth.pad_count.get()),
        "infiniband.bth.tver" => return int(p.bth.tver.get()),
        "infiniband.deth.q_key" => return p.deth.and_then(|d| int(d.qkey.0)),
        "infiniband.deth.srcqp" => return p.deth.and_then(|d| int(d.src_qp.get())),
        "infiniband.invariant.crc" => {
            let n = p.packet.len();
            let w = p.packet.get(n - 4..)?;
            return int(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
        }
        _ => {}
    }
    let f = field.strip_prefix("infiniband.cm.")?;
    match (&mad.msg, f) {
        (CmMessage::Req(r), f) => match f {
            "req" => int(r.local_comm_id.0),
            "req.serviceid" => int(r.service_id.0),
            "req.localcaguid" => int(r.local_ca_guid.0),
            "req.localqkey" => int(r.local_qkey.0),
            "req.localqpn" => int(r.local_qpn.get()),
            "req.responderres" => int(r.responder_resources),
            "req.localeecn" => int(r.local_eecn.get()),
            "req.initdepth" => int(r.initiator_depth),
            "req.remoteeecn" => int(r.remote_eecn.get()),
            "req.remoteresptout" => int(r.remote_cm_response_timeout.get()),
            "req.transpsvctype" => int(r.transport_service_type.raw()),
            "req.e2eflowctrl" => int(r.end_to_end_flow_control),
            "req.startpsn" => int(r.starting_psn.get()),
            "req.localresptout" => int(r.local_cm_response_timeout.get()),
            "req.retrcount" => int(r.retry_count.get()),
            "req.pkey" => int(r.partition_key.0),
            "req.pppmtu" => int(r.path_mtu.raw()),
            "req.rdcexist" => int(r.rdc_exists),
            "req.rnrretrcount" => int(r.rnr_retry_count.get()),
            "req.maxcmretr" => int(r.max_cm_retries.get()),
            "req.srq" => int(r.srq),
            "req.ext_transport" => int(r.extended_transport_type.raw()),
            "req.prim_locallid" => int(r.primary_path.local_lid.0),
            "req.prim_remotelid" => int(r.primary_path.remote_lid.0),
            // §3.7 quirk 6: IPv4 display on RoCEv2/IPv4 frames, IPv6 otherwise.
            "req.prim_localgid" if !roce_v4 => ipv6(r.primary_path.local_gid),
            "req.prim_remotegid" if !roce_v4 => ipv6(r.primary_path.remote_gid),
            "req.prim_localgid_ipv4" if roce_v4 => ipv4_tail(r.primary_path.local_gid),
            "req.prim_remotegid_ipv4" if roce_v4 => ipv4_tail(r.primary_path.remote_gid),
            "req.prim_tfcclass" => int(r.primary_path.traffic_class),
            "req.prim_hoplim" => int(r.primary_path.hop_limit),
            "req.prim_sl" => int(r.primary_path.sl.get()),
            "req.prim_subnetlocal" => int(r.primary_path.subnet_local),
            "req.prim_localacktout" => int(r.primary_path.local_ack_timeout.get()),
            "req.alt_locallid" => int(r.alternate_path.local_lid.0),
            "req.alt_remotelid" => int(r.alternate_path.remote_lid.0),
            "req.alt_localgid" => bytes(&r.alternate_path.local_gid.0),
            "req.alt_remotegid" => bytes(&r.alternate_path.remote_gid.0),
            "req.alt_tfcclass" => int(r.alternate_path.traffic_class),
            "req.alt_hoplim" => int(r.alternate_path.hop_limit),
            "req.alt_sl" => int(r.alternate_path.sl.get()),
            "req.alt_subnetlocal" => int(r.alternate_path.subnet_local),
            "req.alt_localacktout" => int(r.alternate_path.local_ack_timeout.get()),
            "req.private" if !is_ip_cm(r.service_id.0) => bytes(r.private_data.as_bytes()),
            f if f.starts_with("req.ip_cm.") && is_ip_cm(r.service_id.0) => {
                let pd = r.private_data.as_bytes();
                let hdr = CmaHeader::parse(pd).ok();
                let v = pd[1] >> 4;
                match &f["req.ip_cm.".len()..] {
                    "majv" => int(pd[0] >> 4),
                    "minv" => int(pd[0] & 0x0f),
                    "ipv" => int(v),
                    "sport" => int(u16::from_be_bytes([pd[2], pd[3]])),
                    "sip4" if v == 4 => hdr.map(|h| Val::Ip(h.src)),
                    "dip4" if v == 4 => hdr.map(|h| Val::Ip(h.dst)),
                    "sip6" if v == 6 => hdr.map(|h| Val::Ip(h.src)),
                    "dip6" if v == 6 => hdr.map(|h| Val::Ip(h.dst)),
                    "private" => bytes(&pd[36..]),
                    _ => None,
                }
            }
            _ => None,
        },
        (CmMessage::Rep(r), f) => match f {
            "rep" => int(r.local_comm_id.0),
            "rep.remotecommid" => int(r.remote_comm_id.0),
            "rep.localqkey" => int(r.local_qkey.0),
            "rep.localqpn" => int(r.local_qpn.get()),
            "rep.localeecn" => int(r.local_eecn.get()),
            "rep.startpsn" => int(r.starting_psn.get()),
            "rep.respres" => int(r.responder_resources),
            "rep.initdepth" => int(r.initiator_depth),
            "rep.tgtackdelay" => int(r.target_ack_delay.get()),
            "rep.failoveracc" => int(r.failover_accepted.raw()),
            "rep.e2eflowctrl" => int(r.end_to_end_flow_control),
            "rep.rnrretrcount" => int(r.rnr_retry_count.get()),
            "rep.srq" => int(r.srq),
            "rep.localcaguid" => int(r.local_ca_guid.0),
            "rep.private" => bytes(r.private_data.as_bytes()),
            _ => None,
        },
        (CmMessage::Rtu(r), f) => match f {
            "rtu.localcommid" => int(r.local_comm_id.0),
            "rtu.remotecommid" => int(r.remote_comm_id.0),
            "rtu.private" => bytes(r.private_data.as_bytes()),
            _ => None,
        },
        (CmMessage::Rej(r), f) => match f {
            "rej.localcommid" => int(r.local_comm_id.0),
            "rej.remotecommid" => int(r.remote_comm_id.0),
            "rej.msgrej" => int(r.message_rejected.raw()),
            "rej.rejinfolen" => int(r.reject_info_length.get()),
            "rej.reason" => int(r.reason.raw()),
            "rej.ari" => bytes(&r.ari),
            "rej.private" => bytes(r.private_data.as_bytes()),
            _ => None,
        },
        (CmMessage::Dreq(d), f) => match f {
            "dreq.localcommid" => int(d.local_comm_id.0),
            "dreq.remotecommid" => int(d.remote_comm_id.0),
            "req.remoteqpneecn" => int(d.remote_qpn_eecn.get()),
            "dreq.private" => bytes(d.private_data.as_bytes()),
            _ => None,
        },
        (CmMessage::Drep(d), f) => match f {
            "drsp.localcommid" => int(d.local_comm_id.0),
            "drsp.remotecommid" => int(d.remote_comm_id.0),
            "drsp.private" => bytes(d.private_data.as_bytes()),
            _ => None,
        },
        _ => None,
    }
}

/// Our per-frame values: frame number → field → value.
fn ours_for_file(path: &Path) -> BTreeMap<u64, BTreeMap<&'static str, Val>> {
    let mut out = BTreeMap::new();
    let mut r = CaptureReader::open(path).unwrap();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        let Ok(frame::Decoded::Ib(p)) = frame::decode(rec.link_type, rec.data) else {
            continue;
        };
        let Some(Ok(raw)) = p.mad() else { continue };
        if raw[1] != 0x07 {
            continue;
        }
        let Ok(mad) = Mad::parse(raw) else { continue };
        let mut fields = BTreeMap::new();
        for f in FIELDS {
            if let Some(v) = ours(f, p.encap, &p, &mad) {
                fields.insert(*f, v);
            }
        }
        out.insert(rec.number, fields);
    }
    out
}

fn tshark_rows(path: &Path) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-n")
        .arg("-r")
        .arg(path)
        // Packets with a UDP source port below 4791 would go to another dissector (§3.5).
        .args(["--disable-protocol", "tftp"])
        .args(["-Y", "infiniband.mad.mgmtclass == 0x07"])
        .args(["-T", "fields", "-E", "separator=\t", "-E", "occurrence=f"])
        .args(["-e", "frame.number"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed on {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

#[test]
fn tshark_agrees_on_every_fixture() {
    if !have_tshark("tshark_agrees_on_every_fixture") {
        return;
    }
    let mut checked_frames = 0;
    let mut checked_values = 0;
    let dir = temp_dir("fields");
    for path in all_captures() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // tshark 4.0 cannot read LINKTYPE_INFINIBAND (§3.7 bug 9): an ERF copy is checked.
        let path = tshark_readable(&path, &dir);
        let ours = ours_for_file(&path);
        let rows = tshark_rows(&path);
        let theirs: Vec<u64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
        let mine: Vec<u64> = ours.keys().copied().collect();
        assert_eq!(mine, theirs, "{name}: CM frames (ours vs tshark)");
        for row in &rows {
            let frame: u64 = row[0].parse().unwrap();
            let fields = &ours[&frame];
            for (i, f) in FIELDS.iter().enumerate() {
                let t = row.get(i + 1).map(String::as_str).unwrap_or("");
                match fields.get(f) {
                    None => assert!(
                        t.is_empty(),
                        "{name} frame {frame}: {f}: tshark has {t:?}, we have nothing"
                    ),
                    Some(v) => {
                        let tv = v.parse_like(t);
                        assert_eq!(
                            tv.as_ref(),
                            Some(v),
                            "{name} frame {frame}: {f}: tshark {t:?}, ours {v:?}"
                        );
                        checked_values += 1;
                    }
                }
            }
            checked_frames += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("tshark oracle: {checked_frames} CM frames, {checked_values} field values agree");
    assert!(
        checked_frames >= 50,
        "too few CM frames checked: {checked_frames}"
    );
}

/// tshark fields for the cm-trace view checks, in this order.
const VIEW_FIELDS: &[&str] = &[
    "frame.number",
    "frame.time_epoch",
    "infiniband.mad.attributeid",
    "infiniband.mad.transactionid",
    // local comm ID, per message (first non-empty wins)
    "infiniband.cm.req",
    "infiniband.cm.rep",
    "infiniband.cm.rtu.localcommid",
    "infiniband.cm.rej.localcommid",
    "infiniband.cm.dreq.localcommid",
    "infiniband.cm.drsp.localcommid",
    // remote comm ID
    "infiniband.cm.rep.remotecommid",
    "infiniband.cm.rtu.remotecommid",
    "infiniband.cm.rej.remotecommid",
    "infiniband.cm.dreq.remotecommid",
    "infiniband.cm.drsp.remotecommid",
    // 15..
    "infiniband.cm.req.serviceid",
    "infiniband.cm.req.localqpn",
    "infiniband.cm.rep.localqpn",
    "infiniband.cm.rep.localeecn",
    "infiniband.cm.req.remoteqpneecn",
    "infiniband.cm.req.transpsvctype",
    "infiniband.cm.req.ext_transport",
    "infiniband.cm.rej.reason",
    "infiniband.cm.rej.msgrej",
    "infiniband.cm.req.localcaguid",
    "infiniband.cm.rep.localcaguid",
    "infiniband.cm.req.startpsn",
    "infiniband.cm.rep.startpsn",
    "infiniband.cm.req.ip_cm.sport",
    "infiniband.cm.req.ip_cm.sip4",
    "infiniband.cm.req.ip_cm.dip4",
    // 31..
    "ip.src",
    "ip.dst",
    "ipv6.src",
    "ipv6.dst",
    "infiniband.lrh.slid",
    "infiniband.lrh.dlid",
    "infiniband.cm.req.serviceid.dport",
];

fn view_rows(path: &Path) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-n")
        .arg("-r")
        .arg(path)
        .args(["--disable-protocol", "tftp"])
        .args(["-Y", "infiniband.mad.mgmtclass == 0x07"])
        .args(["-T", "fields", "-E", "separator=\t", "-E", "occurrence=f"]);
    for f in VIEW_FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(out.status.success(), "tshark failed on {}", path.display());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

fn cm_trace_view(view: ibcm_trace::View, path: &Path) -> String {
    let opts = ibcm_trace::Options {
        view,
        ..Default::default()
    };
    let mut out = Vec::new();
    let mut err = Vec::new();
    let files = [path.to_string_lossy().to_string()];
    ibcm_trace::run(&opts, &files, &mut out, &mut err).unwrap();
    String::from_utf8(out).unwrap()
}

fn num(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// cm-trace's own views against tshark on every fixture: every `--json` line (frame, time,
/// attribute, TID, comm IDs, Service ID and rdma_cm port, QPNs, TGT QPN, XRC, REJ reason and
/// message rejected, CA GUIDs, PSNs, CMA header addresses and port, packet addresses), and
/// the `--stats --json` message counts and connection counts (REQ pairs, RTU pairs, REJ by
/// reason) derived from tshark's rows.
#[test]
fn cm_trace_views_agree_with_tshark() {
    use ibcm_trace::View;
    use std::collections::{BTreeMap, BTreeSet};
    if !have_tshark("cm_trace_views_agree_with_tshark") {
        return;
    }
    let mut checked = 0;
    let dir = temp_dir("views");
    for path in all_captures() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let path = tshark_readable(&path, &dir);
        let rows = view_rows(&path);
        // The CM lines (SA MADs have lines of their own, `"msg":"SA"`).
        let lines: Vec<serde_json::Value> = cm_trace_view(View::Json, &path)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["msg"] != "SA")
            .collect();
        if lines.iter().any(|v| v.get("captured").is_some()) {
            // Cut by the snaplen: tshark calls these frames malformed and shows no CM field;
            // cm-trace decodes them as far as captured (tools/trace/tests/cm_trace_input.rs).
            assert!(rows.is_empty(), "{name}: tshark decoded a cut frame");
            assert!(lines.iter().all(|v| v.get("captured").is_some()), "{name}");
            continue;
        }
        assert_eq!(rows.len(), lines.len(), "{name}: CM frames");
        for (r, v) in rows.iter().zip(&lines) {
            let f = |i: usize| r.get(i).map(String::as_str).unwrap_or("");
            let first = |range: std::ops::Range<usize>| range.map(f).find(|s| !s.is_empty());
            let ctx = format!("{name} frame {}", f(0));
            // JSON schema 3: 64-bit values are "0x…" strings.
            let u = |k: &str| v[k].as_u64().or_else(|| v[k].as_str().and_then(num));
            assert_eq!(num(f(0)), u("frame"), "{ctx}");
            let t: f64 = f(1).parse().unwrap();
            assert!(
                (t - v["time"].as_f64().unwrap()).abs() < 2e-6,
                "{ctx}: time"
            );
            assert_eq!(num(f(2)), u("attr_id"), "{ctx}");
            assert_eq!(num(f(3)), u("tid"), "{ctx}");
            let attr = num(f(2)).unwrap();
            // tshark decodes the fields of REQ REJ REP RTU DREQ DREP only (§3.7 quirk 8).
            if !matches!(attr, 0x10 | 0x12..=0x16) {
                continue;
            }
            assert_eq!(first(4..10).and_then(num), u("local_comm_id"), "{ctx}");
            assert_eq!(first(10..15).and_then(num), u("remote_comm_id"), "{ctx}");
            assert_eq!(num(f(15)), u("service_id"), "{ctx}");
            assert_eq!(first(16..18).and_then(num), u("local_qpn"), "{ctx}");
            let eecn = num(f(18)).filter(|&e| e != 0);
            assert_eq!(eecn, u("local_eecn"), "{ctx}");
            assert_eq!(num(f(19)), u("remote_qpn"), "{ctx}");
            if attr == 0x10 {
                let xrc = num(f(20)) == Some(3) && num(f(21)) == Some(1);
                assert_eq!(Some(xrc), v["xrc"].as_bool(), "{ctx}");
                let tr = if xrc { "XRC" } else { "RC" };
                if matches!(num(f(20)), Some(0 | 3)) {
                    assert_eq!(v["transport"], tr, "{ctx}");
                }
            }
            assert_eq!(num(f(22)), u("rej_reason"), "{ctx}");
            if let Some(m) = num(f(23)) {
                let want = ["REQ", "REP", "other"].get(m as usize).copied();
                assert_eq!(want, v["msg_rejected"].as_str(), "{ctx}");
            }
            assert_eq!(first(24..26).and_then(num), u("ca_guid"), "{ctx}");
            assert_eq!(first(26..28).and_then(num), u("psn"), "{ctx}");
            // rdma_cm: port from the Service ID, and the CMA header.
            if !f(37).is_empty() {
                assert_eq!(num(f(37)), u("port"), "{ctx}");
            }
            if !f(29).is_empty() {
                assert_eq!(num(f(28)), u("cma_src_port"), "{ctx}");
                assert_eq!(Some(f(29)), v["cma_src"].as_str(), "{ctx}");
                assert_eq!(Some(f(30)), v["cma_dst"].as_str(), "{ctx}");
            }
            // Packet addresses.
            let (src, dst) = match v["encap"].as_str().unwrap() {
                "RoCEv2/IPv4" => (f(31).to_string(), f(32).to_string()),
                "RoCEv2/IPv6" => (f(33).to_string(), f(34).to_string()),
                "IB LNH=2" => (format!("LID {}", f(35)), format!("LID {}", f(36))),
                _ => (String::new(), String::new()),
            };
            if !src.is_empty() {
                assert_eq!(Some(src.as_str()), v["src"].as_str(), "{ctx}");
                assert_eq!(Some(dst.as_str()), v["dst"].as_str(), "{ctx}");
            }
            checked += 1;
        }
        // --stats --json against counts derived from tshark's rows.
        let stats: serde_json::Value =
            serde_json::from_str(cm_trace_view(View::StatsJson, &path).trim()).unwrap();
        let mut by_attr: BTreeMap<u64, u64> = BTreeMap::new();
        let mut reqs = BTreeSet::new();
        let mut rtus = BTreeSet::new();
        let mut rejs: BTreeMap<(u64, u64, u64), ()> = BTreeMap::new();
        for r in &rows {
            let f = |i: usize| r.get(i).map(String::as_str).unwrap_or("");
            let attr = num(f(2)).unwrap();
            *by_attr.entry(attr).or_default() += 1;
            match attr {
                0x10 => {
                    reqs.insert((num(f(24)), num(f(4))));
                }
                0x14 => {
                    rtus.insert((num(f(6)), num(f(11))));
                }
                0x12 => {
                    let k = (num(f(7)).unwrap(), num(f(12)).unwrap(), num(f(22)).unwrap());
                    rejs.insert(k, ());
                }
                _ => {}
            }
        }
        for (attr, n) in &by_attr {
            let a = ibcm_mad::AttrId::from_raw(*attr as u16);
            let key = if a.is_known() {
                a.name().to_string()
            } else {
                format!("{attr:#06x}")
            };
            assert_eq!(stats["messages"][&key].as_u64(), Some(*n), "{name}: {key}");
        }
        // synth_attrs.pcap holds single messages cut from other exchanges: no REQ there.
        assert_eq!(
            stats["attempted"].as_u64(),
            Some(reqs.len() as u64),
            "{name}"
        );
        assert!(
            stats["established"].as_u64().unwrap() >= rtus.len() as u64,
            "{name}"
        );
        if !reqs.is_empty() {
            assert_eq!(
                stats["established"].as_u64(),
                Some(rtus.len() as u64),
                "{name}"
            );
            let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
            for (_, _, reason) in rejs.keys() {
                *by_reason.entry(reason.to_string()).or_default() += 1;
            }
            let ours: BTreeMap<String, u64> = stats["rejected"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                .collect();
            assert_eq!(ours, by_reason, "{name}: rejected by reason");
        }
    }
    eprintln!("tshark oracle (cm-trace views): {checked} CM frames agree");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(checked >= 50, "too few: {checked}");
}
