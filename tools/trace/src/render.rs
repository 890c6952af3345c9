//! The per-MAD views: the one-line text view and the JSON line view.
//!
//! Both write into a caller-owned, reused `Vec<u8>` (one line per call), so a run allocates
//! nothing per packet: numbers, addresses and strings through the writers of `put.rs`, and
//! [`json_line`] writes its keys as literals.
//!
//! # JSON schema (version [`JSON_SCHEMA_VERSION`])
//! `cm-trace --json` prints one object per CM MAD, one per line. Keys, in this order; a key is
//! absent where the message has no such field. 64-bit identifiers (`tid`, `service_id`,
//! `ca_guid`) are strings `"0x"` + 16 lower-case hex digits (JSON numbers above 2^53 lose
//! precision in JavaScript and jq); other identifiers and numbers are JSON integers.
//!
//! | key | type | when | meaning |
//! |---|---|---|---|
//! | `v` | int | always | schema version (3) |
//! | `file` | string | several input files | the input file |
//! | `frame` | int | always | 1-based frame number in its file |
//! | `time` | float | always | capture time, seconds since the Unix epoch |
//! | `time_rel`, `time_utc`, `time_delta`, `time_delta_displayed` | float, string, float, float | `-t r`, `-t a`/`ad`, `-t d`, `-t dd` | the time as `-t` asks (`time_utc`: `"2026-12-01 17:54:51.123456"`, or the time of day alone for `-t a`) |
//! | `msg` | string | always | `REQ MRA REJ REP RTU DREQ DREP SIDR_REQ SIDR_REP LAP APR CPI` or `UNKNOWN` |
//! | `attr_id` | int | always | MAD Attribute ID |
//! | `tid` | string | always | MAD Transaction ID, `"0x…"` (16 hex digits) |
//! | `local_comm_id` | int | all but SIDR, CPI | Local Communication ID |
//! | `remote_comm_id` | int | all but REQ, SIDR, CPI | Remote Communication ID |
//! | `request_id` | int | SIDR_REQ, SIDR_REP | SIDR Request ID |
//! | `service_id` | string | REQ, SIDR_REQ, SIDR_REP | Service ID, `"0x…"` (16 hex digits) |
//! | `port_space`, `port` | string, int | rdma_cm Service IDs | rdma_cm port space (`TCP`, `UDP`, `IB`, `IPOIB`) and port |
//! | `ca_guid` | string | REQ, REP | Local CA GUID, `"0x…"` (16 hex digits) |
//! | `local_qpn` | int | REQ, REP, SIDR_REP | Local QPN (SIDR_REP: QPN) |
//! | `local_eecn` | int | REP with non-zero EECN | Local EECN: an XRC target's TGT QPN |
//! | `remote_qpn` | int | DREQ, LAP | Remote QPN/EECN |
//! | `psn` | int | REQ, REP | Starting PSN |
//! | `transport` | string | REQ | `RC`, `UC`, `XRC`, `other` |
//! | `xrc` | bool | always | the message is an XRC REQ or belongs to an XRC connection |
//! | `rej_reason`, `rej_reason_name` | int, string | REJ | REJ reason and its name |
//! | `msg_rejected` | string | REJ | `REQ`, `REP`, `other` |
//! | `mraed`, `service_timeout` | string, int | MRA | message acknowledged; Service Timeout exponent |
//! | `sidr_status` | int | SIDR_REP | status |
//! | `cma_src`, `cma_dst`, `cma_src_port` | string, string, int | REQ/SIDR_REQ with an rdma_cm Service ID and a valid CMA header | addresses and port from the rdma_cm private-data header |
//! | `qkey`, `responder_resources`, `initiator_depth`, `remote_cm_response_timeout`, `local_cm_response_timeout`, `flow_control`, `retry_count`, `rnr_retry_count`, `max_cm_retries`, `pkey`, `mtu`, `srq` | int / bool | REQ (from MAD byte 76) | the REQ's connection parameters: Q_Key, responder resources, initiator depth, CM response timeout exponents, end-to-end flow control, retry and RNR retry counts, max CM retries, P_Key, path MTU in bytes (`mtu_code` for a reserved code), SRQ |
//! | `remote_eecn`, `ece_vendor_id` | int | REQ, REP, SIDR_REP when non-zero | Remote EECN; the ECE vendor ID |
//! | `primary_path`, `alternate_path` | object | REQ (from byte 120 / 164; the alternate only when present), LAP (`alternate_path`) | `local_lid`, `remote_lid`, `local_gid`, `remote_gid` (IPv6 notation, `::ffff:a.b.c.d` for IPv4-mapped), `flow_label`, `packet_rate` and `packet_rate_name`, `traffic_class`, `hop_limit`, `sl`, `subnet_local`, `local_ack_timeout` |
//! | `qkey`, `responder_resources`, `initiator_depth`, `target_ack_delay`, `failover`, `flow_control`, `rnr_retry_count`, `srq` | int / string / bool | REP (from MAD byte 52) | the REP's parameters |
//! | `ari_len`, `ari` | int, string | REJ | Reject Info Length and the ARI bytes in hex |
//! | `remote_cm_response_timeout` | int | LAP | |
//! | `ap_status`, `ap_status_name`, `additional_info` | int, string, string | APR | AP status and the additional information in hex |
//! | `pkey` | int | SIDR_REQ | P_Key |
//! | `sidr_status_name`, `qkey`, `additional_info` | string, int, string | SIDR_REP | |
//! | `base_version` … `trap_qp` | | CPI | ClassPortInfo fields |
//! | `private_data` | string | every message but CPI, whole MADs | the private data in lower-case hex, trailing zero bytes left out (`""`: all zero); its length is fixed by the message type (REQ 92, REP 196, REJ 148, …) |
//! | `attr_data` | string | unknown attributes, whole MADs | the attribute data in hex, trailing zeros left out |
//! | `xrc_block` | object | REQ, REP, REJ, DREQ carrying ibcm-xrc's block (docs/xrc.md) | `kind`, `len`, `fields` (name → value as `-V` shows them); `xrc_block_error` for a block with the marker that does not parse |
//! | `ulp` | string | a Service ID (the message's or its connection's) of a known upper layer | `NVMe-oF` (rdma_cm TCP 4420 / 8009), `iSER` (3260), `IPoIB-CM` (`0x1000000000000000 \| QPN`) |
//! | `upper` | object | private data of a recognised upper layer | `protocol` and its fields: NVMe-oF REQ `recfmt qid hrqsize hsqsize cntlid`, REP `recfmt crqsize`, REJ `recfmt status status_name`; iSER `flags`; IPoIB-CM `qpn mtu`; SRP `msg` (`SRP_LOGIN_REQ` / `_RSP` / `_REJ`) and its fields (`src/upper.rs`) |
//! | `conn` | int | connection messages | connection number in the file (1, 2, … by first appearance) |
//! | `from` | string | connection messages | `active` (the REQ side) or `passive` |
//! | `retrans` | bool | always | a retransmission: a repeat (same attribute, TID and comm IDs) of an earlier message in a new packet (new BTH PSN) |
//! | `dup` | bool | duplicate captures only | the same packet (same BTH PSN) as an earlier one, captured twice (merged captures); not a retransmission |
//! | `icrc` | string | always | `ok`, `bad`, `absent`, or `not-captured` (the snaplen cut the packet) |
//! | `captured` | int | MADs cut by the snaplen | MAD bytes captured (32..255); the keys of fields that end after them are left out (the text view shows them as `name=?`) |
//! | `src`, `dst` | string | always | sender and receiver: IP address (RoCEv2), GID (RoCEv1, IB with GRH) or `LID n` |
//! | `encap` | string | always | `RoCEv2/IPv4`, `RoCEv2/IPv6`, `RoCEv1`, `IB LNH=2`, `IB LNH=3` |
//! | `sa_path`, `sa_alternate_path` | object | a REQ whose primary / alternate path follows an SA PathRecord answer in the capture | `frame` (the answer's), `differs` (the fields in which the REQ disagrees with the record: `sl`, `mtu`, `pkey`, `local_ack_timeout`, `packet_rate`, `flow_label`, `traffic_class`, `hop_limit`; `[]` when none) |
//!
//! # SA MADs (`"msg":"SA"`)
//! A Subnet Administration MAD (class 0x03, captured whole) is a line of its own (`src/sa/`),
//! in frame order with the CM lines: `v`, `file`, `frame`, `time` (and the `-t` key) as
//! above; `msg` `"SA"`; `method` (`Get`, `GetResp`, `GetTable`, `GetTableResp`, …) and
//! `method_id`; `attr` (`PathRecord`, `MCMemberRecord`, …) and `attr_id`; `tid` (`"0x…"`);
//! `status` and `status_name` (`success`, `ERR_NO_RECORDS`, …); `sm_key`, `attr_offset`,
//! `comp_mask` (`"0x…"`); `rmpp` (`{version, type, type_id, resp_time, flags, status, data1,
//! data2}`, when the MAD uses RMPP); for a PathRecord query `components` (the names of the
//! ComponentMask bits) and `template` (those fields of the query's record); for a PathRecord
//! answer `records` (every field of each record: `service_id`, `dgid`, `sgid`, `dlid`,
//! `slid`, `raw_traffic`, `flow_label`, `hop_limit`, `traffic_class`, `reversible`,
//! `numb_path`, `pkey`, `qos_class`, `sl`, `mtu_selector`, `mtu` (bytes; `mtu_code` for a
//! reserved code), `rate_selector`, `rate`, `rate_name`, `packet_life_time_selector`,
//! `packet_life_time`, `preference`; empty for a failed answer or a segment of a longer RMPP
//! transfer); then `icrc`, `src`, `dst`, `encap`. `-Y` expressions select CM MADs only; the
//! other filters hide SA lines but for `--addr` (their addresses, GIDs and LIDs) and
//! `--problems` (answers with a non-zero status).
//!
//! Version history: 1 = the first cm-trace (`xrc` only on XRC REQs). 2 adds `port_space`,
//! `port`, `ca_guid`, `psn`, `transport`, `msg_rejected`, `mraed`, `service_timeout`,
//! `sidr_status`, `cma_*`, `conn`, `from`, `retrans`, and sets `xrc` on every message of an
//! XRC connection. 3 (cm-trace v3) writes the 64-bit values `tid`, `service_id` and `ca_guid`
//! (also in `--ladder --json` and `--stats --json`) as `"0x…"` hex strings instead of JSON
//! integers, adds `dup` (duplicate captures) here and `duplicates` in the ladder and stats
//! objects, and gives a SIDR exchange with a non-zero SIDR_REP status the ladder outcome
//! `failed` (was `resolved`). Later in version 3: `captured` and the `icrc` value
//! `not-captured` for MADs cut by the snaplen; the `-t` keys `time_rel`, `time_utc`,
//! `time_delta`, `time_delta_displayed`; every remaining CM field (the connection parameters,
//! paths, ARI / additional information, `private_data`, `xrc_block`: `src/json_full.rs`); the
//! SA MAD lines (`"msg":"SA"`) and a REQ's `sa_path` / `sa_alternate_path`.
//! Keys are only ever added within a version.

