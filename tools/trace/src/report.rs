//! The `--stats` report, as text and as one JSON object.
//!
//! # JSON object (schema version [`JSON_SCHEMA_VERSION`])
//! `v`; totals `files`, `frames`, `cm_mads`, `non_cm`, `malformed`, `bad_icrc`, `cut` (records
//! cut by the snaplen), `cm_cut` (CM MADs among them, decoded as far as captured) and
//! `skipped_bytes` (skipped over damaged record headers to the next plausible one); `messages`
//! (message name → count, repeats included); connections counted by comm-ID pair:
//! `attempted` (REQ seen), `established`, `rejected` (object: REJ reason number as a string
//! key → count), `rejected_total`, `timed_out`, `waiting` (capture ended within the timeout),
//! `partial` (REQ not in the capture), `closed` (DREQ/DREP), `xrc`; `retransmissions`
//! (identical repeats), `mras`; `setup_ms` (REQ → RTU) and `teardown_ms` (DREQ → DREP), each
//! `{count, p50, p90, p99, max, mean}` in milliseconds (`null` without samples);
//! `slow_setups` and `slow_teardowns` (slower than 1 s: [`crate::stats::SLOW`]);
//! `by_service`: an array of `{service_id` (a `"0x…"` hex string since schema 3)`, port_space?, port?, attempted, established,
//! rejected, timed_out, retransmissions, mras, setup_ms}` sorted by Service ID, then
//! `other_services` when more than [`crate::stats::MAX_SERVICES`] were seen; `sidr`
//! (`requests`, `resolved`, `failed`, `unanswered`); `data` (the RC traffic on the
//! connections' QPNs: `capture_has_rc`, `connections` with data, `packets`, `bytes`, `naks`,
//! `rnr_naks`, `retransmissions`, `psn_gaps`, `cnps`, `ecn_ce`, and established connections
//! by verdict `ok`, `broken`, `no_data`); `sa` (only for captures with SA MADs: `mads`,
//! PathRecord `exchanges`, `queries` (with their query in the capture), `query_resends`,
//! `unanswered`, `failed` (non-zero status), `records`, `tid_low32` (answers paired by TID bits
//! 31–0 only), `repeats`, `rmpp_control` (RMPP ACK/STOP/ABORT MADs), `served` (exchanges that
//! served a connection), `served_none`, `reqs_following` (connections whose REQ follows a
//! record), `reqs_differing` (those whose REQ disagrees with it), `served_no_connection` (at
//! most 32 exchange objects as `--ladder --json` writes them, `crate::sa::view`) and
//! `not_listed`); `non_cm_kinds` (kind → count);
//! `evicted` and `peak_live_connections` (the tracker's memory bound at work).

use std::io::Write;
use std::time::Duration;

use ibcm_mad::{AttrId, ServiceId};

use crate::render::{human, Obj, JSON_SCHEMA_VERSION};
use crate::stats::{rej_name, ConnStats, Latency, TraceStats, SLOW};
use crate::style::{Palette, Role};

/// Milliseconds, computed from whole nanoseconds so that e.g. 158.345 ms prints as such.
fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

fn latency_obj(o: &mut Obj<'_>, key: &str, l: &Latency) {
    let out = o.key(key);
    let mut lo = Obj::new(out);
    lo.u64("count", l.count());
    for (k, p) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0)] {
        match l.percentile(p) {
            Some(d) => lo.f64(k, ms(d)),
            None => lo.key(k).extend_from_slice(b"null"),
        }
    }
    match l.max() {
        Some(d) => lo.f64("max", ms(d)),
        None => lo.key("max").extend_from_slice(b"null"),
    }
    match l.mean() {
        Some(d) => lo.f64("mean", ms(d)),
        None => lo.key("mean").extend_from_slice(b"null"),
    }
    lo.close();
}

fn rejected_obj(o: &mut Obj<'_>, s: &ConnStats) {
    let out = o.key("rejected");
    let mut r = Obj::new(out);
    for (reason, n) in &s.rejected {
        r.u64(&reason.to_string(), *n);
    }
    r.close();
}

