//! How the views show SA MADs and PathRecord exchanges.
//!
//! * Per MAD (text, `-V`, `--json`): every SA MAD is one line / block / JSON object, like a CM
//!   MAD: method, attribute, TID, status, a query's ComponentMask and the template fields it
//!   selects, an answer's PathRecords, the RMPP header of a segment.
//! * `--ladder`: the exchange a connection's REQ followed heads its ladder, as `SA` rows
//!   before the REQ (times before it are negative), and the REQ row says where the REQ
//!   disagrees with the record; exchanges that served no connection get a ladder of their
//!   own after the connections. `--ladder --json`: a connection's `sa` object, and one
//!   `sa_exchange` object per exchange that served none.
//!
//! ```text
//!          +time   frame  active                            passive
//!     -0.000188      32  SA Get PathRecord dgid fe80::2:c903:0:1895 sgid fe80::2:c902:24:f636 reversible 0 numb_path 1 pkey 0xffff
//!     -0.000141      33  SA GetResp 1 record: slid 4 dlid 2 sl 0 mtu 2048 rate 10 Gb/s pkt_life 18 pkey 0xffff reversible
//!     +0.000000      34  ─── REQ ─────────────────────────▶
//! ```

use std::io::Write;
use std::time::Duration;

use ibcm_mad::sa::{PathRecord, Selector};
use ibcm_mad::Rate;

use super::{
    attr_name, component_names, differs_names, method_name, min_ack_timeout, mtu_text,
    rmpp_type_name, status_name, Field, SaEvent, FIELDS, PATH_COMPONENTS,
};
use crate::conn::{Conn, Exchange, SaAnswer, SaLink, SaNote, SaQuery};
use crate::put::put_secs;
use crate::render::{human, put_wire_addr, Obj, JSON_SCHEMA_VERSION};
use crate::style::{Palette, Role};
use crate::timefmt::{json_time, put_time, TimeFormat, TimeRef};
use crate::verbose::{field, private, transport_line};

/// How a value is written: `name=value` (per-MAD text) or `name value` (ladder).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Eq,
    Space,
}

fn selector(s: Selector) -> &'static str {
    match s {
        Selector::GreaterThan => "greater than",
        Selector::LessThan => "less than",
        Selector::Exactly => "exactly",
        Selector::Largest => "largest available",
    }
}

fn rate_text(r: Rate, style: Style) -> String {
    let name = if r.is_known() {
        r.name().to_string()
    } else {
        format!("code {}", r.raw())
    };
    match style {
        Style::Space => name,
        Style::Eq => name.replace(' ', ""),
    }
}

/// The value of the component with JSON name `key` in `rec`, as text.
fn value(rec: &PathRecord, key: &str, style: Style) -> String {
    match key {
        "service_id" => format!("{:#018x}", rec.service_id),
        "dgid" => rec.dgid.to_string(),
        "sgid" => rec.sgid.to_string(),
        "dlid" => rec.dlid.0.to_string(),
        "slid" => rec.slid.0.to_string(),
        "raw_traffic" => u8::from(rec.raw_traffic).to_string(),
        "flow_label" => format!("{:#07x}", rec.flow_label.get()),
        "hop_limit" => rec.hop_limit.to_string(),
        "traffic_class" => format!("{:#04x}", rec.traffic_class),
        "reversible" => u8::from(rec.reversible).to_string(),
        "numb_path" => rec.numb_path.to_string(),
        "pkey" => rec.pkey.to_string(),
        "qos_class" => rec.qos_class.to_string(),
        "sl" => rec.sl.get().to_string(),
        "mtu_selector" => rec.mtu_selector.raw().to_string(),
        "mtu" => mtu_text(rec.mtu),
        "rate_selector" => rec.rate_selector.raw().to_string(),
        "rate" => rate_text(rec.rate, style),
        "packet_life_time_selector" => rec.packet_life_time_selector.raw().to_string(),
        "packet_life_time" => rec.packet_life_time.to_string(),
        "preference" => rec.preference.to_string(),
        _ => String::new(),
    }
}

fn sep(style: Style) -> char {
    match style {
        Style::Eq => '=',
        Style::Space => ' ',
    }
}

/// ` dgid=… sgid=… pkey=0xffff`: the template fields a query's ComponentMask selects.
fn put_template(out: &mut Vec<u8>, rec: &PathRecord, mask: u64, style: Style) {
    for (bit, key, short) in PATH_COMPONENTS {
        if mask & bit != 0 {
            let _ = write!(out, " {short}{}{}", sep(style), value(rec, key, style));
        }
    }
}

/// ` slid=4 dlid=2 sl=0 mtu=2048 rate=10Gb/s pkt_life=18 pkey=0xffff`, then `hop_limit` when
/// not 0 and `reversible` when set.
fn put_record(out: &mut Vec<u8>, rec: &PathRecord, style: Style) {
    let s = sep(style);
    let _ = write!(
        out,
        " slid{s}{} dlid{s}{} sl{s}{} mtu{s}{} rate{s}{} pkt_life{s}{} pkey{s}{}",
        rec.slid.0,
        rec.dlid.0,
        rec.sl.get(),
        mtu_text(rec.mtu),
        rate_text(rec.rate, style),
        rec.packet_life_time,
        rec.pkey
    );
    if rec.hop_limit != 0 {
        let _ = write!(out, " hop_limit{s}{}", rec.hop_limit);
    }
    if rec.reversible {
        out.extend_from_slice(b" reversible");
    }
}

