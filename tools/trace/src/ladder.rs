//! `cm-trace --ladder`: one ladder diagram per connection, and `--ladder --json`: one JSON
//! object per connection.
//!
//! ```text
//! conn 1  RC  service 0x0000000001061b59 (rdma_cm TCP port 7001)
//!   active   10.77.0.2  CA 0x505400fffe770002  comm 0xe27631d4  QPN 0x000011
//!   passive  10.77.0.1  CA 0x505400fffe770001  comm 0xfd36d9f3  QPN 0x000011
//!         +time   frame  active                            passive
//!     +0.000000       1  ─── REQ ─────────────────────────▶
//!     +0.088114       2  ◀───────────────────────── REP ───
//!   result: closed by the active side (DREQ → DREP 8.1 ms); REQ → RTU 105.2 ms
//! ```
//!
//! On native InfiniBand, the SA PathRecord query and answer the REQ followed head the ladder
//! (rows `SA …` with negative times), and the REQ row says where the REQ disagrees with the
//! record (`crate::sa::view`); the exchanges that served no connection follow the
//! connections, each with a ladder of its own.
//!
//! # JSON object (schema version [`crate::render::JSON_SCHEMA_VERSION`])
//! `v`, `file` (several inputs), `conn`, `kind` (`RC UC XRC other unknown SIDR`),
//! `service_id`, `port_space`, `port`, `request_id` (SIDR), `active` and `passive` (objects
//! with `addr`, `ca_guid`, `comm_id`, `qpn`, each when known; `service_id` and `ca_guid` are
//! `"0x…"` hex strings since schema 3), `first`, `last` (capture time,
//! seconds), `first_frame`, `outcome` (`closed established rejected timed_out waiting
//! resolved failed partial`; `failed`: a SIDR_REP with a non-zero status, as `--stats` counts
//! it), `closed_by`, `rej_reason`, `rej_reason_name`, `rej_by`,
//! `timed_out_waiting_for` / `waiting_for` (the missing answer), `sends` (for a timeout),
//! `sidr_status`, `setup_ms` (REQ → RTU), `teardown_ms` (DREQ → DREP), `slow_setup` /
//! `slow_teardown` (`true` when over 1 s: [`crate::stats::SLOW`]), `rdma_cm_event` (for an
//! rdma_cm Service ID that failed: `{side, event, status}`, what that side's librdmacm
//! application gets, `crate::upper`), `messages`,
//! `retransmissions`, `mras`, `bad_icrc`, `evicted` (tracking stopped because the table was
//! full), `duplicates` (only when non-zero: packets captured twice, same BTH PSN), and `events`
//! (when recorded): an array of `{frame, t, from, msg, retrans, icrc}` (plus `dup: true` on a
//! duplicate capture)
//! with `t` in seconds since the connection's first message, plus `rej_reason` / `mraed` /
//! `service_timeout` / `sidr_status` where they apply; `events_dropped` counts entries beyond
//! the per-connection limit.
//!
//! `sa` (later in schema 3, only for a connection whose REQ follows an SA PathRecord answer
//! in the capture): `primary` and / or `alternate`, each `{exchange, tid, tid_match` (`full`,
//! or `low32`: paired by TID bits 31–0)`, query` (when in the capture: `frame`, `t`,
//! `method`, `comp_mask`, `components`, `template`, `sends`, `src`, `dst`)`, answer`
//! (`frame`, `t`, `method`, `status`, `status_name`, `records`, `segments`, `partial`)`,
//! record_index, record` (the PathRecord, keys as the per-MAD SA lines have them)`,
//! differs}`: `t` is relative to the connection's first message (negative before it), and
//! `differs` lists `{field, req, record}` for each field in which the REQ disagrees with the
//! record (`local_ack_timeout`: `{field, req, record_packet_life_time, min}`). A PathRecord
//! exchange that served no connection is an object of its own after the connections, without
//! `conn`: `{v, file?, sa_exchange, tid, tid_match, first, query?, answer?, records, served,
//! repeats, outcome}` (`outcome`: `served_none`, `unanswered`, `failed`; capture times in
//! seconds since the epoch).
//!
//! `data` (added in schema 3): the RC traffic on the connection's QPNs, both directions
//! (`crate::conn` `data` module): `packets`, `bytes` (wire length),
//! packets by family `send`, `write`, `read_req`, `read_resp`, `ack`, `atomic`, `cnp`;
//! `acks`, `naks` (RNR NAKs included), `rnr_naks`, NAKs by code `psn_sequence_error`,
//! `invalid_request`, `remote_access_error`, `remote_operational_error`,
//! `invalid_rd_request`; `retransmissions` (request PSNs resent), `psn_gaps`, `ecn_ce`,
//! `duplicates` (packets captured twice, not counted);
//! `first` and `last` (capture time of the first and last packet, when any); `verdict`:
//! `ok`, `broken` (NAKs or retransmissions), `no_data`, or `null` (not established, or no RC
//! traffic in the capture at all). XRC connections add `srqns` (the SRQ numbers the REP
//! announced in its private data) and `srq_packets` (requests counted by their XRCETH SRQ
//! number). SIDR exchanges (since the SIDR data path) count UD SENDs to and from the QP the
//! SIDR_REP resolved: `packets`, `bytes`, `send`, `duplicates`, `ecn_ce`, `qkey` (the
//! SIDR_REP's, `null` unless status 0), `qkey_mismatches` (SENDs to the QP under another
//! Q_Key); the verdict is for a resolved exchange (`broken`: a Q_Key mismatch).