fn conn_members(o: &mut Obj<'_>, s: &ConnStats, full: bool) {
    o.u64("attempted", s.attempted);
    o.u64("established", s.established);
    rejected_obj(o, s);
    if full {
        o.u64("rejected_total", s.rejected_total());
    }
    o.u64("timed_out", s.timed_out);
    if full {
        o.u64("waiting", s.waiting);
        o.u64("partial", s.partial);
        o.u64("closed", s.closed);
        o.u64("xrc", s.xrc);
    }
    o.u64("retransmissions", s.retransmissions);
    if s.duplicates > 0 {
        o.u64("duplicates", s.duplicates);
    }
    o.u64("mras", s.mras);
    latency_obj(o, "setup_ms", &s.setup);
    if full {
        latency_obj(o, "teardown_ms", &s.teardown);
        o.u64("slow_setups", s.slow_setups);
        o.u64("slow_teardowns", s.slow_teardowns);
    }
}

/// Appends the `--stats --json` object (one line).
pub(crate) fn stats_json(out: &mut Vec<u8>, s: &TraceStats) {
    let mut o = Obj::new(out);
    o.u64("v", u64::from(JSON_SCHEMA_VERSION));
    o.u64("files", s.files);
    o.u64("frames", s.frames);
    o.u64("cm_mads", s.cm);
    o.u64("non_cm", s.non_cm);
    o.u64("malformed", s.malformed);
    o.u64("bad_icrc", s.bad_icrc);
    o.u64("cut", s.cut);
    o.u64("cm_cut", s.cm_cut);
    o.u64("skipped_bytes", s.skipped_bytes);
    {
        let out = o.key("messages");
        let mut m = Obj::new(out);
        for (attr, n) in &s.messages {
            let a = AttrId::from_raw(*attr);
            if a.is_known() {
                m.u64(a.name(), *n);
            } else {
                m.u64(&format!("{attr:#06x}"), *n);
            }
        }
        m.close();
    }
    conn_members(&mut o, &s.all, true);
    {
        let out = o.key("by_service");
        out.push(b'[');
        for (i, (sid, cs)) in s.by_service.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let mut so = Obj::new(out);
            so.hex64("service_id", *sid);
            if let Some((ps, port)) = ServiceId(*sid).rdma_cm_port() {
                so.name("port_space", ps.name());
                so.u64("port", u64::from(port));
            }
            conn_members(&mut so, cs, false);
            so.close();
        }
        out.push(b']');
    }
    if s.other_services.attempted + s.other_services.partial > 0 {
        let out = o.key("other_services");
        let mut so = Obj::new(out);
        conn_members(&mut so, &s.other_services, false);
        so.close();
    }
    {
        let out = o.key("sidr");
        let mut so = Obj::new(out);
        so.u64("requests", s.sidr.requests);
        so.u64("resolved", s.sidr.resolved);
        so.u64("failed", s.sidr.failed);
        so.u64("unanswered", s.sidr.unanswered);
        so.close();
    }
    {
        let d = &s.data;
        let out = o.key("data");
        let mut dobj = Obj::new(out);
        dobj.bool("capture_has_rc", d.capture_has_rc);
        dobj.u64("connections", d.connections);
        dobj.u64("packets", d.packets);
        dobj.u64("bytes", d.bytes);
        dobj.u64("naks", d.naks);
        dobj.u64("rnr_naks", d.rnr_naks);
        dobj.u64("retransmissions", d.retransmissions);
        dobj.u64("psn_gaps", d.psn_gaps);
        dobj.u64("cnps", d.cnps);
        dobj.u64("ecn_ce", d.ecn_ce);
        dobj.u64("ok", d.ok);
        dobj.u64("broken", d.broken);
        dobj.u64("no_data", d.no_data);
        dobj.u64("srq_packets", d.srq_packets);
        dobj.bool("capture_has_ud", d.capture_has_ud);
        dobj.u64("ud_packets", d.ud_packets);
        dobj.u64("ud_bytes", d.ud_bytes);
        dobj.u64("qkey_mismatches", d.qkey_mismatches);
        dobj.close();
    }
    if s.sa.mads > 0 {
        let sa = &s.sa;
        let out = o.key("sa");
        let mut so = Obj::new(out);
        for (k, v) in [
            ("mads", sa.mads),
            ("exchanges", sa.exchanges),
            ("queries", sa.queries),
            ("query_resends", sa.query_resends),
            ("unanswered", sa.unanswered),
            ("failed", sa.failed),
            ("records", sa.records),
            ("tid_low32", sa.tid_low32),
            ("repeats", sa.repeats),
            ("rmpp_control", sa.rmpp_control),
            ("served", sa.served),
            ("served_none", sa.served_none),
            ("reqs_following", sa.reqs_following),
            ("reqs_differing", sa.reqs_differing),
        ] {
            so.u64(k, v);
        }
        let out = so.key("served_no_connection");
        out.push(b'[');
        for (i, (_, json)) in sa.listed.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(json.as_bytes());
        }
        out.push(b']');
        so.u64("not_listed", sa.not_listed);
        so.close();
    }
    {
        let out = o.key("non_cm_kinds");
        let mut no = Obj::new(out);
        for (k, n) in s.non_cm_sorted() {
            no.u64_str_key(&k, n);
        }
        no.close();
    }
    o.u64("evicted", s.evicted);
    o.u64("peak_live_connections", s.peak_live);
    o.close();
    out.push(b'\n');
}