fn records_word(n: usize) -> &'static str {
    if n == 1 {
        "record"
    } else {
        "records"
    }
}

/// The one-line summary of an SA MAD (after the addresses in the text view and `-V`).
pub(crate) fn summary(out: &mut Vec<u8>, ev: &SaEvent, pal: &Palette) {
    let h = &ev.mad.header;
    pal.paint(out, Role::Other, "SA");
    let _ = write!(
        out,
        " {} {} tid={}",
        method_name(h.method),
        attr_name(h.attr_id),
        h.tid
    );
    if ev.is_response() {
        let _ = write!(out, " status={:#06x} (", h.status);
        if h.status == 0 {
            out.extend_from_slice(b"success");
        } else {
            pal.paint(out, Role::Bad, status_name(h.status));
        }
        out.push(b')');
    }
    let r = &ev.mad.rmpp;
    if r.is_active() {
        let _ = write!(out, " rmpp={}", rmpp_type_name(r.rmpp_type));
        match ev.rmpp_data() {
            Some((seg, first, last)) => {
                let _ = write!(out, " seg={seg}");
                if first {
                    out.extend_from_slice(b" first");
                }
                if last {
                    out.extend_from_slice(b" last");
                }
                let _ = write!(out, " paylen={}", r.data2);
            }
            None => {
                let _ = write!(out, " seg={} window={}", r.data1, r.data2);
            }
        }
    }
    if !ev.is_path() {
        if !ev.is_response() && ev.mad.comp_mask != 0 {
            let _ = write!(out, " comp={:#x}", ev.mad.comp_mask);
        }
        return;
    }
    if ev.is_query() {
        let _ = write!(out, " comp={:#x}", ev.mad.comp_mask);
        put_template(out, &ev.template(), ev.mad.comp_mask, Style::Eq);
        return;
    }
    if !ev.is_answer() || h.status != 0 {
        return;
    }
    if ev.rmpp_active() && ev.rmpp_data().is_some_and(|(_, f, l)| !(f && l)) {
        // A segment of a longer table: its records are put together in `--ladder`.
        return;
    }
    let recs = ev.records();
    let _ = write!(out, " {} {}", recs.len(), records_word(recs.len()));
    for (i, rec) in recs.iter().take(4).enumerate() {
        out.extend_from_slice(if i == 0 { b":" } else { b";" });
        put_record(out, rec, Style::Eq);
    }
    if recs.len() > 4 {
        out.extend_from_slice(" …".as_bytes());
    }
}

/// Appends the one-line text view of an SA MAD (the CM line's columns).
///
/// ```text
///     33   249.575266  LID 1 → LID 4  SA GetResp PathRecord tid=0x0000000bb9647f9e status=0x0000 (success) 1 record: slid=4 dlid=2 sl=0 mtu=2048 rate=10Gb/s pkt_life=18 pkey=0xffff reversible  icrc=ok
/// ```
pub(crate) fn text_line(
    out: &mut Vec<u8>,
    ev: &SaEvent,
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
    summary(out, ev, pal);
    out.extend_from_slice(b"  icrc=");
    match ev.icrc {
        crate::trace::Icrc::Bad => pal.paint(out, Role::Bad, "bad"),
        other => out.extend_from_slice(other.as_str().as_bytes()),
    }
    out.push(b'\n');
}

fn verbose_record(out: &mut Vec<u8>, rec: &PathRecord, mask: Option<u64>) {
    let row = |out: &mut Vec<u8>, bit: u64, name: &str, v: String| {
        let mark = match mask {
            Some(m) if m & bit != 0 => "  * ",
            _ => "    ",
        };
        let _ = writeln!(out, "{mark}{name:<34} {v}");
    };
    row(out, 0b11, "ServiceID", format!("{:#018x}", rec.service_id));
    row(out, 1 << 2, "DGID", rec.dgid.to_string());
    row(out, 1 << 3, "SGID", rec.sgid.to_string());
    row(out, 1 << 4, "DLID", rec.dlid.0.to_string());
    row(out, 1 << 5, "SLID", rec.slid.0.to_string());
    row(
        out,
        1 << 6,
        "RawTraffic",
        u8::from(rec.raw_traffic).to_string(),
    );
    row(
        out,
        1 << 8,
        "FlowLabel",
        format!("{:#07x}", rec.flow_label.get()),
    );
    row(out, 1 << 9, "HopLimit", rec.hop_limit.to_string());
    row(
        out,
        1 << 10,
        "TClass",
        format!("{:#04x}", rec.traffic_class),
    );
    row(
        out,
        1 << 11,
        "Reversible",
        u8::from(rec.reversible).to_string(),
    );
    row(out, 1 << 12, "NumbPath", rec.numb_path.to_string());
    row(out, 1 << 13, "P_Key", rec.pkey.to_string());
    row(out, 1 << 14, "QoSClass", rec.qos_class.to_string());
    row(out, 1 << 15, "SL", rec.sl.get().to_string());
    row(
        out,
        1 << 16,
        "MTUSelector",
        format!(
            "{} ({})",
            rec.mtu_selector.raw(),
            selector(rec.mtu_selector)
        ),
    );
    row(
        out,
        1 << 17,
        "MTU",
        format!("{} ({} bytes)", rec.mtu.raw(), mtu_text(rec.mtu)),
    );
    row(
        out,
        1 << 18,
        "RateSelector",
        format!(
            "{} ({})",
            rec.rate_selector.raw(),
            selector(rec.rate_selector)
        ),
    );
    row(
        out,
        1 << 19,
        "Rate",
        format!("{} ({})", rec.rate.raw(), rate_text(rec.rate, Style::Space)),
    );
    row(
        out,
        1 << 20,
        "PacketLifeTimeSelector",
        format!(
            "{} ({})",
            rec.packet_life_time_selector.raw(),
            selector(rec.packet_life_time_selector)
        ),
    );
    let plt = ibcm_mad::TimeoutExp::masked(rec.packet_life_time);
    row(
        out,
        1 << 21,
        "PacketLifeTime",
        format!(
            "{} (4.096 µs × 2^{} = {})",
            rec.packet_life_time,
            plt.get(),
            human(plt.to_duration())
        ),
    );
    row(out, 1 << 22, "Preference", rec.preference.to_string());
}

