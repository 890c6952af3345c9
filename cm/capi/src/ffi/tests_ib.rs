//! "lid:N" and "gid:G" peers end to end through the C ABI: two in-process daemons
//! (`NodeServer`) whose endpoints are LID-routed ports of one in-memory network, the client's
//! daemon at LID 2 with an SA client (a fake SA at LID 1), the server's at LID 5 without one.

use std::ffi::{c_int, CStr, CString};
use std::path::PathBuf;
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::time::Duration;

use ibcm::proto::{EndpointConfig, IbAddr, PeerAddr};
use ibcm::rt::node::{
    EventSink, HookFuture, NodeHooks, NodeServer, ServerConfig, SessionInfo, XrcListenReq,
};
use ibcm::rt::sa::{PathResolver, Sa};
use ibcm::rt::umad::{IbPort, LinkLayer};
use ibcm::rt::{Cm, DatagramTransport, MemNetwork, MemTransport};
use ibcm::sa::{SaClient, SaConfig};
use ibcm_mad::sa::{PathRecord, SaMad};
use ibcm_mad::{Gid, Guid, Lid, Method, Pkey, Qkey, Qpn, ServiceId, Tid};

use super::api::*;
use super::apm::*;
use super::conn::*;
use super::ctx::ibcm_ctx;
use super::status;
use super::types::ibcm_event_type::*;
use super::types::ibcm_status::{self, *};
use super::types::*;

fn st(c: c_int) -> ibcm_status {
    status(c).unwrap_or_else(|| panic!("{c} is not a status"))
}

struct NoXrc;

impl NodeHooks for NoXrc {
    fn xrc_listen<'a>(
        &'a self,
        _: SessionInfo,
        _: ServiceId,
        _: XrcListenReq<'a>,
        _: EventSink,
    ) -> HookFuture<'a, Result<(), String>> {
        Box::pin(async { Err("no XRC here".to_owned()) })
    }
    fn xrc_destroy(&self, _: SessionInfo) -> HookFuture<'_, Result<u64, String>> {
        Box::pin(async { Ok(0) })
    }
    fn xrc_unlisten(&self, _: SessionInfo, _: ServiceId) -> HookFuture<'_, ()> {
        Box::pin(async {})
    }
    fn session_ended(&self, _: SessionInfo) -> HookFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// fe80::`n`.
fn gid(n: u16) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[14..].copy_from_slice(&n.to_be_bytes());
    Gid(g)
}

/// The CM (QP1) of the port at `lid`, LID-routed: what `cm_peer` of a path to it gives.
fn cm_at(lid: u16) -> PeerAddr {
    PeerAddr::Ib(IbAddr {
        lid: Lid(lid),
        gid: None,
        qpn: Qpn::masked(1),
        qkey: Qkey::GSI,
        sl: 0,
        pkey_index: 0,
    })
}

/// The SA at LID 1: a path from LID 2 to the template's DLID (or its DGID's last two
/// bytes), MTU 2048; ERR_NO_RECORDS for DLIDs of 0x100 and above. The ports have two LIDs
/// each (LMC 1: 2 and 3, D and D + 1): a GetTable is answered with the paths 2 → D,
/// 2 → D + 1 and 3 → D + 1.
async fn fake_sa(mut t: MemTransport) {
    while let Ok((from, mad)) = t.recv().await {
        let Ok(q) = SaMad::parse(&mad) else { continue };
        let tmpl = PathRecord::parse(&q.data).unwrap_or_default();
        let dlid = match tmpl.dlid.0 {
            0 => u16::from_be_bytes([tmpl.dgid.0[14], tmpl.dgid.0[15]]),
            l => l,
        };
        let rec = PathRecord {
            sgid: gid(2),
            dgid: gid(dlid),
            slid: Lid(2),
            dlid: Lid(dlid),
            pkey: Pkey(0xffff),
            mtu: ibcm_mad::Mtu::Mtu2048,
            packet_life_time: 18,
            reversible: true,
            ..PathRecord::default()
        };
        let mut a = q.clone();
        a.header.method = Method::from_raw(q.header.method.raw() | 0x80);
        a.header.tid = Tid(q.header.tid.0);
        a.data = [0; 200];
        if dlid >= 0x100 {
            a.header.status = 0x0300;
        } else if q.header.method == ibcm_mad::sa::method::GET_TABLE {
            a.attr_offset = 8;
            for (i, (s, d)) in [(2, dlid), (2, dlid + 1), (3, dlid + 1)]
                .into_iter()
                .enumerate()
            {
                let r = PathRecord {
                    slid: Lid(s),
                    dlid: Lid(d),
                    ..rec
                };
                a.data[i * 64..(i + 1) * 64].copy_from_slice(&r.to_bytes());
            }
        } else {
            a.data[..64].copy_from_slice(&rec.to_bytes());
        }
        let _ = t.send(from, &a.to_bytes()).await;
    }
}

