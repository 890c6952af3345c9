//! Oracle test: the frame decoder against tshark 4.0.x on the fixture captures
//! (docs/framing.md §3.5, §6). Every LRH/GRH/BTH/DETH/IP/UDP field and the ICRC/VCRC wire
//! values that Wireshark shows must match, frame by frame, and the frames Wireshark does not
//! decode as InfiniBand must be `NotIb` here.
//!
//! Skipped, with a loud message, when `tshark` is not installed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::process::Command;

use ibcm_mad::frame::{decode, Decoded, IbPacket, IpRepr};
use ibcm_trace::CaptureReader;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/captures/");

/// The tshark fields compared, in order.
const FIELDS: &[&str] = &[
    "frame.number",
    "ip.src",
    "ip.dst",
    "ipv6.src",
    "ipv6.dst",
    "udp.srcport",
    "udp.dstport",
    "infiniband.lrh.vl",
    "infiniband.lrh.sl",
    "infiniband.lrh.lnh",
    "infiniband.lrh.dlid",
    "infiniband.lrh.pktlen",
    "infiniband.lrh.slid",
    "infiniband.grh.tclass",
    "infiniband.grh.flowlabel",
    "infiniband.grh.paylen",
    "infiniband.grh.nxthdr",
    "infiniband.grh.hoplmt",
    "infiniband.grh.sgid",
    "infiniband.grh.dgid",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.tver",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.invariant.crc",
    "infiniband.variant.crc",
];

fn tshark_available() -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            // Written to the process's stderr directly: libtest captures `eprintln!` of a
            // passing test, and a skip must be seen.
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!(
                    "\n!!! SKIPPED: `tshark` not found. Install it with \
                 `DEBIAN_FRONTEND=noninteractive apt-get install -y tshark` \
                 (Debian bookworm ships 4.0.17) to run the Wireshark oracle tests. !!!\n"
                ),
            );
            false
        }
    }
}

fn tshark_rows(file: &str, extra: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(format!("{DIR}{file}")).args(extra);
    cmd.args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "tshark failed on {file}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('|').map(str::to_owned).collect())
        .collect()
}

fn b(v: bool) -> String {
    u8::from(v).to_string()
}

/// Our decode of a frame, rendered the way tshark prints the same fields.
fn ours(number: u64, p: Option<&IbPacket<'_>>) -> Vec<String> {
    let mut row = vec![String::new(); FIELDS.len()];
    row[0] = number.to_string();
    let Some(p) = p else { return row };
    let mut set = |name: &str, v: String| {
        let i = FIELDS.iter().position(|f| *f == name).unwrap();
        row[i] = v;
    };
    match p.ip {
        Some(IpRepr::V4(ip)) => {
            set("ip.src", ip.src_addr.to_string());
            set("ip.dst", ip.dst_addr.to_string());
        }
        Some(IpRepr::V6(ip)) => {
            set("ipv6.src", ip.src_addr.to_string());
            set("ipv6.dst", ip.dst_addr.to_string());
        }
        None => {}
    }
    if let Some(u) = p.udp {
        set("udp.srcport", u.src_port.to_string());
        set("udp.dstport", u.dst_port.to_string());
    }
    if let Some(l) = p.lrh {
        set("infiniband.lrh.vl", format!("{:#04x}", l.vl.get()));
        set("infiniband.lrh.sl", l.sl.get().to_string());
        set("infiniband.lrh.lnh", format!("{:#04x}", l.lnh.bits()));
        set("infiniband.lrh.dlid", l.dlid.0.to_string());
        set("infiniband.lrh.pktlen", l.pkt_len.to_string());
        set("infiniband.lrh.slid", l.slid.0.to_string());
    }
    if let Some(g) = p.grh {
        set("infiniband.grh.tclass", g.traffic_class.to_string());
        set("infiniband.grh.flowlabel", g.flow_label.get().to_string());
        set("infiniband.grh.paylen", g.payload_len.to_string());
        set("infiniband.grh.nxthdr", g.next_header.to_string());
        set("infiniband.grh.hoplmt", g.hop_limit.to_string());
        set("infiniband.grh.sgid", g.sgid.to_ipv6().to_string());
        set("infiniband.grh.dgid", g.dgid.to_ipv6().to_string());
    }
    let t = &p.bth;
    set("infiniband.bth.opcode", t.opcode.0.to_string());
    set("infiniband.bth.se", b(t.solicited));
    set("infiniband.bth.m", b(t.mig_req));
    set("infiniband.bth.padcnt", t.pad_count.get().to_string());
    set("infiniband.bth.tver", t.tver.get().to_string());
    set("infiniband.bth.p_key", t.pkey.0.to_string());
    set("infiniband.bth.destqp", format!("{:#08x}", t.dest_qp.get()));
    set("infiniband.bth.a", b(t.ack_req));
    set("infiniband.bth.psn", t.psn.get().to_string());
    if let Some(d) = p.deth {
        set("infiniband.deth.q_key", format!("{:#018x}", d.qkey.0));
        set("infiniband.deth.srcqp", format!("{:#010x}", d.src_qp.get()));
    }
    let icrc = &p.packet[p.packet.len() - 4..];
    set(
        "infiniband.invariant.crc",
        format!("{:#010x}", u32::from_be_bytes(icrc.try_into().unwrap())),
    );
    row
}