/// Appends the `-V` view of one SA MAD.
pub(crate) fn verbose(
    out: &mut Vec<u8>,
    ev: &SaEvent,
    (time, when): (TimeFormat, TimeRef),
    pal: &Palette,
) {
    pal.start(out, Role::Head);
    let _ = write!(out, "Frame {}", ev.frame);
    pal.end(out, Role::Head);
    out.extend_from_slice(b"  ");
    put_time(out, time, ev.time, &when, 1);
    out.extend_from_slice(match time {
        TimeFormat::Absolute | TimeFormat::AbsoluteDate => b" UTC  ",
        _ => b" s  ",
    });
    let _ = write!(out, "{}  ", ev.encap);
    put_wire_addr(out, &ev.src);
    out.extend_from_slice(" → ".as_bytes());
    put_wire_addr(out, &ev.dst);
    out.extend_from_slice(b"  ");
    summary(out, ev, pal);
    out.push(b'\n');
    transport_line(out, &ev.wire, ev.icrc, pal);
    let m = &ev.mad;
    let h = &m.header;
    let _ = writeln!(
        out,
        "  MAD: BaseVersion {} MgmtClass {:#04x} ({}) ClassVersion {} Method {:#04x} ({}) Status {:#06x} ({}) ClassSpecific {:#06x}",
        h.base_version,
        h.mgmt_class.raw(),
        h.mgmt_class.name(),
        h.class_version,
        h.method.raw(),
        method_name(h.method),
        h.status,
        status_name(h.status),
        h.class_specific
    );
    let _ = writeln!(
        out,
        "       TransactionID {} AttributeID {:#06x} ({}) AttributeModifier {:#010x}",
        h.tid,
        h.attr_id.raw(),
        attr_name(h.attr_id),
        h.attr_mod
    );
    let r = &m.rmpp;
    if r.is_active() || r.version != 0 {
        let mut flags = Vec::new();
        for (bit, name) in [(1u8, "active"), (2, "first"), (4, "last")] {
            if r.flags & bit != 0 {
                flags.push(name);
            }
        }
        let (d1, d2) = match r.rmpp_type {
            1 => ("SegmentNumber", "PayloadLength"),
            2 => ("SegmentNumber", "NewWindowLast"),
            _ => ("Data1", "Data2"),
        };
        let _ = writeln!(
            out,
            "  RMPP: Version {} Type {} ({}) RRespTime {} Flags {:#x} ({}) Status {} {d1} {} {d2} {}",
            r.version,
            r.rmpp_type,
            rmpp_type_name(r.rmpp_type),
            r.resp_time,
            r.flags,
            flags.join(" "),
            r.status,
            r.data1,
            r.data2
        );
    } else {
        out.extend_from_slice(b"  RMPP: not in use\n");
    }
    let _ = write!(
        out,
        "  SA: SM_Key {:#018x} AttributeOffset {} ComponentMask {:#018x}",
        m.sm_key, m.attr_offset, m.comp_mask
    );
    if ev.is_path() && m.comp_mask != 0 {
        let names: Vec<&str> = component_names(m.comp_mask).collect();
        let _ = write!(out, " ({})", names.join(" "));
    }
    out.push(b'\n');
    if !ev.is_path() {
        private(out, "SA data", &m.data);
    } else if ev.is_query() {
        out.extend_from_slice(
            b"  PathRecord (the query's template; * = selected by the ComponentMask)\n",
        );
        verbose_record(out, &ev.template(), Some(m.comp_mask));
    } else if ev.is_answer() && h.status == 0 {
        if ev.rmpp_active() && ev.rmpp_data().is_some_and(|(_, f, l)| !(f && l)) {
            field(
                out,
                "SA data",
                format_args!(
                    "a segment of a table in several MADs (its PathRecords: --ladder and --json of the whole exchange)"
                ),
            );
            private(out, "Segment data", &m.data);
        } else {
            let recs = ev.records();
            if recs.is_empty() {
                out.extend_from_slice(b"  no PathRecord\n");
            }
            for (i, rec) in recs.iter().enumerate() {
                let _ = writeln!(out, "  PathRecord {} of {}", i + 1, recs.len());
                verbose_record(out, rec, None);
            }
        }
    } else {
        private(out, "SA data", &m.data);
    }
    out.push(b'\n');
}