use std::io::Write;

use ibcm_mad::AttrId;

use crate::conn::{
    Conn, ConnKind, DataStats, Detail, End, LadderEntry, Outcome, Side, Verdict, FAMILIES,
    NAK_CODES,
};
use crate::put::put_secs;
use crate::render::{human, put_wire_addr, Obj, JSON_SCHEMA_VERSION};
use crate::stats::SLOW;
use crate::style::{msg_role, Palette, Role};
use crate::trace::Icrc;
use crate::upper::rdma_cm_event;

/// Width of the arrow between the two columns.
const ARROW: usize = 36;

fn end_line(out: &mut Vec<u8>, label: &str, e: &End) {
    let _ = write!(out, "  {label:<8} ");
    match &e.addr {
        Some(a) => put_wire_addr(out, a),
        None => out.push(b'?'),
    }
    if let Some(g) = e.ca_guid {
        let _ = write!(out, "  CA {g}");
    }
    if let Some(c) = e.comm_id {
        let _ = write!(out, "  comm {c}");
    }
    if let Some(q) = e.qpn {
        let _ = write!(out, "  QPN {q}");
    }
    out.push(b'\n');
}

fn arrow(out: &mut Vec<u8>, pal: &Palette, name: &str, role: Role, from: Side) {
    let n = name.chars().count();
    let rest = ARROW.saturating_sub(n + 6);
    match from {
        Side::Active => {
            out.extend_from_slice("─── ".as_bytes());
            pal.paint(out, role, name);
            out.push(b' ');
            for _ in 0..rest {
                out.extend_from_slice("─".as_bytes());
            }
            out.extend_from_slice("▶".as_bytes());
        }
        Side::Passive => {
            out.extend_from_slice("◀".as_bytes());
            for _ in 0..rest {
                out.extend_from_slice("─".as_bytes());
            }
            out.push(b' ');
            pal.paint(out, role, name);
            out.extend_from_slice(" ───".as_bytes());
        }
    }
}

