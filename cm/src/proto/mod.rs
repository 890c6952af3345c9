//! The sans-IO CM core: deterministic, no clock, no I/O, no threads.
//!
//! [`Endpoint`] is fed received MADs ([`Endpoint::handle_datagram`]), the passage of time
//! ([`Endpoint::handle_timeout`]) and application commands, and is drained with
//! [`Endpoint::poll_transmit`], [`Endpoint::poll_timeout`] and [`Endpoint::poll_event`].
//! Behaviour follows Linux's `ib_cm` (docs/protocol.md §4): the same states, retransmission
//! rules, duplicate and stale-connection handling, and wire choices (local comm ID 0 in a REJ
//! from REQ_RCVD, the TID reused by every reply, REJ 4 with the CA GUID as ARI, …).

mod addr;
mod config;
mod conn;
mod endpoint;
mod error;
mod event;
mod ids;
mod index;
mod memory;
mod peers;
mod state;
mod stateless;
mod stats;
mod sys;
mod table;
mod timer;
mod util;

pub use addr::{IbAddr, PeerAddr};
pub use config::{
    gid_of, roce_path, AcceptParams, ConnectParams, EndpointConfig, ListenOptions, SidrRepParams,
    SidrReqParams, StaleConnection, DEFAULT_CONNECT_TIMEOUT,
};
pub use endpoint::Endpoint;
pub use error::{CallError, ConnectError};
pub use event::{
    ConnId, ConnectionError, Event, EventKind, RepInfo, ReqInfo, SidrReqInfo, Transmit,
};
pub use memory::MemoryUse;
pub use state::{LapState, Side, State};
pub use stateless::{StatelessAccept, StatelessInfo};
pub use stats::{DropReason, Stats};
