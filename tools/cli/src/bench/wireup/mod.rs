//! `cm-bench wireup`: an MPI/SHMEM-style static all-to-all wire-up of N nodes × P processes
//! over ibcm's deterministic simulator (`ibcm::sim`) with the real endpoint.
//!
//! * `rc`: one RC connection per pair of processes on different nodes;
//! * `xrc`: one XRC INI per (process, remote node), each to its own TGT on that node;
//! * `xrc-sidr`: one physical XRC connection per ordered node pair and one SIDR_REQ/SIDR_REP
//!   per pair of processes for the logical connection.
//!
//! Each node's CM is one server handling `--cm-rate` MADs per second (received plus sent);
//! links have a latency and a loss rate; retransmissions are the endpoint's own. Up to
//! `--full-max-ends` connection ends the whole fabric is simulated; beyond, node 0 is
//! simulated in full against modelled peers ([`fabric::run_model`]). docs/scale.md has the
//! figures.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ibcm_mad::xrc::OwnershipPolicy;

mod app;
mod fabric;
mod plan;
mod report;
#[cfg(test)]
mod tests;

use fabric::{Outcome, Setup};
use plan::{Mode, Shape};

/// MADs one node's CM handles per second by default: `cm-bench rate` on this project's 2-core
/// test machine (2026-12-01, loaded, best of three) set up 50,131 connections/s between two
/// endpoints in one process; each connection's 3 MADs are sent once and received once there,
/// 6 MADs handled per connection: 300,786 MADs/s.
pub(crate) const DEFAULT_CM_RATE: f64 = 300_786.0;

/// Bytes of CM state per established connection by default: `cm-bench scale --no-thp --conns
/// 1000000` on the same machine (issue 14, §2; 383 before the compact connection table).
pub(crate) const DEFAULT_CONN_BYTES: u64 = 106;

/// How the whole fabric is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum MethodArg {
    /// Full simulation up to `--full-max-ends` connection ends, the per-node model beyond.
    Auto,
    /// Every node and connection.
    Full,
    /// Node 0 in full against modelled peers.
    Model,
}

/// TGT ownership policy asked for in each XRC REQ (ibcm-xrc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PolicyArg {
    /// Lives until its owner destroys it.
    Explicit,
    /// Destroyed with its XRC domain.
    DomainBound,
    /// Destroyed when its creating process exits.
    ProcessBound,
    /// Reference-counted.
    Shared,
}

impl From<PolicyArg> for OwnershipPolicy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Explicit => OwnershipPolicy::Explicit,
            PolicyArg::DomainBound => OwnershipPolicy::DomainBound,
            PolicyArg::ProcessBound => OwnershipPolicy::ProcessBound,
            PolicyArg::Shared => OwnershipPolicy::Shared,
        }
    }
}

/// `cm-bench wireup` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct WireupArgs {
    /// Nodes.
    #[arg(long, default_value_t = 16)]
    pub nodes: u32,
    /// Processes per node.
    #[arg(long, default_value_t = 4)]
    pub ppn: u32,
    /// Connection scheme.
    #[arg(long, value_enum, default_value_t = Mode::Xrc)]
    pub mode: Mode,
    /// Probability that a MAD is lost on a link.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Seed of the simulator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// TGT ownership policy asked for in XRC REQs.
    #[arg(long, value_enum, default_value_t = PolicyArg::ProcessBound)]
    pub policy: PolicyArg,
    /// Operations one process (and, for xrc-sidr, one node's physical-connection agent) has
    /// in flight.
    #[arg(long, default_value_t = 8)]
    pub window: u32,
    /// MADs (received plus sent) one node's CM handles per second.
    #[arg(long, default_value_t = DEFAULT_CM_RATE)]
    pub cm_rate: f64,
    /// One-way link latency in microseconds.
    #[arg(long, default_value_t = 5.0)]
    pub latency_us: f64,
    /// Bytes of CM state per connection (for CM state/node).
    #[arg(long, default_value_t = DEFAULT_CONN_BYTES)]
    pub conn_bytes: u64,
    /// Full simulation or per-node model.
    #[arg(long, value_enum, default_value_t = MethodArg::Auto)]
    pub method: MethodArg,
    /// With `--method auto`: the largest fabric (connection ends of all nodes) simulated in
    /// full.
    #[arg(long, default_value_t = 2_000_000)]
    pub full_max_ends: u64,
    /// Simulated seconds after which an unfinished wire-up is reported as such.
    #[arg(long, default_value_t = 3600.0)]
    pub max_secs: f64,
}

impl WireupArgs {
    pub(crate) fn setup(&self) -> Result<Setup> {
        if self.nodes < 2 || self.ppn < 1 {
            bail!("need at least 2 nodes and 1 process per node");
        }
        if !(0.0..1.0).contains(&self.loss) {
            bail!("--loss must be in [0, 1)");
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if self.window == 0
            || !positive(self.cm_rate)
            || !(positive(self.latency_us) || self.latency_us == 0.0)
        {
            bail!("--window, --cm-rate must be positive and --latency-us not negative");
        }
        if !positive(self.max_secs) {
            bail!("--max-secs must be positive");
        }
        Ok(Setup {
            shape: Shape {
                nodes: self.nodes,
                ppn: self.ppn,
                mode: self.mode,
            },
            loss: self.loss,
            seed: self.seed,
            window: self.window,
            cm_rate: self.cm_rate,
            latency: Duration::try_from_secs_f64(self.latency_us / 1e6)
                .context("--latency-us out of range")?,
            policy: self.policy.into(),
            max_time: Duration::try_from_secs_f64(self.max_secs)
                .context("--max-secs out of range")?,
            first_qpn: app::FIRST_QPN,
        })
    }

    fn full(&self, s: &Setup) -> bool {
        match self.method {
            MethodArg::Full => true,
            MethodArg::Model => false,
            MethodArg::Auto => {
                u64::from(s.shape.nodes).saturating_mul(s.shape.ends_per_node())
                    <= self.full_max_ends
            }
        }
    }
}

/// Runs one wire-up and returns what it measured.
pub(crate) fn simulate(a: &WireupArgs) -> Result<(Setup, Outcome)> {
    let s = a.setup()?;
    let out = if a.full(&s) {
        fabric::run_full(&s)
    } else {
        fabric::run_model(&s)
    };
    Ok((s, out))
}

/// `cm-bench wireup`.
pub(crate) fn run(a: &WireupArgs) -> Result<()> {
    let s = a.setup()?;
    println!(
        "wireup: {} {}×{}, loss {}, seed {}, window {}/process, CM {:.0} MADs/s/node{}, link {} µs, \
         TGT policy {:?}",
        s.shape.mode.name(),
        s.shape.nodes,
        s.shape.ppn,
        s.loss,
        s.seed,
        s.window,
        s.cm_rate,
        if a.cm_rate == DEFAULT_CM_RATE {
            " (default, measured with cm-bench rate)"
        } else {
            ""
        },
        a.latency_us,
        s.policy
    );
    // The simulator's own wall time is what is measured here; nothing simulated reads it.
    let t0 = std::time::Instant::now();
    let (setup, out) = simulate(a)?;
    let wall = t0.elapsed();
    let r = report::Report {
        setup: &setup,
        out: &out,
        conn_bytes: a.conn_bytes,
        wall,
        rss: report::peak_rss(),
    };
    for l in r.lines() {
        println!("{l}");
    }
    if !out.complete {
        bail!("the wire-up did not complete");
    }
    Ok(())
}
