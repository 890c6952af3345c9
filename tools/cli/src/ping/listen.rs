//! `cm-ping --listen`: accept (or reject, delay, answer SIDR) until SIGINT/SIGTERM.

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use ibcm::proto::SidrRepParams;
use ibcm::proto::{AcceptParams, ListenOptions};
use ibcm::rt::{Arrival, Cm, IncomingKind, LapPolicy};
use ibcm_mad::cma::PortSpace;
use ibcm_mad::{Qkey, Qpn, RejReason, ReqTransport, ServiceId, SidrStatus, TimeoutExp};

use super::args::{Args, DISCONNECT_MARKER};
use super::counts::Counts;
use super::endpoint::{bind, service_id};
use super::out::{hex_trim, out_limited};
use super::stateless::PeerCounts;
use crate::qpn::QpnAlloc;

pub(crate) async fn listen(args: Args, ip: IpAddr) -> Result<ExitCode> {
    let args = Arc::new(args);
    if let (Some(path), true) = (&args.daemon, args.xrc) {
        let (_cm, node) = super::node::attach_cm(path).await?;
        let policy = args.policy.as_deref().unwrap_or("process");
        let counts = Arc::new(Counts::default());
        super::node::xrc_listen(&node, service_id(&args, 7471), policy, args.quiet, &counts)
            .await?;
        return Ok(ExitCode::SUCCESS);
    }
    let (cm, _) = bind(&args, ip).await?;
    if args.accept_laps {
        cm.set_lap_policy(LapPolicy::Application).await?;
    }
    let sid = service_id(&args, 7471);
    let mut sids = vec![sid];
    // rdma_cm listeners take every port space of a port: TCP for RC, IB for XRC, and UDP for
    // SIDR when this listener answers SIDR.
    if let Some((PortSpace::Tcp, p)) = sid.rdma_cm_port() {
        sids.push(ServiceId::rdma_cm(PortSpace::Ib, p));
        if args.sidr_qpn.is_some() {
            sids.push(ServiceId::rdma_cm(PortSpace::Udp, p));
        }
    }
    let (tx, mut incoming) = tokio::sync::mpsc::unbounded_channel();
    for s in sids {
        // --stateless: every connection port space (SIDR has no stateless answer).
        let stateless = args.stateless.stateless
            && s.rdma_cm_port()
                .is_none_or(|(space, _)| space != PortSpace::Udp);
        let mut l = if stateless {
            let data = args.accept_data.as_ref().map(|h| h.0.as_slice());
            let t = super::stateless::template(&args.stateless, data);
            cm.listen_stateless(s, ListenOptions::default(), t).await?
        } else {
            cm.listen(s, ListenOptions::default()).await?
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(i) = l.next_arrival().await {
                if tx.send(i).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    // Printed even with --quiet: scripts wait for it before they connect.
    println!("listening on {ip} service_id={sid}");
    let counts = Arc::new(Counts::default());
    let qpn = Arc::new(QpnAlloc::new());
    let peers = Arc::new(PeerCounts::default());
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let inc = tokio::select! {
            i = incoming.recv() => i,
            _ = sigint.recv() => None,
            _ = sigterm.recv() => None,
        };
        let Some(inc) = inc else {
            break;
        };
        if let Arrival::Stateless(conn, info) = &inc {
            stateless_arrived(&args, &counts, &peers, conn, info);
        }
        let (cm, args, counts, qpn) = (cm.clone(), args.clone(), counts.clone(), qpn.clone());
        let peers = peers.clone();
        tokio::spawn(async move {
            let inc = match inc {
                Arrival::Request(inc) => inc,
                Arrival::Stateless(conn, info) => {
                    return serve_stateless(&args, &counts, &peers, conn, &info).await;
                }
            };
            if let Err(e) = serve_one(&cm, &args, &counts, &qpn, &peers, inc).await {
                out_limited(&args, format_args!("error {e:#}"));
            }
        });
    }
    // Stateless connections already handed over are established: counted (requests still
    // queued are left unanswered).
    while let Ok(inc) = incoming.try_recv() {
        if let Arrival::Stateless(conn, info) = &inc {
            stateless_arrived(&args, &counts, &peers, conn, info);
        }
    }
    super::datapath::report_timing();
    if args.stateless.peer_counts {
        println!("{}", peers.line());
    }
    println!("{}", counts.line());
    // The endpoint's counters, every drop by reason: the last line, one JSON object (the
    // daemon's endpoint is not this client's to report).
    if args.daemon.is_none() {
        println!("{}", cm.stats().await?.to_json());
    }
    // Stopped with its connections up, as a killed peer's would be: the process ends here.
    // Returning would drop the handles while the runtime shuts down, and whether the driver
    // then still ran long enough to send DREQs depended on which task the shutdown reached
    // first (the tests that stop a listener to count what it held rely on no DREQ).
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(0)
}

async fn serve_one(
    cm: &Cm,
    args: &Args,
    counts: &Counts,
    qpn: &QpnAlloc,
    peers: &PeerCounts,
    inc: ibcm::rt::Incoming,
) -> Result<()> {
    let req = match inc.kind() {
        IncomingKind::Connect(req) => req,
        IncomingKind::Sidr(s) => {
            out_limited(
                args,
                format_args!(
                    "sidr request from {} request_id={} sid={} pd={}",
                    s.peer,
                    s.request_id.0,
                    s.service_id,
                    hex_trim(&s.private_data)
                ),
            );
            // Without --sidr-qpn cm-ping serves no UD QP: a SIDR_REQ is refused (explicitly,
            // so nothing is logged).
            let p = match args.sidr_qpn {
                Some(q) => {
                    SidrRepParams::success(Qpn::masked(q as u32), Qkey(args.sidr_qkey as u32))
                }
                None => SidrRepParams {
                    status: SidrStatus::Rejected,
                    ..SidrRepParams::success(Qpn::default(), Qkey(0))
                },
            };
            let status = p.status;
            inc.sidr_reply(p).await?;
            out_limited(args, format_args!("sidr answered status={status:?}"));
            return Ok(());
        }
    };
    let id_hint = req.req.local_comm_id;
    let peer = req.peer;
    let alt = req.req.alternate_path;
    if alt.remote_lid.0 != 0 || alt.remote_gid != ibcm_mad::Gid::ZERO {
        counts.alt_paths.fetch_add(1, Ordering::Relaxed);
    }
    let xrc = req.transport() == ReqTransport::Xrc;
    let passive_disconnects = req.user_private_data().starts_with(DISCONNECT_MARKER);
    let cma = req.cma_header.map_or(String::new(), |h| {
        format!(" cma={}:{}->{}", h.src, h.src_port, h.dst)
    });
    out_limited(
        args,
        format_args!(
            "request from {peer} remote_comm_id={id_hint} remote_qpn={} sid={}{}{cma} pd={}",
            req.remote_qpn(),
            req.service_id(),
            if xrc { " XRC" } else { "" },
            hex_trim(req.user_private_data())
        ),
    );
    if let Some(reason) = args.reject {
        let pd = args.reject_data.clone().map(|h| h.0).unwrap_or_default();
        inc.reject(RejReason::from_raw(reason), &[], &pd).await?;
        counts.rejected.fetch_add(1, Ordering::Relaxed);
        out_limited(
            args,
            format_args!("rejected remote_comm_id={id_hint} reason={reason}"),
        );
        return Ok(());
    }
    if let (Some(ms), true) = (args.accept_delay, args.mra_on_duplicate) {
        // No MRA now: a duplicate REQ before the accept gets one from the endpoint
        // (EndpointConfig::mra_on_duplicate_req).
        out_limited(
            args,
            format_args!("accepting remote_comm_id={id_hint} in {ms} ms (MRA on a duplicate REQ)"),
        );
        tokio::time::sleep(Duration::from_millis(ms)).await;
    } else if let Some(ms) = args.accept_delay {
        let t = TimeoutExp::from_duration_ceil(Duration::from_millis(ms * 2));
        inc.mra(t).await?;
        out_limited(
            args,
            format_args!(
                "mra sent remote_comm_id={id_hint} service_timeout={}; accepting in {ms} ms",
                t.get()
            ),
        );
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if args.verbs.verbs.is_some() {
        return super::datapath::serve(cm, args, counts, inc).await;
    }
    let q = super::stateless::stateful_qpn(&args.stateless, qpn);
    let mut p = if xrc {
        // One TGT QP per listener: every XRC connection lands on it. It lives as long as the
        // listener, so a new connection may attach while an earlier one is in TimeWait.
        let mut p = AcceptParams::xrc_tgt(Qpn::masked(0x0ab_cdef));
        p.xrc_tgt_live = true;
        p
    } else {
        AcceptParams::new(q)
    };
    p.starting_psn = cm.random_psn().await?;
    if let Some(h) = &args.accept_data {
        p.private_data = h.0.clone();
    }
    let conn = inc.accept(p).await?;
    match conn.established().await {
        Ok(()) => {
            counts.established.fetch_add(1, Ordering::Relaxed);
            peers.up(peer);
            out_limited(args, format_args!("established conn={}", conn.id()));
        }
        Err(e) => {
            counts.count_error(&e);
            out_limited(args, format_args!("failed conn={} {e}", conn.id()));
            return Ok(());
        }
    }
    let why = if passive_disconnects {
        conn.disconnect(&[]).await
    } else if args.accept_laps {
        serve_laps(args, counts, &conn).await
    } else {
        conn.closed().await
    };
    peers.down(peer);
    counts.count_end(&why);
    out_limited(
        args,
        format_args!("disconnected conn={} ({why})", conn.id()),
    );
    Ok(())
}

/// `--accept-laps`: loads every alternate path the peer proposes on `conn` (APR status 0)
/// until the connection ends; returns why it ended. A LAP taken is answered and counted to
/// the end even when the connection ends meanwhile (`next_lap` is cancel-safe; the answer,
/// in a branch's body, is not raced).
async fn serve_laps(
    args: &Args,
    counts: &Counts,
    conn: &ibcm::rt::Connection,
) -> ibcm::proto::ConnectionError {
    loop {
        let lap = tokio::select! {
            why = conn.closed() => return why,
            lap = conn.next_lap() => lap,
        };
        let Ok(lap) = lap else {
            return conn.closed().await;
        };
        let p = *lap.path();
        match lap.accept(&[]).await {
            Ok(()) => {
                counts.laps.fetch_add(1, Ordering::Relaxed);
                out_limited(
                    args,
                    format_args!(
                        "conn={}: alternate path lid {} -> {} loaded",
                        conn.id(),
                        p.remote_lid,
                        p.local_lid
                    ),
                );
            }
            Err(e) => out_limited(args, format_args!("conn={}: APR: {e}", conn.id())),
        }
    }
}

/// A connection the endpoint made statelessly has arrived: counted and printed like an
/// accepted one (`established conn=… stateless`). Called from the listener's loop itself, so
/// that a connection that arrived before SIGINT/SIGTERM is in the counts printed then.
fn stateless_arrived(
    args: &Args,
    counts: &Counts,
    peers: &PeerCounts,
    conn: &ibcm::rt::Connection,
    info: &ibcm::proto::StatelessInfo,
) {
    let peer = info.req.peer;
    counts
        .established
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    peers.up(peer);
    out_limited(
        args,
        format_args!(
            "established conn={} stateless from {peer} remote_qpn={} qpn={} pd={}",
            conn.id(),
            info.req.remote_qpn(),
            info.rep.local_qpn,
            hex_trim(info.req.user_private_data())
        ),
    );
}

/// A stateless connection, then: held until the peer ends it, or disconnected at once when the REQ carried cm-ping's
/// passive-disconnect marker.
async fn serve_stateless(
    args: &Args,
    counts: &Counts,
    peers: &PeerCounts,
    conn: ibcm::rt::Connection,
    info: &ibcm::proto::StatelessInfo,
) {
    let peer = info.req.peer;
    let why = if info.req.user_private_data().starts_with(DISCONNECT_MARKER) {
        conn.disconnect(&[]).await
    } else {
        conn.closed().await
    };
    peers.down(peer);
    counts.count_end(&why);
    out_limited(
        args,
        format_args!("disconnected conn={} ({why})", conn.id()),
    );
}
