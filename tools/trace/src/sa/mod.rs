//! Subnet Administration MADs (management class 0x03) on QP1, and the PathRecords a CM
//! exchange was built from.
//!
//! On native InfiniBand the active side asks the SA for a PathRecord (attribute 0x0035,
//! method Get 0x01 or GetTable 0x12, a template record with the ComponentMask saying which of
//! its fields to match) before it sends its REQ, and the SA answers (GetResp 0x81, or
//! GetTableResp 0x92, by RMPP when the table needs several MADs). cm-trace decodes every
//! whole SA MAD with the codec's [`SaMad`] (`ibcm_mad::sa`) into an [`SaEvent`]: the per-MAD
//! views show it (`crate::sa::view`), and the connection tracker pairs queries with answers by
//! TID and hands the answer's records to the REQ whose path they describe
//! (`crate::conn` `sa` module).
//!
//! What this module holds: the event, the names of SA methods, attributes, status codes and
//! ComponentMask bits, and the check of a REQ path against the PathRecord it follows
//! ([`path_differs`]): the fields the kernel's `cm_format_req` copies from the record
//! (`drivers/infiniband/core/cm.c`; the workspace's own copy is `req_path` in
//! `cm/src/sa/req.rs`).
//!
//! An SA MAD cut by the snaplen is not decoded (it stays a non-CM record, as before): its
//! records would read as zeros.

pub(crate) mod view;

use std::time::Duration;

use ibcm_mad::frame::Encap;
use ibcm_mad::sa::{attr, method, rmpp_flags, rmpp_type, PathRecord, SaMad, SaStatus, SA_DATA_LEN};
use ibcm_mad::{AttrId, Method, Mtu, PathInfo, Pkey, Rate};

use crate::trace::{Icrc, Wire, WireAddr};

/// An SA MAD (class 0x03, class version 2) found in a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaEvent {
    /// 1-based frame number in its file.
    pub frame: u64,
    /// Capture timestamp (since the Unix epoch).
    pub time: Duration,
    /// Encapsulation.
    pub encap: Encap,
    /// Sender.
    pub src: WireAddr,
    /// Receiver.
    pub dst: WireAddr,
    /// The MAD: common header, RMPP header, SA header and the 200 data bytes.
    pub mad: SaMad,
    /// ICRC verdict.
    pub icrc: Icrc,
    /// Transport-level details.
    pub wire: Wire,
}

/// Most RMPP segments of one answer that are reassembled (200 data bytes each: 50
/// PathRecords); later segments are counted, their records not read.
pub(crate) const MAX_SEGMENTS: usize = 16;

impl SaEvent {
    /// Whether the attribute is PathRecord.
    pub(crate) fn is_path(&self) -> bool {
        self.mad.header.attr_id == attr::PATH_RECORD
    }

    /// Whether the method is a response (bit 0x80).
    pub(crate) fn is_response(&self) -> bool {
        self.mad.header.method.raw() & 0x80 != 0
    }

    /// Whether the method asks for records (Get, GetTable).
    pub(crate) fn is_query(&self) -> bool {
        matches!(self.mad.header.method, method::GET | method::GET_TABLE)
    }

    /// Whether the method answers a query (GetResp, GetTableResp).
    pub(crate) fn is_answer(&self) -> bool {
        matches!(
            self.mad.header.method,
            method::GET_RESP | method::GET_TABLE_RESP
        )
    }

    /// Whether the MAD is a segment of an RMPP transfer (its Active flag).
    pub(crate) fn rmpp_active(&self) -> bool {
        self.mad.rmpp.is_active()
    }

    /// The RMPP DATA segment this MAD is, when it is one: (segment number, first, last).
    pub(crate) fn rmpp_data(&self) -> Option<(u32, bool, bool)> {
        let r = &self.mad.rmpp;
        (r.is_active() && r.rmpp_type == rmpp_type::DATA).then_some((
            r.data1,
            r.flags & rmpp_flags::FIRST != 0,
            r.flags & rmpp_flags::LAST != 0,
        ))
    }

    /// The query template of a PathRecord Get / GetTable (its data's first 64 bytes).
    pub(crate) fn template(&self) -> PathRecord {
        PathRecord::parse(&self.mad.data).unwrap_or_default()
    }