use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::frame::Encap;
use ibcm_mad::{CmMessage, ReqTransport, ServiceId};

use crate::conn::{Note, Side};
use crate::json_full::full_fields;
use crate::put::{put_f64, put_ipv4, put_json_str, put_short, put_u64};
use crate::style::{msg_role, Palette, Role};
use crate::timefmt::{json_time, put_time, TimeFormat, TimeRef};
use crate::trace::{CmEvent, Icrc, WireAddr};
use crate::upper::{self, Ulp};

/// Version of the JSON schemas (per-MAD lines, `--ladder --json` and `--stats --json`).
/// Bumped on any incompatible change.
pub(crate) const JSON_SCHEMA_VERSION: u32 = 3;

/// Appends a wire address as text (`2.2.2.1`, a GID, `LID 5`).
#[inline]
pub(crate) fn put_wire_addr(out: &mut Vec<u8>, e: &WireAddr) {
    match e {
        WireAddr::Ip(IpAddr::V4(a)) => put_ipv4(out, *a),
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

/// A JSON object under construction in a byte buffer.
pub(crate) struct Obj<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Obj<'a> {
    /// Starts an object.
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Obj { out, first: true }
    }

    /// Writes `"key":` (keys are plain ASCII identifiers).
    #[inline]
    pub(crate) fn key(&mut self, k: &str) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(k.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    /// An integer member whose key is arbitrary text (escaped).
    pub(crate) fn u64_str_key(&mut self, k: &str, v: u64) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        put_json_str(self.out, k);
        self.out.push(b':');
        put_u64(self.out, v);
    }

    /// An integer member.
    #[inline]
    pub(crate) fn u64(&mut self, k: &str, v: u64) {
        put_u64(self.key(k), v);
    }

    /// A 64-bit identifier member, as a `"0x…"` string (schema 3).
    #[inline]
    pub(crate) fn hex64(&mut self, k: &str, v: u64) {
        put_hex64_str(self.key(k), v);
    }

    /// An integer member, when present.
    #[inline]
    pub(crate) fn opt_u64(&mut self, k: &str, v: Option<u64>) {
        if let Some(v) = v {
            self.u64(k, v);
        }
    }

    /// A float member.
    pub(crate) fn f64(&mut self, k: &str, v: f64) {
        put_f64(self.key(k), v);
    }

    /// A boolean member.
    pub(crate) fn bool(&mut self, k: &str, v: bool) {
        let out = self.key(k);
        out.extend_from_slice(if v { b"true" } else { b"false" });
    }

    /// A string member whose value needs no escaping (static ASCII names).
    pub(crate) fn name(&mut self, k: &str, v: &str) {
        let out = self.key(k);
        out.push(b'"');
        out.extend_from_slice(v.as_bytes());
        out.push(b'"');
    }

    /// A string member, escaped.
    pub(crate) fn str(&mut self, k: &str, v: &str) {
        put_json_str(self.key(k), v);
    }

    /// A wire-address member.
    pub(crate) fn wire_addr(&mut self, k: &str, e: &WireAddr) {
        let out = self.key(k);
        out.push(b'"');
        put_wire_addr(out, e);
        out.push(b'"');
    }

    /// The buffer, for members written whole by the caller, each with its leading comma
    /// (never the object's first member).
    pub(crate) fn raw_members(&mut self) -> &mut Vec<u8> {
        self.first = false;
        self.out
    }

    /// Ends the object.
    pub(crate) fn close(self) {
        self.out.push(b'}');
    }
}

