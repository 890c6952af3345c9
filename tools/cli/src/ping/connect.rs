//! cm-ping's active side (`--connect`): the connections one after another or `--parallel`,
//! each brought up (through the kernel's QP order with `--verbs`), held, pinged and torn down;
//! `--manual-rtu`, SIDR (`--sidr`) and the summary.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ibcm::proto::SidrReqParams;
use ibcm::proto::{ConnectError, ConnectParams, ConnectionError, PeerAddr};
use ibcm::rt::{Cm, CmError, Connection};
use ibcm::sa::{cm_peer, req_mtu, req_path};
use ibcm_mad::cma::{CmaHeader, PortSpace};
use ibcm_mad::{Qpn, RejReason, ServiceId, SidrStatus, TimeoutExp, U4};

use super::args::{Args, Who, DISCONNECT_MARKER};
use super::counts::Counts;
use super::end::finish;
use super::endpoint::bind;
use super::ib::Paths;
use super::out::{hex_trim, out};
use crate::qpn::QpnAlloc;

fn parse_target(s: &str) -> Result<(IpAddr, Option<u16>)> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok((ip, None));
    }
    let sa: SocketAddr = s
        .parse()
        .with_context(|| format!("{s:?} is neither IP nor IP:PORT"))?;
    Ok((sa.ip(), Some(sa.port())))
}

pub(crate) async fn connect(args: Args, target: &str) -> Result<ExitCode> {
    let ib = super::ib::parse(target).transpose()?;
    let (ip, port) = match ib {
        Some(_) => (std::net::Ipv4Addr::UNSPECIFIED.into(), None),
        None => parse_target(target)?,
    };
    let local = match (args.bind, args.local_ip) {
        (Some(b), _) => b,
        (None, Some(l)) => l,
        (None, None) if ip.is_loopback() => "127.0.0.1".parse()?,
        (None, None) => "0.0.0.0".parse()?,
    };
    let args = Arc::new(args);
    let (cm, mk) = bind(&args, local).await?;
    let (peer, path) = match ib {
        Some(t) => {
            let paths = super::ib::path_to(args.umad.as_deref(), t, args.alt_path).await?;
            (PeerAddr::Ib(cm_peer(&paths.primary, 0)), Some(paths))
        }
        None if args.alt_path => {
            bail!("--alt-path needs a lid: or gid: target on an InfiniBand port")
        }
        None => (mk.peer(ip), None),
    };
    if args.sidr {
        return sidr(&cm, &args, peer, local, port).await;
    }
    let counts = Arc::new(Counts::default());
    let next = Arc::new(AtomicU64::new(0));
    let qpns = Arc::new(QpnAlloc::new());
    // --same-qpn (test only): one QPN for every connection
    let shared_qpn = args.req.same_qpn.then(|| qpns.next());
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.parallel.max(1) {
        let (cm, args, counts, next) = (cm.clone(), args.clone(), counts.clone(), next.clone());
        let qpns = qpns.clone();
        workers.push(tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= args.count {
                    break;
                }
                let at = Target {
                    peer,
                    local,
                    port,
                    qpn: shared_qpn,
                    path,
                };
                held.extend(one_connection(&cm, &args, &counts, &qpns, at, i).await);
            }
            held
        }));
    }
    let mut held = Vec::new();
    for w in workers {
        held.extend(w.await.unwrap_or_default());
    }
    if args.stay {
        let by_peer = super::stay::stay(args.quiet, &counts, held).await;
        println!("{}", super::stay::line(&counts, by_peer));
        let ok = counts.established.load(Ordering::Relaxed) == args.count;
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(2)
        });
    }
    if args.hold {
        let secs = start.elapsed().as_secs_f64();
        println!(
            "cm-ping: connect step: {} connections in {secs:.3} s ({:.0} conn/s)",
            held.len(),
            held.len() as f64 / secs.max(1e-9)
        );
        let mut closing = Vec::new();
        for conn in held {
            let (args, counts) = (args.clone(), counts.clone());
            closing.push(tokio::spawn(async move {
                finish(&args, &counts, conn).await;
            }));
        }
        for c in closing {
            let _ = c.await;
        }
        super::datapath::release_held();
    }
    let secs = start.elapsed().as_secs_f64();
    if !args.quiet {
        eprintln!(
            "cm-ping: {} connections in {secs:.3} s ({:.0} conn/s)",
            args.count,
            args.count as f64 / secs.max(1e-9)
        );
    }
    super::datapath::report_timing();
    println!("{}", counts.line());
    if args.stats {
        println!("{}", cm.stats().await?.to_json());
    }
    let ok = counts.established.load(Ordering::Relaxed) == args.count
        && counts.disconnect_timed_out.load(Ordering::Relaxed) == 0
        && super::data::data_ok(counts.established.load(Ordering::Relaxed));
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

