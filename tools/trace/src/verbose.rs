//! `cm-trace -V`: every field of every CM message, named as in the IBTA tables
//! (docs/wire.md §2), with the meaning of codes, timeouts, XRC fields and the rdma_cm
//! Service ID and private-data IP header spelled out.

use std::io::Write;

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::xrc::XrcBlock;
use ibcm_mad::{CmMessage, Gid, PathInfo, TimeoutExp};

use crate::conn::Note;
use crate::render::{event_sid, human, put_wire_addr, summary};
use crate::style::{Palette, Role};
use crate::timefmt::{put_time, TimeFormat, TimeRef};
use crate::trace::{CmEvent, Icrc, Wire};
use crate::upper::{self, Ulp};

const NAME_WIDTH: usize = 34;

/// One `    Name   value` line.
pub(crate) fn field(out: &mut Vec<u8>, name: &str, value: std::fmt::Arguments<'_>) {
    let _ = writeln!(out, "    {name:<NAME_WIDTH$} {value}");
}

fn timeout(t: TimeoutExp) -> String {
    format!(
        "{} (4.096 µs × 2^{} = {})",
        t.get(),
        t.get(),
        human(t.to_duration())
    )
}

fn gid(g: Gid) -> String {
    match g.to_ipv6().to_ipv4_mapped() {
        Some(v4) => format!("{g} (IPv4 {v4})"),
        None => g.to_string(),
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "1 (yes)"
    } else {
        "0 (no)"
    }
}

/// Hex dump of private data: trailing zeros dropped, printable text shown.
pub(crate) fn private(out: &mut Vec<u8>, name: &str, data: &[u8]) {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let used = data.get(..end).unwrap_or(&[]);
    if used.is_empty() {
        field(out, name, format_args!("{} bytes, all zero", data.len()));
        return;
    }
    field(
        out,
        name,
        format_args!("{} bytes, {} up to the last non-zero byte", data.len(), end),
    );
    for (i, chunk) in used.chunks(16).enumerate() {
        let _ = write!(out, "      {:04x}  ", i * 16);
        for b in chunk {
            let _ = write!(out, "{b:02x} ");
        }
        for _ in chunk.len()..16 {
            out.extend_from_slice(b"   ");
        }
        out.push(b' ');
        for &b in chunk {
            out.push(if b.is_ascii_graphic() || b == b' ' {
                b
            } else {
                b'.'
            });
        }
        out.push(b'\n');
    }
}

fn path(out: &mut Vec<u8>, which: &str, p: &PathInfo, req_layout: bool) {
    if which == "Alternate" && !p.is_present() {
        field(
            out,
            "Alternate path",
            format_args!("absent (Alternate Local Port LID 0)"),
        );
        return;
    }
    let n = |f: &str| format!("{which} {f}");
    field(out, &n("Local Port LID"), format_args!("{}", p.local_lid.0));
    field(
        out,
        &n("Remote Port LID"),
        format_args!("{}", p.remote_lid.0),
    );
    field(
        out,
        &n("Local Port GID"),
        format_args!("{}", gid(p.local_gid)),
    );
    field(
        out,
        &n("Remote Port GID"),
        format_args!("{}", gid(p.remote_gid)),
    );
    field(
        out,
        &n("Flow Label"),
        format_args!("{:#07x}", p.flow_label.get()),
    );
    field(
        out,
        &n("Packet Rate"),
        format_args!("{} ({})", p.packet_rate.raw(), p.packet_rate.name()),
    );
    field(
        out,
        &n("Traffic Class"),
        format_args!("{:#04x}", p.traffic_class),
    );
    field(out, &n("Hop Limit"), format_args!("{}", p.hop_limit));
    field(out, &n("SL"), format_args!("{}", p.sl.get()));
    field(
        out,
        &n("Subnet Local"),
        format_args!("{}", yes(p.subnet_local)),
    );
    field(
        out,
        &n("Local ACK Timeout"),
        format_args!("{}", timeout(p.local_ack_timeout)),
    );
    let _ = req_layout;
}

