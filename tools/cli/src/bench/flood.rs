//! `cm-bench flood`: an off-path attacker against a listening endpoint, on loopback only;
//! with `--target`, the same attacks against a listener on another host ([`remote`]).
//!
//! In one process: a listener (on a tokio runtime of its own, one worker thread; `ibcm::rt`
//! over RoCEv2/UDP on 127.0.0.2:PORT, default
//! configuration, accepting every REQ as `cm-ping --listen` does; with `--stateless` it listens
//! with a stateless template, `Cm::listen_stateless`, so that under pressure REQs are answered
//! with cookie REPs: docs/protocol.md §5.12); a legitimate client on
//! 127.0.0.1:PORT; and an attacker owning the "spoofed" source addresses 127.0.3.1..K:PORT (on
//! loopback a sender can only use addresses it can bind; owning them also lets this tool count
//! every byte the listener sends to them — the attacker logic never reads them).
//!
//! 1. **Flood**: one thread sends REQs (valid ICRC, fresh comm ID and QPN each, half with CM
//!    response timeout 0 — the worst case for amplification —, half with 31, all with 15
//!    retries) round-robin from the K sources as fast as it can; after `--warmup` seconds
//!    (default 1) of flood alone the client connects N
//!    times (all attempts in flight at once; REQ timeout ≈ 300 ms, 15 retries, and the
//!    connect timeout `--connect-timeout`, default [`DEFAULT_CONNECT_TIMEOUT`], 10 s). The
//!    flood lasts until every attempt ended or `--secs` passed (unfinished attempts count as
//!    failures). An attempt succeeds when the client is established **and** the listener
//!    has the connection established too (a client can be established alone: its RTU lost,
//!    or dropped by the listener); the time to connect is from the connect call to the
//!    client's ESTABLISHED.
//! 2. **Blind RTU**: per attempt the attacker learns a real comm ID of the listener (its own
//!    connection), sends a REQ from a spoofed source and 32 RTUs guessing the listener's comm
//!    ID from it (neighbours and the `2^k − 1` differences of a counter XOR a constant). Success:
//!    the listener establishes a connection for that source.
//! 3. **Spoofed teardown**: per victim (an established client connection whose comm IDs, QPNs
//!    and CA GUID the attacker knows) a DREQ, a REJ 28 and a REJ 4 naming both comm IDs, and a
//!    stale-connection REQ naming the client's (QPN, CA GUID), all from a wrong source, once
//!    both sides have it established (a victim the listener has not established within 10 s
//!    is left out and said so). Success: either side leaves ESTABLISHED.
//!
//! Amplification is the bytes the listener sent to the spoofed sources over the bytes they
//! sent, counted until `--settle` seconds after the last attack. Last line:
//! `flood: success <r> (<ok>/<n>); connect ms p50 <a> p99 <b>; amplification <x>; blind-rtu
//! <s>/<n>; teardown <s>/<n>; reqs <count> at <rate>/s; mode <stateful|stateless>`.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use ibcm::proto::{
    AcceptParams, ConnId, ConnectParams, Endpoint, EndpointConfig, ListenOptions, PeerAddr,
    StatelessAccept, DEFAULT_CONNECT_TIMEOUT,
};
use ibcm::rt::{Arrival, Cm, ConnStatus, Connection, UdpTransport};
use ibcm_mad::frame::RoceV2UdRepr;
use ibcm_mad::{
    CmMessage, CommId, Dreq, Guid, Mad, MsgKind, PrivateData, Psn, Qpn, Rej, RejReason, Rtu,
    ServiceId, Tid, TimeoutExp, U4,
};

use crate::qpn::QpnAlloc;

pub(crate) mod remote;

