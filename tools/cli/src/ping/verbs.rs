//! One real RC QP per connection, brought up through the CM in the kernel's order:
//!
//! * passive: QP to INIT and RTR *before* the REP (`Incoming::accept`), to RTS when the RTU
//!   arrives (`Connection::established`);
//! * active: the REQ names the QP; on the REP (`Cm::connect_manual`) the QP goes to INIT,
//!   RTR and RTS, and only then is the RTU sent (`PendingConnection::establish`).
//!
//! Every attribute comes from `ibcm::qp_attr::qp_attr` (REQ + REP + the local port: on RoCE
//! a global address vector with `--gid-index`). Completions are waited for on the CQ's
//! completion channel through tokio's `AsyncFd`.

use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use ibcm::mad::Req;
use ibcm::proto::{roce_path, AcceptParams, ConnectParams};
use ibcm::qp_attr::{
    negotiate_accept, qp_attr, Connection as QpConn, LinkLayer, LocalPort, QpState, Side,
};
use ibcm::rt::{Cm, CmError, Connection, Incoming, IncomingKind};
use ibcm_mad::{Gid, ReqTransport, TimeoutExp};
use ibcm_xrc::verbs::rc::{CompletionQueue, Device, QpCaps, RcQp};

use super::args::Args;
use super::counts::Counts;
use super::data::{DataProto, DATA};
use super::out::{out, out_limited};
use super::qp::{ConnQp, Cq};

/// The device and the local port facts every connection's QP needs.
#[derive(Debug)]
struct Ctx {
    dev: Device,
    port: LocalPort,
    link: LinkLayer,
    /// `--data none`: one CQ without a channel for every QP (nothing is ever posted), as
    /// cmtime does.
    shared_cq: Option<CompletionQueue>,
}

static CTX: OnceLock<Ctx> = OnceLock::new();