fn cma(out: &mut Vec<u8>, sid: ibcm_mad::ServiceId, pd: &[u8], user_len: usize) -> bool {
    let Some((ps, port)) = sid.rdma_cm_port() else {
        return false;
    };
    let _ = writeln!(
        out,
        "    rdma_cm: port space {} ({:#06x}), port {port}; private data starts with the CMA IP header",
        ps.name(),
        ps.raw()
    );
    match CmaHeader::parse(pd) {
        Ok(h) => {
            field(out, "CMA version", format_args!("{}", h.cma_version));
            field(
                out,
                "CMA IP version",
                format_args!("{}", if h.src.is_ipv4() { 4 } else { 6 }),
            );
            field(out, "CMA source port", format_args!("{}", h.src_port));
            field(out, "CMA source address", format_args!("{}", h.src));
            field(out, "CMA destination address", format_args!("{}", h.dst));
            private(
                out,
                "User private data",
                pd.get(CmaHeader::LEN..CmaHeader::LEN + user_len)
                    .unwrap_or(&[]),
            );
        }
        Err(e) => {
            field(out, "CMA IP header", format_args!("invalid: {e}"));
            private(out, "Private Data", pd);
        }
    }
    true
}

fn message(out: &mut Vec<u8>, msg: &CmMessage) {
    match msg {
        CmMessage::Req(r) => {
            let _ = writeln!(out, "  REQ (Connect Request, 0x0010)");
            field(
                out,
                "Local Communication ID",
                format_args!("{}", r.local_comm_id),
            );
            field(out, "ECE Vendor ID", format_args!("{}", r.ece_vendor_id));
            let sid_note = r
                .service_id
                .rdma_cm_port()
                .map(|(ps, port)| format!("  (rdma_cm {} port {port})", ps.name()))
                .unwrap_or_default();
            field(
                out,
                "Service ID",
                format_args!("{}{sid_note}", r.service_id),
            );
            field(out, "Local CA GUID", format_args!("{}", r.local_ca_guid));
            field(out, "Local Q_Key", format_args!("{}", r.local_qkey));
            let qpn_note = if r.is_xrc() { "  (XRC INI QPN)" } else { "" };
            field(out, "Local QPN", format_args!("{}{qpn_note}", r.local_qpn));
            field(
                out,
                "Responder Resources",
                format_args!("{}", r.responder_resources),
            );
            field(out, "Local EECN", format_args!("{}", r.local_eecn));
            field(
                out,
                "Initiator Depth",
                format_args!("{}", r.initiator_depth),
            );
            field(out, "Remote EECN", format_args!("{}", r.remote_eecn));
            field(
                out,
                "Remote CM Response Timeout",
                format_args!("{}", timeout(r.remote_cm_response_timeout)),
            );
            field(
                out,
                "Transport Service Type",
                format_args!(
                    "{} ({})",
                    r.transport_service_type.raw(),
                    r.transport_service_type.name()
                ),
            );
            field(
                out,
                "End-to-End Flow Control",
                format_args!("{}", yes(r.end_to_end_flow_control)),
            );
            field(out, "Starting PSN", format_args!("{}", r.starting_psn));
            field(
                out,
                "Local CM Response Timeout",
                format_args!("{}", timeout(r.local_cm_response_timeout)),
            );
            field(out, "Retry Count", format_args!("{}", r.retry_count.get()));
            field(out, "Partition Key", format_args!("{}", r.partition_key));
            field(
                out,
                "Path Packet Payload MTU",
                format_args!("{} ({} bytes)", r.path_mtu.raw(), r.path_mtu.name()),
            );
            field(out, "RDC Exists", format_args!("{}", yes(r.rdc_exists)));
            let rnr = r.rnr_retry_count.get();
            field(
                out,
                "RNR Retry Count",
                format_args!("{rnr}{}", if rnr == 7 { " (infinite)" } else { "" }),
            );
            field(
                out,
                "Max CM Retries",
                format_args!("{}", r.max_cm_retries.get()),
            );
            field(out, "SRQ", format_args!("{}", yes(r.srq)));
            field(
                out,
                "Extended Transport Type",
                format_args!(
                    "{} ({})",
                    r.extended_transport_type.raw(),
                    r.extended_transport_type.name()
                ),
            );
            if r.is_xrc() {
                let _ = writeln!(
                    out,
                    "    XRC: Transport Service Type 3 + Extended Transport Type 1 = an XRC INI asking for an XRC TGT"
                );
            }
            path(out, "Primary", &r.primary_path, true);
            path(out, "Alternate", &r.alternate_path, true);
            field(
                out,
                "SAP Supported",
                format_args!("{}", yes(r.sap_supported)),
            );
            let pd = r.private_data.as_bytes();
            if !cma(out, r.service_id, pd, CmaHeader::REQ_USER_LEN) {
                private(out, "Private Data", pd);
            }
        }
        CmMessage::Mra(m) => {
            let _ = writeln!(out, "  MRA (Message Receipt Acknowledgement, 0x0011)");
            field(
                out,
                "Local Communication ID",
                format_args!("{}", m.local_comm_id),
            );
            field(
                out,
                "Remote Communication ID",
                format_args!("{}", m.remote_comm_id),
            );
            field(
                out,
                "Message MRAed",
                format_args!("{} ({})", m.message_mraed.raw(), m.message_mraed.name()),
            );
            field(
                out,
                "Service Timeout",
                format_args!("{}", timeout(m.service_timeout)),
            );
            private(out, "Private Data", m.private_data.as_bytes());
        }
        CmMessage::Rej(r) => {
            let _ = writeln!(out, "  REJ (Connect Reject, 0x0012)");
            let lcid_note = if r.local_comm_id.0 == 0 {
                "  (0: rejected from REQ_RCVD)"
            } else {
                ""
            };
            field(
                out,
                "Local Communication ID",
                format_args!("{}{lcid_note}", r.local_comm_id),
            );
            field(
                out,
                "Remote Communication ID",
                format_args!("{}", r.remote_comm_id),
            );
            field(
                out,
                "Message Rejected",
                format_args!(
                    "{} ({})",
                    r.message_rejected.raw(),
                    r.message_rejected.name()
                ),
            );
            field(
                out,
                "Reject Info Length",
                format_args!("{}", r.reject_info_length.get()),
            );
            field(
                out,
                "Reason",
                format_args!("{} ({})", r.reason.raw(), r.reason.name()),
            );
            let ari = r.ari_bytes();
            if ari.is_empty() {
                field(
                    out,
                    "Additional Rejection Information",
                    format_args!("none"),
                );
            } else {
                let hex: String = ari.iter().map(|b| format!("{b:02x}")).collect();
                let meaning = match r.timeout_ca_guid() {
                    Some(g) => format!("  (CA GUID of the rejecting side: {g})"),
                    None => String::new(),
                };
                field(
                    out,
                    "Additional Rejection Information",
                    format_args!("{hex}{meaning}"),
                );
            }
            private(out, "Private Data", r.private_data.as_bytes());
        }
        CmMessage::Rep(r) => {
            let _ = writeln!(out, "  REP (Connect Reply, 0x0013)");
            field(
                out,
                "Local Communication ID",
                format_args!("{}", r.local_comm_id),
            );
            field(
                out,
                "Remote Communication ID",
                format_args!("{}", r.remote_comm_id),
            );
            field(out, "Local Q_Key", format_args!("{}", r.local_qkey));
            field(out, "Local QPN", format_args!("{}", r.local_qpn));
            field(out, "ECE Vendor ID", format_args!("{}", r.ece_vendor_id));
            let xrc_note = if r.local_eecn.get() != 0 && r.local_qpn.get() == 0 {
                "  (XRC: the TGT QPN)"
            } else {
                ""
            };
            field(
                out,
                "Local EE Context Number",
                format_args!("{}{xrc_note}", r.local_eecn),
            );
            field(out, "Starting PSN", format_args!("{}", r.starting_psn));
            field(
                out,
                "Responder Resources",
                format_args!("{}", r.responder_resources),
            );
            field(
                out,
                "Initiator Depth",
                format_args!("{}", r.initiator_depth),
            );
            field(
                out,
                "Target ACK Delay",
                format_args!("{}", timeout(r.target_ack_delay)),
            );
            field(
                out,
                "Failover Accepted",
                format_args!(
                    "{} ({})",
                    r.failover_accepted.raw(),
                    r.failover_accepted.name()
                ),
            );
            field(
                out,
                "End-to-End Flow Control",
                format_args!("{}", yes(r.end_to_end_flow_control)),
            );
            field(
                out,
                "RNR Retry Count",
                format_args!("{}", r.rnr_retry_count.get()),
            );
            field(out, "SRQ", format_args!("{}", yes(r.srq)));
            field(out, "Local CA GUID", format_args!("{}", r.local_ca_guid));
            private(out, "Private Data", r.private_data.as_bytes());
        }
        CmMessage::Rtu(r) => {
            let _ = writeln!(out, "  RTU (Ready To Use, 0x0014)");
            field(
                out,
                "Local Communication ID",
                format_args!("{}", r.local_comm_id),
            );
            field(
                out,
                "Remote Communication ID",
                format_args!("{}", r.remote_comm_id),
            );
            private(out, "Private Data", r.private_data.as_bytes());
        }
        CmMessage::Dreq(d) => {
            let _ = writeln!(out, "  DREQ (Disconnect Request, 0x0015)");
            field(
                out,
                "Local Communication ID",
                format_args!("{}", d.local_comm_id),
            );
            field(
                out,
                "Remote Communication ID",
                format_args!("{}", d.remote_comm_id),
            );
            field(
                out,
                "Remote QPN/EECN",
                format_args!("{}", d.remote_qpn_eecn),
            );
            private(out, "Private Data", d.private_data.as_bytes());
        }
        CmMessage::Drep(d) => {
            let _ = writeln!(out, "  DREP (Disconnect Reply, 0x0016)");
            field(
                out,
                "Local Communication ID",
                format_args!("{}", d.local_comm_id),
            );
            field(
                out,
                "Remote Communication ID",
                format_args!("{}", d.remote_comm_id),
            );
            private(out, "Private Data", d.private_data.as_bytes());
        }
        CmMessage::SidrReq(s) => {
            let _ = writeln!(out, "  SIDR_REQ (Service ID Resolution Request, 0x0017)");
            field(out, "Request ID", format_args!("{}", s.request_id));
            field(out, "Partition Key", format_args!("{}", s.partition_key));
            let sid_note = s
                .service_id
                .rdma_cm_port()
                .map(|(ps, port)| format!("  (rdma_cm {} port {port})", ps.name()))
                .unwrap_or_default();
            field(
                out,
                "Service ID",
                format_args!("{}{sid_note}", s.service_id),
            );
            let pd = s.private_data.as_bytes();
            if !cma(out, s.service_id, pd, CmaHeader::SIDR_REQ_USER_LEN) {
                private(out, "Private Data", pd);
            }
        }
        CmMessage::SidrRep(s) => {
            let _ = writeln!(out, "  SIDR_REP (Service ID Resolution Response, 0x0018)");
            field(out, "Request ID", format_args!("{}", s.request_id));
            field(
                out,
                "Status",
                format_args!("{} ({})", s.status.raw(), s.status.name()),
            );
            field(
                out,
                "Additional Information Length",
                format_args!("{}", s.additional_info_length),
            );
            field(out, "ECE Vendor ID", format_args!("{}", s.ece_vendor_id));
            field(out, "QPN", format_args!("{}", s.qpn));
            field(out, "Service ID", format_args!("{}", s.service_id));
            field(out, "Q_Key", format_args!("{}", s.qkey));
            let n = usize::from(s.additional_info_length).min(72);
            private(
                out,
                "Additional Information",
                s.additional_info.get(..n).unwrap_or(&[]),
            );
            private(out, "Private Data", s.private_data.as_bytes());
        }
        CmMessage::Lap(l) => {
            let _ = writeln!(out, "  LAP (Load Alternate Path, 0x0019)");
            field(
                out,
                "Local Communication ID",
                format_args!("{}", l.local_comm_id),
            );
            field(
                out,
                "Remote Communication ID",
                format_args!("{}", l.remote_comm_id),
            );
            field(
                out,
                "Remote QPN/EECN",
                format_args!("{}", l.remote_qpn_eecn),
            );
            field(
                out,
                "Remote CM Response Timeout",
                format_args!("{}", timeout(l.remote_cm_response_timeout)),
            );
            path(out, "Alternate", &l.alternate_path, false);
            private(out, "Private Data", l.private_data.as_bytes());
        }
        CmMessage::Apr(a) => {
            let _ = writeln!(out, "  APR (Alternate Path Response, 0x001a)");
            field(
                out,
                "Local Communication ID",
                format_args!("{}", a.local_comm_id),
            );
            field(
                out,
                "Remote Communication ID",
                format_args!("{}", a.remote_comm_id),
            );
            field(
                out,
                "Additional Information Length",
                format_args!("{}", a.additional_info_length),
            );
            field(
                out,
                "AP Status",
                format_args!("{} ({})", a.ap_status.raw(), a.ap_status.name()),
            );
            private(out, "Additional Information", a.additional_info_bytes());
            private(out, "Private Data", a.private_data.as_bytes());
        }
        CmMessage::ClassPortInfo(c) => {
            let _ = writeln!(out, "  ClassPortInfo (0x0001)");
            field(out, "BaseVersion", format_args!("{}", c.base_version));
            field(out, "ClassVersion", format_args!("{}", c.class_version));
            field(
                out,
                "CapabilityMask",
                format_args!("{:#06x}", c.capability_mask),
            );
            field(
                out,
                "CapabilityMask2",
                format_args!("{:#09x}", c.capability_mask2.get()),
            );
            field(
                out,
                "RespTimeValue",
                format_args!("{}", timeout(c.resp_time_value)),
            );
            field(out, "RedirectGID", format_args!("{}", gid(c.redirect_gid)));
            field(out, "RedirectTC", format_args!("{:#04x}", c.redirect_tc));
            field(out, "RedirectSL", format_args!("{}", c.redirect_sl.get()));
            field(
                out,
                "RedirectFL",
                format_args!("{:#07x}", c.redirect_fl.get()),
            );
            field(out, "RedirectLID", format_args!("{}", c.redirect_lid));
            field(out, "RedirectP_Key", format_args!("{}", c.redirect_pkey));
            field(out, "RedirectQP", format_args!("{}", c.redirect_qp));
            field(out, "RedirectQ_Key", format_args!("{}", c.redirect_qkey));
            field(out, "TrapGID", format_args!("{}", gid(c.trap_gid)));
            field(out, "TrapTC", format_args!("{:#04x}", c.trap_tc));
            field(out, "TrapSL", format_args!("{}", c.trap_sl.get()));
            field(out, "TrapFL", format_args!("{:#07x}", c.trap_fl.get()));
            field(out, "TrapLID", format_args!("{}", c.trap_lid));
            field(out, "TrapP_Key", format_args!("{}", c.trap_pkey));
            field(out, "TrapHL", format_args!("{}", c.trap_hl));
            field(out, "TrapQP", format_args!("{}", c.trap_qp));
            field(out, "TrapQ_Key", format_args!("{}", c.trap_qkey));
        }
        CmMessage::Unknown { attr, raw } => {
            let _ = writeln!(out, "  Unknown attribute {attr:#06x}");
            private(out, "Attribute data", raw);
        }
    }
}