/// A daemon on `sock` whose endpoint is the port at `lid` of `net`, with the fake SA when
/// `sa`, as `ibcmd --umad` on an InfiniBand port runs it.
async fn daemon(net: &MemNetwork, sock: &std::path::Path, lid: u16, sa: bool) {
    let cfg = EndpointConfig {
        local_ca_guid: Guid(u64::from(lid)),
        ..EndpointConfig::default()
    };
    let (cm, _) = Cm::bind(net.transport(cm_at(lid)), cfg);
    if sa {
        let mut sa_cfg = SaConfig::new(1, Lid(1));
        sa_cfg.timeout = Duration::from_millis(200);
        // The SA's QP1 at the SM's LID, as the SA task addresses it.
        tokio::spawn(fake_sa(net.transport(cm_at(1))));
        let me = net.transport(PeerAddr::Ib(IbAddr {
            lid: Lid(lid),
            ..IbAddr::roce(gid(lid))
        }));
        let port = IbPort {
            device: "mlx5_0".into(),
            port: 1,
            link_layer: LinkLayer::InfiniBand,
            lid: Lid(lid),
            lmc: 0,
            sm_lid: Lid(1),
            sm_sl: 0,
            gid: gid(lid),
            pkey0: Pkey(0xffff),
        };
        let r = PathResolver::new(Sa::spawn(SaClient::new(sa_cfg, 7), me), port);
        assert!(cm.set_path_resolver(r).is_ok());
    }
    let l = tokio::net::UnixListener::bind(sock).unwrap();
    let cfg = ServerConfig {
        infiniband: true,
        ..ServerConfig::default()
    };
    tokio::spawn(NodeServer::new(cm, Arc::new(NoXrc), cfg, None).serve(l));
}

/// The next event of `ctx` (5 s at most), as (type, handle, status, peer, reason).
fn next(ctx: *mut ibcm_ctx) -> (ibcm_event_type, u64, ibcm_status, String, String) {
    let mut ev = null_mut();
    // SAFETY: (test) a live context and a writable local; the event's strings are read
    // before it is given back.
    unsafe {
        assert_eq!(st(ibcm_wait_event(ctx, 5000, &mut ev)), IBCM_OK);
        let e = &*ev;
        let r = (
            e.event,
            e.conn,
            e.status,
            CStr::from_ptr(e.peer).to_string_lossy().into_owned(),
            CStr::from_ptr(e.reason).to_string_lossy().into_owned(),
        );
        assert_eq!(st(ibcm_ack_event(ctx, ev)), IBCM_OK);
        r
    }
}

fn open(sock: &std::path::Path) -> *mut ibcm_ctx {
    let path = CString::new(sock.to_str().unwrap()).unwrap();
    let mut ctx = null_mut();
    // SAFETY: (test) a NUL-terminated path and a writable local.
    assert_eq!(st(unsafe { ibcm_open(path.as_ptr(), &mut ctx) }), IBCM_OK);
    ctx
}

/// Starts a connect from `ctx` to `peer` for service 0x77 from QP `qpn`.
fn connect(ctx: *mut ibcm_ctx, peer: &str, qpn: u32) -> u64 {
    connect_with(ctx, peer, qpn, crate::params::conn_param_default())
}

/// As [`connect`], with the other fields of `p`.
fn connect_with(ctx: *mut ibcm_ctx, peer: &str, qpn: u32, mut p: ibcm_conn_param) -> u64 {
    let peer = CString::new(peer).unwrap();
    p.peer = peer.as_ptr();
    p.service_id = 0x77;
    p.qp_num = qpn;
    let mut h = 0u64;
    // SAFETY: (test) live locals; the peer string outlives the call.
    assert_eq!(st(unsafe { ibcm_connect(ctx, &p, &mut h) }), IBCM_OK);
    h
}

