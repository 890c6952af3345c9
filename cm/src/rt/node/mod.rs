//! The node's CM service: one daemon (`ibcmd`) owns the node's CM endpoint and serves the
//! node's processes on a Unix socket, as the kernel's `rdma_cm` serves them through
//! `/dev/infiniband/rdma_cm`. A process attaches with [`Cm::attach`](crate::rt::Cm::attach)
//! and uses the ordinary [`Cm`](crate::rt::Cm) API; when it dies, its socket closes and the
//! daemon disconnects its connections at once.
//!
//! * `proto`: the socket protocol ([`proto::ClientMsg`], [`proto::DaemonMsg`]), JSON in
//!   length-prefixed frames; `wire` and `errors`: the parameters, messages, errors and
//!   statuses in it;
//! * `client`: [`attach`], the task that forwards a [`Cm`](crate::rt::Cm)'s commands;
//! * `server`: [`NodeServer`], the daemon's sessions, ownership and limits; `requests`: a
//!   session's requests; `config`: [`ServerConfig`], its limits and options; `hooks`:
//!   [`NodeHooks`], what the embedder (`ibcmd`) adds around the CM;
//! * `sidr`: SIDR both ways and the counters through the service;
//! * `paths`: path queries (`lid:N`, `gid:G`, with an alternate path) answered from the
//!   daemon's SA client;
//! * `lap`: path migration (LAP/APR) for the clients: their LAPs sent, the LAPs of their
//!   connections delivered to those that answer them, the answers;
//! * `journal`: [`StateDir`] and [`Journal`], the daemon's private state directory and its
//!   file of live connections for a restart.
//!
//! The protocol, the ownership rules and an example session: `docs/ibcmd.md`.

mod client;
mod config;
mod errors;
mod fields;
mod hooks;
pub mod journal;
mod lap;
mod paths;
pub mod proto;
mod requests;
mod server;
mod sidr;
mod wire;

pub use client::{attach, Attached, Node, NodeError};
pub use config::{Reservation, ServerConfig};
pub use hooks::{EventSink, HookFuture, NodeHooks, SessionInfo, XrcListenReq};
pub use journal::{Journal, JournalEntry, JournalTx, Replay, StateDir, DEFAULT_STATE_DIR};
pub(crate) use paths::NodePaths;
pub use server::NodeServer;