/// The `  Transport: …` line of `-V` (LIDs, UDP port, traffic class and hop limit, P_Key,
/// PSN, QPs, Q_Key, ICRC).
pub(crate) fn transport_line(out: &mut Vec<u8>, w: &Wire, icrc: Icrc, pal: &Palette) {
    out.extend_from_slice(b"  Transport:");
    if let Some((s, d)) = w.lids {
        let _ = write!(out, " SLID {} DLID {}", s.0, d.0);
    }
    if let Some(p) = w.udp_src_port {
        let _ = write!(out, " UDP {p} → 4791");
    }
    if let (Some(tc), Some(hl)) = (w.traffic_class, w.hop_limit) {
        let _ = write!(out, " TClass {tc:#04x} HopLimit {hl}");
    }
    let _ = write!(out, " P_Key {} PSN {} DestQP {}", w.pkey, w.psn, w.dest_qp);
    if let (Some(sq), Some(qk)) = (w.src_qp, w.qkey) {
        let _ = write!(out, " SrcQP {sq} Q_Key {qk}");
    }
    out.extend_from_slice(b" ICRC ");
    // Shown as its four bytes in wire order (as Wireshark shows it), not as the CRC value
    // (which the wire carries little-endian).
    match (w.icrc_value.map(u32::swap_bytes), icrc) {
        (Some(v), Icrc::Bad) => {
            let _ = write!(out, "{v:#010x} ");
            pal.paint(out, Role::Bad, "bad");
        }
        (Some(v), i) => {
            let _ = write!(out, "{v:#010x} {}", i.as_str());
        }
        (None, i) => out.extend_from_slice(i.as_str().as_bytes()),
    }
    out.push(b'\n');
}