/// The message acronym as the JSON view spells it.
pub(crate) fn msg_name(msg: &CmMessage) -> &'static str {
    let attr = msg.attr_id();
    if attr.is_known() {
        attr.name()
    } else {
        "UNKNOWN"
    }
}

fn transport_name(t: ReqTransport) -> &'static str {
    match t {
        ReqTransport::Rc => "RC",
        ReqTransport::Uc => "UC",
        ReqTransport::Xrc => "XRC",
        ReqTransport::Other => "other",
    }
}

/// The Service ID of a message's connection (a REQ's or SIDR's own).
pub(crate) fn event_sid(ev: &CmEvent, note: &Note) -> Option<ServiceId> {
    match &ev.mad.msg {
        CmMessage::Req(r) => Some(r.service_id),
        CmMessage::SidrReq(s) => Some(s.service_id),
        CmMessage::SidrRep(s) => Some(s.service_id),
        _ => note.service_id,
    }
}

/// The rdma_cm IP header of a REQ / SIDR_REQ, when its Service ID is an rdma_cm one.
pub(crate) fn cma_header(msg: &CmMessage) -> Option<CmaHeader> {
    let (sid, pd): (ServiceId, &[u8]) = match msg {
        CmMessage::Req(r) => (r.service_id, r.private_data.as_bytes()),
        CmMessage::SidrReq(s) => (s.service_id, s.private_data.as_bytes()),
        _ => return None,
    };
    sid.rdma_cm_port()?;
    CmaHeader::parse(pd).ok()
}