/// One member of a PathRecord object, by its JSON key (`mtu` in bytes, `mtu_code` for a
/// reserved code; `rate` with its `rate_name`).
fn member(o: &mut Obj<'_>, rec: &PathRecord, key: &str) {
    match key {
        "service_id" => o.hex64(key, rec.service_id),
        "dgid" => o.str(key, &rec.dgid.to_string()),
        "sgid" => o.str(key, &rec.sgid.to_string()),
        "dlid" => o.u64(key, u64::from(rec.dlid.0)),
        "slid" => o.u64(key, u64::from(rec.slid.0)),
        "raw_traffic" => o.bool(key, rec.raw_traffic),
        "flow_label" => o.u64(key, u64::from(rec.flow_label.get())),
        "hop_limit" => o.u64(key, u64::from(rec.hop_limit)),
        "traffic_class" => o.u64(key, u64::from(rec.traffic_class)),
        "reversible" => o.bool(key, rec.reversible),
        "numb_path" => o.u64(key, u64::from(rec.numb_path)),
        "pkey" => o.u64(key, u64::from(rec.pkey.0)),
        "qos_class" => o.u64(key, u64::from(rec.qos_class)),
        "sl" => o.u64(key, u64::from(rec.sl.get())),
        "mtu_selector" => o.u64(key, u64::from(rec.mtu_selector.raw())),
        "mtu" => match rec.mtu.bytes() {
            Some(b) => o.u64("mtu", u64::from(b)),
            None => o.u64("mtu_code", u64::from(rec.mtu.raw())),
        },
        "rate_selector" => o.u64(key, u64::from(rec.rate_selector.raw())),
        "rate" => {
            o.u64(key, u64::from(rec.rate.raw()));
            o.name("rate_name", rec.rate.name());
        }
        "packet_life_time_selector" => {
            o.u64(key, u64::from(rec.packet_life_time_selector.raw()));
        }
        "packet_life_time" => o.u64(key, u64::from(rec.packet_life_time)),
        "preference" => o.u64(key, u64::from(rec.preference)),
        _ => {}
    }
}

/// A PathRecord as a JSON object: every field, keys as [`PATH_COMPONENTS`] names them.
fn record_obj(out: &mut Vec<u8>, rec: &PathRecord) {
    let mut o = Obj::new(out);
    for (_, key, _) in PATH_COMPONENTS {
        member(&mut o, rec, key);
    }
    o.close();
}

/// `"components":[…]` and `"template":{…}` with the fields the mask selects.
fn template_members(o: &mut Obj<'_>, rec: &PathRecord, mask: u64) {
    let out = o.key("components");
    out.push(b'[');
    for (i, n) in component_names(mask).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = write!(out, "\"{n}\"");
    }
    out.push(b']');
    let out = o.key("template");
    let mut t = Obj::new(out);
    for (bit, key, _) in PATH_COMPONENTS {
        if mask & bit != 0 {
            member(&mut t, rec, key);
        }
    }
    t.close();
}

/// Appends one JSON line for an SA MAD (`"msg":"SA"`; the keys in `crate::render`'s
/// schema).
pub(crate) fn json_line(
    out: &mut Vec<u8>,
    ev: &SaEvent,
    file: Option<&str>,
    (time, when): (Option<TimeFormat>, TimeRef),
) {
    let mut o = Obj::new(out);
    o.u64("v", u64::from(JSON_SCHEMA_VERSION));
    if let Some(f) = file {
        o.str("file", f);
    }
    o.u64("frame", ev.frame);
    crate::timefmt::put_epoch(o.key("time"), ev.time);
    if let Some(f) = time {
        json_time(o.raw_members(), f, ev.time, &when);
    }
    let m = &ev.mad;
    let h = &m.header;
    o.name("msg", "SA");
    o.name("method", method_name(h.method));
    o.u64("method_id", u64::from(h.method.raw()));
    o.name("attr", attr_name(h.attr_id));
    o.u64("attr_id", u64::from(h.attr_id.raw()));
    o.hex64("tid", h.tid.0);
    o.u64("status", u64::from(h.status));
    o.name("status_name", status_name(h.status));
    o.hex64("sm_key", m.sm_key);
    o.u64("attr_offset", u64::from(m.attr_offset));
    o.hex64("comp_mask", m.comp_mask);
    if m.rmpp.is_active() || m.rmpp.version != 0 {
        let out = o.key("rmpp");
        let mut r = Obj::new(out);
        r.u64("version", u64::from(m.rmpp.version));
        r.name("type", rmpp_type_name(m.rmpp.rmpp_type));
        r.u64("type_id", u64::from(m.rmpp.rmpp_type));
        r.u64("resp_time", u64::from(m.rmpp.resp_time));
        r.u64("flags", u64::from(m.rmpp.flags));
        r.u64("status", u64::from(m.rmpp.status));
        r.u64("data1", u64::from(m.rmpp.data1));
        r.u64("data2", u64::from(m.rmpp.data2));
        r.close();
    }
    if ev.is_path() && ev.is_query() {
        template_members(&mut o, &ev.template(), m.comp_mask);
    }
    if ev.is_path() && ev.is_answer() {
        let recs = ev.records();
        let out = o.key("records");
        out.push(b'[');
        for (i, rec) in recs.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            record_obj(out, rec);
        }
        out.push(b']');
    }
    o.name("icrc", ev.icrc.as_str());
    o.wire_addr("src", &ev.src);
    o.wire_addr("dst", &ev.dst);
    o.name("encap", ev.encap.name());
    o.close();
    out.push(b'\n');
}