/// Compares every frame of `file`; returns how many IB frames were compared.
fn compare(file: &str, extra: &[&str]) -> usize {
    let theirs = tshark_rows(file, extra);
    let mut r = CaptureReader::open(format!("{DIR}{file}")).unwrap();
    let mut ib = 0;
    let mut i = 0;
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        let d = decode(rec.link_type, rec.data).unwrap();
        let mut mine = ours(rec.number, d.ib());
        let mut expected = theirs[i].clone();
        i += 1;
        match &d {
            Decoded::Ib(p) => {
                ib += 1;
                // VCRC: Wireshark reads the two wire bytes big-endian.
                let vi = FIELDS
                    .iter()
                    .position(|f| *f == "infiniband.variant.crc")
                    .unwrap();
                if p.encap.is_native_ib() {
                    let at = p.packet_offset + p.packet.len();
                    let v = &rec.data[at..at + 2];
                    mine[vi] = format!("{:#06x}", u16::from_be_bytes(v.try_into().unwrap()));
                }
                // Without an outer IP header (native IB, RoCEv1) the IP/UDP fields Wireshark
                // shows come from the payload (IPoIB): not ours to compare.
                if p.ip.is_none() {
                    for (k, f) in FIELDS.iter().enumerate() {
                        if f.starts_with("ip") || f.starts_with("udp") {
                            mine[k] = expected[k].clone();
                        }
                    }
                }
            }
            Decoded::NotIb { .. } => {
                // Wireshark shows IP addresses and ports for non-IB frames; keep only the
                // InfiniBand fields, which must all be absent.
                for (k, f) in FIELDS.iter().enumerate() {
                    if !f.starts_with("infiniband.") {
                        expected[k] = mine[k].clone();
                    }
                }
            }
        }
        assert_eq!(mine, expected, "{file} frame {}", rec.number);
    }
    assert_eq!(i, theirs.len(), "{file}: frame count");
    ib
}

#[test]
fn decoder_matches_tshark() {
    if !tshark_available() {
        return;
    }
    let cases: &[(&str, &[&str], usize)] = &[
        ("real/rocev2_mlx_nvme-discover.pcap", &[], 61),
        ("real/rocev2_mlx_nvme-discover2.pcap", &[], 31),
        ("real/rocev2_ibdump_write.pcap", &[], 17),
        ("real/rocev2_ibdump_read2.pcap", &[], 13),
        ("real/rocev2_ibdump_send.pcap", &[], 9),
        ("real/rocev2_nocm_ib_send_bw.pcap", &[], 10),
        ("real/rocev2_nocm_nvme_rdma.pcap", &[], 45),
        ("real/rocev2_nocm_bad_icrc_rc-small.pcap", &[], 21),
        // Wireshark decodes UDP sport 69 as TFTP unless told otherwise (docs/framing.md §3.5).
        (
            "real/rocev2_nocm_sport69_tftp_quirk.pcap",
            &["--disable-protocol", "tftp"],
            105,
        ),
        ("real/rocev1_and_v2_mixed.pcap", &[], 624),
        ("real/ib_erf_rdma_ping.pcap", &[], 127),
        ("real/ib_erf_infiniband.pcap", &[], 43),
        ("derived/cm_eth.pcapng", &[], 5),
        ("derived/cm_qinq.pcap", &[], 5),
        ("derived/cm_sll2_276.pcap", &[], 5),
        ("derived/cm_raw101.pcap", &[], 5),
        ("derived/synth_req_ipv6.pcap", &[], 1),
        ("derived/synth_attrs.pcap", &[], 8),
        // rxe traffic from the conformance lab (fixtures/KERNEL-CAPTURES.md).
        ("kernel/rping_3.pcap", &[], 41),
        ("kernel/xrc_handshake_no_qp.pcap", &[], 5),
    ];
    for (file, extra, ib) in cases {
        assert_eq!(compare(file, extra), *ib, "{file}");
    }
}
