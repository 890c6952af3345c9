//! The fields a `-Y` expression can name, and their values in a CM message.
//!
//! A field a message does not have (a REP has no `rej.reason`) makes every comparison on it
//! false (as in Wireshark), so `!(rej.reason == 3)` is true for a REP.

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{CmMessage, ServiceId};

use crate::conn::Note;
use crate::render::{cma_end, cma_header, msg_name};
use crate::trace::{CmEvent, WireAddr};
use crate::upper::{self, Upper};

/// The kind of a field's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An unsigned integer (decimal or `0x` hex in the expression).
    Num,
    /// A name, compared without regard to case.
    Str,
    /// A flag: a bare field tests it; `== true` / `== false`.
    Bool,
    /// An address: IP, GID (IPv6 notation) or `lid:N`.
    Addr,
}

impl Kind {
    pub(crate) fn what(self) -> &'static str {
        match self {
            Kind::Num => "a number",
            Kind::Str => "a name",
            Kind::Bool => "a flag",
            Kind::Addr => "an address",
        }
    }
}

macro_rules! fields {
    ($($v:ident $name:literal $kind:ident $doc:literal;)*) => {
        /// A field of the `-Y` grammar.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Field { $($v,)* }

        /// (name, kind, meaning) of every field, in the documented order.
        pub(crate) const TABLE: &[(&str, Field, Kind, &str)] = &[
            $(($name, Field::$v, Kind::$kind, $doc),)*
        ];
    };
}

fields! {
    Frame "frame" Num "frame number in its file";
    Msg "msg" Str "message: REQ MRA REJ REP RTU DREQ DREP SIDR_REQ SIDR_REP LAP APR CPI";
    AttrId "attr_id" Num "MAD Attribute ID";
    Tid "tid" Num "MAD Transaction ID";
    Lcid "lcid" Num "Local Communication ID";
    Rcid "rcid" Num "Remote Communication ID";
    Sid "sid" Num "Service ID (REQ, SIDR; other messages: their connection's)";
    SidPort "sid.port" Num "rdma_cm port of the Service ID";
    SidPs "sid.ps" Str "rdma_cm port space of the Service ID: TCP UDP IB IPOIB";
    CaGuid "ca_guid" Num "Local CA GUID (REQ, REP)";
    Qpn "qpn" Num "Local QPN (REQ, REP; SIDR_REP: QPN)";
    RemoteQpn "remote_qpn" Num "Remote QPN/EECN (DREQ, LAP)";
    Eecn "eecn" Num "REP Local EECN (an XRC TGT QPN)";
    Psn "psn" Num "Starting PSN (REQ, REP)";
    Transport "transport" Str "REQ transport: RC UC XRC other";
    Xrc "xrc" Bool "an XRC REQ or a message of an XRC connection";
    RejReason "rej.reason" Num "REJ reason code";
    RejName "rej.name" Str "REJ reason name as cm-trace prints it (quote names with spaces)";
    RejMsg "rej.msg" Str "message rejected: REQ REP other";
    MraTimeout "mra.timeout" Num "MRA Service Timeout exponent";
    SidrStatus "sidr.status" Num "SIDR_REP status";
    SidrQkey "sidr.qkey" Num "SIDR_REP Q_Key";
    RequestId "request_id" Num "SIDR Request ID";
    Mtu "mtu" Num "REQ path MTU in bytes";
    RetryCount "retry_count" Num "REQ Retry Count";
    RnrRetryCount "rnr_retry_count" Num "REQ / REP RNR Retry Count";
    ResponderResources "responder_resources" Num "REQ / REP responder resources";
    InitiatorDepth "initiator_depth" Num "REQ / REP initiator depth";
    Pkey "pkey" Num "REQ / SIDR_REQ P_Key";
    FlowLabel "flow_label" Num "REQ primary path flow label";
    Sl "sl" Num "REQ primary path SL";
    AckTimeout "ack_timeout" Num "REQ primary path Local ACK Timeout exponent";
    CmaSrc "cma.src" Addr "rdma_cm header source address (REQ, SIDR_REQ)";
    CmaDst "cma.dst" Addr "rdma_cm header destination address";
    CmaPort "cma.port" Num "rdma_cm header source port";
    Conn "conn" Num "connection number in the file";
    From "from" Str "sender: active or passive";
    Retrans "retrans" Bool "a retransmission";
    Dup "dup" Bool "a duplicate capture of an earlier packet";
    Icrc "icrc" Str "ICRC verdict: ok bad absent not-captured";
    Truncated "truncated" Bool "cut by the snaplen";
    Src "src" Addr "packet source (IP, GID or lid:N)";
    Dst "dst" Addr "packet destination";
    Addr "addr" Addr "packet source or destination";
    Encap "encap" Str "\"RoCEv2/IPv4\" \"RoCEv2/IPv6\" RoCEv1 \"IB LNH=2\" \"IB LNH=3\" (quoted: they hold `/`, `=` or spaces)";
    NvmeQid "nvme.qid" Num "NVMe-oF RDMA CM: queue ID (REQ private data)";
    NvmeQsize "nvme.qsize" Num "NVMe-oF RDMA CM: host receive queue size (REQ), controller receive queue size (REP)";
    NvmeStatus "nvme.status" Num "NVMe-oF RDMA CM: REJ status";
}