#[test]
fn connects_by_lid_and_gid_and_says_why_not() {
    let dir = std::env::temp_dir().join(format!("ibcm-capi-ib-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (a_sock, b_sock): (PathBuf, PathBuf) = (dir.join("a.sock"), dir.join("b.sock"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let net = MemNetwork::new();
    rt.block_on(async {
        daemon(&net, &a_sock, 2, true).await;
        daemon(&net, &b_sock, 5, false).await;
    });
    let (client, server) = (open(&a_sock), open(&b_sock));
    // SAFETY: (test) a live context.
    assert_eq!(st(unsafe { ibcm_listen(server, 0x77) }), IBCM_OK);
    // Connection parameters other than the defaults, both ways.
    let mut cp = crate::params::conn_param_default();
    (cp.responder_resources, cp.initiator_depth) = (4, 2);
    (cp.retry_count, cp.rnr_retry_count, cp.srq) = (5, 6, 1);
    for (i, peer) in ["lid:5", "lid:0x5", "gid:fe80::5"].into_iter().enumerate() {
        let h = connect_with(client, peer, 0x100 + i as u32, cp);
        let (sh, from, params) = with_event(server, |e| {
            assert_eq!(e.event, IBCM_EVENT_CONNECT_REQUEST, "{peer}");
            // SAFETY: (test) the event's string, valid until it is acknowledged.
            let from = unsafe { CStr::from_ptr(e.peer) }
                .to_string_lossy()
                .into_owned();
            (e.conn, from, conn_params(e))
        });
        assert_eq!(
            from, "lid:2",
            "the passive side names the client's port as connect takes it"
        );
        // The REQ's, from the receiver's view: its initiator depth is our responder
        // resources; flow control is the endpoint's (on); MTU 1024, the asked one.
        assert_eq!(params, [2, 4, 1, 5, 6, 1, 3], "{peer}");
        let mut ap = crate::params::accept_param_default();
        ap.qp_num = 0x200 + i as u32;
        (ap.responder_resources, ap.initiator_depth) = (2, 3);
        (ap.rnr_retry_count, ap.srq) = (1, 1);
        // SAFETY: (test) a live context and a local.
        assert_eq!(st(unsafe { ibcm_accept(server, sh, &ap) }), IBCM_OK);
        let (t, ch, params) = with_event(client, |e| (e.event, e.conn, conn_params(e)));
        assert_eq!((t, ch), (IBCM_EVENT_ESTABLISHED, h), "{peer}");
        // The REP's, from the receiver's view; a REP has no retry count and no MTU.
        assert_eq!(params, [3, 2, 1, 0, 1, 1, 0], "{peer}");
        // The REQ's path: the SA's record, LID-routed.
        let mut a = ibcm_qp_attr::default();
        let mut mask = 0;
        let port = ibcm_port {
            port_num: 1,
            sgid_index: 0,
            lmc: 0,
            pkey_index: 0,
            link_layer: ibcm_link_layer::IBCM_LINK_LAYER_INFINIBAND as u32,
        };
        // SAFETY: (test) a live context and locals.
        let r = unsafe { ibcm_init_qp_attr(client, h, 2, &port, null(), &mut a, &mut mask) };
        assert_eq!(st(r), IBCM_OK);
        assert_eq!((a.ah_attr.dlid, a.ah_attr.is_global), (5, 0), "{peer}");
        assert_eq!(a.path_mtu, 3, "the asked 1024, below the path's 2048");
        let (t, params) = with_event(server, |e| (e.event, conn_params(e)));
        assert_eq!(
            (t, params),
            (IBCM_EVENT_ESTABLISHED, [0; 7]),
            "none on the RTU"
        );
        // SAFETY: (test) a live context.
        let r = unsafe { ibcm_disconnect(client, h, null(), 0) };
        assert_eq!(st(r), IBCM_OK);
        assert_eq!(next(client).0, IBCM_EVENT_DISCONNECTED);
        assert_eq!(next(server).0, IBCM_EVENT_DISCONNECTED);
    }
    // No path: the SA's ERR_NO_RECORDS, as the connect's final event.
    let h = connect(client, "lid:0x200", 0x110);
    let (t, ch, status, _, reason) = next(client);
    assert_eq!((t, ch, status), (IBCM_EVENT_CONNECT_ERROR, h, IBCM_ENOPATH));
    assert!(
        reason.starts_with(
            "path to lid:512: no path: PathRecord query to the SA: SA status NoRecords"
        ),
        "{reason}"
    );
    // A daemon without an SA (not on an InfiniBand port).
    let h = connect(server, "lid:2", 0x120);
    let (t, ch, status, _, reason) = next(server);
    assert_eq!(
        (t, ch, status),
        (IBCM_EVENT_CONNECT_ERROR, h, IBCM_EUNSUPPORTED)
    );
    assert!(reason.contains("not on an InfiniBand port"), "{reason}");
    // An IP peer through a daemon on an InfiniBand port: refused by the daemon.
    let h = connect(client, "10.0.0.9", 0x130);
    let (t, ch, status, _, reason) = next(client);
    assert_eq!(
        (t, ch, status),
        (IBCM_EVENT_CONNECT_ERROR, h, IBCM_EREFUSED)
    );
    assert!(reason.contains("lid:N, gid:G"), "{reason}");
    // Malformed targets are refused at once.
    let bad = CString::new("lid:0").unwrap();
    let mut p = crate::params::conn_param_default();
    p.peer = bad.as_ptr();
    p.qp_num = 0x140;
    let mut h = 0u64;
    // SAFETY: (test) live locals.
    assert_eq!(st(unsafe { ibcm_connect(client, &p, &mut h) }), IBCM_EINVAL);
    // SAFETY: (test) each context closed once, last.
    unsafe {
        assert_eq!(st(ibcm_close(client)), IBCM_OK);
        assert_eq!(st(ibcm_close(server)), IBCM_OK);
    }
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An event of `ctx` (5 s at most), acknowledged after `f` has read it.
fn with_event<R>(ctx: *mut ibcm_ctx, f: impl FnOnce(&ibcm_event) -> R) -> R {
    let mut ev = null_mut();
    // SAFETY: (test) a live context and a writable local; the event is read before it is
    // given back.
    unsafe {
        assert_eq!(st(ibcm_wait_event(ctx, 5000, &mut ev)), IBCM_OK);
        let r = f(&*ev);
        assert_eq!(st(ibcm_ack_event(ctx, ev)), IBCM_OK);
        r
    }
}

/// An event's connection parameters: responder resources, initiator depth, flow control,
/// retry count, RNR retry count, SRQ, path MTU.
fn conn_params(e: &ibcm_event) -> [u8; 7] {
    [
        e.responder_resources,
        e.initiator_depth,
        e.flow_control,
        e.retry_count,
        e.rnr_retry_count,
        e.srq,
        e.path_mtu,
    ]
}

/// The next event of `ctx` (5 s at most), not acknowledged.
fn take(ctx: *mut ibcm_ctx) -> *mut ibcm_event {
    let mut ev = null_mut();
    // SAFETY: (test) a live context and a writable local.
    assert_eq!(st(unsafe { ibcm_wait_event(ctx, 5000, &mut ev) }), IBCM_OK);
    ev
}

/// The bytes of an event's `private_data`.
fn pd(e: &ibcm_event) -> Vec<u8> {
    if e.private_data_len == 0 {
        return Vec::new();
    }
    // SAFETY: (test) the event's data, valid until it is acknowledged.
    unsafe { std::slice::from_raw_parts(e.private_data, e.private_data_len as usize) }.to_vec()
}

fn ib_port() -> ibcm_port {
    ibcm_port {
        port_num: 1,
        sgid_index: 0,
        lmc: 1,
        pkey_index: 0,
        link_layer: ibcm_link_layer::IBCM_LINK_LAYER_INFINIBAND as u32,
    }
}

fn query(ctx: *mut ibcm_ctx, h: u64, which: ibcm_path_kind) -> Result<ibcm_path, ibcm_status> {
    let mut p = ibcm_path::default();
    // SAFETY: (test) a live context and a local.
    match st(unsafe { ibcm_query_path(ctx, h, which as c_int, &mut p) }) {
        IBCM_OK => Ok(p),
        e => Err(e),
    }
}

fn alt_attr(ctx: *mut ibcm_ctx, h: u64) -> Result<(ibcm_qp_attr, c_int), ibcm_status> {
    let (mut a, mut m) = (ibcm_qp_attr::default(), 0);
    let port = ib_port();
    // SAFETY: (test) a live context and locals.
    match st(unsafe { ibcm_init_alt_path_attr(ctx, h, &port, &mut a, &mut m) }) {
        IBCM_OK => Ok((a, m)),
        e => Err(e),
    }
}

/// The LIDs of a path, this side's first.
fn lids(p: &ibcm_path) -> (u16, u16) {
    (p.local_lid, p.remote_lid)
}

const ALT_PATH: c_int = 1 << 14;
const PATH_MIG_STATE: c_int = 1 << 18;

/// Automatic Path Migration through the C ABI: a connect to "gid:G" with
/// `IBCM_CONNECT_ALT_PATH` carries the alternate path the daemon found (LMC 1), the RTR
/// attributes load it, both sides see the paths; the client reports the migration and
/// loads the former primary back as the alternate (a LAP), which the server (that answers
/// its LAPs) loads and accepts after an MRA; a LAP rejected with a status, one acknowledged
/// unanswered ("rejected"), one answered by the daemon ("unsupported"); and the errors.
#[test]
fn paths_migrate_through_the_c_abi() {
    let dir = std::env::temp_dir().join(format!("ibcm-capi-apm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (a_sock, b_sock): (PathBuf, PathBuf) = (dir.join("a.sock"), dir.join("b.sock"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let net = MemNetwork::new();
    rt.block_on(async {
        daemon(&net, &a_sock, 2, true).await;
        daemon(&net, &b_sock, 5, false).await;
    });
    let (client, server) = (open(&a_sock), open(&b_sock));
    // SAFETY: (test) live contexts.
    unsafe {
        assert_eq!(st(ibcm_lap_policy(server, 2)), IBCM_EINVAL);
        assert_eq!(st(ibcm_lap_policy(server, 1)), IBCM_OK);
        assert_eq!(st(ibcm_listen(server, 0x77)), IBCM_OK);
    }
    let peer = CString::new("gid:fe80::5").unwrap();
    let mut p = crate::params::conn_param_default();
    p.peer = peer.as_ptr();
    p.service_id = 0x77;
    p.qp_num = 0x300;
    p.flags = IBCM_CONNECT_MANUAL_RTU | IBCM_CONNECT_ALT_PATH;
    let mut h = 0u64;
    // SAFETY: (test) live locals.
    assert_eq!(st(unsafe { ibcm_connect(client, &p, &mut h) }), IBCM_OK);
    // The passive side sees the REQ's paths, turned to its view.
    let sh = with_event(server, |e| {
        assert_eq!(e.event, IBCM_EVENT_CONNECT_REQUEST);
        e.conn
    });
    assert_eq!(
        lids(&query(server, sh, ibcm_path_kind::IBCM_PATH_PRIMARY).unwrap()),
        (5, 2)
    );
    assert_eq!(
        lids(&query(server, sh, ibcm_path_kind::IBCM_PATH_ALTERNATE).unwrap()),
        (6, 3)
    );
    assert_eq!(
        alt_attr(server, sh).unwrap_err(),
        IBCM_ESTATE,
        "not accepted yet"
    );
    let mut ap = crate::params::accept_param_default();
    ap.qp_num = 0x400;
    (ap.responder_resources, ap.initiator_depth) = (6, 5);
    (ap.rnr_retry_count, ap.srq) = (3, 1);
    // SAFETY: (test) a live context and a local.
    assert_eq!(st(unsafe { ibcm_accept(server, sh, &ap) }), IBCM_OK);
    // The REP's parameters, from the receiver's view (its initiator depth is our
    // responder resources).
    let params = with_event(client, |e| {
        assert_eq!(e.event, IBCM_EVENT_CONNECT_RESPONSE);
        conn_params(e)
    });
    assert_eq!(params, [5, 6, 1, 0, 3, 1, 0]);
    // The RTR attributes load the REQ's alternate path; RTS arms it.
    let (mut a, mut m) = (ibcm_qp_attr::default(), 0);
    let port = ib_port();
    // SAFETY: (test) a live context and locals.
    unsafe {
        assert_eq!(
            st(ibcm_init_qp_attr(
                client,
                h,
                2,
                &port,
                null(),
                &mut a,
                &mut m
            )),
            IBCM_OK
        );
        assert_eq!(m & ALT_PATH, ALT_PATH);
        assert_eq!(
            (
                a.ah_attr.dlid,
                a.alt_ah_attr.dlid,
                a.alt_ah_attr.src_path_bits
            ),
            (5, 6, 1)
        );
        assert_eq!(
            st(ibcm_init_qp_attr(
                client,
                h,
                3,
                &port,
                null(),
                &mut a,
                &mut m
            )),
            IBCM_OK
        );
        assert_eq!((m & PATH_MIG_STATE, a.path_mig_state), (PATH_MIG_STATE, 1));
        assert_eq!(st(ibcm_establish(client, h, null(), 0)), IBCM_OK);
    }
    let params = with_event(client, |e| {
        assert_eq!(e.event, IBCM_EVENT_ESTABLISHED);
        conn_params(e)
    });
    assert_eq!(params, [5, 6, 1, 0, 3, 1, 0], "the REP's again");
    with_event(server, |e| assert_eq!(e.event, IBCM_EVENT_ESTABLISHED));
    let primary = query(client, h, ibcm_path_kind::IBCM_PATH_PRIMARY).unwrap();
    assert_eq!(lids(&primary), (2, 5));
    let alt = query(client, h, ibcm_path_kind::IBCM_PATH_ALTERNATE).unwrap();
    assert_eq!(lids(&alt), (3, 6));
    // The REQ's alternate path, as its QP loaded it (the active side's view).
    assert_eq!(alt_attr(client, h).unwrap().0.alt_ah_attr.dlid, 6);
    // The QP migrated: the alternate is the primary, none is left.
    // SAFETY: (test) a live context.
    assert_eq!(st(unsafe { ibcm_path_migrated(client, h) }), IBCM_OK);
    assert_eq!(
        lids(&query(client, h, ibcm_path_kind::IBCM_PATH_PRIMARY).unwrap()),
        (3, 6)
    );
    assert_eq!(
        query(client, h, ibcm_path_kind::IBCM_PATH_ALTERNATE),
        Err(IBCM_ESTATE)
    );
    assert_eq!(alt_attr(client, h).unwrap_err(), IBCM_ESTATE);
    // The former primary back as the alternate: a LAP; one at a time.
    let load = |path: &ibcm_path, data: &[u8]| {
        // SAFETY: (test) a live context and locals.
        st(unsafe { ibcm_load_alt_path(client, h, path, data.as_ptr(), data.len() as u32) })
    };
    assert_eq!(load(&primary, b"back"), IBCM_OK);
    assert_eq!(load(&primary, b""), IBCM_EBUSY);
    // The LAP event is answered before it is acknowledged.
    let lap = take(server);
    // SAFETY: (test) the event, valid until it is acknowledged below.
    let (lap_path, lap_pd) = unsafe {
        let e = &*lap;
        assert_eq!((e.event, e.conn), (IBCM_EVENT_LAP, sh));
        assert!(!e.path.is_null());
        (*e.path, pd(e))
    };
    assert_eq!((lids(&lap_path), lap_pd.as_slice()), ((5, 2), &b"back"[..]));
    // The server loads the LAP's path (its DLID is the client's port) and accepts it after
    // an MRA.
    let (sa, sm) = alt_attr(server, sh).unwrap();
    assert_eq!((sa.alt_ah_attr.dlid, sm), (2, ALT_PATH | PATH_MIG_STATE));
    // SAFETY: (test) a live context and its event.
    unsafe {
        assert_eq!(st(ibcm_mra(server, sh, 16)), IBCM_OK);
        assert_eq!(st(ibcm_lap_accept(server, sh, b"ok".as_ptr(), 2)), IBCM_OK);
        assert_eq!(
            st(ibcm_lap_accept(server, sh, null(), 0)),
            IBCM_ESTATE,
            "answered"
        );
        assert_eq!(st(ibcm_ack_event(server, lap)), IBCM_OK);
    }
    let (status, data) = with_event(client, |e| {
        assert_eq!((e.event, e.status), (IBCM_EVENT_APR, IBCM_OK));
        (e.apr_status, pd(e))
    });
    assert_eq!((status, data.as_slice()), (0, &b"ok"[..]));
    assert_eq!(
        lids(&query(client, h, ibcm_path_kind::IBCM_PATH_ALTERNATE).unwrap()),
        (2, 5)
    );
    assert_eq!(
        lids(&query(server, sh, ibcm_path_kind::IBCM_PATH_ALTERNATE).unwrap()),
        (5, 2)
    );
    assert_eq!(alt_attr(client, h).unwrap().0.alt_ah_attr.dlid, 5);
    // Rejected with a status, information and data.
    assert_eq!(load(&primary, b""), IBCM_OK);
    let lap = take(server);
    // SAFETY: (test) a live context, locals and its event.
    unsafe {
        assert_eq!((*lap).event, IBCM_EVENT_LAP);
        let r = ibcm_lap_reject(server, sh, 0, null(), 0, null(), 0);
        assert_eq!(st(r), IBCM_EINVAL, "status 0 is an accept");
        let r = ibcm_lap_reject(server, sh, 7, b"i".as_ptr(), 1, null(), 149);
        assert_eq!(st(r), IBCM_ETOOLONG);
        let r = ibcm_lap_reject(server, sh, 7, b"i".as_ptr(), 1, b"no".as_ptr(), 2);
        assert_eq!(st(r), IBCM_OK);
        assert_eq!(st(ibcm_ack_event(server, lap)), IBCM_OK);
    }
    let (status, info, data) = with_event(client, |e| {
        assert_eq!(e.event, IBCM_EVENT_APR);
        // SAFETY: (test) the event's data, valid until it is acknowledged.
        let info = unsafe {
            std::slice::from_raw_parts(e.additional_info, e.additional_info_len as usize)
        };
        (e.apr_status, info.to_vec(), pd(e))
    });
    assert_eq!((status, info, data), (7, b"i".to_vec(), b"no".to_vec()));
    // Its event acknowledged unanswered: "rejected".
    assert_eq!(load(&primary, b""), IBCM_OK);
    with_event(server, |e| assert_eq!(e.event, IBCM_EVENT_LAP));
    let status = with_event(client, |e| {
        assert_eq!(e.event, IBCM_EVENT_APR);
        e.apr_status
    });
    assert_eq!(status, 3);
    // Back to the daemon's answers: "unsupported".
    // SAFETY: (test) a live context.
    assert_eq!(st(unsafe { ibcm_lap_policy(server, 0) }), IBCM_OK);
    assert_eq!(load(&primary, b""), IBCM_OK);
    let status = with_event(client, |e| {
        assert_eq!(e.event, IBCM_EVENT_APR);
        e.apr_status
    });
    assert_eq!(status, 2);
    // Bad arguments.
    let bad = ibcm_path { sl: 16, ..primary };
    assert_eq!(load(&bad, b""), IBCM_EINVAL);
    assert_eq!(load(&primary, &[0; 169]), IBCM_ETOOLONG);
    // SAFETY: (test) a live context and locals.
    unsafe {
        assert_eq!(
            st(ibcm_load_alt_path(client, h, null(), null(), 0)),
            IBCM_EINVAL
        );
        assert_eq!(
            st(ibcm_load_alt_path(client, 999, &primary, null(), 0)),
            IBCM_ENOENT
        );
        assert_eq!(
            st(ibcm_query_path(client, h, 2, &mut ibcm_path::default())),
            IBCM_EINVAL
        );
        assert_eq!(st(ibcm_query_path(client, h, 0, null_mut())), IBCM_EINVAL);
        assert_eq!(st(ibcm_lap_accept(server, sh, null(), 0)), IBCM_ESTATE);
        assert_eq!(st(ibcm_path_migrated(client, 999)), IBCM_ENOENT);
        assert_eq!(st(ibcm_disconnect(client, h, null(), 0)), IBCM_OK);
    }
    with_event(client, |e| assert_eq!(e.event, IBCM_EVENT_DISCONNECTED));
    with_event(server, |e| assert_eq!(e.event, IBCM_EVENT_DISCONNECTED));
    // Without an SA (a daemon not on an InfiniBand port): the connect's final event.
    let to2 = CString::new("lid:2").unwrap();
    p.peer = to2.as_ptr();
    p.qp_num = 0x310;
    // SAFETY: (test) live locals.
    assert_eq!(st(unsafe { ibcm_connect(server, &p, &mut h) }), IBCM_OK);
    let (t, status) = with_event(server, |e| (e.event, e.status));
    assert_eq!((t, status), (IBCM_EVENT_CONNECT_ERROR, IBCM_EUNSUPPORTED));
    // An IP peer has no alternate path to ask for.
    let ip = CString::new("10.0.0.9").unwrap();
    p.peer = ip.as_ptr();
    // SAFETY: (test) live locals.
    assert_eq!(st(unsafe { ibcm_connect(client, &p, &mut h) }), IBCM_EINVAL);
    // SAFETY: (test) each context closed once, last.
    unsafe {
        assert_eq!(st(ibcm_close(client)), IBCM_OK);
        assert_eq!(st(ibcm_close(server)), IBCM_OK);
    }
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}