fn lat_text(l: &Latency) -> String {
    match (l.percentile(50.0), l.percentile(99.0), l.max()) {
        (Some(p50), Some(p99), Some(max)) => format!(
            "p50 {}  p99 {}  max {}  (n={})",
            human(p50),
            human(p99),
            human(max),
            l.count()
        ),
        _ => "-".to_string(),
    }
}

fn conn_block(out: &mut Vec<u8>, s: &ConnStats, pal: &Palette, indent: &str) {
    let _ = writeln!(out, "{indent}attempted        {:>8}", s.attempted);
    let _ = writeln!(out, "{indent}established      {:>8}", s.established);
    let rej = s.rejected_total();
    let _ = write!(out, "{indent}rejected         ");
    if rej > 0 {
        pal.paint(out, Role::Bad, &format!("{rej:>8}"));
    } else {
        let _ = write!(out, "{rej:>8}");
    }
    out.push(b'\n');
    for (reason, n) in &s.rejected {
        let _ = writeln!(
            out,
            "{indent}  reason {reason:>2} {:<28} {n:>8}",
            rej_name(*reason)
        );
    }
    let _ = write!(out, "{indent}timed out        ");
    if s.timed_out > 0 {
        pal.paint(out, Role::Bad, &format!("{:>8}", s.timed_out));
    } else {
        let _ = write!(out, "{:>8}", s.timed_out);
    }
    out.push(b'\n');
    if s.waiting > 0 {
        let _ = writeln!(out, "{indent}still waiting    {:>8}", s.waiting);
    }
    if s.partial > 0 {
        let _ = writeln!(out, "{indent}partial (no REQ) {:>8}", s.partial);
    }
    if s.xrc > 0 {
        let _ = writeln!(out, "{indent}XRC              {:>8}", s.xrc);
    }
    let _ = writeln!(out, "{indent}retransmissions  {:>8}", s.retransmissions);
    if s.duplicates > 0 {
        let _ = writeln!(out, "{indent}duplicate capts. {:>8}", s.duplicates);
    }
    let _ = writeln!(out, "{indent}MRAs             {:>8}", s.mras);
    let _ = writeln!(out, "{indent}REQ → RTU        {}", lat_text(&s.setup));
    let _ = writeln!(out, "{indent}DREQ → DREP      {}", lat_text(&s.teardown));
    for (what, n) in [("setups", s.slow_setups), ("teardowns", s.slow_teardowns)] {
        if n > 0 {
            let _ = write!(out, "{indent}");
            pal.paint(
                out,
                Role::Warn,
                &format!("slow {what:<10} {n:>8}  (over {})", human(SLOW)),
            );
            out.push(b'\n');
        }
    }
}