/// `,"key":` as a literal.
macro_rules! key {
    ($k:literal) => {
        concat!(",\"", $k, "\":").as_bytes()
    };
}

/// `,"key":N`.
#[inline(always)]
fn num(out: &mut Vec<u8>, key: &'static [u8], v: u64) {
    out.extend_from_slice(key);
    put_u64(out, v);
}

/// A 64-bit value as a JSON string `"0x" + 16 hex digits` (schema 3: JavaScript and jq turn
/// integers above 2^53 into doubles and merge neighbouring values).
#[inline(always)]
pub(crate) fn put_hex64_str(out: &mut Vec<u8>, v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut buf = *b"\"0x0000000000000000\"";
    for (i, b) in buf.iter_mut().skip(3).take(16).enumerate() {
        let nibble = (v >> (60 - 4 * i)) & 0xf;
        *b = DIGITS.get(nibble as usize).copied().unwrap_or(b'0');
    }
    out.extend_from_slice(&buf);
}

/// `,"key":"0x…"` for a 64-bit value.
#[inline(always)]
fn hex64(out: &mut Vec<u8>, key: &'static [u8], v: u64) {
    out.extend_from_slice(key);
    put_hex64_str(out, v);
}

/// `,"key":"value"` for a name that needs no escaping.
#[inline(always)]
fn name(out: &mut Vec<u8>, key: &'static [u8], v: &str) {
    out.extend_from_slice(key);
    out.push(b'"');
    put_short(out, v);
    out.push(b'"');
}

/// `,"key":"address"`.
#[inline(always)]
fn wire_addr(out: &mut Vec<u8>, key: &'static [u8], e: &WireAddr) {
    out.extend_from_slice(key);
    out.push(b'"');
    put_wire_addr(out, e);
    out.push(b'"');
}

