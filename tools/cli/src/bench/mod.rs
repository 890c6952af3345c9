//! `cm-bench`'s benchmarks: CM performance, each number next to a baseline measured in the same
//! run. The binary parses [`Args`] and calls [`run`].
//!
//! ```text
//! cm-bench rate  [--conns N] [--parallel K]    connection setup over RoCEv2/UDP on loopback
//! cm-bench scale [--conns N]                   1M connections in memory: bytes/conn, rate
//! cm-bench scale --rt [--conns N]              the same through ibcm::rt: bytes/conn vs core
//! cm-bench flood [--legit N] [--attacks N]     an off-path attacker on loopback (see below)
//! cm-bench flood --target IP --client IP --sources-from IP [--rate R] [--hold-until PATH]
//!                                              the same against a listener on another host
//! cm-bench wireup --nodes N --ppn P --mode rc|xrc|xrc-sidr [--loss X] [--seed S]
//!                                              an all-to-all wire-up in the simulator
//! cm-bench node-kill [--conns N] [--rounds R]  SIGKILL of an ibcmd client → DREQ on the wire
//! ```
//!
//! * `rate`: ibcm's MAD rate between two endpoints on 127.0.0.1:P and 127.0.0.2:P (UDP),
//!   each on its own thread: N connections set up with K in flight and torn down, 5 MADs
//!   each (REQ, REP, RTU, DREQ, DREP), against the path's limit measured in the same run:
//!   300-byte datagrams between two sockets on the same addresses, `sendmmsg`/`recvmmsg` with
//!   64 per call, one sender and one receiver thread (the `rate` module's docs: what is counted).
//!   Last line: `rate: <conn/s> conn/s; mads: <MAD/s> MAD/s; limit: <datagrams/s>
//!   datagrams/s (batched); ratio: <x.xx>`.
//! * `scale`: two sans-IO endpoints exchange MADs in memory (the core without any transport);
//!   N connections are established and held. Memory is the RSS growth divided by N and by 2
//!   (both endpoints hold N connections), printed next to the core's own count by structure
//!   (`Endpoint::memory`, from the capacities); the setup rate is the median of batches of
//!   1,000 connections on a fresh pair (up to 5,000 held) and on the full pair, per second of
//!   the thread's CPU time, measured in turn once the pair is full (the `scale` module's docs).
//!   Last line:
//!   `scale: <bytes> B/conn; rate@1k: <conn/s>; rate@N: <conn/s>; ratio: <x.xx>`.
//! * `scale --rt`: N connections held through the async API (the `scale_rt` module's docs). Last
//!   line: `scale-rt: <bytes> B/conn; core: <bytes> B/conn; ratio: <x.xx>`.
//! * `flood`: a REQ flood at the highest rate one thread can send, from spoofed loopback
//!   sources, while a client connects N times; then blind-RTU and spoofed-teardown attempts
//!   (the `flood` module's docs; `--stateless`: the listener's stateless mode). Last line:
//!   `flood: success <r> (<ok>/<n>); connect ms p50 <a> p99 <b>; amplification <x>;
//!   blind-rtu <s>/<n>; teardown <s>/<n>; reqs <count> at <rate>/s; mode <m>`.
//! * `wireup`: every process connects to every process of the other nodes, over the
//!   simulator (the `wireup` module's docs, docs/scale.md). Last line: `wireup: <mode> N×P:
//!   <secs> s to full mesh; <qps> QPs/node; <bytes> B CM state/node; <msgs> MADs`.

use std::net::IpAddr;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

mod flood;
mod host;
mod node_kill;
mod rate;
mod scale;
mod scale_rt;
mod sys;
mod wireup;

