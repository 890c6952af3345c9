//! `cm-bench rate`: ibcm's MAD rate over RoCEv2/UDP on loopback against the path's limit,
//! measured in the same run.
//!
//! * **ibcm**: two endpoints, A on 127.0.0.1:P and B on 127.0.0.2:P, each in its own OS thread
//!   with its own single-threaded tokio runtime (its driver and its tasks), so the two cores
//!   work at once and a wake-up never crosses threads except through the socket. A runs K
//!   tasks that [`Cm::connect`] one connection after another until N are established (timed:
//!   *setup*); B's listener accepts each request in a task of its own. Then K tasks on A
//!   disconnect the N connections, each [`Connection::disconnect`] waiting for the DREP
//!   (timed: *teardown*).
//! * **What is counted**: 5 MADs per connection, REQ, REP, RTU, DREQ and DREP, over the
//!   setup and teardown time together: the *MAD rate*. The two transports' `tx` counters must
//!   show at least that many datagrams sent in the two phases; anything beyond
//!   (retransmissions) is printed as `resent` and not counted. `rate` is the setup alone:
//!   connections per second (3 MADs each).
//! * **The limit**: 300-byte datagrams (ibcm's are 280: BTH, DETH, MAD, ICRC) between two
//!   unconnected UDP sockets on the same two addresses, with the same socket options as
//!   ibcm's transport (`IP_PMTUDISC_DO`, 4 MiB buffers): one sender thread calling
//!   `sendmmsg` with 64 datagrams, each with its destination address, one receiver thread
//!   calling `recvmmsg` for up to 64; the sender stays at most 2,048 datagrams ahead. Two
//!   receivers: one that sleeps in `recvmmsg` until a datagram arrives (`MSG_WAITFORONE`,
//!   as an event loop does) and one that polls without sleeping (`MSG_DONTWAIT`), which
//!   spares the sender the wake-ups and is the faster by far. The ratio against the sleeping
//!   receiver alone and the old baseline, one `send_to`/`recv` per datagram, are printed too,
//!   labelled.
//! * **Rounds**: the run is `--rounds` R rounds (3 by default) of the sleeping baseline, the
//!   polling baseline and ibcm (fresh endpoints each round), in turn. Each round's ratio is
//!   its ibcm run against the better of the two baselines measured just before it, and the
//!   run's ratio is the median of the rounds' ratios (of an even number, the lower of the two
//!   in the middle). Pairing a run with the baselines next to it in time matters here: this
//!   machine's speed drifts by 10–20 % over seconds (on 2026-12-02, within one six-round run,
//!   the polling baseline went from 312 k to 376 k datagrams/s and ibcm's rounds followed it
//!   up and down), so the best run of one kind and the best of the other, taken seconds apart,
//!   measure the machine's drift as much as ibcm. That figure (ibcm's best round against the
//!   best of the 2R baselines, the headline until 2026-12-02) is still printed, labelled.
//! * **CPU time**: `getrusage` of the process over ibcm's two phases (both threads) per MAD,
//!   and of each baseline thread per datagram, waiting included: figures that depend less on
//!   what else the machine runs than the rates do.
//! * **The machine**: after each round and for the whole run, the load average and the
//!   shares of all CPUs' time that were idle and stolen by the hypervisor ([`host`]): on a
//!   shared virtual machine the rates move with them.
//! * **Batches**: datagrams per `recvmmsg` and per `sendmmsg` of ibcm's two transports over
//!   its two phases (their `recv_calls` and `send_calls` counters), to see that the batched
//!   calls carry full batches under load.
//! * Last line: `rate: <conn/s> conn/s; mads: <MAD/s> MAD/s; limit: <datagrams/s>
//!   datagrams/s (batched); ratio: <x.xx>` (ratio = MAD rate ÷ limit, of the median round).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ibcm::proto::{
    AcceptParams, ConnectParams, ConnectionError, EndpointConfig, ListenOptions, PeerAddr,
};
use ibcm::rt::{Cm, Connection, UdpTransport};
use ibcm_mad::{Guid, Qpn, ServiceId};

use super::host;
use super::sys as mmsg;

/// The options of `cm-bench rate`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateOpts {
    /// Connections to set up and tear down.
    pub(crate) conns: u64,
    /// Connections in flight.
    pub(crate) parallel: u64,
    /// UDP port of both endpoints (and of the baseline's sockets).
    pub(crate) port: u16,
    /// Datagrams per baseline measurement.
    pub(crate) datagrams: u64,
    /// Rounds of (sleeping baseline, polling baseline, ibcm).
    pub(crate) rounds: u32,
}

