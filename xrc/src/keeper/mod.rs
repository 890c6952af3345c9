//! xrcd-keeper: the "persistent server" of the 2011 thread, as a daemon.
//!
//! On modern kernels a TGT QP lives exactly as long as some process holds a handle on it
//! (docs/xrc.md §0.1), so a QP meant to outlive its creator (`DomainBound`, orphaned
//! `Explicit`) or to be reference-counted across processes and jobs (`Shared`) needs a
//! process that holds the handle. The keeper is that process: it opens the domains, creates
//! (or opens) every TGT QP its clients ask for, holds one handle on each, and drops it when the
//! QP's [`OwnershipPolicy`](crate::OwnershipPolicy) says so. Clients talk to it over a Unix
//! socket with the JSON-lines protocol in [`proto`]; the OFED-compatible operations
//! (register, unregister, modify and query a receive QP by number, from any process) are
//! there.
//!
//! * `core::KeeperCore` (private): the state machine (no I/O; unit-tested).
//! * [`server::serve`]: the daemon (threads, `SO_PEERCRED`, client-death cleanup).
//! * [`client::KeeperClient`]: a blocking client with restart detection.
//! * `cli` (feature `cli`): the `xrcd-keeper` command line, also `ibcmd keeper`.
//! * [`node::NodeKeeper`] (feature `cm`): the same core inside `ibcmd`, acting on the
//!   registry of the node's XRC target (one registry for the CM and the keeper's clients).
//!
//! # Who may do what
//!
//! Every domain and TGT QP belongs to the uid of the client that made it (`SO_PEERCRED`); a
//! client acts only on its own objects unless the object's sharing rule admits it: a
//! file-named domain opened by another uid under the same path (and a file that uid could
//! open itself), a `Shared` QP in a domain the client was admitted to. A domain name held by
//! another uid is refused with `permission-denied`, never handed out. Clients talk only to a
//! keeper run by root or by their own user ([`client::ClientError::UntrustedDaemon`]). The
//! table of rules is in docs/xrc.md §8.4.
//!
//! A keeper restart is never silent: every reply and event carries the instance's random
//! epoch, and a client that meets a different epoch is told that all keeper-held QPs are
//! gone ([`client::ClientError::KeeperRestarted`]).

#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
mod core;
#[cfg(feature = "cm")]
pub mod node;
pub mod proto;
pub mod server;