/// Where a connection goes: the peer, the local IP, the rdma_cm port if any.
#[derive(Debug, Clone, Copy)]
struct Target {
    peer: PeerAddr,
    local: IpAddr,
    port: Option<u16>,
    /// The QPN every connection announces (`--same-qpn`), else a fresh one each.
    qpn: Option<Qpn>,
    /// On InfiniBand: the paths from the SA, for the REQ's primary (and alternate) path, MTU
    /// and P_Key.
    path: Option<Paths>,
}

async fn one_connection(
    cm: &Cm,
    args: &Args,
    counts: &Counts,
    qpns: &QpnAlloc,
    at: Target,
    i: u64,
) -> Option<Connection> {
    let Target {
        peer,
        local,
        port,
        qpn,
        path,
    } = at;
    // A QPN of our own choosing may be replaced (`connect_fresh_qpn`), `--same-qpn`'s not.
    let fresh = qpn.is_none().then_some(qpns);
    let mut qpn = qpn.unwrap_or_else(|| qpns.next());
    let mut p = match (args.service_id, port.or(args.port)) {
        (Some(sid), _) => ConnectParams::new(peer, ServiceId(sid), qpn),
        (None, p) => {
            let dport = p.unwrap_or(7471);
            let mut p = ConnectParams::rdma_cm(
                SocketAddr::new(local, 0xc000 | (i as u16 & 0x3fff)),
                SocketAddr::new(peer.ip().unwrap_or(local), dport),
                qpn,
            );
            p.peer = peer;
            p
        }
    };
    if args.xrc {
        p = p.xrc();
    }
    let mut pd = args.private_data.clone().map(|h| h.0).unwrap_or_default();
    if args.disconnect_from == Who::Passive {
        pd = DISCONNECT_MARKER.to_vec();
    }
    p.private_data = pd;
    p.remote_cm_response_timeout = TimeoutExp::masked(args.timeout_exp);
    p.local_cm_response_timeout = TimeoutExp::masked(args.timeout_exp);
    p.max_cm_retries = U4::masked(args.retries);
    args.req.apply(&mut p, local);
    if let Some(paths) = path {
        let rec = paths.primary;
        let mut pp = req_path(&rec, super::ib::CA_ACK_DELAY);
        // The REQ's timer: 2 × the path's packet life time + the remote response timeout.
        p.packet_life_time = TimeoutExp::masked(rec.packet_life_time);
        if let Some(n) = args.req.local_ack_timeout {
            // The packet life time the passive side derives from it (N - 1), for both sides.
            pp.local_ack_timeout = TimeoutExp::masked(n);
            p.packet_life_time = TimeoutExp::masked(n.saturating_sub(1));
        }
        p.primary_path = Some(pp);
        p.alternate_path = paths
            .alternate
            .map(|a| req_path(&a, super::ib::CA_ACK_DELAY));
        p.path_mtu = req_mtu(&rec);
        p.pkey = rec.pkey;
    }
    if args.verbs.verbs.is_some() {
        return super::datapath::connect(cm, args, counts, p, i).await;
    }
    let manual = args.rtu_delay.is_some() || args.reject_rep.is_some();
    let conn = if manual {
        manual_connect(cm, args, counts, p, i).await
    } else {
        connect_fresh_qpn(cm, p, &mut qpn, fresh).await.map(Some)
    };
    let conn = match conn {
        Ok(Some(c)) => c,
        Ok(None) => return None,
        Err(CmError::Connection(e)) => {
            counts.count_error(&e);
            match &e {
                ConnectionError::Rejected { private_data, .. } => out(
                    args,
                    format_args!("connection {i}: {e} pd={}", hex_trim(private_data)),
                ),
                _ => out(args, format_args!("connection {i}: {e}")),
            }
            return None;
        }
        Err(e) => {
            out(args, format_args!("connection {i}: {e}"));
            return None;
        }
    };
    counts.established.fetch_add(1, Ordering::Relaxed);
    if path.is_some_and(|p| p.alternate.is_some()) {
        counts.alt_paths.fetch_add(1, Ordering::Relaxed);
    }
    // What the REP said: the peer's QPN (for XRC the TGT QPN from the EECN) and private data.
    let rep = conn.rep().map_or(String::new(), |r| {
        format!(
            " remote_qpn={} pd={}",
            r.remote_qpn,
            hex_trim(r.rep.private_data.as_bytes())
        )
    });
    out(
        args,
        format_args!("established conn={} qpn={qpn}{rep}", conn.id()),
    );
    if args.migrate {
        if let Some(paths) = path {
            migrate(args, counts, &conn, &paths, i).await;
        }
    }
    if args.hold || args.stay {
        return Some(conn);
    }
    finish(args, counts, conn).await;
    None
}