/// Size of the baseline's datagrams.
const BASELINE_LEN: usize = 300;
/// How far the baseline's sender may run ahead of its receiver (well within 4 MiB of
/// receive buffer, so nothing is dropped).
const WINDOW: u64 = 2_048;
/// A baseline's receiver stops after this long without a datagram (the sender then stops
/// too; what was received counts). Long enough for a loaded machine's scheduling gaps.
const IDLE: Duration = Duration::from_secs(2);
/// The socket buffers ibcm's UDP transport asks for.
const SOCK_BUF: i32 = 4 << 20;

/// Fewer baseline datagrams than this are too short a measurement of the path's steady rate
/// (most of them fit in the sender's window and the socket buffers): on 2026-12-02 on one
/// machine, baselines of 1,000–3,000 datagrams gave 0.16 M to 1.2 M datagrams/s, those of the
/// default 300,000 gave 0.24 M to 0.35 M.
const STEADY_DATAGRAMS: u64 = 100_000;

pub(crate) fn rate(o: RateOpts) -> Result<()> {
    if o.datagrams < STEADY_DATAGRAMS {
        println!(
            "*** --datagrams {}: below {STEADY_DATAGRAMS} the baselines are too short to \
             measure the path's steady rate (mostly a burst into the socket buffers): the limit \
             and the ratio below are not comparable with a default run",
            o.datagrams
        );
    }
    let a = Ipv4Addr::new(127, 0, 0, 1);
    let b = Ipv4Addr::new(127, 0, 0, 2);
    let (sa, sb) = (SocketAddrV4::new(a, o.port), SocketAddrV4::new(b, o.port));
    let mut baselines = Vec::new();
    let mut runs: Vec<(CmRun, f64)> = Vec::new();
    let rounds = o.rounds.max(1);
    let run_start = host::Sample::now();
    for r in 1..=rounds {
        let when = format!("round {r} of {rounds}");
        let round_start = host::Sample::now();
        let mut limit: f64 = 0.0;
        for wait in [true, false] {
            let b = udp_batched(sa, sb, o.datagrams, wait)?;
            b.print(&when);
            limit = limit.max(b.rate);
            baselines.push(b);
        }
        let cm = cm_rate(sa, sb, o.conns, o.parallel)?;
        println!("ibcm, {when}:");
        cm.print(o.conns);
        let mads = cm.mad_rate(o.conns);
        println!(
            "{when}: ibcm {mads:.0} MAD/s against this round's limit {limit:.0} datagrams/s \
             (its better baseline): ratio {:.2}",
            mads / limit
        );
        println!(
            "{when}, machine during the run: {}",
            host::since(&round_start)
        );
        runs.push((cm, limit));
    }
    let single = udp_single(sa, sb, o.datagrams)?;
    println!(
        "udp, one datagram per syscall (send_to / recv, {BASELINE_LEN} B): {single:.0} datagrams/s"
    );
    let best = |wait: Option<bool>| {
        baselines
            .iter()
            .filter(|b| wait.is_none_or(|w| b.wait == w))
            .map(|b| b.rate)
            .fold(0.0, f64::max)
    };
    let (best_limit, sleeping) = (best(None), best(Some(true)));
    let best_mads = runs
        .iter()
        .map(|(cm, _)| cm.mad_rate(o.conns))
        .fold(0.0, f64::max);
    println!(
        "ibcm's best round against the best of the {} baselines: ratio {:.2}; against the best \
         receiver-sleeps baseline alone: {:.2} ({sleeping:.0} datagrams/s); against one \
         datagram per syscall: {:.2}",
        baselines.len(),
        best_mads / best_limit,
        best_mads / sleeping,
        best_mads / single
    );
    let (cm, limit) = median_round(runs, o.conns).context("no ibcm round")?;
    let mads = cm.mad_rate(o.conns);
    println!(
        "the whole run, machine during the run: {}",
        host::since(&run_start)
    );
    println!(
        "the median of the {rounds} rounds' ratios (each round's ibcm run against the better of \
         the two baselines measured just before it):"
    );
    println!(
        "rate: {:.0} conn/s; mads: {mads:.0} MAD/s; limit: {limit:.0} datagrams/s (batched); ratio: {:.2}",
        cm.conn_rate(o.conns),
        mads / limit
    );
    Ok(())
}

