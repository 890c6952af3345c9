//! `ibcm`: an InfiniBand Communication Manager (IBTA CM, MAD class 0x07).
//!
//! * [`proto`]: the protocol as a deterministic sans-IO state machine.
//! * [`qp_attr`]: QP attributes (INIT, RTR, RTS) from a connection's REQ and REP, and those of
//!   an alternate path a LAP loads, as the kernel's `ib_cm_init_qp_attr` computes them.
//! * [`sa`]: a Subnet Administration client (PathRecords from the SM/SA of an InfiniBand
//!   fabric), sans-IO like the endpoint.
//! * [`App`]: an application run next to an endpoint, with its own timers, by the simulator
//!   and by the tokio driver alike.
//! * `rt` (feature `rt`, default): the tokio driver, async API and transports.
//! * `sim` (feature `sim`): a deterministic network simulator for tests and benchmarks.
#![deny(unsafe_code)]
#![cfg_attr(not(fuzzing), warn(missing_docs))]

pub use ibcm_mad as mad;

mod log_limit;
pub mod proto;

pub mod qp_attr;

pub mod sa;

mod app;
pub use app::App;

#[cfg(feature = "sim")]
pub mod sim;

#[cfg(feature = "rt")]
pub mod rt;

/// The Rust snippet of the repository's README, compiled as a doctest so it cannot rot.
#[cfg(all(doctest, feature = "rt"))]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