// ---- A REQ's paths in the per-MAD views ----

/// ` [path: SA GetResp frame 33]` after a REQ in the text view, or where it disagrees.
pub(crate) fn req_tag(out: &mut Vec<u8>, note: &SaNote, pal: &Palette) {
    for (what, link) in [
        ("path", note.primary()),
        ("alternate path", note.alternate()),
    ] {
        let Some((frame, differs)) = link else {
            continue;
        };
        out.push(b' ');
        if differs == 0 {
            let _ = write!(out, "[{what}: SA frame {frame}]");
        } else {
            let names: Vec<&str> = differs_names(differs).collect();
            pal.paint(
                out,
                Role::Bad,
                &format!(
                    "[{what} differs from SA frame {frame}: {}]",
                    names.join(", ")
                ),
            );
        }
    }
}

/// The `-V` line of a REQ whose paths follow SA answers.
pub(crate) fn req_verbose(out: &mut Vec<u8>, note: &SaNote, pal: &Palette) {
    for (what, link) in [("primary", note.primary()), ("alternate", note.alternate())] {
        let Some((frame, differs)) = link else {
            continue;
        };
        let _ = write!(
            out,
            "  Path from the SA: the {what} path follows the PathRecord answered in frame {frame}"
        );
        if differs != 0 {
            let names: Vec<&str> = differs_names(differs).collect();
            out.extend_from_slice(b"; ");
            pal.paint(
                out,
                Role::Bad,
                &format!("the REQ disagrees with it in {}", names.join(", ")),
            );
        }
        out.push(b'\n');
    }
}

/// The `sa_path` / `sa_alternate_path` keys of a REQ's JSON line (`,"key":{…}`).
pub(crate) fn req_json(out: &mut Vec<u8>, note: &SaNote) {
    for (key, link) in [
        (&b",\"sa_path\":"[..], note.primary()),
        (&b",\"sa_alternate_path\":"[..], note.alternate()),
    ] {
        let Some((frame, differs)) = link else {
            continue;
        };
        out.extend_from_slice(key);
        let mut o = Obj::new(out);
        o.u64("frame", frame);
        let d = o.key("differs");
        d.push(b'[');
        for (i, n) in differs_names(differs).enumerate() {
            if i > 0 {
                d.push(b',');
            }
            let _ = write!(d, "\"{n}\"");
        }
        d.push(b']');
        o.close();
    }
}

// ---- The ladder ----

/// The time of `t` relative to `first` in the ladder's `+time` column (`-` before it).
fn put_rel(out: &mut Vec<u8>, t: Duration, first: Duration, digits: usize) {
    match first.checked_sub(t).filter(|d| !d.is_zero()) {
        Some(before) => {
            out.extend_from_slice(b"    -");
            put_secs(out, before, digits);
        }
        None => {
            out.extend_from_slice(b"    +");
            put_secs(out, t.saturating_sub(first), digits);
        }
    }
}

/// The capture times of a connection's SA rows (for the width of the time column).
pub(crate) fn conn_times(c: &Conn) -> Vec<Duration> {
    let mut v = Vec::new();
    for l in links(c) {
        if let Some(q) = l.query {
            v.push(q.time);
        }
        v.push(l.answer.time);
    }
    v
}

fn links(c: &Conn) -> Vec<SaLink> {
    c.sa.as_deref()
        .map(|s| [s.primary, s.alternate].into_iter().flatten().collect())
        .unwrap_or_default()
}

fn query_row(
    out: &mut Vec<u8>,
    pal: &Palette,
    q: &SaQuery,
    first: Duration,
    digits: usize,
    tid_low: bool,
) {
    pal.start(out, Role::Dim);
    put_rel(out, q.time, first, digits);
    let _ = write!(out, " {:>7}", q.frame);
    pal.end(out, Role::Dim);
    out.extend_from_slice(b"  ");
    pal.paint(out, Role::Other, "SA");
    let _ = write!(out, " {} PathRecord", method_name(q.method));
    put_template(out, &q.template, q.comp_mask, Style::Space);
    if q.sends > 1 {
        out.extend_from_slice(b"  ");
        pal.paint(out, Role::Warn, &format!("sent {} times", q.sends));
    }
    if tid_low {
        out.extend_from_slice(b"  (answer paired by TID bits 31-0)");
    }
    out.push(b'\n');
}

