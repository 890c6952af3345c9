//! `ibcm-mad`: the InfiniBand Communication Manager (MAD class 0x07) on the wire.
//!
//! This crate parses and emits every CM message (REQ, MRA, REJ, REP, RTU, DREQ, DREP,
//! SIDR_REQ, SIDR_REP, LAP, APR and ClassPortInfo), the XRC encodings, rdma_cm's IP
//! private-data header, and the packet framing around a MAD: RoCEv2 over IPv4/IPv6 (with
//! 802.1Q/QinQ tags), RoCEv1, native InfiniBand LRH/GRH, ICRC and VCRC, and the capture link
//! layers cm-trace meets (ERF record headers, Linux cooked v1/v2, raw IP) as they sit in a
//! captured frame's bytes. Reading capture files (pcap, pcapng, raw ERF) is `ibcm-trace`'s job.
//!
//! # Contract
//! * Deterministic, no I/O, no clock, no `unsafe`.
//! * **No input makes it panic.** Every parser returns a typed error ([`ParseError`],
//!   [`FrameError`]) that names the byte offset and the reason. Unknown codes are not errors:
//!   they parse to `Unknown(raw)` variants and are emitted back unchanged.
//! * Reserved bits are ignored on parse and zeroed on emit, so `parse(emit(m)) == m` for every
//!   message and `emit(parse(b))` equals `b` with its reserved bits cleared.
//!
//! # Example
//! ```
//! use ibcm_mad::{CmMessage, Mad, MadHeader, Method, Rtu, CommId, PrivateData, Tid};
//!
//! let rtu = Rtu {
//!     local_comm_id: CommId(0x1122_3344),
//!     remote_comm_id: CommId(0x5566_7788),
//!     private_data: PrivateData::from_slice(b"hi").unwrap(),
//! };
//! let mad = Mad::new(Tid(0x0000_0002_4433_2211), CmMessage::Rtu(rtu));
//! let bytes = mad.to_bytes();
//! assert_eq!(bytes.len(), 256);
//!
//! let back = Mad::parse(&bytes).unwrap();
//! assert_eq!(back, mad);
//! assert_eq!(back.header.method, Method::Send);
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(fuzzing), warn(missing_docs))]

pub mod cm;
pub mod cma;
pub mod codes;
pub mod error;
pub mod frame;
pub mod header;
pub mod sa;
pub mod types;
pub mod xrc;

pub use cm::{
    Apr, ClassPortInfo, CmMessage, Drep, Dreq, Lap, Mad, Mra, PathInfo, Rej, Rep, Req,
    ReqTransport, Rtu, SidrRep, SidrReq, MAD_DATA_LEN, MAD_LEN,
};
pub use codes::{
    AprStatus, AttrId, ExtTransportType, FailoverAccepted, Method, MgmtClass, MsgKind, Mtu, Rate,
    RejReason, SidrStatus, TransportType,
};
pub use error::{EmitError, FrameError, ParseError};
pub use header::MadHeader;
pub use types::{
    CommId, Eecn, FlowLabel, Gid, Guid, Lid, OutOfRange, Pkey, PrivateData, PrivateDataTooLong,
    Psn, Qkey, Qpn, RequestId, ServiceId, Side, Tid, TimeoutExp, VendorId, U2, U27, U3, U4, U7,
};