/// Opens `--verbs DEVICE` once, before the first connection; refuses options that have no
/// meaning with real QPs.
pub(crate) fn init(args: &Args) -> Result<()> {
    let Some(name) = &args.verbs.verbs else {
        return Ok(());
    };
    if args.xrc {
        bail!("--verbs makes RC QPs; --xrc is not supported with it");
    }
    if args.verbs.size == 0 || args.verbs.size > 1 << 20 {
        bail!("--size must be 1..=1048576");
    }
    let dev = Device::open(name).with_context(|| format!("--verbs {name}"))?;
    let port_num = args.verbs.verbs_port;
    let pinfo = dev
        .port(port_num)
        .with_context(|| format!("--verbs {name}: port {port_num}"))?;
    if pinfo.state != 4 {
        eprintln!(
            "cm-ping: warning: {name} port {port_num} is not ACTIVE (state {})",
            pinfo.state
        );
    }
    // The GID index names the source GID of every QP's address vector: it must be the GID of
    // the address the CM speaks from, or the peer answers a GID it never asked for.
    if let Some(ip) = args.local_ip.or(args.listen.and_then(|l| l.ip())) {
        let gid = dev.gid(port_num, args.gid_index)?;
        if gid != Gid::from_ip(ip).0 {
            bail!(
                "--verbs {name}: GID index {} of port {port_num} is {}, not the GID of {ip}",
                args.gid_index,
                Gid(gid)
            );
        }
    }
    let shared_cq = match args.verbs.data {
        DataProto::None => Some(CompletionQueue::new(&dev, 4)?),
        _ => None,
    };
    let ctx = Ctx {
        shared_cq,
        dev,
        port: LocalPort {
            port_num,
            pkey_index: 0,
            sgid_index: args.gid_index,
            lmc: 0,
        },
        link: pinfo.link_layer,
    };
    CTX.set(ctx)
        .map_err(|_| anyhow!("--verbs: the device is already open"))?;
    super::data::ENABLED.store(true, Ordering::Relaxed);
    super::data::NO_DATA.store(args.verbs.data == DataProto::None, Ordering::Relaxed);
    if args.hold && args.connect.is_some() {
        // As cmtime does (its "create qp" step), every QP exists before the first REQ, so the
        // timed connect step holds the CM exchange and the INIT/RTR/RTS transitions.
        let start = std::time::Instant::now();
        let (sends, recvs) = depths(args);
        let mut pool = Vec::new();
        for _ in 0..args.count {
            pool.push(ConnQp::create(sends, recvs)?);
        }
        let n = pool.len();
        if let Ok(mut p) = POOL.lock() {
            *p = pool;
        }
        eprintln!(
            "cm-ping: created {n} QPs before the connect step in {:.3} s",
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// `--hold --connect`: the QPs created before the connect step, taken one per connection.
static POOL: std::sync::Mutex<Vec<ConnQp>> = std::sync::Mutex::new(Vec::new());

fn ctx() -> Result<&'static Ctx> {
    CTX.get().ok_or_else(|| anyhow!("--verbs: device not open"))
}

impl ConnQp {
    /// A QP from the pool made before the connect step, else a new one.
    fn new(sends: u32, recvs: u32) -> Result<Self> {
        if let Some(q) = POOL.lock().ok().and_then(|mut p| p.pop()) {
            return Ok(q);
        }
        Self::create(sends, recvs)
    }

    fn create(sends: u32, recvs: u32) -> Result<Self> {
        let t = std::time::Instant::now();
        let r = Self::create_inner(sends, recvs);
        TIMES.create.add(t);
        r
    }

    fn create_inner(sends: u32, recvs: u32) -> Result<Self> {
        let c = ctx()?;
        let caps = QpCaps {
            max_send_wr: sends,
            max_recv_wr: recvs,
            max_inline_data: 0,
        };
        let (qp, cq) = match &c.shared_cq {
            Some(shared) => (RcQp::new(&c.dev, shared, caps)?, None),
            None => {
                let cq = Cq::new(&c.dev, sends + recvs + 4)?;
                (RcQp::new(&c.dev, &cq.cq, caps)?, Some(cq))
            }
        };
        Ok(ConnQp {
            qp,
            cq,
            dev: c.dev.clone(),
        })
    }

    /// Moves the QP to `state` with the attributes the CM computes for this connection.
    fn to(&self, conn: &QpConn<'_>, state: QpState) -> Result<()> {
        let (attr, mask) = qp_attr(conn, state)?;
        let t = std::time::Instant::now();
        let r = self
            .qp
            .modify(&attr, mask)
            .with_context(|| format!("QP {:#x} to {state:?}", self.qp.qpn().get()));
        let slot = match state {
            QpState::Init => &TIMES.init,
            QpState::Rtr => &TIMES.rtr,
            _ => &TIMES.rts,
        };
        slot.add(t);
        r
    }
}

/// Work-request depths per protocol: (sends, receives).
fn depths(args: &Args) -> (u32, u32) {
    match args.verbs.data {
        DataProto::Rping => (16, 4),
        DataProto::Ucmatose => {
            let n = args.verbs.pings.max(1);
            (n + 4, n + 4)
        }
        DataProto::None => (1, 1),
    }
}

/// The protocol's state on one connection, set up (buffers registered, receives posted)
/// before the QP leaves RESET… or INIT: receives must be posted before RTR.
enum Proto {
    Rping(super::rping::Rping),
    Ucmatose(super::ucmatose::Ucmatose),
    /// `--data none`: the QP is brought up and torn down, nothing is sent.
    None,
}

impl Proto {
    fn new(args: &Args, q: &ConnQp, server: bool) -> Result<Self> {
        Ok(match args.verbs.data {
            DataProto::Rping => Proto::Rping(super::rping::Rping::new(q, args.verbs.size, server)?),
            DataProto::Ucmatose => Proto::Ucmatose(super::ucmatose::Ucmatose::new(
                q,
                args.verbs.size,
                args.verbs.pings.max(1),
            )?),
            DataProto::None => Proto::None,
        })
    }

    /// Posts the initial receives (the QP is in INIT).
    fn post_recvs(&self, q: &ConnQp) -> Result<()> {
        match self {
            Proto::Rping(p) => p.post_recvs(q),
            Proto::Ucmatose(p) => p.post_recvs(q),
            Proto::None => Ok(()),
        }
    }

    /// Runs the exchange; `Ok(bytes checked)`.
    async fn run(
        &mut self,
        q: &mut ConnQp,
        conn: &Connection,
        args: &Args,
        server: bool,
    ) -> Result<u64> {
        match self {
            Proto::Rping(p) if server => p.serve(q, conn).await,
            Proto::Rping(p) => p.ping(q, args.verbs.pings.max(1)).await,
            Proto::Ucmatose(p) => p.exchange(q, server).await,
            Proto::None => Ok(0),
        }
    }
}

fn count_data(r: &Result<u64>) {
    match r {
        Ok(b) => {
            DATA.verified.fetch_add(1, Ordering::Relaxed);
            DATA.bytes.fetch_add(*b, Ordering::Relaxed);
        }
        Err(_) => {
            DATA.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The passive side of one connection: QP to RTR, REP, RTS on the RTU, the exchange, and the
/// end of the connection (the rping client disconnects; a ucmatose server disconnects).
pub(crate) async fn serve(cm: &Cm, args: &Args, counts: &Counts, inc: Incoming) -> Result<()> {
    let IncomingKind::Connect(req) = inc.kind() else {
        bail!("not a connection request");
    };
    let req: Req = req.req;
    if req.transport() != ReqTransport::Rc {
        inc.reject(ibcm_mad::RejReason::ConsumerReject, &[], &[])
            .await?;
        counts.rejected.fetch_add(1, Ordering::Relaxed);
        bail!(
            "--verbs serves RC only: rejected a {:?} REQ",
            req.transport()
        );
    }
    let c = ctx()?;
    let (sends, recvs) = depths(args);
    let mut q = ConnQp::new(sends, recvs)?;
    let mut proto = Proto::new(args, &q, true)?;
    let mut p = AcceptParams::new(q.qp.qpn());
    p.starting_psn = cm.random_psn().await?;
    let lim = c.dev.limits();
    let rd = negotiate_accept(&req, lim.max_qp_rd_atom, lim.max_qp_init_rd_atom);
    p.responder_resources = rd.responder_resources;
    p.initiator_depth = rd.initiator_depth;
    if let Some(h) = &args.accept_data {
        p.private_data = h.0.clone();
    }
    // The REP these parameters make, as far as the QP attributes read it.
    let rep = p.rep_fields();
    let qc = QpConn::new(&req, &rep, Side::Passive, c.link, c.port);
    q.to(&qc, QpState::Init)?;
    proto.post_recvs(&q)?;
    q.to(&qc, QpState::Rtr)?;
    let conn = inc.accept(p).await?;
    if let Err(e) = conn.established().await {
        counts.count_error(&e);
        out_limited(args, format_args!("failed conn={} {e}", conn.id()));
        return Ok(());
    }
    counts.established.fetch_add(1, Ordering::Relaxed);
    q.to(&qc, QpState::Rts)?;
    out_limited(
        args,
        format_args!(
            "established conn={} qpn={:#x} remote_qpn={} RTS",
            conn.id(),
            q.qp.qpn().get(),
            req.local_qpn
        ),
    );
    let r = proto.run(&mut q, &conn, args, true).await;
    if !matches!(proto, Proto::None) {
        report(args, &conn, &r);
        count_data(&r);
    }
    // rping: the client disconnects when it is done; ucmatose: the server does.
    let why = if matches!(proto, Proto::Ucmatose(_)) || r.is_err() {
        conn.disconnect(&[]).await
    } else {
        conn.closed().await
    };
    counts.count_end(&why);
    out_limited(
        args,
        format_args!("disconnected conn={} ({why})", conn.id()),
    );
    Ok(())
}

fn report(args: &Args, conn: &Connection, r: &Result<u64>) {
    match r {
        Ok(b) => out_limited(
            args,
            format_args!("data verified conn={} bytes={b}", conn.id()),
        ),
        Err(e) => out_limited(args, format_args!("data failed conn={}: {e:#}", conn.id())),
    }
}

/// The active side of one connection: REQ naming the QP, on the REP INIT/RTR/RTS, RTU, the
/// exchange, then the disconnect as `--disconnect-from` says.
/// With `--hold`, returns the established connection; its QP is kept until
/// [`release_held`].
pub(crate) async fn connect(
    cm: &Cm,
    args: &Args,
    counts: &Counts,
    p: ConnectParams,
    i: u64,
) -> Option<Connection> {
    match connect_inner(cm, args, counts, p, i).await {
        Ok(c) => c,
        Err(e) => {
            out(args, format_args!("connection {i}: {e:#}"));
            None
        }
    }
}

/// The QPs of `--hold` connections.
static HELD: std::sync::Mutex<Vec<ConnQp>> = std::sync::Mutex::new(Vec::new());

/// Destroys the QPs kept for `--hold` connections (after their disconnects).
pub(crate) fn release_held() {
    let t = std::time::Instant::now();
    if let Ok(mut h) = HELD.lock() {
        h.clear();
    }
    TIMES.destroy.add(t);
}

/// Time spent in the verbs calls of one kind, summed over the connections, and the calls.
#[derive(Debug)]
struct CallTime {
    nanos: std::sync::atomic::AtomicU64,
    calls: std::sync::atomic::AtomicU64,
}

impl CallTime {
    const fn new() -> Self {
        CallTime {
            nanos: std::sync::atomic::AtomicU64::new(0),
            calls: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn add(&self, since: std::time::Instant) {
        let n = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(n, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn show(&self, what: &str) -> String {
        let (n, c) = (
            self.nanos.load(Ordering::Relaxed),
            self.calls.load(Ordering::Relaxed),
        );
        format!("{what} {:.3} s/{c}", n as f64 / 1e9)
    }
}

/// Where the QP work of this process went: wall time in the verbs calls.
struct Times {
    create: CallTime,
    init: CallTime,
    rtr: CallTime,
    rts: CallTime,
    destroy: CallTime,
}

static TIMES: Times = Times {
    create: CallTime::new(),
    init: CallTime::new(),
    rtr: CallTime::new(),
    rts: CallTime::new(),
    destroy: CallTime::new(),
};

/// `cm-ping: verbs time: create X s/N, INIT …, destroy …` (wall time inside the verbs
/// calls, summed; `destroy` counts the release of held QPs as one call).
pub(crate) fn timing_line() -> String {
    format!(
        "cm-ping: verbs time: {}, {}, {}, {}, {}",
        TIMES.create.show("create"),
        TIMES.init.show("INIT"),
        TIMES.rtr.show("RTR"),
        TIMES.rts.show("RTS"),
        TIMES.destroy.show("destroy held")
    )
}

async fn connect_inner(
    cm: &Cm,
    args: &Args,
    counts: &Counts,
    mut p: ConnectParams,
    i: u64,
) -> Result<Option<Connection>> {
    let c = ctx()?;
    let (sends, recvs) = depths(args);
    let mut q = ConnQp::new(sends, recvs)?;
    let mut proto = Proto::new(args, &q, false)?;
    p.local_qpn = q.qp.qpn();
    let lim = c.dev.limits();
    p.responder_resources = p.responder_resources.min(lim.max_qp_rd_atom);
    p.initiator_depth = p.initiator_depth.min(lim.max_qp_init_rd_atom);
    let (local, remote) = match (cm_local_gid(args), p.peer.gid()) {
        (Some(l), Some(r)) => (l, r),
        _ => bail!("--verbs needs --local-ip and an IP peer"),
    };
    // The path the REQ carries (the endpoint's default, spelled out: the QP attributes read it).
    let path = roce_path(
        local,
        remote,
        TimeoutExp::masked(p.packet_life_time.get().saturating_add(1).min(31)),
    );
    p.primary_path = Some(path);
    let life = p.packet_life_time.get();
    let pending = match cm.connect_manual(p).await {
        Ok(pc) => pc,
        Err(CmError::Connection(e)) => {
            counts.count_error(&e);
            out(args, format_args!("connection {i}: {e}"));
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let rep = pending.rep().rep;
    // The REQ as the endpoint sent it (with the start PSN it drew).
    let req = *pending.req();
    let mut qc = QpConn::new(&req, &rep, Side::Active, c.link, c.port);
    qc.packet_life_time = Some(life);
    // Dropping `pending` on an error rejects the REP (REJ 28): the peer is not left waiting.
    q.to(&qc, QpState::Init)?;
    proto.post_recvs(&q)?;
    q.to(&qc, QpState::Rtr)?;
    q.to(&qc, QpState::Rts)?;
    let conn = match pending.establish(&[]).await {
        Ok(conn) => conn,
        Err(CmError::Connection(e)) => {
            counts.count_error(&e);
            out(args, format_args!("connection {i}: {e}"));
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    counts.established.fetch_add(1, Ordering::Relaxed);
    out(
        args,
        format_args!(
            "established conn={} qpn={:#x} remote_qpn={} RTS",
            conn.id(),
            q.qp.qpn().get(),
            rep.local_qpn
        ),
    );
    let r = proto.run(&mut q, &conn, args, false).await;
    if !matches!(proto, Proto::None) {
        report_active(args, &conn, &r);
        count_data(&r);
    }
    if args.hold {
        // The QP lives as long as the held connection: released after the disconnects.
        if let Ok(mut h) = HELD.lock() {
            h.push(q);
        }
        return Ok(Some(conn));
    }
    super::end::finish(args, counts, conn).await;
    Ok(None)
}

fn report_active(args: &Args, conn: &Connection, r: &Result<u64>) {
    match r {
        Ok(b) => out(
            args,
            format_args!("data verified conn={} bytes={b}", conn.id()),
        ),
        Err(e) => out(args, format_args!("data failed conn={}: {e:#}", conn.id())),
    }
}

/// The GID the endpoint speaks from (`--local-ip`, else `--bind`).
fn cm_local_gid(args: &Args) -> Option<Gid> {
    args.local_ip.or(args.bind).map(Gid::from_ip)
}