fn answer_row(
    out: &mut Vec<u8>,
    pal: &Palette,
    a: &SaAnswer,
    first: Duration,
    digits: usize,
    what: &str,
) {
    pal.start(out, Role::Dim);
    put_rel(out, a.time, first, digits);
    let _ = write!(out, " {:>7}", a.frame);
    pal.end(out, Role::Dim);
    out.extend_from_slice(b"  ");
    pal.paint(out, Role::Other, "SA");
    let _ = write!(out, " {}", method_name(a.method));
    if a.status != 0 {
        out.push(b' ');
        pal.paint(
            out,
            Role::Bad,
            &format!("status {:#06x} ({})", a.status, status_name(a.status)),
        );
    } else {
        let n = usize::try_from(a.records).unwrap_or(usize::MAX);
        let _ = write!(out, " {n} {}", records_word(n));
    }
    out.extend_from_slice(what.as_bytes());
    if a.segments > 0 {
        let _ = write!(out, "  (RMPP, {} segment(s))", a.segments);
    }
    if a.partial {
        out.extend_from_slice(b"  ");
        pal.paint(
            out,
            Role::Warn,
            "partial: the RMPP transfer did not complete",
        );
    }
    out.push(b'\n');
}

/// The SA rows at the head of a connection's ladder: the query and answer of each exchange
/// its REQ's paths follow.
pub(crate) fn ladder_rows(out: &mut Vec<u8>, pal: &Palette, c: &Conn, digits: usize) {
    let Some(s) = c.sa.as_deref() else {
        return;
    };
    let same = matches!((s.primary, s.alternate), (Some(p), Some(a)) if p.exchange == a.exchange);
    let mut shown: Vec<(SaLink, String)> = Vec::new();
    if same {
        if let (Some(p), Some(a)) = (s.primary, s.alternate) {
            let mut what = format!(": record {} → primary path", p.index + 1);
            put_record_text(&mut what, &p.record);
            what.push_str(&format!("; record {} → alternate path", a.index + 1));
            put_record_text(&mut what, &a.record);
            shown.push((p, what));
        }
    } else {
        for (role, link) in [("", s.primary), (" (alternate path)", s.alternate)] {
            let Some(l) = link else { continue };
            let mut what = String::new();
            if l.answer.records > 1 {
                what.push_str(&format!(
                    ": record {} of {}{role}:",
                    l.index + 1,
                    l.answer.records
                ));
            } else {
                what.push_str(role);
                what.push(':');
            }
            put_record_text(&mut what, &l.record);
            shown.push((l, what));
        }
    }
    // In time order (an alternate path's exchange may come first).
    shown.sort_by_key(|(l, _)| l.query.map_or(l.answer.time, |q| q.time));
    for (l, what) in shown {
        if let Some(q) = &l.query {
            query_row(out, pal, q, c.first, digits, l.tid_low);
        }
        answer_row(out, pal, &l.answer, c.first, digits, &what);
    }
}

fn put_record_text(s: &mut String, rec: &PathRecord) {
    let mut b = Vec::new();
    put_record(&mut b, rec, Style::Space);
    s.push_str(&String::from_utf8_lossy(&b));
}

/// How the REQ path disagrees with its record, field by field: `sl 3 (record 0), mtu 1024
/// (record 2048)`.
pub(crate) fn differs_text(l: &SaLink) -> String {
    let p = &l.path;
    let r = &l.record;
    let mut parts = Vec::new();
    for f in FIELDS {
        if l.differs & f.bit() == 0 {
            continue;
        }
        parts.push(match f {
            Field::Sl => format!("sl {} (record {})", p.sl.get(), r.sl.get()),
            Field::Mtu => format!(
                "mtu {} (record {})",
                l.wide.map_or_else(String::new, |w| mtu_text(w.mtu)),
                mtu_text(r.mtu)
            ),
            Field::Pkey => format!(
                "P_Key {} (record {})",
                l.wide.map_or_else(String::new, |w| w.pkey.to_string()),
                r.pkey
            ),
            Field::AckTimeout => format!(
                "local ACK timeout {} (record pkt_life {}: at least {})",
                p.local_ack_timeout.get(),
                r.packet_life_time,
                min_ack_timeout(r.packet_life_time)
            ),
            Field::Rate => format!(
                "rate {} (record {})",
                rate_text(p.packet_rate, Style::Space),
                rate_text(r.rate, Style::Space)
            ),
            Field::FlowLabel => format!(
                "flow label {:#07x} (record {:#07x})",
                p.flow_label.get(),
                r.flow_label.get()
            ),
            Field::TrafficClass => format!(
                "traffic class {:#04x} (record {:#04x})",
                p.traffic_class, r.traffic_class
            ),
            Field::HopLimit => format!("hop limit {} (record {})", p.hop_limit, r.hop_limit),
        });
    }
    parts.join(", ")
}

/// The REQ row's note: where the REQ disagrees with the records it follows.
pub(crate) fn req_row_note(out: &mut Vec<u8>, pal: &Palette, c: &Conn) {
    let Some(s) = c.sa.as_deref() else {
        return;
    };
    for (what, link) in [("path", s.primary), ("alternate path", s.alternate)] {
        if let Some(l) = link.filter(|l| l.differs != 0) {
            out.extend_from_slice(b"  ");
            pal.paint(
                out,
                Role::Bad,
                &format!("{what} differs from SA record: {}", differs_text(&l)),
            );
        }
    }
}