/// What the loopback and the remote attack share: the flood, the legitimate clients and the
/// targeted attacks (`cm-bench flood`'s flags of the same names).
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct AttackOpts {
    /// Legitimate connection attempts during the flood.
    #[arg(long, default_value_t = 1000)]
    pub(crate) legit: u64,
    /// Blind-RTU attempts and spoofed-teardown victims.
    #[arg(long, default_value_t = 100)]
    pub(crate) attacks: u64,
    /// Spoofed source addresses (127.0.3.1..N).
    #[arg(long, default_value_t = 16)]
    pub(crate) sources: u8,
    /// Longest flood, in seconds (it stops earlier once every legitimate attempt ended).
    #[arg(long, default_value_t = 60.0)]
    pub(crate) secs: f64,
    /// Most REQs to send.
    #[arg(long, default_value_t = 20_000_000)]
    pub(crate) max_reqs: u64,
    /// Seconds to keep counting bytes to the spoofed sources after the last attack.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) settle: f64,
    /// The legitimate clients' connect timeout, in seconds (default: the library's
    /// `DEFAULT_CONNECT_TIMEOUT`, 10 s).
    // display_order 7 and 8: `--port` (6, in `cm-bench`'s `Flood`) is listed between
    // `--settle` and these two, as before they were shared.
    #[arg(long, default_value_t = LEGIT_CONNECT_TIMEOUT.as_secs_f64(), display_order = 7)]
    connect_timeout: f64,
    /// Seconds of flood alone before the legitimate clients start.
    #[arg(long, default_value_t = 1.0, display_order = 8)]
    warmup: f64,
}

impl AttackOpts {
    /// The legitimate clients' connect timeout (at least 1 ms).
    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.connect_timeout.max(0.001))
    }

    /// How long the flood runs before the legitimate clients start.
    pub(crate) fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup.max(0.0))
    }
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FloodOpts {
    /// The flood, the legitimate clients and the attacks.
    pub(crate) attack: AttackOpts,
    /// UDP port of every endpoint.
    pub(crate) port: u16,
    /// The listener answers statelessly under pressure (`Cm::listen_stateless`).
    pub(crate) stateless: bool,
    /// Its `stateless_threshold` (`None`: the default).
    pub(crate) stateless_threshold: Option<usize>,
    /// Its `stateless_always`.
    pub(crate) stateless_always: bool,
}

/// The legitimate clients' connect timeout when none is given: the library's default.
pub(crate) const LEGIT_CONNECT_TIMEOUT: Duration = DEFAULT_CONNECT_TIMEOUT;

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct FloodReport {
    legit_ok: u64,
    legit: u64,
    /// Clients established whose connection the listener did not have established.
    legit_client_only: u64,
    /// Time to connect of the successful attempts, p50 and p99, in ms.
    connect_p50: f64,
    connect_p99: f64,
    /// The listener's stateless counters: REPs sent, connections made.
    stateless_replies: u64,
    stateless_established: u64,
    /// The listener's counters after the flood phase (`CmStats::to_json`).
    listener_json: String,
    reqs: u64,
    flood_secs: f64,
    bytes_in: u64,
    bytes_out: u64,
    blind_ok: u64,
    blind: u64,
    teardown_ok: u64,
    teardown: u64,
    /// Victims the listener had not established within [`VICTIM_READY`] (not attacked).
    victims_unready: u64,
}

/// How long a victim may take to be established at the listener before it is left out.
const VICTIM_READY: Duration = Duration::from_secs(10);

const SID: ServiceId = ServiceId(0x0106_1d2f);
const CLIENT_GUID: Guid = Guid(0x0002_c903_00c1_1e47);