/// Appends the `-V` view of one CM MAD.
pub(crate) fn verbose(
    out: &mut Vec<u8>,
    ev: &CmEvent,
    note: &Note,
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
    summary(out, &ev.mad.msg, pal, ev.captured.map_or(256, usize::from));
    out.push(b'\n');
    if let Some(n) = ev.captured {
        out.extend_from_slice(b"  ");
        pal.paint(
            out,
            Role::Warn,
            &format!(
                "Truncated: the snaplen kept {n} of the MAD's 256 bytes; fields from byte {n} on \
                 were not captured and show as 0; no ICRC verdict"
            ),
        );
        out.push(b'\n');
    }
    transport_line(out, &ev.wire, ev.icrc, pal);
    let h = &ev.mad.header;
    let _ = writeln!(
        out,
        "  MAD: BaseVersion {} MgmtClass {:#04x} ({}) ClassVersion {} Method {:#04x} ({}) Status {:#06x} ClassSpecific {:#06x}",
        h.base_version,
        h.mgmt_class.raw(),
        h.mgmt_class.name(),
        h.class_version,
        h.method.raw(),
        h.method.name(),
        h.status,
        h.class_specific
    );
    let _ = writeln!(
        out,
        "       TransactionID {} AttributeID {:#06x} AttributeModifier {:#010x}",
        h.tid,
        h.attr_id.raw(),
        h.attr_mod
    );
    if let Some(c) = note.conn {
        let _ = write!(out, "  Connection {c}");
        if let Some(f) = note.from {
            let _ = write!(out, ", from the {} side", f.as_str());
        }
        if note.xrc {
            out.extend_from_slice(b", XRC");
        }
        if note.retrans {
            out.extend_from_slice(b", ");
            pal.paint(out, Role::Warn, "retransmission (identical repeat)");
        }
        if note.dup {
            out.extend_from_slice(b", duplicate capture (the same packet, same PSN, seen twice)");
        }
        out.push(b'\n');
    }
    if matches!(ev.mad.msg, CmMessage::Req(_)) && !note.sa.is_empty() {
        crate::sa::view::req_verbose(out, &note.sa, pal);
    }
    message(out, &ev.mad.msg);
    xrc_block(out, &ev.mad.msg);
    let sid = event_sid(ev, note);
    if let Some(u) = sid.and_then(Ulp::of) {
        let _ = writeln!(out, "  Upper layer (Service ID): {}", u.name());
    }
    if let Some(u) = upper::decode(&ev.mad.msg, sid, ev.captured.map_or(256, usize::from)) {
        let _ = writeln!(out, "  Upper layer (private data): {}", u.text());
    }
    out.push(b'\n');
}