/// The result line's part for a REQ that disagrees with its records.
pub(crate) fn result_part(c: &Conn) -> Option<String> {
    let s = c.sa.as_deref()?;
    let mut bits = 0;
    for l in [s.primary, s.alternate].into_iter().flatten() {
        bits |= l.differs;
    }
    (bits != 0).then(|| {
        let names: Vec<&str> = differs_names(bits).collect();
        format!(
            "REQ disagrees with its SA PathRecord ({})",
            names.join(", ")
        )
    })
}

fn query_obj(o: &mut Obj<'_>, q: &SaQuery, first: Option<Duration>) {
    let out = o.key("query");
    let mut qo = Obj::new(out);
    qo.u64("frame", q.frame);
    match first {
        Some(f) => qo.f64("t", signed_secs(q.time, f)),
        None => qo.f64("time", q.time.as_secs_f64()),
    }
    qo.name("method", method_name(q.method));
    qo.hex64("comp_mask", q.comp_mask);
    template_members(&mut qo, &q.template, q.comp_mask);
    qo.u64("sends", u64::from(q.sends));
    qo.wire_addr("src", &q.src);
    qo.wire_addr("dst", &q.dst);
    qo.close();
}

fn answer_obj(o: &mut Obj<'_>, a: &SaAnswer, first: Option<Duration>) {
    let out = o.key("answer");
    let mut ao = Obj::new(out);
    ao.u64("frame", a.frame);
    match first {
        Some(f) => ao.f64("t", signed_secs(a.time, f)),
        None => ao.f64("time", a.time.as_secs_f64()),
    }
    ao.name("method", method_name(a.method));
    ao.u64("status", u64::from(a.status));
    ao.name("status_name", status_name(a.status));
    ao.u64("records", u64::from(a.records));
    ao.u64("segments", u64::from(a.segments));
    ao.bool("partial", a.partial);
    ao.close();
}

/// `t - first` in seconds, negative before `first`.
fn signed_secs(t: Duration, first: Duration) -> f64 {
    match first.checked_sub(t) {
        Some(before) => -before.as_secs_f64(),
        None => t.saturating_sub(first).as_secs_f64(),
    }
}

fn link_obj(out: &mut Vec<u8>, l: &SaLink, first: Duration) {
    let mut o = Obj::new(out);
    o.u64("exchange", l.exchange);
    o.hex64("tid", l.tid);
    o.name("tid_match", if l.tid_low { "low32" } else { "full" });
    if let Some(q) = &l.query {
        query_obj(&mut o, q, Some(first));
    }
    answer_obj(&mut o, &l.answer, Some(first));
    o.u64("record_index", u64::from(l.index));
    record_obj(o.key("record"), &l.record);
    let out = o.key("differs");
    out.push(b'[');
    let mut n = 0;
    for f in FIELDS {
        if l.differs & f.bit() == 0 {
            continue;
        }
        if n > 0 {
            out.push(b',');
        }
        n += 1;
        let (req, rec): (u64, u64) = match f {
            Field::Sl => (l.path.sl.get().into(), l.record.sl.get().into()),
            Field::Mtu => (
                l.wide.and_then(|w| w.mtu.bytes()).map_or(0, u64::from),
                l.record.mtu.bytes().map_or(0, u64::from),
            ),
            Field::Pkey => (
                l.wide.map_or(0, |w| u64::from(w.pkey.0)),
                u64::from(l.record.pkey.0),
            ),
            Field::AckTimeout => (
                l.path.local_ack_timeout.get().into(),
                l.record.packet_life_time.into(),
            ),
            Field::Rate => (l.path.packet_rate.raw().into(), l.record.rate.raw().into()),
            Field::FlowLabel => (
                l.path.flow_label.get().into(),
                l.record.flow_label.get().into(),
            ),
            Field::TrafficClass => (l.path.traffic_class.into(), l.record.traffic_class.into()),
            Field::HopLimit => (l.path.hop_limit.into(), l.record.hop_limit.into()),
        };
        let mut d = Obj::new(out);
        d.name("field", f.name());
        d.u64("req", req);
        if f == Field::AckTimeout {
            d.u64("record_packet_life_time", rec);
            d.u64("min", u64::from(min_ack_timeout(l.record.packet_life_time)));
        } else {
            d.u64("record", rec);
        }
        d.close();
    }
    out.push(b']');
    o.close();
}

/// The `sa` member of a connection's `--ladder --json` object (only for a connection whose
/// REQ follows SA answers): `primary` and `alternate`, each `{exchange, tid, tid_match,
/// query?, answer, record_index, record, differs}` with times `t` relative to the
/// connection's first message.
pub(crate) fn conn_json(o: &mut Obj<'_>, c: &Conn) {
    let Some(s) = c.sa.as_deref() else {
        return;
    };
    let out = o.key("sa");
    let mut so = Obj::new(out);
    if let Some(l) = &s.primary {
        link_obj(so.key("primary"), l, c.first);
    }
    if let Some(l) = &s.alternate {
        link_obj(so.key("alternate"), l, c.first);
    }
    so.close();
}