/// `cm-bench`'s command line: the benchmark to run and its options.
#[derive(Debug, Parser)]
#[command(name = "cm-bench", version, about = "ibcm benchmarks")]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// SIGKILL of a client of the node's CM service (`ibcmd`) → the DREQs at the peer
    /// ([`node_kill`] module docs).
    NodeKill {
        #[arg(long, default_value_t = 16)]
        conns: u64,
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// The daemon's address (UDP 4791).
        #[arg(long, default_value = "127.0.0.40")]
        daemon_ip: IpAddr,
        /// This process's endpoint's address (UDP 4791).
        #[arg(long, default_value = "127.0.0.41")]
        peer_ip: IpAddr,
        /// Where `ibcmd` and `cm-ping` are (default: next to cm-bench).
        #[arg(long)]
        bin_dir: Option<std::path::PathBuf>,
        /// Kill and restart the daemon instead of a client: the time from the restart to
        /// the DREQs of the connections its journal names.
        #[arg(long)]
        restart: bool,
        /// With --restart: drop the DREQs that arrive here in the first N ms after the
        /// restart (the daemon must retransmit them).
        #[arg(long, default_value_t = 0, requires = "restart")]
        drop_ms: u64,
    },
    /// ibcm's MAD rate over RoCEv2/UDP loopback (connection setup and teardown) vs the
    /// batched raw UDP datagram rate between the same addresses.
    Rate {
        /// Connections to set up.
        #[arg(long, default_value_t = 20_000)]
        conns: u64,
        /// Connections in flight (256: enough that neither endpoint's thread waits for the
        /// other's batch).
        #[arg(long, default_value_t = 256)]
        parallel: u64,
        /// UDP port for both endpoints (4791 by default).
        #[arg(long, default_value_t = 4791)]
        port: u16,
        /// Datagrams per raw UDP baseline measurement (below 100,000 a warning says the
        /// baselines are too short to be the path's steady rate).
        #[arg(long, default_value_t = 300_000)]
        datagrams: u64,
        /// Rounds of (sleeping baseline, polling baseline, ibcm): each round's ibcm run is
        /// set against the better of its two baselines, and the ratio is the median round's.
        #[arg(long, default_value_t = 3)]
        rounds: u32,
    },
    /// Memory per connection and setup rate with many live connections (in memory).
    Scale {
        /// Connections to hold.
        #[arg(long, default_value_t = 1_000_000)]
        conns: u64,
        /// Do not re-run with glibc's huge-page tunable (see below): the allocator's default
        /// settings, as a runtime that embeds ibcm runs. The core's own huge-page advice for
        /// its tables stays on (see --small-pages).
        #[arg(long)]
        no_thp: bool,
        /// Turn the core's huge-page advice off (`EndpointConfig::huge_pages = false`); with
        /// --no-thp nothing asks for huge pages.
        #[arg(long)]
        small_pages: bool,
        /// Through the async API (`ibcm::rt`, two `Cm` endpoints over an in-memory network,
        /// every `Connection` handle held) instead of the sans-IO core; prints B/conn next to
        /// the core's, measured in a child process of the same run.
        #[arg(long)]
        rt: bool,
        /// With --rt: connections in flight.
        #[arg(long, default_value_t = 256)]
        parallel: u64,
    },
    /// A REQ flood from spoofed loopback sources during legitimate connects; blind RTUs and
    /// spoofed teardowns. Prints success, amplification and attack success ratios.
    Flood {
        /// The flood, the legitimate clients and the attacks (both modes).
        #[command(flatten)]
        attack: flood::AttackOpts,
        /// UDP port of every endpoint (loopback only; 4791 is left to cm-ping).
        #[arg(long, default_value_t = 4799, display_order = 6)]
        port: u16,
        /// The listener answers statelessly under pressure (`Cm::listen_stateless`; cookie
        /// REPs, docs/protocol.md §5.12).
        #[arg(long)]
        stateless: bool,
        /// With --stateless: the half-open count at which it starts (default: the endpoint's
        /// default, 1024).
        #[arg(long)]
        stateless_threshold: Option<usize>,
        /// With --stateless: answer every REQ statelessly.
        #[arg(long)]
        stateless_always: bool,
        /// Attack a listener on another host (IP, UDP 4791) instead of one in this process:
        /// needs --client and --sources-from; its mode is its own (no --stateless here).
        #[arg(long, requires_all = ["client", "sources_from"], conflicts_with_all = ["stateless", "stateless_threshold", "stateless_always"])]
        target: Option<std::net::IpAddr>,
        /// --target: the listener's rdma_cm port (service ID 0x0106 << 16 | PORT).
        #[arg(long, default_value_t = 7471)]
        rdma_port: u16,
        /// --target: the legitimate client's address (this host's, UDP 4791).
        #[arg(long, requires = "target")]
        client: Option<std::net::IpAddr>,
        /// --target: the first of --sources + 2 consecutive IPv4 addresses this host owns
        /// (the flood's sources, the targeted attacks' source, the victims' client).
        #[arg(long, requires = "target")]
        sources_from: Option<std::net::Ipv4Addr>,
        /// --target: REQs per second of the flood (0: as fast as one thread sends).
        #[arg(long, default_value_t = 0, requires = "target")]
        rate: u64,
        /// --target: hold the legitimate and victim connections until this file exists.
        #[arg(long, requires = "target")]
        hold_until: Option<std::path::PathBuf>,
        /// --target: the longest hold, in seconds.
        #[arg(long, default_value_t = 60.0)]
        hold_secs: f64,
        /// --target: every flood REQ's CM response timeout exponent (default: half 0, half 31).
        #[arg(long, requires = "target", value_parser = clap::value_parser!(u8).range(0..32))]
        req_timeout: Option<u8>,
    },
    /// An all-to-all wire-up of N nodes × P processes (rc, xrc, xrc-sidr) in the simulator.
    Wireup(wireup::WireupArgs),
}