/// The field called `name`.
pub(crate) fn lookup(name: &str) -> Option<Field> {
    TABLE
        .iter()
        .find(|(n, ..)| n.eq_ignore_ascii_case(name))
        .map(|&(_, f, ..)| f)
}

impl Field {
    pub(crate) fn kind(self) -> Kind {
        TABLE
            .iter()
            .find(|(_, f, ..)| *f == self)
            .map_or(Kind::Num, |&(_, _, k, _)| k)
    }

    pub(crate) fn name(self) -> &'static str {
        TABLE
            .iter()
            .find(|(_, f, ..)| *f == self)
            .map_or("?", |&(n, ..)| n)
    }
}

/// A field's value in one message.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Got<'a> {
    Num(u64),
    Str(&'a str),
    Bool(bool),
    Addr(WireAddr),
    /// Either of two addresses (`addr`).
    Addrs(WireAddr, WireAddr),
}

fn service_id(msg: &CmMessage, note: &Note) -> Option<ServiceId> {
    match msg {
        CmMessage::Req(r) => Some(r.service_id),
        CmMessage::SidrReq(s) => Some(s.service_id),
        CmMessage::SidrRep(s) => Some(s.service_id),
        _ => note.service_id,
    }
}

fn cma(msg: &CmMessage, have: usize) -> Option<CmaHeader> {
    cma_header(msg).filter(|_| have >= cma_end(msg))
}

