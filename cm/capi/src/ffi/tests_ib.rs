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
/// bytes), MTU 2048; ERR_NO_RECORDS for DLIDs of 0x100 and above.
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
    let peer = CString::new(peer).unwrap();
    let mut p = crate::params::conn_param_default();
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
    for (i, peer) in ["lid:5", "lid:0x5", "gid:fe80::5"].into_iter().enumerate() {
        let h = connect(client, peer, 0x100 + i as u32);
        let (t, sh, _, from, _) = next(server);
        assert_eq!(t, IBCM_EVENT_CONNECT_REQUEST, "{peer}");
        assert_eq!(
            from, "lid:2",
            "the passive side names the client's port as connect takes it"
        );
        let mut ap = crate::params::accept_param_default();
        ap.qp_num = 0x200 + i as u32;
        // SAFETY: (test) a live context and a local.
        assert_eq!(st(unsafe { ibcm_accept(server, sh, &ap) }), IBCM_OK);
        let (t, ch, ..) = next(client);
        assert_eq!((t, ch), (IBCM_EVENT_ESTABLISHED, h), "{peer}");
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
        let (t, ..) = next(server);
        assert_eq!(t, IBCM_EVENT_ESTABLISHED);
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