/// `,"key":true|false`.
#[inline(always)]
fn boolean(out: &mut Vec<u8>, key: &'static [u8], v: bool) {
    out.extend_from_slice(key);
    out.extend_from_slice(if v { b"true" } else { b"false" });
}

#[inline(always)]
fn sid(out: &mut Vec<u8>, sid: ServiceId) {
    hex64(out, key!("service_id"), sid.0);
    if let Some((ps, port)) = sid.rdma_cm_port() {
        name(out, key!("port_space"), ps.name());
        num(out, key!("port"), u64::from(port));
    }
}

/// Appends one JSON line (schema above) for a CM MAD.
///
/// Written with literal keys straight into `out` (this is cm-trace's hottest path): the same
/// bytes as building the object member by member.
pub(crate) fn json_line(
    out: &mut Vec<u8>,
    ev: &CmEvent,
    note: &Note,
    file: Option<&str>,
    (time, when): (Option<TimeFormat>, TimeRef),
) {
    const _: () = assert!(JSON_SCHEMA_VERSION == 3);
    let msg = &ev.mad.msg;
    // MAD bytes captured: a field ending after them (a packet cut by the snaplen) is left out.
    let have = ev.captured.map_or(256, usize::from);
    out.reserve(1024);
    out.extend_from_slice(b"{\"v\":3");
    if let Some(f) = file {
        out.extend_from_slice(key!("file"));
        put_json_str(out, f);
    }
    num(out, key!("frame"), ev.frame);
    out.extend_from_slice(key!("time"));
    crate::timefmt::put_epoch(out, ev.time);
    if let Some(f) = time {
        json_time(out, f, ev.time, &when);
    }
    out.extend_from_slice(match msg {
        CmMessage::ClassPortInfo(_) => b",\"msg\":\"CPI\",\"attr_id\":1",
        CmMessage::Req(_) => b",\"msg\":\"REQ\",\"attr_id\":16",
        CmMessage::Mra(_) => b",\"msg\":\"MRA\",\"attr_id\":17",
        CmMessage::Rej(_) => b",\"msg\":\"REJ\",\"attr_id\":18",
        CmMessage::Rep(_) => b",\"msg\":\"REP\",\"attr_id\":19",
        CmMessage::Rtu(_) => b",\"msg\":\"RTU\",\"attr_id\":20",
        CmMessage::Dreq(_) => b",\"msg\":\"DREQ\",\"attr_id\":21",
        CmMessage::Drep(_) => b",\"msg\":\"DREP\",\"attr_id\":22",
        CmMessage::SidrReq(_) => b",\"msg\":\"SIDR_REQ\",\"attr_id\":23",
        CmMessage::SidrRep(_) => b",\"msg\":\"SIDR_REP\",\"attr_id\":24",
        CmMessage::Lap(_) => b",\"msg\":\"LAP\",\"attr_id\":25",
        CmMessage::Apr(_) => b",\"msg\":\"APR\",\"attr_id\":26",
        CmMessage::Unknown { .. } => b"",
    });
    if let CmMessage::Unknown { .. } = msg {
        name(out, key!("msg"), msg_name(msg));
        num(out, key!("attr_id"), u64::from(msg.attr_id().raw()));
    }
    hex64(out, key!("tid"), ev.mad.header.tid.0);
    if let Some(c) = msg.local_comm_id() {
        num(out, key!("local_comm_id"), u64::from(c.0));
    }
    if let Some(c) = msg.remote_comm_id() {
        num(out, key!("remote_comm_id"), u64::from(c.0));
    }
    match msg {
        CmMessage::Req(r) if have == 256 => {
            sid(out, r.service_id);
            hex64(out, key!("ca_guid"), r.local_ca_guid.0);
            num(out, key!("local_qpn"), u64::from(r.local_qpn.get()));
            num(out, key!("psn"), u64::from(r.starting_psn.get()));
            out.extend_from_slice(match r.transport() {
                ReqTransport::Rc => b",\"transport\":\"RC\"",
                ReqTransport::Uc => b",\"transport\":\"UC\"",
                ReqTransport::Xrc => b",\"transport\":\"XRC\"",
                ReqTransport::Other => b",\"transport\":\"other\"",
            });
        }
        // Cut by the snaplen: the fields that end within the bytes captured.
        CmMessage::Req(r) => {
            if have >= 40 {
                sid(out, r.service_id);
            }
            if have >= 48 {
                hex64(out, key!("ca_guid"), r.local_ca_guid.0);
            }
            if have >= 59 {
                num(out, key!("local_qpn"), u64::from(r.local_qpn.get()));
            }
            if have >= 71 {
                num(out, key!("psn"), u64::from(r.starting_psn.get()));
            }
            if have >= 76 {
                name(out, key!("transport"), transport_name(r.transport()));
            }
        }
        CmMessage::Rep(r) => {
            if have >= 60 {
                hex64(out, key!("ca_guid"), r.local_ca_guid.0);
            }
            if have >= 39 {
                num(out, key!("local_qpn"), u64::from(r.local_qpn.get()));
            }
            if r.local_eecn.get() != 0 && have >= 43 {
                num(out, key!("local_eecn"), u64::from(r.local_eecn.get()));
            }
            if have >= 47 {
                num(out, key!("psn"), u64::from(r.starting_psn.get()));
            }
        }
        CmMessage::Dreq(d) if have >= 35 => {
            num(out, key!("remote_qpn"), u64::from(d.remote_qpn_eecn.get()));
        }
        CmMessage::Lap(l) if have >= 35 => {
            num(out, key!("remote_qpn"), u64::from(l.remote_qpn_eecn.get()));
        }
        CmMessage::SidrReq(s) => {
            num(out, key!("request_id"), u64::from(s.request_id.0));
            if have >= 40 {
                sid(out, s.service_id);
            }
        }
        CmMessage::SidrRep(s) => {
            num(out, key!("request_id"), u64::from(s.request_id.0));
            if have >= 44 {
                sid(out, s.service_id);
            }
            if have >= 35 {
                num(out, key!("local_qpn"), u64::from(s.qpn.get()));
            }
            num(out, key!("sidr_status"), u64::from(s.status.raw()));
        }
        _ => {}
    }
    boolean(out, key!("xrc"), msg.is_xrc() || note.xrc);
    match msg {
        CmMessage::Rej(r) => {
            if have >= 36 {
                num(out, key!("rej_reason"), u64::from(r.reason.raw()));
                name(out, key!("rej_reason_name"), r.reason.name());
            }
            name(out, key!("msg_rejected"), r.message_rejected.name());
        }
        CmMessage::Mra(m) if have >= 34 => {
            name(out, key!("mraed"), m.message_mraed.name());
            num(
                out,
                key!("service_timeout"),
                u64::from(m.service_timeout.get()),
            );
        }
        _ => {}
    }
    if let Some(h) = cma_header(msg).filter(|_| have >= cma_end(msg)) {
        wire_addr(out, key!("cma_src"), &WireAddr::Ip(h.src));
        wire_addr(out, key!("cma_dst"), &WireAddr::Ip(h.dst));
        num(out, key!("cma_src_port"), u64::from(h.src_port));
    }
    full_fields(out, msg, have);
    let conn_sid = match msg {
        CmMessage::Req(r) => Some(r.service_id),
        CmMessage::SidrReq(s) => Some(s.service_id),
        CmMessage::SidrRep(s) => Some(s.service_id),
        _ => note.service_id,
    };
    if let Some(u) = conn_sid.and_then(Ulp::of) {
        name(out, key!("ulp"), u.name());
    }
    if let Some(u) = upper::decode(msg, conn_sid, have) {
        out.extend_from_slice(key!("upper"));
        u.json(out);
    }
    if matches!(msg, CmMessage::Req(_)) && !note.sa.is_empty() {
        crate::sa::view::req_json(out, &note.sa);
    }
    if let Some(c) = note.conn {
        num(out, key!("conn"), c);
    }
    match note.from {
        Some(Side::Active) => out.extend_from_slice(b",\"from\":\"active\""),
        Some(Side::Passive) => out.extend_from_slice(b",\"from\":\"passive\""),
        None => {}
    }
    boolean(out, key!("retrans"), note.retrans);
    if note.dup {
        out.extend_from_slice(b",\"dup\":true");
    }
    out.extend_from_slice(match ev.icrc {
        Icrc::Ok => b",\"icrc\":\"ok\"",
        Icrc::Bad => b",\"icrc\":\"bad\"",
        Icrc::Absent => b",\"icrc\":\"absent\"",
        Icrc::NotCaptured => b",\"icrc\":\"not-captured\"",
    });
    if let Some(n) = ev.captured {
        num(out, key!("captured"), u64::from(n));
    }
    wire_addr(out, key!("src"), &ev.src);
    wire_addr(out, key!("dst"), &ev.dst);
    out.extend_from_slice(match ev.encap {
        Encap::RoceV2Ipv4 => b",\"encap\":\"RoCEv2/IPv4\"}\n",
        Encap::RoceV2Ipv6 => b",\"encap\":\"RoCEv2/IPv6\"}\n",
        Encap::RoceV1 => b",\"encap\":\"RoCEv1\"}\n",
        Encap::IbLocal => b",\"encap\":\"IB LNH=2\"}\n",
        Encap::IbGlobal => b",\"encap\":\"IB LNH=3\"}\n",
    });
}