/// Runs the three phases and prints the figures.
pub(crate) fn flood(o: FloodOpts) -> Result<()> {
    ensure!(
        o.attack.sources >= 1 && o.attack.legit >= 1,
        "--sources and --legit must be at least 1"
    );
    // The listener on a runtime of its own, as if on another host: a flooded listener must
    // not take the client's worker threads (nor the client the listener's).
    let lrt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let r = rt.block_on(run(o, lrt.handle().clone()))?;
    drop(rt);
    drop(lrt);
    let success = r.legit_ok as f64 / r.legit as f64;
    let amp = r.bytes_out as f64 / (r.bytes_in as f64).max(1.0);
    let mode = if o.stateless { "stateless" } else { "stateful" };
    println!(
        "flood: {} REQs in {:.2} s ({:.0} REQ/s) from {} spoofed sources; legitimate: {}/{} \
         established on both sides during the flood ({} on the client's side only), connect \
         timeout {:.1} s",
        r.reqs,
        r.flood_secs,
        r.reqs as f64 / r.flood_secs.max(1e-9),
        o.attack.sources,
        r.legit_ok,
        r.legit,
        r.legit_client_only,
        o.attack.connect_timeout().as_secs_f64()
    );
    println!(
        "listener: {mode}; {} stateless REPs, {} stateless connections; counters after the \
         flood: {}",
        r.stateless_replies, r.stateless_established, r.listener_json
    );
    println!(
        "amplification: {} bytes to the spoofed sources for {} bytes from them ({} s after \
         the last attack)",
        r.bytes_out, r.bytes_in, o.attack.settle
    );
    if r.victims_unready > 0 {
        println!(
            "teardown: {} of {} victims were not established at the listener within {} s and \
             were not attacked (their 4 messages are not in the count)",
            r.victims_unready,
            o.attack.attacks,
            VICTIM_READY.as_secs()
        );
    }
    println!(
        "flood: success {success:.4} ({}/{}); connect ms p50 {:.1} p99 {:.1}; amplification \
         {amp:.2}; blind-rtu {}/{}; teardown {}/{}; reqs {} at {:.0}/s; mode {mode}",
        r.legit_ok,
        r.legit,
        r.connect_p50,
        r.connect_p99,
        r.blind_ok,
        r.blind,
        r.teardown_ok,
        r.teardown,
        r.reqs,
        r.reqs as f64 / r.flood_secs.max(1e-9)
    );
    Ok(())
}

/// Server-side connections that got established, by the listener's comm ID.
type Established = Arc<Mutex<HashMap<ConnId, (PeerAddr, Connection)>>>;

