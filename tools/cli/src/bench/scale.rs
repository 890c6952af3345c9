//! `cm-bench scale`: memory per connection and the setup rate with a million connections in
//! the table against the rate with a thousand, in the sans-IO core.
//!
//! Two [`Endpoint`]s in this thread exchange MADs in memory (no transport): A connects, B's
//! application accepts every request, until N connections are established in both; nothing is
//! torn down.
//! * **Memory**: the process's RSS growth over the fill divided by 2N, printed next to the
//!   core's own count by structure (`Endpoint::memory`, from the capacities).
//! * **Rate**: connections set up per second of this thread's CPU time
//!   (`CLOCK_THREAD_CPUTIME_ID`; both endpoints run on it), in batches of 1,000. *rate@1k* is
//!   the median of batches on a fresh pair of endpoints holding up to 5,000 connections,
//!   *rate@N* the median of batches on the full pair (N to N + 5,000 connections). The two are
//!   measured **interleaved** once the pair is full: five rounds of five batches on a fresh
//!   pair, then five on the full one, 25 batches each. On a shared machine the CPU time of a
//!   batch moves by ±30 % over seconds (other processes' cache pressure, the hypervisor);
//!   measured seconds apart, as the first and the last batches of the fill are, that drift
//!   alone moved the ratio between 0.54 and 1.11 for the same binary. Those sequential figures
//!   (medians of the fill's first five and last five batches) are printed too, labelled.
//! * Last line: `scale: <bytes> B/conn; rate@1k: <conn/s>; rate@N: <conn/s>; ratio: <x.xx>`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use ibcm::proto::{
    AcceptParams, ConnectParams, Endpoint, EndpointConfig, EventKind, ListenOptions, PeerAddr,
};
use ibcm_mad::{Guid, Qpn, ServiceId};

use super::sys;

/// Connections per timed batch.
const BATCH: u64 = 1_000;
/// Batches per round and rounds of the interleaved measurement.
const BATCHES: u64 = 5;
const ROUNDS: u64 = 5;

/// This thread's CPU time (user + system).
fn thread_cpu() -> Result<Duration> {
    sys::thread_cpu_clock().context("clock_gettime(CLOCK_THREAD_CPUTIME_ID)")
}

/// Two endpoints wired in memory; B's application accepts every request.
struct Pair {
    a: Endpoint,
    b: Endpoint,
    a_addr: PeerAddr,
    b_addr: PeerAddr,
    now: Instant,
    queue: VecDeque<(bool, Bytes)>,
    sid: ServiceId,
    /// B's next QPN.
    qpn_b: u32,
    /// A's next QPN (one per connection).
    qpn_a: u32,
    established: u64,
}

impl Pair {
    fn new(now: Instant, huge_pages: bool) -> Result<Pair> {
        let a_addr = PeerAddr::Udp("127.0.0.1:4791".parse()?);
        let b_addr = PeerAddr::Udp("127.0.0.2:4791".parse()?);
        let sid = ServiceId(0x1234);
        let mut p = Pair {
            a: Endpoint::new(EndpointConfig {
                rng_seed: Some(1),
                huge_pages,
                ..Default::default()
            }),
            b: Endpoint::new(EndpointConfig {
                rng_seed: Some(2),
                local_ca_guid: Guid(2),
                max_half_open: usize::MAX,
                max_established: usize::MAX,
                max_established_per_peer: usize::MAX,
                huge_pages,
                ..Default::default()
            }),
            a_addr,
            b_addr,
            now,
            queue: VecDeque::new(),
            sid,
            qpn_b: 0x80_0000,
            qpn_a: 0,
            established: 0,
        };
        p.b.listen(sid, ListenOptions::default());
        Ok(p)
    }

    /// Moves MADs until both sides are quiet; B accepts every request.
    fn pump(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(t) = self.a.poll_transmit() {
                self.queue.push_back((true, t.mad));
            }
            while let Some(t) = self.b.poll_transmit() {
                self.queue.push_back((false, t.mad));
            }
            while let Some(ev) = self.b.poll_event() {
                progressed = true;
                if let EventKind::ReqReceived(_) = ev.kind {
                    self.qpn_b = self.qpn_b.wrapping_add(1);
                    let q = Qpn::masked(self.qpn_b);
                    let _ = self.b.accept(self.now, ev.conn, AcceptParams::new(q));
                }
            }
            while let Some(ev) = self.a.poll_event() {
                progressed = true;
                if ev.kind == EventKind::Established {
                    self.established += 1;
                }
            }
            if let Some((to_b, mad)) = self.queue.pop_front() {
                progressed = true;
                if to_b {
                    self.b.handle_datagram(self.now, self.a_addr, &mad);
                } else {
                    self.a.handle_datagram(self.now, self.b_addr, &mad);
                }
            }
            if !progressed {
                return;
            }
        }
    }

    /// Sets up `count` connections one after the other; returns (connections per CPU second,
    /// per wall second).
    fn batch(&mut self, count: u64) -> Result<(f64, f64)> {
        let t = Instant::now();
        let cpu0 = thread_cpu()?;
        for _ in 0..count {
            let q = Qpn::masked(self.qpn_a);
            self.qpn_a = self.qpn_a.wrapping_add(1);
            self.a
                .connect(self.now, ConnectParams::new(self.b_addr, self.sid, q))
                .map_err(|e| anyhow::anyhow!("connect {}: {e}", self.established))?;
            self.pump();
        }
        let cpu = thread_cpu()?.saturating_sub(cpu0).as_secs_f64();
        let wall = t.elapsed().as_secs_f64();
        Ok((count as f64 / cpu.max(1e-6), count as f64 / wall.max(1e-9)))
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// What backs the tables: the core's huge-page advice, glibc's tunable, the kernel's THP mode
/// and the huge pages the process holds now (`/proc`; "unknown" where it cannot be read).
fn pages_line(huge_pages: bool) -> String {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| {
            let (_, rest) = s.split_once('[')?;
            Some(rest.split_once(']')?.0.to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let held = std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("AnonHugePages:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.0} MiB", kib as f64 / 1024.0))
        })
        .unwrap_or_else(|| "unknown".into());
    let tunable = std::env::var("GLIBC_TUNABLES").unwrap_or_else(|_| "not set".into());
    format!(
        "pages: the core's huge-page advice (EndpointConfig::huge_pages) {}; GLIBC_TUNABLES \
         {tunable}; kernel THP mode {thp}; huge pages held now {held}",
        if huge_pages { "on" } else { "off" }
    )
}

