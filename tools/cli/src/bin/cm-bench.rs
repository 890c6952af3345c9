//! `cm-bench`: CM performance, each number next to a baseline measured in the same run.
//!
//! ```text
//! cm-bench rate  [--conns N] [--parallel K]    connection setup over RoCEv2/UDP on loopback
//! cm-bench scale [--conns N]                   1M connections in memory: bytes/conn, rate
//! cm-bench scale --rt [--conns N]              the same through ibcm::rt: bytes/conn vs core
//! cm-bench flood [--legit N] [--attacks N]     an off-path attacker on loopback
//! cm-bench flood --target IP --client IP --sources-from IP [--rate R] [--hold-until PATH]
//!                                              the same against a listener on another host
//! cm-bench wireup --nodes N --ppn P --mode rc|xrc|xrc-sidr [--loss X] [--seed S]
//!                                              an all-to-all wire-up in the simulator
//! cm-bench node-kill [--conns N] [--rounds R]  SIGKILL of an ibcmd client → DREQ on the wire
//! ```
//!
//! What each benchmark measures and its last line: [`ibcm_tools::bench`].

use anyhow::Result;
use clap::Parser;
use ibcm_tools::bench::{run, Args};

fn main() -> Result<()> {
    run(Args::parse())
}