/// ibcm-xrc's XRC block (REQ/REP private data, or the "target gone" block of a REJ or DREQ),
/// field by field, when the message carries one (`ibcm_mad::xrc`, docs/xrc.md §9).
fn xrc_block(out: &mut Vec<u8>, msg: &CmMessage) {
    match XrcBlock::find(msg) {
        None => {}
        Some(Ok(b)) => {
            let _ = writeln!(out, "    {} ({} bytes): {b}", b.name(), b.len());
            for f in b.fields() {
                let name = format!("  {} [{}+{}]", f.name, f.offset, f.len);
                field(out, &name, format_args!("{}", f.value));
            }
        }
        Some(Err(e)) => field(out, "XRC block", format_args!("invalid: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use ibcm_mad::xrc::{GoneCause, OwnershipPolicy, TargetGone, XrcReqData};
    use ibcm_mad::{CmMessage, Dreq, PrivateData, Qpn, Req, ReqTransport};

    use super::xrc_block;

    fn text(msg: &CmMessage) -> String {
        let mut out = Vec::new();
        xrc_block(&mut out, msg);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn xrc_blocks_are_decoded_field_by_field() {
        let mut req = Req::default();
        req.set_transport(ReqTransport::Xrc);
        let d = XrcReqData::any(Some(OwnershipPolicy::Shared));
        req.private_data = PrivateData::from_slice(&d.to_bytes()).unwrap();
        let t = text(&CmMessage::Req(req));
        assert!(t.starts_with("    XRC REQ data (8 bytes): "), "{t}");
        assert!(t.contains("marker [0+2]"), "{t}");
        assert!(t.contains("ownership policy [7+1]"), "{t}");
        assert!(t.contains("shared"), "{t}");

        let g = TargetGone::gone(GoneCause::KeeperLost, Qpn::new(0x10).unwrap());
        let dreq = Dreq {
            private_data: PrivateData::from_slice(&g.to_bytes()).unwrap(),
            ..Dreq::default()
        };
        let t = text(&CmMessage::Dreq(dreq));
        assert!(t.contains("XRC target-gone block"), "{t}");
        assert!(t.contains("keeper lost"), "{t}");
        // No block, no lines; a damaged block is named, not skipped.
        assert_eq!(text(&CmMessage::Dreq(Dreq::default())), "");
        let mut req = Req::default();
        req.set_transport(ReqTransport::Xrc);
        req.private_data = PrivateData::from_slice(&[0x58, 0x51, 1, 9, 0, 0, 0, 0]).unwrap();
        assert!(text(&CmMessage::Req(req)).contains("XRC block"));
    }
}