    /// The PathRecords this one MAD carries: the one of a GetResp, those of a GetTableResp in
    /// one MAD (without RMPP, or an RMPP segment that is First and Last at once); none for a
    /// segment of a longer transfer (the tracker reassembles those) or a failed answer.
    pub(crate) fn records(&self) -> Vec<PathRecord> {
        if !self.is_path() || !self.is_answer() || self.mad.header.status != 0 {
            return Vec::new();
        }
        if self.mad.header.method == method::GET_RESP {
            return PathRecord::parse(&self.mad.data).into_iter().collect();
        }
        match self.rmpp_data() {
            None if self.rmpp_active() => Vec::new(),
            None => table_records(&self.mad.data, self.mad.attr_offset, None),
            Some((_, true, true)) => table_records(
                &self.mad.data,
                self.mad.attr_offset,
                Some(last_segment_data(self.mad.rmpp.data2)),
            ),
            Some(_) => Vec::new(),
        }
    }
}

/// The SA data bytes in the last RMPP segment of a transfer whose PayloadLength is `paylen`:
/// the kernel's MAD layer counts the SA header's 20 bytes in it (`get_mad_len` in
/// `drivers/infiniband/core/mad_rmpp.c`); an implausible value gives a whole segment.
pub(crate) fn last_segment_data(paylen: u32) -> usize {
    usize::try_from(paylen)
        .ok()
        .and_then(|p| p.checked_sub(20))
        .filter(|&n| n <= DATA_LEN)
        .unwrap_or(DATA_LEN)
}

/// The PathRecords of the SA data `data` (one MAD's, or a reassembled table), `attr_offset`
/// 8-byte words apart (a record's 64 bytes when 0). `valid`: how many bytes of `data` the
/// answer filled (from the RMPP PayloadLength); without it, records that are all zero are
/// padding and left out.
pub(crate) fn table_records(
    data: &[u8],
    attr_offset: u16,
    valid: Option<usize>,
) -> Vec<PathRecord> {
    // A length beyond the data is not plausible: read as without one.
    let valid = valid.filter(|&n| n <= data.len());
    let end = valid.unwrap_or(data.len());
    let bytes = data.get(..end).unwrap_or(data);
    let step = (usize::from(attr_offset) * 8).max(PathRecord::LEN);
    bytes
        .chunks(step)
        .filter_map(|chunk| chunk.get(..PathRecord::LEN))
        .filter(|rec| valid.is_some() || rec.iter().any(|&b| b != 0))
        .filter_map(|rec| PathRecord::parse(rec).ok())
        .collect()
}

/// Bytes of SA data in one MAD.
pub(crate) const DATA_LEN: usize = SA_DATA_LEN;

/// The name of an SA method (IBTA Vol 1 Table 200).
pub(crate) fn method_name(m: Method) -> &'static str {
    match m.raw() {
        0x01 => "Get",
        0x02 => "Set",
        0x06 => "Report",
        0x12 => "GetTable",
        0x13 => "GetTraceTable",
        0x14 => "GetMulti",
        0x15 => "Delete",
        0x81 => "GetResp",
        0x86 => "ReportResp",
        0x92 => "GetTableResp",
        0x94 => "GetMultiResp",
        0x95 => "DeleteResp",
        _ => "method",
    }
}

/// The name of an SA attribute (IBTA Vol 1 Table 201).
pub(crate) fn attr_name(a: AttrId) -> &'static str {
    match a.raw() {
        0x0001 => "ClassPortInfo",
        0x0002 => "Notice",
        0x0003 => "InformInfo",
        0x0011 => "NodeRecord",
        0x0012 => "PortInfoRecord",
        0x0013 => "SLtoVLMappingTableRecord",
        0x0014 => "SwitchInfoRecord",
        0x0015 => "LinearForwardingTableRecord",
        0x0016 => "RandomForwardingTableRecord",
        0x0017 => "MulticastForwardingTableRecord",
        0x0018 => "SMInfoRecord",
        0x0020 => "LinkRecord",
        0x0030 => "GuidInfoRecord",
        0x0031 => "ServiceRecord",
        0x0033 => "P_KeyTableRecord",
        0x0035 => "PathRecord",
        0x0036 => "VLArbitrationTableRecord",
        0x0038 => "MCMemberRecord",
        0x0039 => "TraceRecord",
        0x003a => "MultiPathRecord",
        0x003b => "ServiceAssociationRecord",
        0x00f3 => "InformInfoRecord",
        _ => "attribute",
    }
}

