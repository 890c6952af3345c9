//! Text and JSON views of [`CmEvent`]s.

use std::io::{self, Write};
use std::time::Duration;

use ibcm_mad::CmMessage;
use serde::Serialize;

use crate::trace::CmEvent;

/// Version of the JSON line schema (the keys below). Bumped on any incompatible change.
pub const JSON_SCHEMA_VERSION: u32 = 1;

/// One JSON object per CM MAD (`cm-trace --json`).
///
/// Keys: `frame` (1-based), `time` (seconds since the Unix epoch, float), `msg` (REQ MRA REJ
/// REP RTU DREQ DREP SIDR_REQ SIDR_REP LAP APR CPI, or UNKNOWN), `attr_id`, `tid`,
/// `local_comm_id` / `remote_comm_id` (absent where the message has none), `request_id`
/// (SIDR), `service_id` (REQ, SIDR_REQ, SIDR_REP), `local_qpn` (REQ, REP), `local_eecn` (REP,
/// when non-zero: an XRC target's TGT QPN), `remote_qpn` (DREQ, LAP), `xrc` (REQ with XRC
/// transport), `rej_reason` and `rej_reason_name` (REJ), `icrc` (`"ok"`, `"bad"`, `"absent"`),
/// `src`, `dst`, `encap`, and `file` when several files are decoded. Identifiers and numbers
/// are JSON integers.
#[derive(Debug, Serialize)]
pub struct JsonEvent<'a> {
    /// Schema version.
    pub v: u32,
    /// Source file, when more than one file is decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<&'a str>,
    /// 1-based frame number.
    pub frame: u64,
    /// Seconds since the Unix epoch.
    pub time: f64,
    /// Message acronym.
    pub msg: &'static str,
    /// Attribute ID.
    pub attr_id: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Local Communication ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_comm_id: Option<u32>,
    /// Remote Communication ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_comm_id: Option<u32>,
    /// SIDR Request ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u32>,
    /// Service ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u64>,
    /// Local QPN (REQ, REP) or QPN (SIDR_REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_qpn: Option<u32>,
    /// REP Local EECN (XRC TGT QPN) when non-zero.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_eecn: Option<u32>,
    /// DREQ/LAP Remote QPN/EECN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_qpn: Option<u32>,
    /// Whether this is an XRC REQ.
    pub xrc: bool,
    /// REJ reason number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rej_reason: Option<u16>,
    /// REJ reason name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rej_reason_name: Option<&'static str>,
    /// ICRC verdict.
    pub icrc: &'static str,
    /// Sender address.
    pub src: String,
    /// Receiver address.
    pub dst: String,
    /// Encapsulation.
    pub encap: &'static str,
}

impl<'a> JsonEvent<'a> {
    /// Builds the JSON view of an event.
    pub fn new(ev: &CmEvent, file: Option<&'a str>) -> Self {
        let msg = &ev.mad.msg;
        let (mut service_id, mut local_qpn, mut local_eecn, mut remote_qpn) =
            (None, None, None, None);
        let (mut rej_reason, mut rej_reason_name, mut request_id) = (None, None, None);
        match msg {
            CmMessage::Req(r) => {
                service_id = Some(r.service_id.0);
                local_qpn = Some(r.local_qpn.get());
            }
            CmMessage::Rep(r) => {
                local_qpn = Some(r.local_qpn.get());
                if r.local_eecn.get() != 0 {
                    local_eecn = Some(r.local_eecn.get());
                }
            }
            CmMessage::Rej(r) => {
                rej_reason = Some(r.reason.raw());
                rej_reason_name = Some(r.reason.name());
            }
            CmMessage::Dreq(d) => remote_qpn = Some(d.remote_qpn_eecn.get()),
            CmMessage::Lap(l) => remote_qpn = Some(l.remote_qpn_eecn.get()),
            CmMessage::SidrReq(s) => {
                service_id = Some(s.service_id.0);
                request_id = Some(s.request_id.0);
            }
            CmMessage::SidrRep(s) => {
                service_id = Some(s.service_id.0);
                request_id = Some(s.request_id.0);
                local_qpn = Some(s.qpn.get());
            }
            _ => {}
        }
        let attr = msg.attr_id();
        JsonEvent {
            v: JSON_SCHEMA_VERSION,
            file,
            frame: ev.frame,
            time: ev.time.as_secs_f64(),
            msg: if attr.is_known() {
                attr.name()
            } else {
                "UNKNOWN"
            },
            attr_id: attr.raw(),
            tid: ev.mad.header.tid.0,
            local_comm_id: msg.local_comm_id().map(|c| c.0),
            remote_comm_id: msg.remote_comm_id().map(|c| c.0),
            request_id,
            service_id,
            local_qpn,
            local_eecn,
            remote_qpn,
            xrc: msg.is_xrc(),
            rej_reason,
            rej_reason_name,
            icrc: ev.icrc.as_str(),
            src: ev.src.to_string(),
            dst: ev.dst.to_string(),
            encap: ev.encap.name(),
        }
    }
}

/// Writes one JSON line.
///
/// # Errors
/// I/O errors of `out`.
pub fn write_json(out: &mut impl Write, ev: &CmEvent, file: Option<&str>) -> io::Result<()> {
    serde_json::to_writer(&mut *out, &JsonEvent::new(ev, file))?;
    out.write_all(b"\n")
}

/// Writes the one-line text view: frame, time relative to `t0`, addresses, message summary,
/// XRC flag and ICRC status.
///
/// ```text
///      5     0.000000  2.2.2.1 → 2.2.2.3  REQ lcid=0x3eb0bde5 sid=0x0000000001061144 qpn=0x0000dc psn=0x017c2d Rc  icrc=ok
/// ```
///
/// # Errors
/// I/O errors of `out`.
pub fn write_text(out: &mut impl Write, ev: &CmEvent, t0: Duration) -> io::Result<()> {
    let rel = ev.time.checked_sub(t0).unwrap_or_default();
    write!(
        out,
        "{:>6} {:>12.6}  {} → {}  {}",
        ev.frame,
        rel.as_secs_f64(),
        ev.src,
        ev.dst,
        ev.mad.msg
    )?;
    if ev.mad.msg.is_xrc() {
        write!(out, " XRC")?;
    }
    writeln!(out, "  icrc={}", ev.icrc.as_str())
}