/// The round whose ratio (ibcm's MAD rate ÷ that round's limit) is the median; of an even
/// number of rounds, the lower of the two in the middle.
fn median_round(mut runs: Vec<(CmRun, f64)>, conns: u64) -> Option<(CmRun, f64)> {
    let ratio = |(cm, limit): &(CmRun, f64)| cm.mad_rate(conns) / limit;
    runs.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let mid = runs.len().checked_sub(1)? / 2;
    runs.into_iter().nth(mid)
}

// ------------------------------------------------------------------------------------------
// ibcm

/// What one ibcm run measured.
#[derive(Debug)]
struct CmRun {
    setup: f64,
    teardown: f64,
    /// Datagrams the two transports sent during setup, and during teardown.
    setup_tx: u64,
    teardown_tx: u64,
    /// CPU time of the process (both endpoints' threads) over setup and teardown.
    cpu: Cpu,
    /// Both transports over both phases: datagrams received and sent, and the receive and
    /// send system calls that moved them.
    calls: Calls,
}

/// Datagrams and the system calls that moved them (both transports).
#[derive(Debug, Clone, Copy, Default)]
struct Calls {
    rx: u64,
    tx: u64,
    recv_calls: u64,
    send_calls: u64,
}

impl Calls {
    fn since(self, start: Calls) -> Calls {
        Calls {
            rx: self.rx.saturating_sub(start.rx),
            tx: self.tx.saturating_sub(start.tx),
            recv_calls: self.recv_calls.saturating_sub(start.recv_calls),
            send_calls: self.send_calls.saturating_sub(start.send_calls),
        }
    }
}

/// User and system CPU time.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    user: Duration,
    sys: Duration,
}

impl Cpu {
    fn now(thread: bool) -> Result<Cpu> {
        let (user, sys) = mmsg::cpu_time(thread).context("getrusage")?;
        Ok(Cpu { user, sys })
    }

    fn since(self, start: Cpu) -> Cpu {
        Cpu {
            user: self.user.saturating_sub(start.user),
            sys: self.sys.saturating_sub(start.sys),
        }
    }

    /// Microseconds per item: (total, user, system).
    fn per(self, n: u64) -> (f64, f64, f64) {
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
        (us(self.user + self.sys), us(self.user), us(self.sys))
    }
}

impl CmRun {
    fn conn_rate(&self, n: u64) -> f64 {
        n as f64 / self.setup
    }

    fn mad_rate(&self, n: u64) -> f64 {
        (5 * n) as f64 / (self.setup + self.teardown)
    }

    fn print(&self, n: u64) {
        println!(
            "cm setup: {n} connections in {:.3} s = {:.0} conn/s = {:.0} MAD/s (REQ+REP+RTU; \
             {} datagrams sent, {} resent)",
            self.setup,
            self.conn_rate(n),
            (3 * n) as f64 / self.setup,
            self.setup_tx,
            self.setup_tx.saturating_sub(3 * n),
        );
        println!(
            "cm teardown: {n} connections in {:.3} s = {:.0} MAD/s (DREQ+DREP; {} datagrams \
             sent, {} resent)",
            self.teardown,
            (2 * n) as f64 / self.teardown,
            self.teardown_tx,
            self.teardown_tx.saturating_sub(2 * n),
        );
        println!(
            "cm: {} MADs in {:.3} s = {:.0} MAD/s (5 per connection, setup and teardown)",
            5 * n,
            self.setup + self.teardown,
            self.mad_rate(n)
        );
        let (t, u, s) = self.cpu.per(5 * n);
        let cores = (self.cpu.user + self.cpu.sys).as_secs_f64() / (self.setup + self.teardown);
        println!(
            "cm cpu: {t:.2} µs per MAD (user {u:.2}, system {s:.2}; both threads, {cores:.2} \
             cores busy on average)"
        );
        let c = self.calls;
        let per = |n: u64, calls: u64| n as f64 / calls.max(1) as f64;
        println!(
            "cm batches: {:.1} datagrams per recvmmsg ({} calls), {:.1} per sendmmsg ({} calls)",
            per(c.rx, c.recv_calls),
            c.recv_calls,
            per(c.tx, c.send_calls),
            c.send_calls
        );
    }
}

fn current_thread() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Datagrams sent by both transports so far.
async fn sent(a: &Cm, b: &Cm) -> Result<u64> {
    Ok(a.stats().await?.transport.tx + b.stats().await?.transport.tx)
}