/// The meaning of a MAD status in an SA answer: `success`, the SA's class-specific code
/// (bits 14–8, IBTA Vol 1 Table 202: `ERR_NO_RECORDS`, …) or the common one (bits 4–2 and the
/// busy / redirect bits, Table 111).
pub(crate) fn status_name(status: u16) -> &'static str {
    if status == 0 {
        return "success";
    }
    match SaStatus::from_mad_status(status) {
        SaStatus::Ok => {}
        SaStatus::NoResources => return "ERR_NO_RESOURCES",
        SaStatus::ReqInvalid => return "ERR_REQ_INVALID",
        SaStatus::NoRecords => return "ERR_NO_RECORDS",
        SaStatus::TooManyRecords => return "ERR_TOO_MANY_RECORDS",
        SaStatus::InvalidGid => return "ERR_REQ_INVALID_GID",
        SaStatus::InsufficientComponents => return "ERR_REQ_INSUFFICIENT_COMPONENTS",
        SaStatus::Denied => return "ERR_REQ_DENIED",
        SaStatus::Other(_) => return "class-specific error",
    }
    match (status >> 2) & 0x7 {
        1 => "bad base or class version",
        2 => "method not supported",
        3 => "method/attribute combination not supported",
        7 => "invalid attribute or modifier value",
        0 if status & 0x1 != 0 => "busy",
        0 if status & 0x2 != 0 => "redirect",
        _ => "error",
    }
}

/// The name of an RMPP type.
pub(crate) fn rmpp_type_name(t: u8) -> &'static str {
    match t {
        rmpp_type::DATA => "DATA",
        rmpp_type::ACK => "ACK",
        rmpp_type::STOP => "STOP",
        rmpp_type::ABORT => "ABORT",
        _ => "type",
    }
}

/// PathRecord ComponentMask bits with the names cm-trace gives the fields: the JSON key
/// (as in a record object) and the short name of the text views (bits 0 and 1 together are
/// the ServiceID; bit 7 is reserved).
pub(crate) const PATH_COMPONENTS: [(u64, &str, &str); 21] = [
    (0b11, "service_id", "service_id"),
    (1 << 2, "dgid", "dgid"),
    (1 << 3, "sgid", "sgid"),
    (1 << 4, "dlid", "dlid"),
    (1 << 5, "slid", "slid"),
    (1 << 6, "raw_traffic", "raw_traffic"),
    (1 << 8, "flow_label", "flow_label"),
    (1 << 9, "hop_limit", "hop_limit"),
    (1 << 10, "traffic_class", "tclass"),
    (1 << 11, "reversible", "reversible"),
    (1 << 12, "numb_path", "numb_path"),
    (1 << 13, "pkey", "pkey"),
    (1 << 14, "qos_class", "qos_class"),
    (1 << 15, "sl", "sl"),
    (1 << 16, "mtu_selector", "mtu_sel"),
    (1 << 17, "mtu", "mtu"),
    (1 << 18, "rate_selector", "rate_sel"),
    (1 << 19, "rate", "rate"),
    (1 << 20, "packet_life_time_selector", "pkt_life_sel"),
    (1 << 21, "packet_life_time", "pkt_life"),
    (1 << 22, "preference", "preference"),
];

/// The JSON names of the PathRecord components set in `mask`.
pub(crate) fn component_names(mask: u64) -> impl Iterator<Item = &'static str> {
    PATH_COMPONENTS
        .iter()
        .filter(move |(bit, _, _)| mask & bit != 0)
        .map(|(_, n, _)| *n)
}

/// The local ACK timeout exponent the kernel's `cm_ack_timeout` puts in a REQ path for a CA
/// ACK delay and a packet life time (the workspace's `ibcm::qp_attr::ack_timeout`, which
/// `req_path` in `cm/src/sa/req.rs` applies to the PathRecord's PacketLifeTime): the larger of
/// `ca_ack_delay` and `packet_life_time + 1`, plus one when the other is within a factor of
/// two of it, at most 31.
pub(crate) const fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let delay = ca_ack_delay as i32;
    let mut t = packet_life_time as i32 + 1;
    if t >= delay {
        if delay >= t - 1 {
            t += 1;
        }
    } else {
        t = delay + if t >= delay - 1 { 1 } else { 0 };
    }
    if t > 31 {
        31
    } else {
        t as u8
    }
}

/// The smallest local ACK timeout a REQ built from a PathRecord with PacketLifeTime
/// `packet_life_time` can carry: the least [`cm_ack_timeout`] over every CA ACK delay (0–31).
/// The capture does not show the sender's CA ACK delay, so only a timeout below this one
/// contradicts the record. (It is `packet_life_time + 1`, at most 31, but 2 for a packet life
/// time of 0; every value from there to 31 is reached by some delay: the tests check both.)
pub(crate) const fn min_ack_timeout(packet_life_time: u8) -> u8 {
    let mut best = u8::MAX;
    let mut delay = 0;
    while delay <= 31 {
        let t = cm_ack_timeout(delay, packet_life_time);
        if t < best {
            best = t;
        }
        delay += 1;
    }
    best
}