/// Appends the `--stats` text report.
pub(crate) fn stats_text(out: &mut Vec<u8>, s: &TraceStats, pal: &Palette) {
    pal.paint(out, Role::Head, "Capture");
    out.push(b'\n');
    let _ = writeln!(
        out,
        "  {} file(s), {} frames: {} CM MADs, {} non-CM, {} malformed, {} CM MADs with a bad ICRC",
        s.files, s.frames, s.cm, s.non_cm, s.malformed, s.bad_icrc
    );
    if s.skipped_bytes > 0 {
        let _ = writeln!(
            out,
            "  {} bytes skipped over damaged record headers (to the next plausible record header)",
            s.skipped_bytes
        );
    }
    if s.cut > 0 {
        let _ = writeln!(
            out,
            "  {} frames cut by the snaplen ({} CM MADs decoded as far as captured, no ICRC verdict)",
            s.cut, s.cm_cut
        );
    }
    if !s.messages.is_empty() {
        out.extend_from_slice(b"  CM messages:");
        for (attr, n) in &s.messages {
            let a = AttrId::from_raw(*attr);
            if a.is_known() {
                let _ = write!(out, " {} {n}", a.name());
            } else {
                let _ = write!(out, " {attr:#06x} {n}");
            }
        }
        out.push(b'\n');
    }
    let kinds = s.non_cm_sorted();
    if !kinds.is_empty() {
        out.extend_from_slice(b"  non-CM:");
        for (i, (k, n)) in kinds.iter().enumerate() {
            let _ = write!(out, "{} {n} {k}", if i == 0 { "" } else { "," });
        }
        out.push(b'\n');
    }
    out.push(b'\n');
    pal.paint(out, Role::Head, "Connections (by comm-ID pair)");
    out.push(b'\n');
    conn_block(out, &s.all, pal, "  ");
    if s.sidr.requests > 0 {
        let _ = writeln!(
            out,
            "  SIDR             {:>8} requests: {} resolved, {} failed, {} unanswered",
            s.sidr.requests, s.sidr.resolved, s.sidr.failed, s.sidr.unanswered
        );
    }
    if s.evicted > 0 {
        let _ = writeln!(
            out,
            "  evicted          {:>8} (connection table full; peak {} live)",
            s.evicted, s.peak_live
        );
    }
    let d = &s.data;
    if d.capture_has_rc {
        out.push(b'\n');
        pal.paint(
            out,
            Role::Head,
            "Data path (RC traffic on the connections' QPNs)",
        );
        out.push(b'\n');
        let mut rows = vec![
            ("connections with data", d.connections.to_string()),
            ("packets", d.packets.to_string()),
            ("bytes", d.bytes.to_string()),
            ("NAKs", format!("{} ({} RNR)", d.naks, d.rnr_naks)),
            ("retransmissions", d.retransmissions.to_string()),
            ("PSN gaps", d.psn_gaps.to_string()),
        ];
        if d.cnps + d.ecn_ce > 0 {
            rows.push(("CNPs", d.cnps.to_string()));
            rows.push(("ECN-CE marks", d.ecn_ce.to_string()));
        }
        if d.srq_packets > 0 {
            rows.push(("XRC reqs by SRQ number", d.srq_packets.to_string()));
        }
        for (label, v) in rows {
            let _ = writeln!(out, "  {label:<22}{v:>8}");
        }
        let _ = write!(out, "  established: {} data flowed, ", d.ok);
        if d.broken > 0 {
            pal.paint(
                out,
                Role::Bad,
                &format!("{} established but broken", d.broken),
            );
        } else {
            out.extend_from_slice(b"0 established but broken");
        }
        let _ = writeln!(out, ", {} no data", d.no_data);
    }
    if d.capture_has_ud && s.sidr.requests > 0 {
        out.push(b'\n');
        pal.paint(out, Role::Head, "UD on the QPs SIDR resolved");
        out.push(b'\n');
        let _ = writeln!(out, "  {:<22}{:>8}", "packets", d.ud_packets);
        let _ = writeln!(out, "  {:<22}{:>8}", "bytes", d.ud_bytes);
        let _ = write!(out, "  {:<22}", "with another Q_Key");
        let n = format!("{:>8}", d.qkey_mismatches);
        if d.qkey_mismatches > 0 {
            pal.paint(out, Role::Bad, &n);
        } else {
            out.extend_from_slice(n.as_bytes());
        }
        out.push(b'\n');
    }
    sa_block(out, s, pal);
    if !s.by_service.is_empty() {
        out.push(b'\n');
        pal.paint(out, Role::Head, "Per Service ID");
        out.push(b'\n');
        let _ = writeln!(
            out,
            "  {:<18}  {:<12} {:>9} {:>11} {:>8} {:>9} {:>7} {:>5}  {:>10}  {:>10}",
            "service ID",
            "rdma_cm",
            "attempted",
            "established",
            "rejected",
            "timed out",
            "retrans",
            "MRAs",
            "setup p50",
            "setup p99"
        );
        let row = |out: &mut Vec<u8>, name: String, ps: String, cs: &ConnStats| {
            let p = |q: f64| {
                cs.setup
                    .percentile(q)
                    .map_or_else(|| "-".to_string(), human)
            };
            let _ = writeln!(
                out,
                "  {:<18}  {:<12} {:>9} {:>11} {:>8} {:>9} {:>7} {:>5}  {:>10}  {:>10}",
                name,
                ps,
                cs.attempted,
                cs.established,
                cs.rejected_total(),
                cs.timed_out,
                cs.retransmissions,
                cs.mras,
                p(50.0),
                p(99.0)
            );
        };
        for (sid, cs) in &s.by_service {
            let ps = ServiceId(*sid)
                .rdma_cm_port()
                .map_or_else(String::new, |(ps, port)| format!("{}:{port}", ps.name()));
            row(out, ServiceId(*sid).to_string(), ps, cs);
        }
        if s.other_services.attempted + s.other_services.partial > 0 {
            row(out, "other".to_string(), String::new(), &s.other_services);
        }
    }
}