/// Runs the benchmark `args` names; its report goes to stdout, its progress to stderr.
pub fn run(args: Args) -> Result<()> {
    match args.cmd {
        Cmd::NodeKill {
            conns,
            rounds,
            daemon_ip,
            peer_ip,
            bin_dir,
            restart,
            drop_ms,
        } => node_kill::node_kill(&node_kill::NodeKillOpts {
            conns,
            rounds,
            daemon_ip,
            peer_ip,
            bin_dir,
            restart,
            drop_ms,
        }),
        Cmd::Rate {
            conns,
            parallel,
            port,
            datagrams,
            rounds,
        } => rate::rate(rate::RateOpts {
            conns,
            parallel,
            port,
            datagrams,
            rounds,
        }),
        Cmd::Wireup(a) => wireup::run(&a),
        Cmd::Flood {
            attack,
            port,
            stateless,
            stateless_threshold,
            stateless_always,
            target,
            rdma_port,
            client,
            sources_from,
            rate,
            hold_until,
            hold_secs,
            req_timeout,
        } => match (target, client, sources_from) {
            (Some(target), Some(client), Some(sources_from)) => {
                flood::remote::flood_remote(&flood::remote::RemoteOpts {
                    target,
                    rdma_port,
                    client,
                    sources_from,
                    attack,
                    rate,
                    hold_until,
                    hold_secs,
                    req_timeout,
                })
            }
            _ => flood::flood(flood::FloodOpts {
                attack,
                port,
                stateless,
                stateless_threshold,
                stateless_always,
            }),
        },
        Cmd::Scale {
            conns,
            rt: true,
            parallel,
            ..
        } => scale_rt::scale_rt(conns, parallel, rss_bytes),
        Cmd::Scale {
            conns,
            no_thp,
            small_pages,
            ..
        } => {
            if !no_thp && std::env::var_os("GLIBC_TUNABLES").is_none() {
                return reexec_with_thp();
            }
            scale::scale(conns, !small_pages, rss_bytes)
        }
    }
}

// ------------------------------------------------------------------------------------------
// scale

/// Runs this command again with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`: glibc then asks for
/// transparent huge pages (`madvise`) for its large allocations. A million-connection table
/// is hundreds of MiB of randomly accessed memory; with 4 KiB pages nearly every lookup also
/// misses the TLB, and measured here that alone cuts the setup rate at 1M connections by half
/// or more. A deployment holding that many connections should run the same way (or with THP
/// set to `always`). `--no-thp` measures without.
fn reexec_with_thp() -> Result<()> {
    let exe = std::env::current_exe().context("locate cm-bench")?;
    eprintln!("cm-bench: re-running with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (--no-thp to skip)");
    let status = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
        .status()
        .context("re-run cm-bench")?;
    if status.success() {
        Ok(())
    } else {
        anyhow::bail!("cm-bench scale failed: {status}")
    }
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}