async fn run(o: FloodOpts, lrt: tokio::runtime::Handle) -> Result<FloodReport> {
    let lo = |a: [u8; 4]| IpAddr::V4(Ipv4Addr::from(a));
    let srv = SocketAddr::new(lo([127, 0, 0, 2]), o.port);
    let cli = SocketAddr::new(lo([127, 0, 0, 1]), o.port);
    for a in [srv, cli] {
        ensure!(a.ip().is_loopback(), "loopback only");
    }
    let (listener_cm, established) = lrt
        .spawn(listener(srv, o))
        .await
        .map_err(|e| anyhow!("listener task: {e}"))??;
    let t = UdpTransport::bind_port(cli)
        .await
        .with_context(|| format!("bind {cli}"))?;
    let (client, _) = Cm::bind(
        t,
        EndpointConfig {
            local_ca_guid: CLIENT_GUID,
            ..Default::default()
        },
    );
    // The attacker's sockets (one per spoofed source) and the byte counter reading them.
    let mut socks = Vec::new();
    for i in 0..o.attack.sources {
        let a = SocketAddr::new(lo([127, 0, 3, i + 1]), o.port);
        let s = UdpSocket::bind(a).with_context(|| format!("bind {a}"))?;
        s.set_nonblocking(true)?;
        socks.push(s);
    }
    // The targeted attacks use a source of their own (the flood's sources may have used up
    // their half-open share).
    let attack = UdpSocket::bind(SocketAddr::new(lo([127, 0, 4, 1]), o.port))
        .context("bind the attacker's source 127.0.4.1")?;
    attack.set_nonblocking(true)?;
    let counter = ByteCounter::start(&socks, &attack)?;
    let qpns = Arc::new(QpnAlloc::new());
    let mut r = FloodReport {
        legit: o.attack.legit,
        blind: o.attack.attacks,
        teardown: 4 * o.attack.attacks,
        ..Default::default()
    };

    // 1. Flood, with the legitimate attempts in flight.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flooder = {
        let socks: Vec<UdpSocket> = socks
            .iter()
            .map(UdpSocket::try_clone)
            .collect::<Result<_, _>>()?;
        let (stop, sent, max) = (stop.clone(), sent.clone(), o.attack.max_reqs);
        std::thread::spawn(move || flood_reqs(&socks, srv, &stop, &sent, max))
    };
    let start = Instant::now();
    // The flood alone first: the legitimate clients come into a listener already flooded.
    tokio::time::sleep(o.attack.warmup()).await;
    let mut attempts = Vec::new();
    for _ in 0..o.attack.legit {
        let (client, q, limit) = (client.clone(), qpns.next(), o.attack.connect_timeout());
        attempts.push(tokio::spawn(async move {
            let mut p = ConnectParams::new(PeerAddr::Udp(srv), SID, q);
            // ~300 ms per try (2 × packet life time 12, 16.8 ms, + CM response timeout 16,
            // 268 ms), 15 retries: a client that keeps trying through loss, within its connect
            // timeout. (With the default packet life time, 18, a try would take 2.4 s.)
            p.remote_cm_response_timeout = TimeoutExp::masked(16);
            p.local_cm_response_timeout = TimeoutExp::masked(16);
            p.packet_life_time = TimeoutExp::masked(12);
            p.max_cm_retries = U4::masked(15);
            p.connect_timeout = Some(limit);
            let t = Instant::now();
            let c = client.connect(p).await.ok()?;
            Some((c, t.elapsed()))
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(o.attack.secs);
    let mut legit_conns = Vec::new();
    let mut times = Vec::new();
    for a in attempts {
        match tokio::time::timeout_at(deadline, a).await {
            Ok(Ok(Some((c, t)))) => {
                legit_conns.push(c);
                times.push(t);
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    r.flood_secs = start.elapsed().as_secs_f64();
    r.reqs = flooder
        .join()
        .map_err(|_| anyhow!("flood thread panicked"))??;
    // Both sides: the listener may still be handling the last RTUs; wait up to 5 s for them.
    let both = |m: &HashMap<ConnId, (PeerAddr, Connection)>, c: &Connection| {
        c.rep()
            .is_some_and(|rep| m.get(&rep.rep.local_comm_id).is_some())
    };
    let confirm_by = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut confirmed;
    loop {
        confirmed = {
            let m = established.lock().map_err(|_| anyhow!("poisoned"))?;
            legit_conns
                .iter()
                .map(|c| both(&m, c))
                .collect::<Vec<bool>>()
        };
        if confirmed.iter().all(|&b| b) || tokio::time::Instant::now() >= confirm_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut ok_times: Vec<Duration> = times
        .iter()
        .zip(&confirmed)
        .filter(|(_, &b)| b)
        .map(|(&t, _)| t)
        .collect();
    ok_times.sort();
    if let Ok(st) = listener_cm.stats().await {
        r.listener_json = st.to_json();
    }
    r.legit_ok = ok_times.len() as u64;
    r.legit_client_only = legit_conns.len() as u64 - r.legit_ok;
    r.connect_p50 = percentile_ms(&ok_times, 0.50);
    r.connect_p99 = percentile_ms(&ok_times, 0.99);
    for c in legit_conns {
        tokio::spawn(async move { c.disconnect(&[]).await });
    }
    // Let the listener's queues drain before the targeted attacks.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 2. Blind RTU. 3. Spoofed teardown.
    let spoof = &attack;
    let spoof_addr = spoof.local_addr()?;
    for i in 0..o.attack.attacks {
        // The attacker's own connection shows it one comm ID of the listener.
        let own = connect(&client, srv, qpns.next()).await?;
        let seen = own.rep().map(|r| r.rep.local_comm_id.0).unwrap_or(0);
        let my_id = CommId(0x7a00_0000 | i as u32);
        let spoofed_req = req(srv, my_id, qpns.next(), Guid(0xbad0_0000 + i))?;
        send(spoof, spoof_addr, srv, &spoofed_req)?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        for guess in guesses(seen) {
            let rtu = CmMessage::Rtu(Rtu {
                local_comm_id: my_id,
                remote_comm_id: CommId(guess),
                private_data: PrivateData::default(),
            });
            send(spoof, spoof_addr, srv, &mad(rtu))?;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let blind = established
            .lock()
            .map_err(|_| anyhow!("poisoned"))?
            .values()
            .any(|(peer, _)| *peer == PeerAddr::Udp(spoof_addr));
        r.blind_ok += u64::from(blind);
        own.disconnect(&[]).await;
        // The victim: an established connection the attacker knows everything about.
        let q = qpns.next();
        let victim = connect(&client, srv, q).await?;
        let rep = victim.rep().ok_or_else(|| anyhow!("no REP"))?;
        let (cid, sid) = (victim.id(), rep.rep.local_comm_id);
        // Attacked only once the listener has it established too (its RTU may still be
        // queued behind the flood): a victim the listener never saw established is not
        // counted, so that no teardown is credited to the flood's own backlog.
        let server_up = || {
            established
                .lock()
                .map(|m| m.get(&sid).map(|(_, c)| c.status()) == Some(ConnStatus::Established))
                .unwrap_or(false)
        };
        let ready_by = tokio::time::Instant::now() + VICTIM_READY;
        while !server_up() && tokio::time::Instant::now() < ready_by {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if !server_up() {
            r.teardown = r.teardown.saturating_sub(4);
            r.victims_unready += 1;
            victim.disconnect(&[]).await;
            continue;
        }
        let [dreq, rej28, rej4] = spoofed_teardowns(cid, sid, rep.remote_qpn);
        let stale = req(srv, CommId(0x7b00_0000 | i as u32), q, CLIENT_GUID)?;
        for m in [dreq, rej28, rej4, stale] {
            send(spoof, spoof_addr, srv, &m)?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            let server_side = established
                .lock()
                .map_err(|_| anyhow!("poisoned"))?
                .get(&sid)
                .map(|(_, c)| c.status());
            let torn = victim.status() != ConnStatus::Established
                || server_side != Some(ConnStatus::Established);
            r.teardown_ok += u64::from(torn);
            if torn {
                break;
            }
        }
        victim.disconnect(&[]).await;
    }
    tokio::time::sleep(Duration::from_secs_f64(o.attack.settle)).await;
    (r.bytes_in, r.bytes_out) = (counter.sent_by_attacker(&sent), counter.stop()?);
    if let Ok(st) = listener_cm.stats().await {
        r.stateless_replies = st.endpoint.stateless_replies;
        r.stateless_established = st.endpoint.stateless_established;
    }
    client.shutdown();
    listener_cm.shutdown();
    Ok(r)
}

/// The listener: accepts every REQ (random QPN and PSN) and records the established ones;
/// with `--stateless`, under pressure, the endpoint answers from a template instead and the
/// connections arrive established.
async fn listener(addr: SocketAddr, o: FloodOpts) -> Result<(Cm, Established)> {
    let t = UdpTransport::bind_port(addr)
        .await
        .with_context(|| format!("bind {addr}"))?;
    let mut cfg = EndpointConfig {
        local_ca_guid: Guid(0x0002_c903_0000_0002),
        stateless_always: o.stateless_always,
        ..Default::default()
    };
    if let Some(n) = o.stateless_threshold {
        cfg.stateless_threshold = n;
    }
    let (cm, _) = Cm::bind(t, cfg);
    let mut l = if o.stateless {
        // Stateless QPNs from the upper half of the space; the stateful accepts draw theirs
        // at random from all of it (a clash is refused with a REJ 3, and is rare).
        let template = StatelessAccept::new(
            AcceptParams::new(Qpn::masked(0)),
            Qpn::masked(0x80_0000),
            0x7f_ff00,
        );
        cm.listen_stateless(SID, ListenOptions::default(), template)
            .await?
    } else {
        cm.listen(SID, ListenOptions::default()).await?
    };
    let established: Established = Arc::default();
    let (cm2, est) = (cm.clone(), established.clone());
    tokio::spawn(async move {
        let qpns = Arc::new(QpnAlloc::new());
        while let Some(arrival) = l.next_arrival().await {
            let (cm, est, q) = (cm2.clone(), est.clone(), qpns.next());
            tokio::spawn(async move {
                let (peer, c) = match arrival {
                    Arrival::Request(inc) => {
                        let peer = inc.peer();
                        let mut p = AcceptParams::new(q);
                        p.starting_psn = cm.random_psn().await.unwrap_or_default();
                        let Ok(c) = inc.accept(p).await else {
                            return;
                        };
                        if c.established().await.is_err() {
                            return;
                        }
                        (peer, c)
                    }
                    Arrival::Stateless(c, info) => (info.req.peer, c),
                };
                let id = c.id();
                if let Ok(mut m) = est.lock() {
                    m.insert(id, (peer, c.clone()));
                }
                c.closed().await;
                if let Ok(mut m) = est.lock() {
                    m.remove(&id);
                }
            });
        }
    });
    Ok((cm, established))
}

/// The `q` quantile of sorted durations, in ms (0 for none).
fn percentile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

async fn connect(cm: &Cm, srv: SocketAddr, q: Qpn) -> Result<Connection> {
    let p = ConnectParams::new(PeerAddr::Udp(srv), SID, q);
    cm.connect(p).await.map_err(|e| anyhow!("connect: {e}"))
}

/// The listener's comm ID guesses from one seen ID `x`: neighbours and `x ^ (2^k − 1)`.
fn guesses(x: u32) -> Vec<u32> {
    let mut g: Vec<u32> = (1..=16).map(|d| x.wrapping_add(d)).collect();
    g.extend((1..=16).map(|k| x ^ ((1u32 << k) - 1)));
    g
}

/// The teardowns an off-path attacker forges for a connection whose IDs and QPN it knows
/// (issue finding 4): a DREQ, a REJ 28 and a REJ 4 naming both comm IDs, each of which a CM
/// that checks no source would act on.
fn spoofed_teardowns(cid: CommId, sid: CommId, remote_qpn: Qpn) -> [Vec<u8>; 3] {
    let rej = |reason: u16| {
        mad(CmMessage::Rej(Rej {
            local_comm_id: cid,
            remote_comm_id: sid,
            message_rejected: MsgKind::Rep,
            reason: RejReason::from_raw(reason),
            ..Rej::default()
        }))
    };
    let dreq = mad(CmMessage::Dreq(Dreq {
        local_comm_id: cid,
        remote_comm_id: sid,
        remote_qpn_eecn: remote_qpn,
        private_data: PrivateData::default(),
    }));
    [dreq, rej(28), rej(4)]
}

fn mad(msg: CmMessage) -> Vec<u8> {
    Mad::new(Tid(0x7a7a_0000_0000_0001), msg)
        .to_bytes()
        .to_vec()
}

/// The RoCEv2 UDP payload carrying `mad` from `src` to `dst` (valid ICRC).
fn frame(src: SocketAddr, dst: SocketAddr, mad: &[u8], out: &mut [u8]) -> Result<usize> {
    let mut repr = RoceV2UdRepr::gsi(src.ip(), dst.ip(), 0, src.port(), Psn::default())
        .map_err(|e| anyhow!("{e}"))?;
    repr.udp.dst_port = dst.port();
    repr.emit_udp_payload(mad, out).map_err(|e| anyhow!("{e}"))
}

fn send(s: &UdpSocket, src: SocketAddr, dst: SocketAddr, mad: &[u8]) -> Result<()> {
    let mut out = [0u8; 512];
    let n = frame(src, dst, mad, &mut out)?;
    let b = out.get(..n).ok_or_else(|| anyhow!("frame"))?;
    // A full socket buffer is a lost datagram, as on a real network.
    let _ = s.send_to(b, dst);
    ATTACK_BYTES.fetch_add(n as u64, Ordering::Relaxed);
    Ok(())
}

/// Bytes the targeted attacks (not the flood) sent.
static ATTACK_BYTES: AtomicU64 = AtomicU64::new(0);

/// A REQ to `srv` for [`SID`] with these fields.
fn req(srv: SocketAddr, id: CommId, q: Qpn, guid: Guid) -> Result<Vec<u8>> {
    let mut m = template_req(srv)?;
    if let CmMessage::Req(r) = &mut m.msg {
        r.local_comm_id = id;
        r.local_qpn = q;
        r.local_ca_guid = guid;
    }
    Ok(m.to_bytes().to_vec())
}

/// A REQ for [`SID`] to `srv`, as an endpoint sends it.
fn template_req(srv: SocketAddr) -> Result<Mad> {
    let mut ep = Endpoint::new(EndpointConfig::default());
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut p = ConnectParams::new(PeerAddr::Udp(srv), SID, Qpn::masked(0x10));
    p.max_cm_retries = U4::masked(15);
    ep.connect(now, p).map_err(|e| anyhow!("{e}"))?;
    let t = ep.poll_transmit().ok_or_else(|| anyhow!("no REQ"))?;
    Mad::parse(&t.mad).map_err(|e| anyhow!("{e}"))
}

/// The flood: REQs round-robin from `socks` to `srv` until `stop` or `max`; returns the count.
fn flood_reqs(
    socks: &[UdpSocket],
    srv: SocketAddr,
    stop: &AtomicBool,
    sent: &AtomicU64,
    max: u64,
) -> Result<u64> {
    let mut tpl = template_req(srv)?;
    let srcs: Vec<SocketAddr> = socks
        .iter()
        .map(UdpSocket::local_addr)
        .collect::<Result<_, _>>()?;
    let mut out = [0u8; 512];
    let mut n = 0u64;
    let mut bytes = 0u64;
    while n < max && !stop.load(Ordering::Relaxed) {
        let k = (n % socks.len() as u64) as usize;
        if let CmMessage::Req(r) = &mut tpl.msg {
            // Fresh comm ID and QPN (no stale-connection matches), hostile timers.
            r.local_comm_id = CommId((n as u32).wrapping_mul(0x9e37_79b9) | 1);
            r.local_qpn = Qpn::masked(2 + (n % 0xff_fff0) as u32);
            let t = if n.is_multiple_of(2) { 0 } else { 31 };
            r.remote_cm_response_timeout = TimeoutExp::masked(t);
            r.local_cm_response_timeout = TimeoutExp::masked(t);
            r.max_cm_retries = U4::masked(15);
        }
        let mad = tpl.to_bytes();
        let (Some(s), Some(&src)) = (socks.get(k), srcs.get(k)) else {
            break;
        };
        let len = frame(src, srv, &mad, &mut out)?;
        if s.send_to(out.get(..len).unwrap_or(&[]), srv).is_ok() {
            bytes += len as u64;
            n += 1;
        } else {
            // EAGAIN: the socket buffer is full; the sender is at its limit.
            std::thread::yield_now();
        }
        sent.store(bytes, Ordering::Relaxed);
    }
    Ok(n)
}

/// Counts the bytes arriving at the attacker's sockets, on its own thread.
struct ByteCounter {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl ByteCounter {
    fn start(socks: &[UdpSocket], attack: &UdpSocket) -> Result<Self> {
        let mut socks: Vec<UdpSocket> = socks
            .iter()
            .map(UdpSocket::try_clone)
            .collect::<Result<_, _>>()?;
        socks.push(attack.try_clone()?);
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            let mut total = 0u64;
            loop {
                let mut got = false;
                for s in &socks {
                    while let Ok(n) = s.recv(&mut buf) {
                        total += n as u64;
                        got = true;
                    }
                }
                if !got {
                    if st.load(Ordering::Relaxed) {
                        return total;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        Ok(ByteCounter { stop, thread })
    }

    /// Bytes the attacker sent: the flood's and the targeted attacks'.
    fn sent_by_attacker(&self, flood: &AtomicU64) -> u64 {
        flood.load(Ordering::Relaxed) + ATTACK_BYTES.load(Ordering::Relaxed)
    }

    /// Stops counting; the bytes received.
    fn stop(self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("counter thread panicked"))
    }
}