/// Both transports' datagrams and system calls so far.
async fn calls(a: &Cm, b: &Cm) -> Result<Calls> {
    let mut c = Calls::default();
    for s in [a.stats().await?.transport, b.stats().await?.transport] {
        let other = |name: &str| {
            s.other
                .iter()
                .find(|(k, _)| *k == name)
                .map_or(0, |&(_, v)| v)
        };
        c.rx += s.rx;
        c.tx += s.tx;
        c.recv_calls += other("recv_calls");
        c.send_calls += other("send_calls");
    }
    Ok(c)
}

fn cm_rate(sa: SocketAddrV4, sb: SocketAddrV4, conns: u64, parallel: u64) -> Result<CmRun> {
    let sid = ServiceId(0x1234);
    let (b_tx, b_rx) = std::sync::mpsc::channel::<Result<Cm>>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // B: its driver, its listener and the accepting tasks, on a thread of its own.
    let b_thread = std::thread::Builder::new()
        .name("cm-bench-b".into())
        .spawn(move || -> Result<()> {
            current_thread()?.block_on(async move {
                let started = async {
                    let tb = UdpTransport::bind_port(SocketAddr::V4(sb))
                        .await
                        .with_context(|| format!("bind {sb}"))?;
                    let (b, task) = Cm::bind(
                        tb,
                        EndpointConfig {
                            local_ca_guid: Guid(2),
                            max_half_open: 1 << 20,
                            max_established: usize::MAX,
                            max_established_per_peer: usize::MAX,
                            ..Default::default()
                        },
                    );
                    let listener = b.listen(sid, ListenOptions::default()).await?;
                    anyhow::Ok((b, task, listener))
                };
                let (b, task, mut listener) = match started.await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = b_tx.send(Err(e));
                        return Ok(());
                    }
                };
                tokio::spawn(async move {
                    let mut qpn = 0x10_0000u32;
                    while let Some(inc) = listener.next().await {
                        qpn = qpn.wrapping_add(1);
                        let q = Qpn::masked(qpn);
                        // One task per request: the accepts of one turn go out together.
                        tokio::spawn(async move { inc.accept(AcceptParams::new(q)).await });
                    }
                });
                let _ = b_tx.send(Ok(b.clone()));
                let _ = stop_rx.await;
                b.shutdown();
                let _ = task.await;
                Ok(())
            })
        })
        .context("spawn B's thread")?;
    let run = b_rx
        .recv()
        .context("B's thread ended")?
        .and_then(|b| current_thread()?.block_on(cm_active(sa, sb, &b, sid, conns, parallel)));
    let _ = stop_tx.send(());
    b_thread
        .join()
        .map_err(|_| anyhow::anyhow!("B's thread panicked"))??;
    run
}