/// Runs the measurement and prints the figures (`rss_bytes`: the process's RSS now;
/// `huge_pages`: the endpoints' `EndpointConfig::huge_pages`).
pub(crate) fn scale(n: u64, huge_pages: bool, rss_bytes: fn() -> u64) -> Result<()> {
    anyhow::ensure!(n >= 2 * BATCH, "--conns must be at least {}", 2 * BATCH);
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut p = Pair::new(now, huge_pages)?;
    let rss0 = rss_bytes();
    // The fill, batch by batch (the sequential figures: its first and last five batches).
    let (mut rates, mut wall_rates) = (Vec::new(), Vec::new());
    let mut i = 0u64;
    while i < n {
        let this = BATCH.min(n - i);
        let (cpu, wall) = p.batch(this)?;
        rates.push(cpu);
        wall_rates.push(wall);
        i += this;
    }
    anyhow::ensure!(
        p.established == n,
        "only {} of {n} established",
        p.established
    );
    anyhow::ensure!(p.a.len() as u64 == n && p.b.len() as u64 == n);
    let rss1 = rss_bytes();
    let per = rss1.saturating_sub(rss0) as f64 / (2 * n) as f64;
    println!(
        "held {n} established connections in each of two endpoints; RSS {:.1} MiB -> {:.1} MiB",
        rss0 as f64 / 1048576.0,
        rss1 as f64 / 1048576.0
    );
    println!("{}", pages_line(huge_pages));
    let (ma, mb) = (p.a.memory(), p.b.memory());
    let per_conn = |x: usize, y: usize| (x + y) as f64 / (2 * n) as f64;
    println!(
        "the core's own count (Endpoint::memory, from capacities): {:.0} B/conn = records {:.0} \
         + indexes {:.0} + local QPNs {:.0} + side tables {:.0} + peers {:.1}",
        per_conn(ma.total(), mb.total()),
        per_conn(ma.records, mb.records),
        per_conn(ma.indexes, mb.indexes),
        per_conn(ma.qpns, mb.qpns),
        per_conn(ma.side, mb.side),
        per_conn(ma.peers, mb.peers),
    );
    let k = BATCHES as usize;
    let first = |v: &[f64]| median(v.get(..k.min(v.len())).unwrap_or(&[]));
    let last = |v: &[f64]| median(v.get(v.len().saturating_sub(k)..).unwrap_or(&[]));
    println!(
        "sequential (the fill's first and last five batches, seconds apart), per CPU second: \
         rate@1k: {:.0}; rate@N: {:.0}; ratio: {:.2}; by the clock: rate@1k: {:.0}; rate@N: \
         {:.0}; ratio: {:.2}",
        first(&rates),
        last(&rates),
        last(&rates) / first(&rates),
        first(&wall_rates),
        last(&wall_rates),
        last(&wall_rates) / first(&wall_rates),
    );
    // Interleaved: a fresh pair's first batches, then the full pair's next ones, in turn.
    let (mut small, mut large, mut small_wall, mut large_wall) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let mut fresh = Pair::new(now, huge_pages)?;
        for _ in 0..BATCHES {
            let (cpu, wall) = fresh.batch(BATCH)?;
            small.push(cpu);
            small_wall.push(wall);
        }
        drop(fresh);
        for _ in 0..BATCHES {
            let (cpu, wall) = p.batch(BATCH)?;
            large.push(cpu);
            large_wall.push(wall);
        }
    }
    anyhow::ensure!(
        p.established == n + ROUNDS * BATCHES * BATCH,
        "only {} of {} established",
        p.established,
        n + ROUNDS * BATCHES * BATCH
    );
    let (r1k, rn) = (median(&small), median(&large));
    println!(
        "interleaved ({ROUNDS} rounds of {BATCHES} batches of {BATCH} on a fresh pair, then on \
         the full one), by the clock: rate@1k: {:.0} conn/s; rate@N: {:.0} conn/s; ratio: {:.2}",
        median(&small_wall),
        median(&large_wall),
        median(&large_wall) / median(&small_wall)
    );
    println!(
        "scale: {per:.0} B/conn; rate@1k: {r1k:.0}; rate@N: {rn:.0}; ratio: {:.2}",
        rn / r1k
    );
    Ok(())
}