/// A field in which a REQ path disagrees with its PathRecord (bits of [`path_differs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    /// SL.
    Sl,
    /// The REQ's Path Packet Payload MTU (primary path only).
    Mtu,
    /// The REQ's Partition Key (primary path only).
    Pkey,
    /// The path's Local ACK Timeout below PacketLifeTime + 1.
    AckTimeout,
    /// Packet rate (only when the REQ gives one: 0 is "port current").
    Rate,
    /// Flow label.
    FlowLabel,
    /// Traffic class.
    TrafficClass,
    /// Hop limit.
    HopLimit,
}

/// Every [`Field`], in the order they are reported.
pub(crate) const FIELDS: [Field; 8] = [
    Field::Sl,
    Field::Mtu,
    Field::Pkey,
    Field::AckTimeout,
    Field::Rate,
    Field::FlowLabel,
    Field::TrafficClass,
    Field::HopLimit,
];

impl Field {
    /// Its bit in a [`path_differs`] mask.
    pub(crate) const fn bit(self) -> u16 {
        match self {
            Field::Sl => 1,
            Field::Mtu => 1 << 1,
            Field::Pkey => 1 << 2,
            Field::AckTimeout => 1 << 3,
            Field::Rate => 1 << 4,
            Field::FlowLabel => 1 << 5,
            Field::TrafficClass => 1 << 6,
            Field::HopLimit => 1 << 7,
        }
    }

    /// Its name in the views, as the REQ's JSON keys name it (`sl`, `mtu`, `pkey`,
    /// `local_ack_timeout`, `packet_rate`, `flow_label`, `traffic_class`, `hop_limit`).
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Field::Sl => "sl",
            Field::Mtu => "mtu",
            Field::Pkey => "pkey",
            Field::AckTimeout => "local_ack_timeout",
            Field::Rate => "packet_rate",
            Field::FlowLabel => "flow_label",
            Field::TrafficClass => "traffic_class",
            Field::HopLimit => "hop_limit",
        }
    }
}

/// The REQ-wide fields a primary path is checked with: its Path MTU and Partition Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReqWide {
    /// Path Packet Payload MTU.
    pub(crate) mtu: Mtu,
    /// Partition Key.
    pub(crate) pkey: Pkey,
}

/// Where the REQ path `p` disagrees with the PathRecord `rec` it follows, as a mask of
/// [`Field::bit`]s: what `cm_format_req` copies from the record (SL, flow label, traffic
/// class, hop limit, rate; for the primary path (`wide` given) the REQ's Path MTU and
/// P_Key), and the Local ACK Timeout, which must be at least [`min_ack_timeout`] of the
/// record's PacketLifeTime. A REQ rate of 0 ("port current", what some stacks send) is not
/// compared.
pub(crate) fn path_differs(p: &PathInfo, rec: &PathRecord, wide: Option<ReqWide>) -> u16 {
    let mut bits = 0;
    let mut flag = |f: Field, differs: bool| {
        if differs {
            bits |= f.bit();
        }
    };
    flag(Field::Sl, p.sl != rec.sl);
    if let Some(w) = wide {
        flag(Field::Mtu, w.mtu != rec.mtu);
        flag(Field::Pkey, w.pkey != rec.pkey);
    }
    flag(
        Field::AckTimeout,
        p.local_ack_timeout.get() < min_ack_timeout(rec.packet_life_time),
    );
    flag(
        Field::Rate,
        p.packet_rate != Rate::PortCurrent && p.packet_rate != rec.rate,
    );
    flag(Field::FlowLabel, p.flow_label != rec.flow_label);
    flag(Field::TrafficClass, p.traffic_class != rec.traffic_class);
    flag(Field::HopLimit, p.hop_limit != rec.hop_limit);
    bits
}

/// Whether the REQ path `p` is the one `rec` describes: the same GIDs, and the same LIDs
/// unless the REQ has the permissive LID 0xFFFF in both (a path across routers).
pub(crate) fn path_matches(p: &PathInfo, rec: &PathRecord) -> bool {
    let routed = p.local_lid.0 == 0xffff && p.remote_lid.0 == 0xffff;
    p.local_gid == rec.sgid
        && p.remote_gid == rec.dgid
        && (routed || (p.local_lid == rec.slid && p.remote_lid == rec.dlid))
}

/// The names of the fields set in `bits` (a [`path_differs`] mask).
pub(crate) fn differs_names(bits: u16) -> impl Iterator<Item = &'static str> {
    FIELDS
        .iter()
        .filter(move |f| bits & f.bit() != 0)
        .map(|f| f.name())
}

/// `mtu 2048` (or the code of a reserved MTU).
pub(crate) fn mtu_text(m: Mtu) -> String {
    match m.bytes() {
        Some(b) => b.to_string(),
        None => format!("code {}", m.raw()),
    }
}

#[cfg(test)]
pub(crate) mod tests;
