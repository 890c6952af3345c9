//! The per-MAD views: the one-line text view and the JSON line view.
//!
//! Both write into a caller-owned, reused `Vec<u8>` (one line per call), so a run allocates
//! nothing per packet: numbers go through `itoa`/`ryu`, IPv4 addresses are formatted by hand.
//!
//! # JSON schema (version [`JSON_SCHEMA_VERSION`])
//! `cm-trace --json` prints one object per CM MAD, one per line. Keys, in this order; a key is
//! absent where the message has no such field. Identifiers and numbers are JSON integers.
//!
//! | key | type | when | meaning |
//! |---|---|---|---|
//! | `v` | int | always | schema version (2) |
//! | `file` | string | several input files | the input file |
//! | `frame` | int | always | 1-based frame number in its file |
//! | `time` | float | always | capture time, seconds since the Unix epoch |
//! | `msg` | string | always | `REQ MRA REJ REP RTU DREQ DREP SIDR_REQ SIDR_REP LAP APR CPI` or `UNKNOWN` |
//! | `attr_id` | int | always | MAD Attribute ID |
//! | `tid` | int | always | MAD Transaction ID |
//! | `local_comm_id` | int | all but SIDR, CPI | Local Communication ID |
//! | `remote_comm_id` | int | all but REQ, SIDR, CPI | Remote Communication ID |
//! | `request_id` | int | SIDR_REQ, SIDR_REP | SIDR Request ID |
//! | `service_id` | int | REQ, SIDR_REQ, SIDR_REP | Service ID |
//! | `port_space`, `port` | string, int | rdma_cm Service IDs | rdma_cm port space (`TCP`, `UDP`, `IB`, `IPOIB`) and port |
//! | `ca_guid` | int | REQ, REP | Local CA GUID |
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
//! | `conn` | int | connection messages | connection number in the file (1, 2, … by first appearance) |
//! | `from` | string | connection messages | `active` (the REQ side) or `passive` |
//! | `retrans` | bool | always | an identical repeat (same attribute, TID and comm IDs) of an earlier message |
//! | `icrc` | string | always | `ok`, `bad` or `absent` |
//! | `src`, `dst` | string | always | sender and receiver: IP address (RoCEv2), GID (RoCEv1, IB with GRH) or `LID n` |
//! | `encap` | string | always | `RoCEv2/IPv4`, `RoCEv2/IPv6`, `RoCEv1`, `IB LNH=2`, `IB LNH=3` |
//!
//! Version history: 1 = the first cm-trace (`xrc` only on XRC REQs). 2 adds `port_space`,
//! `port`, `ca_guid`, `psn`, `transport`, `msg_rejected`, `mraed`, `service_timeout`,
//! `sidr_status`, `cma_*`, `conn`, `from`, `retrans`, and sets `xrc` on every message of an
//! XRC connection. Keys are only ever added within a version.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{CmMessage, ReqTransport, ServiceId};

use crate::conn::Note;
use crate::style::{msg_role, Palette, Role};
use crate::trace::{CmEvent, Endpoint, Icrc};

/// Version of the JSON schemas (per-MAD lines, `--ladder --json` and `--stats --json`).
/// Bumped on any incompatible change.
pub const JSON_SCHEMA_VERSION: u32 = 2;

/// Appends an unsigned integer.
#[inline]
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    let mut b = itoa::Buffer::new();
    out.extend_from_slice(b.format(v).as_bytes());
}

/// Appends a float (shortest round-trip form; non-finite values as 0).
#[inline]
pub fn put_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        let mut b = ryu::Buffer::new();
        out.extend_from_slice(b.format_finite(v).as_bytes());
    } else {
        out.push(b'0');
    }
}

fn put_ipv4(out: &mut Vec<u8>, a: Ipv4Addr) {
    let mut b = itoa::Buffer::new();
    for (i, o) in a.octets().iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        out.extend_from_slice(b.format(*o).as_bytes());
    }
}