/// What became of an exchange that served no connection (its ladder's result line).
pub(crate) fn exchange_outcome(x: &Exchange) -> (Role, String) {
    match x.answer {
        None => (
            Role::Warn,
            "unanswered: no answer in the capture".to_string(),
        ),
        Some(a) if a.status != 0 => (
            Role::Bad,
            format!(
                "failed: status {:#06x} ({})",
                a.status,
                status_name(a.status)
            ),
        ),
        Some(a) => (
            Role::Setup,
            format!(
                "answered ({} {}), served no connection: no REQ in the capture follows {}",
                a.records,
                records_word(usize::try_from(a.records).unwrap_or(0)),
                if a.records == 1 {
                    "this path"
                } else {
                    "these paths"
                }
            ),
        ),
    }
}

/// The ladder of a PathRecord exchange that served no connection (after the connections).
pub(crate) fn exchange_ladder(out: &mut Vec<u8>, pal: &Palette, x: &Exchange) {
    let first = x.first_time();
    pal.start(out, Role::Head);
    let _ = write!(out, "SA exchange {}", x.id);
    pal.end(out, Role::Head);
    let _ = writeln!(out, "  PathRecord  tid {:#018x}", x.tid);
    let last = x
        .answer
        .map_or(Duration::ZERO, |a| a.time.saturating_sub(first));
    let digits = last
        .as_secs()
        .checked_ilog10()
        .map_or(1, |d| d as usize + 1);
    pal.start(out, Role::Dim);
    let _ = writeln!(out, "{:>time$} {:>7}", "+time", "frame", time = 12 + digits);
    pal.end(out, Role::Dim);
    if let Some(q) = &x.query {
        query_row(out, pal, q, first, digits, x.tid_low);
    }
    if let Some(a) = &x.answer {
        let mut what = String::new();
        for (i, rec) in x.records.iter().take(8).enumerate() {
            what.push_str(if i == 0 { ":" } else { ";" });
            put_record_text(&mut what, rec);
        }
        if x.records.len() > 8 {
            what.push_str(" …");
        }
        answer_row(out, pal, a, first, digits, &what);
    }
    if x.repeats > 0 {
        let _ = writeln!(out, "  {} repeated answer(s)", x.repeats);
    }
    out.extend_from_slice(b"  result: ");
    let (role, text) = exchange_outcome(x);
    pal.paint(out, role, &text);
    out.extend_from_slice(b"\n\n");
}

/// One `--ladder --json` line for a PathRecord exchange that served no connection:
/// `{v, file?, sa_exchange, tid, tid_match, first, query?, answer?, records, served,
/// repeats}` (capture times in seconds since the epoch).
pub(crate) fn exchange_json(out: &mut Vec<u8>, x: &Exchange, file: Option<&str>) {
    let mut o = Obj::new(out);
    o.u64("v", u64::from(JSON_SCHEMA_VERSION));
    if let Some(f) = file {
        o.str("file", f);
    }
    exchange_members(&mut o, x);
    o.close();
    out.push(b'\n');
}

/// The members of an exchange object (after `v` / `file`).
pub(crate) fn exchange_members(o: &mut Obj<'_>, x: &Exchange) {
    o.u64("sa_exchange", x.id);
    o.hex64("tid", x.tid);
    o.name("tid_match", if x.tid_low { "low32" } else { "full" });
    o.f64("first", x.first_time().as_secs_f64());
    if let Some(q) = &x.query {
        query_obj(o, q, None);
    }
    if let Some(a) = &x.answer {
        answer_obj(o, a, None);
    }
    let out = o.key("records");
    out.push(b'[');
    for (i, rec) in x.records.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        record_obj(out, rec);
    }
    out.push(b']');
    o.u64("served", u64::from(x.served));
    o.u64("repeats", u64::from(x.repeats));
    let outcome = match x.answer {
        None => "unanswered",
        Some(a) if a.status != 0 => "failed",
        Some(_) if x.served == 0 => "served_none",
        Some(_) => "served",
    };
    o.name("outcome", outcome);
}

/// A one-line description of an exchange (`--stats`): `exchange 2: frame 40 Get PathRecord
/// sgid … → frame 41 GetResp 1 record slid 3 dlid 5 …`.
pub(crate) fn exchange_brief(x: &Exchange) -> String {
    let mut b = Vec::new();
    let _ = write!(b, "exchange {}:", x.id);
    if let Some(q) = &x.query {
        let _ = write!(b, " frame {} {} PathRecord", q.frame, method_name(q.method));
        put_template(&mut b, &q.template, q.comp_mask, Style::Space);
    }
    match &x.answer {
        Some(a) => {
            let _ = write!(b, " → frame {} {}", a.frame, method_name(a.method));
            if a.status != 0 {
                let _ = write!(b, " status {:#06x} ({})", a.status, status_name(a.status));
            } else {
                let _ = write!(
                    b,
                    " {} {}",
                    a.records,
                    records_word(usize::try_from(a.records).unwrap_or(0))
                );
                if let Some(rec) = x.records.first() {
                    put_record(&mut b, rec, Style::Space);
                }
                if x.records.len() > 1 {
                    b.extend_from_slice(" …".as_bytes());
                }
            }
        }
        None => b.extend_from_slice(" → no answer".as_bytes()),
    }
    String::from_utf8_lossy(&b).into_owned()
}