/// A's side: N connections with K in flight, then their teardown.
async fn cm_active(
    sa: SocketAddrV4,
    sb: SocketAddrV4,
    b: &Cm,
    sid: ServiceId,
    conns: u64,
    parallel: u64,
) -> Result<CmRun> {
    let ta = UdpTransport::bind_port(SocketAddr::V4(sa))
        .await
        .with_context(|| format!("bind {sa}"))?;
    let (a, task) = Cm::bind(ta, EndpointConfig::default());
    let b_addr = PeerAddr::Udp(SocketAddr::V4(sb));
    let tx0 = sent(&a, b).await?;
    let calls0 = calls(&a, b).await?;
    let cpu0 = Cpu::now(false)?;

    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..parallel.max(1) {
        let (a, next) = (a.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= conns {
                    return anyhow::Ok(held);
                }
                let p = ConnectParams::new(b_addr, sid, Qpn::masked(0x1000 + i as u32));
                let c = a
                    .connect(p)
                    .await
                    .map_err(|e| anyhow::anyhow!("connection {i}: {e}"))?;
                held.push(c);
            }
        }));
    }
    let mut all: Vec<Connection> = Vec::new();
    for w in workers {
        all.extend(w.await??);
    }
    let setup = start.elapsed().as_secs_f64();
    let tx1 = sent(&a, b).await?;

    let all = Arc::new(Mutex::new(all));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..parallel.max(1) {
        let all = all.clone();
        workers.push(tokio::spawn(async move {
            loop {
                let c = match all.lock() {
                    Ok(mut v) => v.pop(),
                    Err(_) => anyhow::bail!("connection list poisoned"),
                };
                let Some(c) = c else { return Ok(()) };
                match c.disconnect(&[]).await {
                    ConnectionError::Disconnected { by_peer: false, .. } => {}
                    e => anyhow::bail!("disconnect {}: {e}", c.id()),
                }
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    let teardown = start.elapsed().as_secs_f64();
    let cpu = Cpu::now(false)?.since(cpu0);
    let tx2 = sent(&a, b).await?;
    let calls = calls(&a, b).await?.since(calls0);
    a.shutdown();
    let _ = task.await;
    let run = CmRun {
        setup,
        teardown,
        setup_tx: tx1 - tx0,
        teardown_tx: tx2 - tx1,
        cpu,
        calls,
    };
    anyhow::ensure!(
        run.setup_tx >= 3 * conns && run.teardown_tx >= 2 * conns,
        "the transports sent fewer datagrams than the connections need: {run:?}"
    );
    Ok(run)
}

// ------------------------------------------------------------------------------------------
// the limit

/// One batched baseline measurement.
#[derive(Debug)]
struct Baseline {
    /// The receiver slept in `recvmmsg` (else it polled).
    wait: bool,
    rate: f64,
    sent: u64,
    received: u64,
    sender: Cpu,
    receiver: Cpu,
}

impl Baseline {
    fn mode(&self) -> &'static str {
        if self.wait {
            "receiver sleeps"
        } else {
            "receiver polls"
        }
    }

    fn print(&self, when: &str) {
        println!(
            "udp, batched, {} ({when}; sendmmsg / recvmmsg, 64 per call, {BASELINE_LEN} B): \
             {:.0} datagrams/s ({} sent, {} received)",
            self.mode(),
            self.rate,
            self.sent,
            self.received
        );
        let (s, ..) = self.sender.per(self.sent);
        let (r, ..) = self.receiver.per(self.received);
        println!(
            "udp cpu, {} ({when}): {:.2} µs per datagram (sender {s:.2}, receiver {r:.2}; \
             waiting included)",
            self.mode(),
            s + r
        );
    }
}

/// Sets its flag when dropped: a baseline's receiver thread has ended (normally or not), so
/// its sender must not wait for it.
struct DoneOnDrop(Arc<AtomicBool>);

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn bind_like_ibcm(addr: SocketAddrV4) -> Result<UdpSocket> {
    let s = UdpSocket::bind(addr).with_context(|| format!("bind {addr}"))?;
    mmsg::set_pmtudisc_do(&s)?;
    mmsg::set_int_opt(&s, libc::SOL_SOCKET, libc::SO_RCVBUF, SOCK_BUF)?;
    mmsg::set_int_opt(&s, libc::SOL_SOCKET, libc::SO_SNDBUF, SOCK_BUF)?;
    Ok(s)
}

/// Datagrams per second from `from` to `to`, 64 per system call on each side; the receiver
/// sleeps in `recvmmsg` until a datagram arrives (`wait`) or polls without sleeping.
fn udp_batched(from: SocketAddrV4, to: SocketAddrV4, n: u64, wait: bool) -> Result<Baseline> {
    let rx = bind_like_ibcm(to)?;
    let tx = bind_like_ibcm(from)?;
    rx.set_read_timeout(Some(IDLE))?;
    let received = Arc::new(AtomicU64::new(0));
    let r2 = received.clone();
    let done = Arc::new(AtomicBool::new(false));
    let done_on_exit = DoneOnDrop(done.clone());
    let receiver = std::thread::spawn(move || -> Result<(u64, f64, Cpu)> {
        let _done = done_on_exit;
        let cpu0 = Cpu::now(true)?;
        let mut bufs = vec![[0u8; mmsg::RECV_LEN]; mmsg::BATCH];
        let mut got = 0u64;
        let mut first: Option<(Instant, u64)> = None;
        let mut last = None;
        let mut polling_since: Option<Instant> = None;
        while got < n {
            match mmsg::recv_batch(&rx, &mut bufs, wait) {
                Ok(k) => {
                    polling_since = None;
                    let now = Instant::now();
                    got += k as u64;
                    first.get_or_insert((now, k as u64));
                    last = Some(now);
                    r2.store(got, Ordering::Relaxed);
                }
                // Polling: nothing yet (the sender has not finished, or is about to).
                Err(e) if !wait && e.kind() == std::io::ErrorKind::WouldBlock => {
                    if polling_since.get_or_insert_with(Instant::now).elapsed() > IDLE {
                        break;
                    }
                    continue;
                }
                Err(_) => break,
            }
        }
        let cpu = Cpu::now(true)?.since(cpu0);
        // The first call's datagrams arrived before the clock started.
        match (first, last) {
            (Some((f, k)), Some(l)) if l > f => {
                Ok((got, (got - k) as f64 / (l - f).as_secs_f64(), cpu))
            }
            _ => anyhow::bail!("too few datagrams received ({got})"),
        }
    });
    let payload = [0u8; BASELINE_LEN];
    let cpu0 = Cpu::now(true)?;
    let mut sent = 0u64;
    while sent < n && !done.load(Ordering::Relaxed) {
        while sent.saturating_sub(received.load(Ordering::Relaxed)) > WINDOW
            && !done.load(Ordering::Relaxed)
        {
            std::thread::yield_now();
        }
        let k = (n - sent).min(mmsg::BATCH as u64) as usize;
        sent += mmsg::send_batch(&tx, to, &payload, k).context("sendmmsg")? as u64;
    }
    let sender = Cpu::now(true)?.since(cpu0);
    let (got, rate, receiver) = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("receiver thread panicked"))??;
    Ok(Baseline {
        wait,
        rate,
        sent,
        received: got,
        sender,
        receiver,
    })
}

/// The old baseline: datagrams per second with one `send_to` and one `recv` per datagram.
fn udp_single(from: SocketAddrV4, to: SocketAddrV4, n: u64) -> Result<f64> {
    let rx = bind_like_ibcm(to)?;
    let tx = bind_like_ibcm(from)?;
    rx.set_read_timeout(Some(IDLE))?;
    let dst = SocketAddr::new(IpAddr::V4(*to.ip()), to.port());
    let received = Arc::new(AtomicU64::new(0));
    let r2 = received.clone();
    let done = Arc::new(AtomicBool::new(false));
    let done_on_exit = DoneOnDrop(done.clone());
    let receiver = std::thread::spawn(move || -> (u64, Option<Instant>, Option<Instant>) {
        let _done = done_on_exit;
        let mut buf = [0u8; 2048];
        let (mut first, mut last) = (None, None);
        let mut got = 0;
        while got < n {
            match rx.recv(&mut buf) {
                Ok(_) => {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = Some(now);
                    got += 1;
                    r2.store(got, Ordering::Relaxed);
                }
                Err(_) => break,
            }
        }
        (got, first, last)
    });
    let payload = [0u8; BASELINE_LEN];
    for i in 0..n {
        if done.load(Ordering::Relaxed) {
            break;
        }
        while i.saturating_sub(received.load(Ordering::Relaxed)) > WINDOW
            && !done.load(Ordering::Relaxed)
        {
            std::thread::yield_now();
        }
        let _ = tx.send_to(&payload, dst);
    }
    let (got, first, last) = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("receiver thread panicked"))?;
    match (first, last) {
        (Some(f), Some(l)) if l > f => Ok((got - 1) as f64 / (l - f).as_secs_f64()),
        _ => anyhow::bail!("no datagrams received"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ibcm run of 1,000 connections at `mad_rate` MADs per second.
    fn run_at(mad_rate: f64) -> CmRun {
        CmRun {
            setup: 3_000.0 / mad_rate,
            teardown: 2_000.0 / mad_rate,
            setup_tx: 3_000,
            teardown_tx: 2_000,
            cpu: Cpu::default(),
            calls: Calls::default(),
        }
    }

    #[test]
    fn the_median_round_is_the_middle_ratio_not_the_middle_rate() {
        // Ratios 0.9, 0.5, 0.8: the median is the third round's, although the first round
        // has the middle MAD rate.
        let runs = vec![
            (run_at(180.0), 200.0),
            (run_at(250.0), 500.0),
            (run_at(80.0), 100.0),
        ];
        let (cm, limit) = median_round(runs, 1_000).expect("three rounds");
        assert_eq!(limit, 100.0);
        assert!((cm.mad_rate(1_000) / limit - 0.8).abs() < 1e-9);
        // Of two, the lower.
        let runs = vec![(run_at(90.0), 100.0), (run_at(70.0), 100.0)];
        let (cm, limit) = median_round(runs, 1_000).expect("two rounds");
        assert!((cm.mad_rate(1_000) / limit - 0.7).abs() < 1e-9);
        assert!(median_round(Vec::new(), 1_000).is_none());
    }
}