/// Digits of the whole seconds of the connection's last relative time (the `+time` column's
/// width, so that the columns stay aligned past 10 s).
fn secs_digits(c: &Conn) -> usize {
    // SA rows before the first message count by their distance to it.
    let sa = crate::sa::view::conn_times(c)
        .into_iter()
        .map(|t| t.abs_diff(c.first).as_secs());
    let max = c
        .events
        .iter()
        .map(|e| e.time.checked_sub(c.first).unwrap_or_default().as_secs())
        .chain(sa)
        .max()
        .unwrap_or(0);
    max.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn entry(
    out: &mut Vec<u8>,
    pal: &Palette,
    c: &Conn,
    e: &LadderEntry,
    (nth_retrans, first_req): (u32, bool),
    digits: usize,
) {
    let rel = e.time.checked_sub(c.first).unwrap_or_default();
    pal.start(out, Role::Dim);
    out.extend_from_slice(b"    +");
    put_secs(out, rel, digits);
    let _ = write!(out, " {:>7}", e.frame);
    pal.end(out, Role::Dim);
    out.extend_from_slice(b"  ");
    let name = if e.attr.is_known() {
        e.attr.name()
    } else {
        "UNKNOWN"
    };
    arrow(out, pal, name, msg_role(e.attr), e.from);
    match e.detail {
        Detail::Rej(reason, rejected) => {
            out.extend_from_slice(b"  ");
            pal.paint(
                out,
                Role::Bad,
                &format!("reason {} {}", reason.raw(), reason.name()),
            );
            let _ = write!(out, " (rejects {})", rejected.name());
        }
        Detail::Mra(kind, t) => {
            let _ = write!(
                out,
                "  acknowledges {}, service timeout {} ({})",
                kind.name(),
                t.get(),
                human(t.to_duration())
            );
        }
        Detail::Sidr(s) => {
            let _ = write!(out, "  status {} ({})", s.raw(), s.name());
        }
        Detail::None => {}
    }
    if first_req {
        crate::sa::view::req_row_note(out, pal, c);
    }
    if e.retrans {
        out.extend_from_slice(b"  ");
        pal.paint(out, Role::Warn, &format!("retransmission #{nth_retrans}"));
    }
    if e.dup {
        out.extend_from_slice(b"  ");
        pal.paint(out, Role::Dim, "duplicate capture (same packet, same PSN)");
    }
    if e.icrc == Icrc::Bad {
        out.extend_from_slice(b"  ");
        pal.paint(out, Role::Bad, "bad ICRC");
    }
    out.push(b'\n');
}

/// One sentence on how the connection ended.
pub(crate) fn outcome_text(c: &Conn) -> String {
    let mut s = match c.outcome {
        Outcome::Closed { by: Some(side) } => {
            format!("established, then closed by the {} side", side.as_str())
        }
        Outcome::Closed { by: None } => "closed (DREP seen, DREQ not in the capture)".to_string(),
        Outcome::Established => "established, still open at the end of the capture".to_string(),
        Outcome::Rejected { reason, by } => format!(
            "rejected by the {} side: reason {} ({})",
            by.as_str(),
            reason.raw(),
            reason.name()
        ),
        Outcome::TimedOut { phase, sends } => format!(
            "timed out: {} sent {} time{}, no {} within the sender's timeout",
            phase.request(),
            sends,
            if sends == 1 { "" } else { "s" },
            phase.answer()
        ),
        Outcome::Waiting { phase } => format!(
            "incomplete: the capture ends while the {} waits for its {}",
            phase.request(),
            phase.answer()
        ),
        Outcome::Resolved { status } if status.raw() == 0 => {
            format!("SIDR resolved: status {} ({})", status.raw(), status.name())
        }
        Outcome::Resolved { status } => {
            format!("SIDR failed: status {} ({})", status.raw(), status.name())
        }
        Outcome::Partial => "partial: the REQ is not in the capture".to_string(),
    };
    let mut parts = Vec::new();
    if let Some(d) = c.setup_latency() {
        parts.push(format!("REQ → RTU {}", human(d)));
        if d > SLOW {
            parts.push(format!("SLOW SETUP (over {})", human(SLOW)));
        }
    }
    if let Some(d) = c.teardown_latency() {
        parts.push(format!("DREQ → DREP {}", human(d)));
        if d > SLOW {
            parts.push(format!("SLOW TEARDOWN (over {})", human(SLOW)));
        }
    }
    if c.retransmissions > 0 {
        parts.push(format!("{} retransmission(s)", c.retransmissions));
    }
    if c.duplicates > 0 {
        parts.push(format!("{} duplicate capture(s)", c.duplicates));
    }
    if c.mras > 0 {
        parts.push(format!("{} MRA(s)", c.mras));
    }
    if c.bad_icrc > 0 {
        parts.push(format!("{} bad ICRC", c.bad_icrc));
    }
    if let Some(p) = crate::sa::view::result_part(c) {
        parts.push(p);
    }
    if c.evicted {
        parts.push("tracking stopped early: connection table full".to_string());
    }
    if !parts.is_empty() {
        s.push_str("; ");
        s.push_str(&parts.join(", "));
    }
    s
}

fn outcome_role(o: &Outcome) -> Role {
    match o {
        Outcome::Closed { .. } | Outcome::Established => Role::Setup,
        Outcome::Resolved { status } if status.raw() == 0 => Role::Setup,
        Outcome::Rejected { .. } | Outcome::TimedOut { .. } | Outcome::Resolved { .. } => Role::Bad,
        Outcome::Waiting { .. } | Outcome::Partial => Role::Warn,
    }
}

/// Appends the ladder of one finished connection.
pub(crate) fn ladder(out: &mut Vec<u8>, c: &Conn, pal: &Palette) {
    pal.start(out, Role::Head);
    let _ = write!(out, "conn {}", c.id);
    pal.end(out, Role::Head);
    let _ = write!(out, "  {}", c.kind.as_str());
    if let Some(sid) = c.service_id {
        let _ = write!(out, "  service {sid}");
        if let Some((ps, port)) = sid.rdma_cm_port() {
            let _ = write!(out, " (rdma_cm {} port {port})", ps.name());
        }
    }
    if let Some(r) = c.request_id {
        let _ = write!(out, "  request ID {r:#010x}");
    }
    out.push(b'\n');
    end_line(out, "active", &c.active);
    end_line(out, "passive", &c.passive);
    pal.start(out, Role::Dim);
    let digits = secs_digits(c);
    let _ = writeln!(
        out,
        "{:>time$} {:>7}  {:<width$}passive",
        "+time",
        "frame",
        "active",
        time = 12 + digits,
        width = ARROW - 7
    );
    pal.end(out, Role::Dim);
    crate::sa::view::ladder_rows(out, pal, c, digits);
    let mut nth = 0;
    let mut req_seen = false;
    for e in &c.events {
        if e.retrans {
            nth += 1;
        }
        let first_req = e.attr == AttrId::Req && !e.dup && !std::mem::replace(&mut req_seen, true);
        entry(out, pal, c, e, (nth, first_req), digits);
    }
    if c.events_dropped > 0 {
        let _ = writeln!(
            out,
            "    … {} more message(s) not shown (per-connection limit)",
            c.events_dropped
        );
    }
    out.extend_from_slice(b"  result: ");
    pal.paint(out, outcome_role(&c.outcome), &outcome_text(c));
    out.push(b'\n');
    if let Some(e) = rdma_cm_event(c) {
        let _ = writeln!(
            out,
            "  rdma_cm: the {} side's application gets {} (status {})",
            e.side.as_str(),
            e.event,
            e.status
        );
    }
    data_lines(out, c, pal);
    out.push(b'\n');
}

/// The data-path lines of the ladder: counts, then the verdict. Nothing when the capture had
/// no RC traffic (SIDR: UD traffic) and none on this connection.
fn data_lines(out: &mut Vec<u8>, c: &Conn, pal: &Palette) {
    let Some(d) = c.data.as_deref() else {
        return;
    };
    if !(d.capture_has_rc || d.packets > 0) {
        return;
    }
    if c.kind == ConnKind::Sidr {
        ud_line(out, c, d);
    } else {
        rc_line(out, c, d);
    }
    if let Some(v) = c.data_verdict() {
        out.extend_from_slice(b"  verdict: ");
        let role = match v {
            Verdict::Ok => Role::Setup,
            Verdict::Broken | Verdict::NoData => Role::Bad,
        };
        let text = match (c.kind, v) {
            (ConnKind::Sidr, Verdict::Broken) => {
                "resolved but broken (UD SENDs under another Q_Key)"
            }
            _ => v.text(),
        };
        pal.paint(out, role, text);
        out.push(b'\n');
    }
}

/// A SIDR exchange's UD line: packets to and from the QP its SIDR_REP resolved.
fn ud_line(out: &mut Vec<u8>, c: &Conn, d: &DataStats) {
    let _ = write!(out, "  data: {} UD packets, {} bytes", d.packets, d.bytes);
    if let (Some(q), Some(k)) = (c.passive.qpn, d.ud_qkey) {
        let _ = write!(out, " (QPN {:#08x}, Q_Key {k:#010x})", q.get());
    }
    if d.qkey_mismatches > 0 {
        let _ = write!(out, "; {} with another Q_Key", d.qkey_mismatches);
    }
    if d.duplicates > 0 {
        let _ = write!(out, ", {} duplicate capture(s)", d.duplicates);
    }
    first_last(out, c, d);
    out.push(b'\n');
}

/// `; first +…, last +…` when packets were seen.
fn first_last(out: &mut Vec<u8>, c: &Conn, d: &DataStats) {
    if let (Some(f), Some(l)) = (d.first, d.last) {
        out.extend_from_slice(b"; first +");
        put_secs(out, f.checked_sub(c.first).unwrap_or_default(), 1);
        out.extend_from_slice(b", last +");
        put_secs(out, l.checked_sub(c.first).unwrap_or_default(), 1);
    }
}

/// An RC / XRC connection's data line.
fn rc_line(out: &mut Vec<u8>, c: &Conn, d: &DataStats) {
    let _ = write!(out, "  data: {} packets, {} bytes", d.packets, d.bytes);
    if d.packets > 0 {
        let fams: Vec<String> = FAMILY_NAMES
            .iter()
            .zip(d.families.iter())
            .filter(|(_, n)| **n > 0)
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        let _ = write!(out, " ({})", fams.join(", "));
    }
    let _ = write!(out, "; {} NAK(s)", d.naks);
    if d.naks > 0 {
        let mut kinds = Vec::new();
        if d.rnr_naks > 0 {
            kinds.push(format!("RNR {}", d.rnr_naks));
        }
        for (name, n) in NAK_NAMES.iter().zip(d.nak_codes.iter()) {
            if *n > 0 {
                kinds.push(format!("{name} {n}"));
            }
        }
        let _ = write!(out, " ({})", kinds.join(", "));
    }
    let _ = write!(
        out,
        ", {} retransmission(s), {} PSN gap(s)",
        d.retransmissions, d.psn_gaps
    );
    if d.cnps > 0 {
        let _ = write!(out, ", {} CNP(s)", d.cnps);
    }
    if d.ecn_ce > 0 {
        let _ = write!(out, ", {} ECN-CE", d.ecn_ce);
    }
    if d.duplicates > 0 {
        let _ = write!(out, ", {} duplicate capture(s)", d.duplicates);
    }
    first_last(out, c, d);
    out.push(b'\n');
    if !d.srqns().is_empty() {
        out.extend_from_slice(b"  XRC SRQs announced:");
        for (i, s) in d.srqns().iter().enumerate() {
            let _ = write!(out, "{} {s:#08x}", if i == 0 { "" } else { "," });
        }
        let _ = writeln!(out, "; {} request(s) by SRQ number", d.srq_packets);
    }
}

/// Family names as the ladder shows them (the order of [`FAMILIES`]).
const FAMILY_NAMES: [&str; 7] = [
    "SEND",
    "RDMA WRITE",
    "RDMA READ request",
    "READ response",
    "ACK",
    "atomic",
    "CNP",
];

/// NAK code names as the ladder shows them (the order of [`NAK_CODES`]).
const NAK_NAMES: [&str; 5] = [
    "PSN sequence error",
    "invalid request",
    "remote access error",
    "remote operational error",
    "invalid RD request",
];

/// The `data` object of a connection (schema above).
fn data_obj(o: &mut Obj<'_>, c: &Conn) {
    let d = c.data.as_deref().copied().unwrap_or_default();
    let out = o.key("data");
    let mut inner = Obj::new(out);
    inner.u64("packets", d.packets);
    inner.u64("bytes", d.bytes);
    for (name, n) in FAMILIES.iter().zip(d.families.iter()) {
        inner.u64(name, *n);
    }
    inner.u64("acks", d.acks);
    inner.u64("naks", d.naks);
    inner.u64("rnr_naks", d.rnr_naks);
    for (name, n) in NAK_CODES.iter().zip(d.nak_codes.iter()) {
        inner.u64(name, *n);
    }
    inner.u64("retransmissions", d.retransmissions);
    inner.u64("psn_gaps", d.psn_gaps);
    inner.u64("ecn_ce", d.ecn_ce);
    inner.u64("duplicates", d.duplicates);
    if c.kind == ConnKind::Xrc {
        let key = inner.key("srqns");
        key.push(b'[');
        for (i, s) in d.srqns().iter().enumerate() {
            if i > 0 {
                key.push(b',');
            }
            let _ = write!(key, "{s}");
        }
        key.push(b']');
        inner.u64("srq_packets", d.srq_packets);
    }
    if c.kind == ConnKind::Sidr {
        match d.ud_qkey {
            Some(q) => inner.u64("qkey", u64::from(q)),
            None => inner.key("qkey").extend_from_slice(b"null"),
        }
        inner.u64("qkey_mismatches", d.qkey_mismatches);
    }
    if let (Some(f), Some(l)) = (d.first, d.last) {
        inner.f64("first", f.as_secs_f64());
        inner.f64("last", l.as_secs_f64());
    }
    match c.data_verdict() {
        Some(v) => inner.name("verdict", v.as_str()),
        None => inner.key("verdict").extend_from_slice(b"null"),
    }
    inner.close();
}

fn end_obj(o: &mut Obj<'_>, key: &str, e: &End) {
    let out = o.key(key);
    let mut inner = Obj::new(out);
    if let Some(a) = &e.addr {
        inner.wire_addr("addr", a);
    }
    if let Some(g) = e.ca_guid {
        inner.hex64("ca_guid", g.0);
    }
    inner.opt_u64("comm_id", e.comm_id.map(|c| u64::from(c.0)));
    inner.opt_u64("qpn", e.qpn.map(|q| u64::from(q.get())));
    inner.close();
}

/// Milliseconds, computed from whole nanoseconds so that e.g. 158.345 ms prints as such.
fn ms(d: std::time::Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

/// Appends one JSON line describing a finished connection (schema above).
pub(crate) fn conn_json(out: &mut Vec<u8>, c: &Conn, file: Option<&str>) {
    let mut o = Obj::new(out);
    o.u64("v", u64::from(JSON_SCHEMA_VERSION));
    if let Some(f) = file {
        o.str("file", f);
    }
    o.u64("conn", c.id);
    o.name("kind", c.kind.as_str());
    if let Some(sid) = c.service_id {
        o.hex64("service_id", sid.0);
        if let Some((ps, port)) = sid.rdma_cm_port() {
            o.name("port_space", ps.name());
            o.u64("port", u64::from(port));
        }
    }
    o.opt_u64("request_id", c.request_id.map(u64::from));
    end_obj(&mut o, "active", &c.active);
    end_obj(&mut o, "passive", &c.passive);
    o.f64("first", c.first.as_secs_f64());
    o.f64("last", c.last.as_secs_f64());
    o.u64("first_frame", c.first_frame);
    o.name("outcome", c.outcome.as_str());
    match c.outcome {
        Outcome::Closed { by: Some(s) } => o.name("closed_by", s.as_str()),
        Outcome::Rejected { reason, by } => {
            o.u64("rej_reason", u64::from(reason.raw()));
            o.name("rej_reason_name", reason.name());
            o.name("rej_by", by.as_str());
        }
        Outcome::TimedOut { phase, sends } => {
            o.name("timed_out_waiting_for", phase.answer());
            o.u64("sends", u64::from(sends));
        }
        Outcome::Waiting { phase } => o.name("waiting_for", phase.answer()),
        Outcome::Resolved { status } => o.u64("sidr_status", u64::from(status.raw())),
        _ => {}
    }
    if let Some(d) = c.setup_latency() {
        o.f64("setup_ms", ms(d));
    }
    if let Some(d) = c.teardown_latency() {
        o.f64("teardown_ms", ms(d));
    }
    if c.setup_latency().is_some_and(|d| d > SLOW) {
        o.bool("slow_setup", true);
    }
    if c.teardown_latency().is_some_and(|d| d > SLOW) {
        o.bool("slow_teardown", true);
    }
    if let Some(e) = rdma_cm_event(c) {
        let out = o.key("rdma_cm_event");
        let _ = write!(
            out,
            "{{\"side\":\"{}\",\"event\":\"{}\",\"status\":{}}}",
            e.side.as_str(),
            e.event,
            e.status
        );
    }
    o.u64("messages", u64::from(c.messages));
    o.u64("retransmissions", u64::from(c.retransmissions));
    if c.duplicates > 0 {
        o.u64("duplicates", u64::from(c.duplicates));
    }
    o.u64("mras", u64::from(c.mras));
    o.u64("bad_icrc", u64::from(c.bad_icrc));
    o.bool("evicted", c.evicted);
    crate::sa::view::conn_json(&mut o, c);
    data_obj(&mut o, c);
    if !c.events.is_empty() {
        let out = o.key("events");
        out.push(b'[');
        for (i, e) in c.events.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let mut eo = Obj::new(out);
            eo.u64("frame", e.frame);
            eo.f64(
                "t",
                e.time
                    .checked_sub(c.first)
                    .unwrap_or_default()
                    .as_secs_f64(),
            );
            eo.name("from", e.from.as_str());
            eo.name(
                "msg",
                if e.attr.is_known() {
                    e.attr.name()
                } else {
                    "UNKNOWN"
                },
            );
            match e.detail {
                Detail::Rej(r, _) => eo.u64("rej_reason", u64::from(r.raw())),
                Detail::Mra(k, t) => {
                    eo.name("mraed", k.name());
                    eo.u64("service_timeout", u64::from(t.get()));
                }
                Detail::Sidr(s) => eo.u64("sidr_status", u64::from(s.raw())),
                Detail::None => {}
            }
            eo.bool("retrans", e.retrans);
            if e.dup {
                eo.bool("dup", true);
            }
            eo.name("icrc", e.icrc.as_str());
            eo.close();
        }
        out.push(b']');
        if c.events_dropped > 0 {
            o.u64("events_dropped", u64::from(c.events_dropped));
        }
    }
    o.close();
    out.push(b'\n');
}

/// Whether the connection had a message of type `attr` (from its recorded events).
pub(crate) fn has_msg(c: &Conn, attr: AttrId) -> bool {
    c.events.iter().any(|e| e.attr == attr)
        || match attr {
            AttrId::Req => c.req.is_some() && c.kind != ConnKind::Sidr,
            AttrId::Rep => c.rep.is_some(),
            AttrId::Rtu => c.rtu.is_some(),
            AttrId::Dreq => c.dreq.is_some(),
            AttrId::Drep => c.drep.is_some(),
            AttrId::Rej => c.rej.is_some(),
            AttrId::Mra => c.mras > 0,
            AttrId::SidrReq => c.kind == ConnKind::Sidr && c.req.is_some(),
            AttrId::SidrRep => c.sidr_rep.is_some(),
            _ => false,
        }
}
