//! `cm-bench scale --rt`: the per-connection cost of the async API (`ibcm::rt`).
//!
//! Two [`Cm`] endpoints in this process, joined by a [`MemNetwork`] (no sockets), set up N
//! connections (K in flight) and hold them: the client keeps every [`Connection`] handle, the
//! listener accepts every request and keeps its handle too, as an application would. Memory is
//! the RSS growth divided by 2N (both endpoints hold N connections; the handles' vectors are
//! allocated before the first measurement). The core's figure comes from `cm-bench scale
//! --no-thp --conns N` run as a child process in the same run (a fresh process, so neither
//! measurement reuses memory the other freed). Last line:
//! `scale-rt: <bytes> B/conn; core: <bytes> B/conn; ratio: <x.xx>`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use ibcm::proto::{AcceptParams, ConnectParams, EndpointConfig, ListenOptions, PeerAddr};
use ibcm::rt::{Cm, Connection, MemNetwork};
use ibcm_mad::{Guid, Qpn, ServiceId};

/// Runs the measurement and prints the figures.
pub(crate) fn scale_rt(n: u64, parallel: u64, rss_bytes: fn() -> u64) -> Result<()> {
    ensure!(n >= 1_000, "--conns must be at least 1000");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (per, secs, rss0, rss1) = rt.block_on(hold(n, parallel, rss_bytes))?;
    println!(
        "held {n} established connections through ibcm::rt in each of two endpoints in {secs:.1} s \
         ({:.0} conn/s); RSS {:.1} MiB -> {:.1} MiB",
        n as f64 / secs,
        rss0 as f64 / 1048576.0,
        rss1 as f64 / 1048576.0
    );
    let core = core_figure(n)?;
    println!(
        "scale-rt: {per:.0} B/conn; core: {core:.0} B/conn; ratio: {:.2}",
        per / core.max(1.0)
    );
    Ok(())
}

async fn hold(n: u64, parallel: u64, rss_bytes: fn() -> u64) -> Result<(f64, f64, u64, u64)> {
    let a_addr = PeerAddr::Udp(SocketAddr::from(([127, 0, 0, 1], 4791)));
    let b_addr = PeerAddr::Udp(SocketAddr::from(([127, 0, 0, 2], 4791)));
    let net = MemNetwork::new();
    let open = |guid: u64| EndpointConfig {
        local_ca_guid: Guid(guid),
        max_half_open: usize::MAX,
        max_half_open_per_source: usize::MAX,
        max_half_open_per_service: usize::MAX,
        max_established: usize::MAX,
        max_established_per_peer: usize::MAX,
        ..Default::default()
    };
    let (a, _) = Cm::bind(net.transport(a_addr), open(1));
    let (b, _) = Cm::bind(net.transport(b_addr), open(2));
    let sid = ServiceId(0x1234);
    let mut listener = b.listen(sid, ListenOptions::default()).await?;
    let cap = usize::try_from(n)?;
    let server: Arc<Mutex<Vec<Connection>>> = Arc::new(Mutex::new(Vec::with_capacity(cap)));
    let client: Arc<Mutex<Vec<Connection>>> = Arc::new(Mutex::new(Vec::with_capacity(cap)));
    let rss0 = rss_bytes();
    let srv = server.clone();
    tokio::spawn(async move {
        let mut q = 0x80_0000u32;
        while let Some(inc) = listener.next().await {
            q += 1;
            if let Ok(c) = inc.accept(AcceptParams::new(Qpn::masked(q))).await {
                if let Ok(mut v) = srv.lock() {
                    v.push(c);
                }
            }
        }
    });
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..parallel.max(1) {
        let (a, next, client) = (a.clone(), next.clone(), client.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), anyhow::Error>(());
                }
                let p = ConnectParams::new(b_addr, sid, Qpn::masked(2 + i as u32));
                let c = a
                    .connect(p)
                    .await
                    .map_err(|e| anyhow!("connection {i}: {e}"))?;
                if let Ok(mut v) = client.lock() {
                    v.push(c);
                }
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    // The listener side: every connection established (the RTUs are in).
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.stats().await?.established_now < cap {
        ensure!(
            Instant::now() < deadline,
            "the listener did not establish all"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let rss1 = rss_bytes();
    let held = (
        client.lock().map_err(|_| anyhow!("poisoned"))?.len(),
        server.lock().map_err(|_| anyhow!("poisoned"))?.len(),
    );
    ensure!(held == (cap, cap), "held {held:?} of {n}");
    let per = rss1.saturating_sub(rss0) as f64 / (2 * n) as f64;
    a.shutdown();
    b.shutdown();
    Ok((per, secs, rss0, rss1))
}

/// `cm-bench scale --no-thp --conns n` in a child process: the core's B/conn.
fn core_figure(n: u64) -> Result<f64> {
    let exe = std::env::current_exe().context("locate cm-bench")?;
    let out = std::process::Command::new(exe)
        .args(["scale", "--no-thp", "--conns", &n.to_string()])
        .output()
        .context("run cm-bench scale")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("scale: "))
        .ok_or_else(|| anyhow!("no `scale:` line from cm-bench scale: {text}"))?;
    line.split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| anyhow!("cannot read {line:?}"))
}