/// The "Subnet Administration" section of `--stats` (for captures with SA MADs).
fn sa_block(out: &mut Vec<u8>, s: &TraceStats, pal: &Palette) {
    let sa = &s.sa;
    if sa.mads == 0 {
        return;
    }
    out.push(b'\n');
    pal.paint(out, Role::Head, "Subnet Administration (PathRecords)");
    out.push(b'\n');
    let mut rows = vec![
        ("SA MADs", sa.mads.to_string(), Role::Head),
        (
            "PathRecord exchanges",
            format!(
                "{:>8}  ({} with their query, {} sent again)",
                sa.exchanges, sa.queries, sa.query_resends
            ),
            Role::Head,
        ),
        ("served a connection", sa.served.to_string(), Role::Head),
        ("served none", sa.served_none.to_string(), Role::Head),
        ("unanswered", sa.unanswered.to_string(), Role::Warn),
        ("failed", sa.failed.to_string(), Role::Bad),
        ("records", sa.records.to_string(), Role::Head),
        (
            "REQs following one",
            sa.reqs_following.to_string(),
            Role::Head,
        ),
        ("REQs disagreeing", sa.reqs_differing.to_string(), Role::Bad),
    ];
    if sa.tid_low32 > 0 {
        rows.push(("paired by TID 31-0", sa.tid_low32.to_string(), Role::Head));
    }
    if sa.repeats > 0 {
        rows.push(("repeated answers", sa.repeats.to_string(), Role::Head));
    }
    for (label, v, role) in rows {
        let _ = write!(out, "  {label:<22}");
        let v = if v.starts_with(' ') {
            v
        } else {
            format!("{v:>8}")
        };
        let flagged = role != Role::Head && !v.trim_start().starts_with('0');
        if flagged {
            pal.paint(out, role, &v);
        } else {
            out.extend_from_slice(v.as_bytes());
        }
        out.push(b'\n');
    }
    if !sa.listed.is_empty() {
        out.extend_from_slice(b"  served no connection:\n");
        for (line, _) in &sa.listed {
            let _ = writeln!(out, "    {line}");
        }
        if sa.not_listed > 0 {
            let _ = writeln!(out, "    … {} more", sa.not_listed);
        }
    }
}