/// A human duration: `500 ns`, `1.250 µs`, `812 µs`, `12.3 ms`, `4.205 s`. Below a
/// millisecond, nanoseconds are shown when the duration has them (a nanosecond capture), not
/// rounded to whole microseconds.
pub(crate) fn human(d: Duration) -> String {
    let us = d.as_micros();
    let sub_us = d.subsec_nanos() % 1000;
    if us < 1000 && sub_us != 0 {
        if us == 0 {
            format!("{sub_us} ns")
        } else {
            format!("{us}.{sub_us:03} µs")
        }
    } else if us < 1000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}

fn put_hex(out: &mut Vec<u8>, v: u64, digits: usize) {
    let _ = write!(out, "{v:#0w$x}", w = digits + 2);
}

/// Where the rdma_cm header in a message's private data ends (MAD bytes): REQ private data
/// starts at byte 164, SIDR_REQ's at 40; the header is 36 bytes.
pub(crate) fn cma_end(msg: &CmMessage) -> usize {
    match msg {
        CmMessage::SidrReq(_) => 76,
        _ => 200,
    }
}

/// The one-line summary of a message (after the addresses in the text view). `have`: the MAD
/// bytes captured (256 unless the snaplen cut the packet); a field that ends after them is
/// shown as `name=?`.
pub(crate) fn summary(out: &mut Vec<u8>, msg: &CmMessage, pal: &Palette, have: usize) {
    // Writes ` name=` and returns whether the field (ending at MAD byte `end`) was captured;
    // if not, writes `?`.
    let field = |out: &mut Vec<u8>, name: &str, end: usize| {
        out.push(b' ');
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        if end > have {
            out.push(b'?');
        }
        end <= have
    };
    pal.paint(out, msg_role(msg.attr_id()), msg_name(msg));
    let ids = |out: &mut Vec<u8>, l: ibcm_mad::CommId, r: ibcm_mad::CommId| {
        out.extend_from_slice(b" lcid=");
        put_hex(out, u64::from(l.0), 8);
        out.extend_from_slice(b" rcid=");
        put_hex(out, u64::from(r.0), 8);
    };
    match msg {
        CmMessage::Req(m) => {
            out.extend_from_slice(b" lcid=");
            put_hex(out, u64::from(m.local_comm_id.0), 8);
            if field(out, "sid", 40) {
                put_hex(out, m.service_id.0, 16);
                if let Some((ps, port)) = m.service_id.rdma_cm_port() {
                    let _ = write!(out, " ({}:{port})", ps.name());
                }
            }
            if field(out, "qpn", 59) {
                put_hex(out, u64::from(m.local_qpn.get()), 6);
            }
            if field(out, "psn", 71) {
                put_hex(out, u64::from(m.starting_psn.get()), 6);
            }
            // The transport fields end at MAD byte 75.
            if have >= 76 {
                out.push(b' ');
                out.extend_from_slice(transport_name(m.transport()).as_bytes());
            }
        }
        CmMessage::Rep(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            if field(out, "qpn", 39) {
                put_hex(out, u64::from(m.local_qpn.get()), 6);
            }
            if field(out, "psn", 47) {
                put_hex(out, u64::from(m.starting_psn.get()), 6);
            }
            if m.local_eecn.get() != 0 {
                out.extend_from_slice(b" eecn=");
                put_hex(out, u64::from(m.local_eecn.get()), 6);
            }
        }
        CmMessage::Rej(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            if field(out, "reason", 36) {
                let _ = write!(out, "{} (", m.reason.raw());
                pal.paint(out, Role::Bad, m.reason.name());
                out.push(b')');
            }
            let _ = write!(out, " rejected={}", m.message_rejected.name());
        }
        CmMessage::Mra(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            let _ = write!(
                out,
                " mraed={} service_timeout={} ({})",
                m.message_mraed.name(),
                m.service_timeout.get(),
                human(m.service_timeout.to_duration())
            );
        }
        CmMessage::Rtu(m) => ids(out, m.local_comm_id, m.remote_comm_id),
        CmMessage::Drep(m) => ids(out, m.local_comm_id, m.remote_comm_id),
        CmMessage::Dreq(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            if field(out, "remote_qpn", 35) {
                put_hex(out, u64::from(m.remote_qpn_eecn.get()), 6);
            }
        }
        CmMessage::Lap(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            if field(out, "remote_qpn", 35) {
                put_hex(out, u64::from(m.remote_qpn_eecn.get()), 6);
            }
        }
        CmMessage::Apr(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            let _ = write!(
                out,
                " status={} ({})",
                m.ap_status.raw(),
                m.ap_status.name()
            );
        }
        CmMessage::SidrReq(m) => {
            out.extend_from_slice(b" request_id=");
            put_hex(out, u64::from(m.request_id.0), 8);
            if field(out, "sid", 40) {
                put_hex(out, m.service_id.0, 16);
                if let Some((ps, port)) = m.service_id.rdma_cm_port() {
                    let _ = write!(out, " ({}:{port})", ps.name());
                }
            }
        }
        CmMessage::SidrRep(m) => {
            out.extend_from_slice(b" request_id=");
            put_hex(out, u64::from(m.request_id.0), 8);
            let _ = write!(out, " status={} ({})", m.status.raw(), m.status.name());
            if field(out, "qpn", 35) {
                put_hex(out, u64::from(m.qpn.get()), 6);
            }
            if field(out, "qkey", 48) {
                put_hex(out, u64::from(m.qkey.0), 8);
            }
        }
        CmMessage::ClassPortInfo(m) => {
            let _ = write!(
                out,
                " base_version={} class_version={} cap={:#06x}",
                m.base_version, m.class_version, m.capability_mask
            );
        }
        CmMessage::Unknown { attr, .. } => {
            let _ = write!(out, " attribute {attr:#06x}");
        }
    }
}