/// `--migrate`, the Automatic Path Migration sequence on an established connection whose REQ
/// carried an alternate path: the QP has migrated to it (`IBV_EVENT_PATH_MIG`, reported with
/// `notify_path_migrated`; there is no QP here), so the former primary path is proposed as
/// the new alternate (LAP) and must be loaded (APR status 0). Counted in `laps`.
async fn migrate(args: &Args, counts: &Counts, conn: &Connection, paths: &Paths, i: u64) {
    if let Err(e) = conn.notify_path_migrated().await {
        out(args, format_args!("connection {i}: path migrated: {e}"));
        return;
    }
    let back = req_path(&paths.primary, super::ib::CA_ACK_DELAY);
    match conn.load_alt_path(back, b"cm-ping:migrate").await {
        Ok(apr) => {
            counts.laps.fetch_add(1, Ordering::Relaxed);
            out(
                args,
                format_args!(
                    "connection {i}: alternate path lid {} -> {} loaded (APR {:?})",
                    back.local_lid, back.remote_lid, apr.status
                ),
            );
        }
        Err(e) => out(args, format_args!("connection {i}: LAP: {e}")),
    }
}

/// How many QPNs [`connect_fresh_qpn`] tries.
const QPN_TRIES: u32 = 8;

/// [`Cm::connect`]; when the endpoint refuses the QPN as still in TimeWait or in use, again
/// with the next one of `fresh` ([`QPN_TRIES`] in all), as an application would with a new
/// QP. cm-ping has no real QPs: its numbers are drawn at random, and one may be that of a
/// connection of another process still in the endpoint's TimeWait (through the node's CM
/// service the daemon's endpoint is shared: the cm-ping of `cm-bench node-kill`'s previous
/// round). `qpn` is the number used. No retry without `fresh` (`--same-qpn`).
async fn connect_fresh_qpn(
    cm: &Cm,
    mut p: ConnectParams,
    qpn: &mut Qpn,
    fresh: Option<&QpnAlloc>,
) -> Result<Connection, CmError> {
    let mut tries = 1;
    loop {
        p.local_qpn = *qpn;
        match (cm.connect(p.clone()).await, fresh) {
            (
                Err(CmError::Connect(
                    ConnectError::QpnInQuarantine { .. } | ConnectError::QpnInUse { .. },
                )),
                Some(qpns),
            ) if tries < QPN_TRIES => {
                tries += 1;
                *qpn = qpns.next();
            }
            (r, _) => return r,
        }
    }
}

/// Connects in the kernel's order ([`Cm::connect_manual`]): the REP arrives, then
/// `--rtu-delay` stands for the application's QP work before the RTU, or `--reject-rep`
/// rejects the REP. `Ok(None)` when the REP was rejected.
async fn manual_connect(
    cm: &Cm,
    args: &Args,
    counts: &Counts,
    p: ConnectParams,
    i: u64,
) -> Result<Option<Connection>, CmError> {
    let pending = cm.connect_manual(p).await?;
    let rep = pending.rep();
    out(
        args,
        format_args!(
            "rep received conn={} remote_qpn={} pd={}",
            pending.id(),
            rep.remote_qpn,
            hex_trim(rep.rep.private_data.as_bytes())
        ),
    );
    if let Some(reason) = args.reject_rep {
        let pd = args.reject_data.clone().map(|h| h.0).unwrap_or_default();
        let id = pending.id();
        pending
            .reject(RejReason::from_raw(reason), &[], &pd)
            .await?;
        counts.rejected.fetch_add(1, Ordering::Relaxed);
        out(
            args,
            format_args!("connection {i}: rejected the REP conn={id} reason={reason}"),
        );
        return Ok(None);
    }
    if let Some(ms) = args.rtu_delay {
        out(args, format_args!("rtu in {ms} ms conn={}", pending.id()));
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    pending.establish(&[]).await.map(Some)
}

/// `--sidr`: one SIDR round trip; exits 0 when the answer is a success.
async fn sidr(
    cm: &Cm,
    args: &Args,
    peer: PeerAddr,
    local: IpAddr,
    port: Option<u16>,
) -> Result<ExitCode> {
    let (sid, cma) = match (args.service_id, port.or(args.port)) {
        (Some(sid), _) => (ServiceId(sid), None),
        (None, p) => {
            let dport = p.unwrap_or(7471);
            let dst = peer.ip().unwrap_or(local);
            (
                ServiceId::rdma_cm(PortSpace::Udp, dport),
                Some(CmaHeader::new(SocketAddr::new(local, 0xc000), dst)),
            )
        }
    };
    let mut pd = Vec::new();
    if let Some(h) = cma {
        pd.resize(CmaHeader::LEN, 0);
        h.emit(&mut pd)?;
    }
    pd.extend(args.private_data.clone().map(|h| h.0).unwrap_or_default());
    let mut p = SidrReqParams::new(peer, sid);
    p.private_data = pd;
    p.max_retries = args.retries;
    let a = cm.sidr(p).await?;
    println!(
        "sidr reply status={:?} qpn={} qkey={:#010x} pd={}",
        a.status,
        a.qpn,
        a.qkey.0,
        hex_trim(&a.private_data)
    );
    Ok(if a.status == SidrStatus::Success {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