/// `field`'s value in `ev` (with its tracking note), or `None` when the message has no such
/// field (or the snaplen cut it off).
pub(crate) fn get<'a>(field: Field, ev: &'a CmEvent, note: &'a Note) -> Option<Got<'a>> {
    use Got::{Bool, Num, Str};
    let msg = &ev.mad.msg;
    let have = ev.captured.map_or(256, usize::from);
    let req = match msg {
        CmMessage::Req(r) => Some(r),
        _ => None,
    };
    // A REQ field ending at MAD byte `end`, when captured.
    let req_f = |end: usize| req.filter(|_| have >= end);
    let rep_f = |end: usize| match msg {
        CmMessage::Rep(r) if have >= end => Some(r),
        _ => None,
    };
    Some(match field {
        Field::Frame => Num(ev.frame),
        Field::Msg => Str(msg_name(msg)),
        Field::AttrId => Num(u64::from(msg.attr_id().raw())),
        Field::Tid => Num(ev.mad.header.tid.0),
        Field::Lcid => Num(u64::from(msg.local_comm_id()?.0)),
        Field::Rcid => Num(u64::from(msg.remote_comm_id()?.0)),
        Field::Sid => Num(service_id(msg, note)?.0),
        Field::SidPort => Num(u64::from(service_id(msg, note)?.rdma_cm_port()?.1)),
        Field::SidPs => Str(service_id(msg, note)?.rdma_cm_port()?.0.name()),
        Field::CaGuid => match msg {
            CmMessage::Req(r) if have >= 48 => Num(r.local_ca_guid.0),
            CmMessage::Rep(r) if have >= 60 => Num(r.local_ca_guid.0),
            _ => return None,
        },
        Field::Qpn => match msg {
            CmMessage::Req(r) if have >= 59 => Num(u64::from(r.local_qpn.get())),
            CmMessage::Rep(r) if have >= 39 => Num(u64::from(r.local_qpn.get())),
            CmMessage::SidrRep(s) if have >= 35 => Num(u64::from(s.qpn.get())),
            _ => return None,
        },
        Field::RemoteQpn => match msg {
            CmMessage::Dreq(d) if have >= 35 => Num(u64::from(d.remote_qpn_eecn.get())),
            CmMessage::Lap(l) if have >= 35 => Num(u64::from(l.remote_qpn_eecn.get())),
            _ => return None,
        },
        Field::Eecn => Num(u64::from(rep_f(43)?.local_eecn.get())),
        Field::Psn => match msg {
            CmMessage::Req(r) if have >= 71 => Num(u64::from(r.starting_psn.get())),
            CmMessage::Rep(r) if have >= 47 => Num(u64::from(r.starting_psn.get())),
            _ => return None,
        },
        Field::Transport => Str(match req_f(76)?.transport() {
            ibcm_mad::ReqTransport::Rc => "RC",
            ibcm_mad::ReqTransport::Uc => "UC",
            ibcm_mad::ReqTransport::Xrc => "XRC",
            ibcm_mad::ReqTransport::Other => "other",
        }),
        Field::Xrc => Bool(msg.is_xrc() || note.xrc),
        Field::RejReason => match msg {
            CmMessage::Rej(r) if have >= 36 => Num(u64::from(r.reason.raw())),
            _ => return None,
        },
        Field::RejName => match msg {
            CmMessage::Rej(r) if have >= 36 => Str(r.reason.name()),
            _ => return None,
        },
        Field::RejMsg => match msg {
            CmMessage::Rej(r) => Str(r.message_rejected.name()),
            _ => return None,
        },
        Field::MraTimeout => match msg {
            CmMessage::Mra(m) if have >= 34 => Num(u64::from(m.service_timeout.get())),
            _ => return None,
        },
        Field::SidrStatus => match msg {
            CmMessage::SidrRep(s) => Num(u64::from(s.status.raw())),
            _ => return None,
        },
        Field::SidrQkey => match msg {
            CmMessage::SidrRep(s) if have >= 48 => Num(u64::from(s.qkey.0)),
            _ => return None,
        },
        Field::RequestId => match msg {
            CmMessage::SidrReq(s) => Num(u64::from(s.request_id.0)),
            CmMessage::SidrRep(s) => Num(u64::from(s.request_id.0)),
            _ => return None,
        },
        Field::Mtu => Num(u64::from(req_f(76)?.path_mtu.bytes()?)),
        Field::RetryCount => Num(u64::from(req_f(76)?.retry_count.get())),
        Field::RnrRetryCount => match msg {
            CmMessage::Req(r) if have >= 76 => Num(u64::from(r.rnr_retry_count.get())),
            CmMessage::Rep(r) if have >= 52 => Num(u64::from(r.rnr_retry_count.get())),
            _ => return None,
        },
        Field::ResponderResources => match msg {
            CmMessage::Req(r) if have >= 76 => Num(u64::from(r.responder_resources)),
            CmMessage::Rep(r) if have >= 52 => Num(u64::from(r.responder_resources)),
            _ => return None,
        },
        Field::InitiatorDepth => match msg {
            CmMessage::Req(r) if have >= 76 => Num(u64::from(r.initiator_depth)),
            CmMessage::Rep(r) if have >= 52 => Num(u64::from(r.initiator_depth)),
            _ => return None,
        },
        Field::Pkey => match msg {
            CmMessage::Req(r) if have >= 76 => Num(u64::from(r.partition_key.0)),
            CmMessage::SidrReq(s) => Num(u64::from(s.partition_key.0)),
            _ => return None,
        },
        Field::FlowLabel => Num(u64::from(req_f(120)?.primary_path.flow_label.get())),
        Field::Sl => Num(u64::from(req_f(120)?.primary_path.sl.get())),
        Field::AckTimeout => Num(u64::from(req_f(120)?.primary_path.local_ack_timeout.get())),
        Field::CmaSrc => Got::Addr(WireAddr::Ip(cma(msg, have)?.src)),
        Field::CmaDst => Got::Addr(WireAddr::Ip(cma(msg, have)?.dst)),
        Field::CmaPort => Num(u64::from(cma(msg, have)?.src_port)),
        Field::Conn => Num(note.conn?),
        Field::From => Str(note.from?.as_str()),
        Field::Retrans => Bool(note.retrans),
        Field::Dup => Bool(note.dup),
        Field::Icrc => Str(ev.icrc.as_str()),
        Field::Truncated => Bool(ev.captured.is_some()),
        Field::Src => Got::Addr(ev.src),
        Field::Dst => Got::Addr(ev.dst),
        Field::Addr => Got::Addrs(ev.src, ev.dst),
        Field::Encap => Str(ev.encap.name()),
        Field::NvmeQid => match upper::decode(msg, service_id(msg, note), have)? {
            Upper::NvmeReq(r) => Num(u64::from(r.qid)),
            _ => return None,
        },
        Field::NvmeQsize => match upper::decode(msg, service_id(msg, note), have)? {
            Upper::NvmeReq(r) => Num(u64::from(r.hrqsize)),
            Upper::NvmeRep(r) => Num(u64::from(r.crqsize)),
            _ => return None,
        },
        Field::NvmeStatus => match upper::decode(msg, service_id(msg, note), have)? {
            Upper::NvmeRej(r) => Num(u64::from(r.status)),
            _ => return None,
        },
    })
}