/// Appends the one-line text view of a CM MAD: frame, time relative to `t0`, addresses,
/// message summary, XRC flag, retransmission mark, ICRC status and connection number.
///
/// ```text
///      5     0.000000  2.2.2.1 → 2.2.2.3  REQ lcid=0x3eb0bde5 sid=0x0000000001061144 (TCP:4420) qpn=0x0000dc psn=0x017c2d RC  icrc=ok  conn=1
/// ```
pub(crate) fn text_line(
    out: &mut Vec<u8>,
    ev: &CmEvent,
    note: &Note,
    (time, when): (TimeFormat, TimeRef),
    pal: &Palette,
) {
    pal.start(out, Role::Dim);
    let _ = write!(out, "{:>6} ", ev.frame);
    put_time(out, time, ev.time, &when, 5);
    pal.end(out, Role::Dim);
    out.extend_from_slice(b"  ");
    put_wire_addr(out, &ev.src);
    out.extend_from_slice(" → ".as_bytes());
    put_wire_addr(out, &ev.dst);
    out.extend_from_slice(b"  ");
    let have = ev.captured.map_or(256, usize::from);
    summary(out, &ev.mad.msg, pal, have);
    if let Some(u) = upper::decode(&ev.mad.msg, event_sid(ev, note), have) {
        out.extend_from_slice(b" [");
        out.extend_from_slice(u.text().as_bytes());
        out.push(b']');
    }
    if matches!(ev.mad.msg, CmMessage::Req(_)) && !note.sa.is_empty() {
        crate::sa::view::req_tag(out, &note.sa, pal);
    }
    // A REQ's summary already names its transport (`XRC`).
    if (ev.mad.msg.is_xrc() || note.xrc) && !matches!(ev.mad.msg, CmMessage::Req(_)) {
        out.extend_from_slice(b" XRC");
    }
    if note.retrans {
        out.push(b' ');
        pal.paint(out, Role::Warn, "[retransmission]");
    }
    if note.dup {
        out.push(b' ');
        pal.paint(out, Role::Dim, "[duplicate capture]");
    }
    if let Some(n) = ev.captured {
        out.push(b' ');
        pal.paint(
            out,
            Role::Warn,
            &format!("[truncated: {n} of 256 MAD bytes]"),
        );
    }
    out.extend_from_slice(b"  icrc=");
    match ev.icrc {
        Icrc::Bad => pal.paint(out, Role::Bad, "bad"),
        other => out.extend_from_slice(other.as_str().as_bytes()),
    }
    if let Some(c) = note.conn {
        pal.start(out, Role::Dim);
        let _ = write!(out, "  conn={c}");
        pal.end(out, Role::Dim);
    }
    out.push(b'\n');
}