/// Appends an endpoint as text (`2.2.2.1`, a GID, `LID 5`).
pub fn put_endpoint(out: &mut Vec<u8>, e: &Endpoint) {
    match e {
        Endpoint::Ip(IpAddr::V4(a)) => put_ipv4(out, *a),
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

/// Appends a JSON string (quoted and escaped).
pub fn put_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let mut b = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// A JSON object under construction in a byte buffer.
pub struct Obj<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Obj<'a> {
    /// Starts an object.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Obj { out, first: true }
    }

    /// Writes `"key":` (keys are plain ASCII identifiers).
    #[inline]
    pub fn key(&mut self, k: &str) -> &mut Vec<u8> {
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
    pub fn u64_str_key(&mut self, k: &str, v: u64) {
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
    pub fn u64(&mut self, k: &str, v: u64) {
        put_u64(self.key(k), v);
    }

    /// An integer member, when present.
    #[inline]
    pub fn opt_u64(&mut self, k: &str, v: Option<u64>) {
        if let Some(v) = v {
            self.u64(k, v);
        }
    }

    /// A float member.
    pub fn f64(&mut self, k: &str, v: f64) {
        put_f64(self.key(k), v);
    }

    /// A boolean member.
    pub fn bool(&mut self, k: &str, v: bool) {
        let out = self.key(k);
        out.extend_from_slice(if v { b"true" } else { b"false" });
    }

    /// A string member whose value needs no escaping (static ASCII names).
    pub fn name(&mut self, k: &str, v: &str) {
        let out = self.key(k);
        out.push(b'"');
        out.extend_from_slice(v.as_bytes());
        out.push(b'"');
    }

    /// A string member, escaped.
    pub fn str(&mut self, k: &str, v: &str) {
        put_json_str(self.key(k), v);
    }

    /// An endpoint member.
    pub fn endpoint(&mut self, k: &str, e: &Endpoint) {
        let out = self.key(k);
        out.push(b'"');
        put_endpoint(out, e);
        out.push(b'"');
    }

    /// Ends the object.
    pub fn close(self) {
        self.out.push(b'}');
    }
}

/// The message acronym as the JSON view spells it.
pub fn msg_name(msg: &CmMessage) -> &'static str {
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

fn sid_members(o: &mut Obj<'_>, sid: ServiceId) {
    o.u64("service_id", sid.0);
    if let Some((ps, port)) = sid.rdma_cm_port() {
        o.name("port_space", ps.name());
        o.u64("port", u64::from(port));
    }
}

/// The rdma_cm IP header of a REQ / SIDR_REQ, when its Service ID is an rdma_cm one.
pub fn cma_header(msg: &CmMessage) -> Option<CmaHeader> {
    let (sid, pd): (ServiceId, &[u8]) = match msg {
        CmMessage::Req(r) => (r.service_id, r.private_data.as_bytes()),
        CmMessage::SidrReq(s) => (s.service_id, s.private_data.as_bytes()),
        _ => return None,
    };
    sid.rdma_cm_port()?;
    CmaHeader::parse(pd).ok()
}

/// Appends one JSON line (schema above) for a CM MAD.
pub fn json_line(out: &mut Vec<u8>, ev: &CmEvent, note: &Note, file: Option<&str>) {
    let msg = &ev.mad.msg;
    let mut o = Obj::new(out);
    o.u64("v", u64::from(JSON_SCHEMA_VERSION));
    if let Some(f) = file {
        o.str("file", f);
    }
    o.u64("frame", ev.frame);
    o.f64("time", ev.time.as_secs_f64());
    o.name("msg", msg_name(msg));
    o.u64("attr_id", u64::from(msg.attr_id().raw()));
    o.u64("tid", ev.mad.header.tid.0);
    o.opt_u64("local_comm_id", msg.local_comm_id().map(|c| u64::from(c.0)));
    o.opt_u64(
        "remote_comm_id",
        msg.remote_comm_id().map(|c| u64::from(c.0)),
    );
    match msg {
        CmMessage::Req(r) => {
            sid_members(&mut o, r.service_id);
            o.u64("ca_guid", r.local_ca_guid.0);
            o.u64("local_qpn", u64::from(r.local_qpn.get()));
            o.u64("psn", u64::from(r.starting_psn.get()));
            o.name("transport", transport_name(r.transport()));
        }
        CmMessage::Rep(r) => {
            o.u64("ca_guid", r.local_ca_guid.0);
            o.u64("local_qpn", u64::from(r.local_qpn.get()));
            if r.local_eecn.get() != 0 {
                o.u64("local_eecn", u64::from(r.local_eecn.get()));
            }
            o.u64("psn", u64::from(r.starting_psn.get()));
        }
        CmMessage::Dreq(d) => o.u64("remote_qpn", u64::from(d.remote_qpn_eecn.get())),
        CmMessage::Lap(l) => o.u64("remote_qpn", u64::from(l.remote_qpn_eecn.get())),
        CmMessage::SidrReq(s) => {
            o.u64("request_id", u64::from(s.request_id.0));
            sid_members(&mut o, s.service_id);
        }
        CmMessage::SidrRep(s) => {
            o.u64("request_id", u64::from(s.request_id.0));
            sid_members(&mut o, s.service_id);
            o.u64("local_qpn", u64::from(s.qpn.get()));
            o.u64("sidr_status", u64::from(s.status.raw()));
        }
        _ => {}
    }
    o.bool("xrc", msg.is_xrc() || note.xrc);
    match msg {
        CmMessage::Rej(r) => {
            o.u64("rej_reason", u64::from(r.reason.raw()));
            o.name("rej_reason_name", r.reason.name());
            o.name("msg_rejected", r.message_rejected.name());
        }
        CmMessage::Mra(m) => {
            o.name("mraed", m.message_mraed.name());
            o.u64("service_timeout", u64::from(m.service_timeout.get()));
        }
        _ => {}
    }
    if let Some(h) = cma_header(msg) {
        o.endpoint("cma_src", &Endpoint::Ip(h.src));
        o.endpoint("cma_dst", &Endpoint::Ip(h.dst));
        o.u64("cma_src_port", u64::from(h.src_port));
    }
    if let Some(c) = note.conn {
        o.u64("conn", c);
    }
    if let Some(f) = note.from {
        o.name("from", f.as_str());
    }
    o.bool("retrans", note.retrans);
    o.name("icrc", ev.icrc.as_str());
    o.endpoint("src", &ev.src);
    o.endpoint("dst", &ev.dst);
    o.name("encap", ev.encap.name());
    o.close();
    out.push(b'\n');
}

/// Appends a duration as seconds with 6 decimals (`12.345678`), right-aligned in `width`.
pub fn put_secs(out: &mut Vec<u8>, d: Duration, width: usize) {
    let _ = write!(
        out,
        "{:>width$}.{:06}",
        d.as_secs(),
        d.subsec_micros(),
        width = width
    );
}

/// A human duration: `812 µs`, `12.3 ms`, `4.205 s`.
pub fn human(d: Duration) -> String {
    let us = d.as_micros();
    if us < 1000 {
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

/// The one-line summary of a message (after the addresses in the text view).
pub fn summary(out: &mut Vec<u8>, msg: &CmMessage, pal: &Palette) {
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
            out.extend_from_slice(b" sid=");
            put_hex(out, m.service_id.0, 16);
            if let Some((ps, port)) = m.service_id.rdma_cm_port() {
                let _ = write!(out, " ({}:{port})", ps.name());
            }
            out.extend_from_slice(b" qpn=");
            put_hex(out, u64::from(m.local_qpn.get()), 6);
            out.extend_from_slice(b" psn=");
            put_hex(out, u64::from(m.starting_psn.get()), 6);
            out.push(b' ');
            out.extend_from_slice(transport_name(m.transport()).as_bytes());
        }
        CmMessage::Rep(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            out.extend_from_slice(b" qpn=");
            put_hex(out, u64::from(m.local_qpn.get()), 6);
            out.extend_from_slice(b" psn=");
            put_hex(out, u64::from(m.starting_psn.get()), 6);
            if m.local_eecn.get() != 0 {
                out.extend_from_slice(b" eecn=");
                put_hex(out, u64::from(m.local_eecn.get()), 6);
            }
        }
        CmMessage::Rej(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            let _ = write!(out, " reason={} (", m.reason.raw());
            pal.paint(out, Role::Bad, m.reason.name());
            let _ = write!(out, ") rejected={}", m.message_rejected.name());
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
            out.extend_from_slice(b" remote_qpn=");
            put_hex(out, u64::from(m.remote_qpn_eecn.get()), 6);
        }
        CmMessage::Lap(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            out.extend_from_slice(b" remote_qpn=");
            put_hex(out, u64::from(m.remote_qpn_eecn.get()), 6);
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
            out.extend_from_slice(b" sid=");
            put_hex(out, m.service_id.0, 16);
            if let Some((ps, port)) = m.service_id.rdma_cm_port() {
                let _ = write!(out, " ({}:{port})", ps.name());
            }
        }
        CmMessage::SidrRep(m) => {
            out.extend_from_slice(b" request_id=");
            put_hex(out, u64::from(m.request_id.0), 8);
            let _ = write!(out, " status={} ({})", m.status.raw(), m.status.name());
            out.extend_from_slice(b" qpn=");
            put_hex(out, u64::from(m.qpn.get()), 6);
            out.extend_from_slice(b" qkey=");
            put_hex(out, u64::from(m.qkey.0), 8);
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
pub fn text_line(out: &mut Vec<u8>, ev: &CmEvent, note: &Note, t0: Duration, pal: &Palette) {
    let rel = ev.time.checked_sub(t0).unwrap_or_default();
    pal.start(out, Role::Dim);
    let _ = write!(out, "{:>6} ", ev.frame);
    put_secs(out, rel, 5);
    pal.end(out, Role::Dim);
    out.extend_from_slice(b"  ");
    put_endpoint(out, &ev.src);
    out.extend_from_slice(" → ".as_bytes());
    put_endpoint(out, &ev.dst);
    out.extend_from_slice(b"  ");
    summary(out, &ev.mad.msg, pal);
    if ev.mad.msg.is_xrc() || note.xrc {
        out.extend_from_slice(b" XRC");
    }
    if note.retrans {
        out.push(b' ');
        pal.paint(out, Role::Warn, "[retransmission]");
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
