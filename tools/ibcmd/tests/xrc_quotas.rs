//! XRC through the daemon against the quotas, and explicit-policy orphans (issue 25, fault
//! 5): the connections the daemon's XRC target accepts for a client's service and the TGT
//! QPs it creates count against the client's and its user's quotas (orphans too, until
//! reclaimed); an orphan is adopted by the next listener of its service of the same user, or
//! reclaimed by its user (or root). Addresses 127.0.27.3x–5x.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;

use ibcm::proto::{ConnectionError, EndpointConfig};
use ibcm::rt::node::proto::{
    encode_frame, read_frame, ClientMsg, DaemonMsg, Op, WireResult, VERSION,
};
use ibcm::rt::{Cm, CmError, Connection, UdpTransport};
use ibcm_mad::{Guid, Qpn, RejReason, ServiceId};
use ibcm_xrc::cm::{xrc_connect_params, IniRep};
use ibcm_xrc::XrcReqData;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use common::{daemon_with, scratch};

/// A raw session: hello answered.
async fn raw(sock: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).await.unwrap();
    assert!(matches!(
        ask(
            &mut s,
            0,
            Op::Hello {
                version: VERSION,
                addr: false,
            }
        )
        .await,
        WireResult::Ok
    ));
    s
}

async fn ask(s: &mut UnixStream, seq: u64, op: Op) -> WireResult {
    s.write_all(&encode_frame(&ClientMsg { seq, op }).unwrap())
        .await
        .unwrap();
    loop {
        if let DaemonMsg::Reply { seq: r, result } = read_frame::<DaemonMsg, _>(s).await.unwrap() {
            if r == seq {
                return result;
            }
        }
    }
}

async fn xrc_listen(s: &mut UnixStream, sid: u64, policy: &str, srqn: u32) {
    let r = ask(
        s,
        1,
        Op::XrcListen {
            service_id: sid,
            policy: policy.into(),
            srqns: vec![srqn],
            domain: None,
            tgt_qpn: None,
        },
    )
    .await;
    assert!(matches!(r, WireResult::Ok), "{r:?}");
}

async fn initiator(ip: &str) -> Cm {
    let t = UdpTransport::bind(ip.parse().unwrap()).await.unwrap();
    let cfg = EndpointConfig {
        local_ca_guid: Guid(0x2777),
        ..EndpointConfig::default()
    };
    Cm::bind(t, cfg).0
}

/// An XRC connect from INI QP `ini` to `sid`, with `data`.
async fn xrc(
    cm: &Cm,
    to: SocketAddr,
    sid: u64,
    ini: u32,
    data: XrcReqData,
) -> Result<Connection, CmError> {
    let p = xrc_connect_params(to, ServiceId(sid), Qpn::new(ini).unwrap(), &data, &[]).unwrap();
    cm.connect(p).await
}

fn no_resources(r: &Result<Connection, CmError>) -> bool {
    matches!(
        r,
        Err(CmError::Connection(ConnectionError::Rejected { reason, .. }))
            if *reason == RejReason::NoResources
    )
}

fn tgt(c: &Connection) -> IniRep {
    IniRep::from_rep_info(&c.rep().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xrc_connections_count_against_the_connection_quotas() {
    let dir = scratch("xrc-conns");
    let extra = ["--max-conns-per-client", "2", "--max-conns-per-user", "3"];
    let (_d, sock) = daemon_with(&dir, "a", "127.0.27.31", &extra);
    let d_addr: SocketAddr = "127.0.27.31:4791".parse().unwrap();
    let ini = initiator("127.0.27.32").await;
    let mut x = raw(&sock).await;
    let mut y = raw(&sock).await;
    xrc_listen(&mut x, 0x2731, "process", 0x10).await;
    xrc_listen(&mut y, 0x2732, "process", 0x20).await;

    // Five connections to the first client's service: two are its quota.
    let mut held = Vec::new();
    let mut refused = 0;
    for k in 0..5 {
        let r = xrc(&ini, d_addr, 0x2731, 0x300 + k, XrcReqData::any(None)).await;
        if no_resources(&r) {
            refused += 1;
        } else {
            held.push(r.unwrap());
        }
    }
    println!("xrc quota: client 1 holds {} of 5 (quota 2)", held.len());
    assert_eq!((held.len(), refused), (2, 3), "per client");
    // The second client: one more is the user's third; the next is over the user's quota.
    let third = xrc(&ini, d_addr, 0x2732, 0x310, XrcReqData::any(None)).await;
    assert!(third.is_ok(), "{third:?}");
    let fourth = xrc(&ini, d_addr, 0x2732, 0x311, XrcReqData::any(None)).await;
    assert!(no_resources(&fourth), "per user: {fourth:?}");
    // One ends: room again.
    held.pop().unwrap().disconnect(&[]).await;
    let again = xrc(&ini, d_addr, 0x2732, 0x312, XrcReqData::any(None)).await;
    assert!(again.is_ok(), "after a disconnect: {again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgt_qps_count_against_their_user_s_quota_orphans_too() {
    let dir = scratch("xrc-qps");
    let (_d, sock) = daemon_with(&dir, "a", "127.0.27.41", &["--max-tgt-qps-per-user", "2"]);
    let d_addr: SocketAddr = "127.0.27.41:4791".parse().unwrap();
    let ini = initiator("127.0.27.42").await;
    let mut x = raw(&sock).await;
    xrc_listen(&mut x, 0x2741, "explicit", 0x10).await;
    let a = xrc(&ini, d_addr, 0x2741, 0x400, XrcReqData::any(None))
        .await
        .unwrap();
    let b = xrc(&ini, d_addr, 0x2741, 0x401, XrcReqData::any(None))
        .await
        .unwrap();
    let c = xrc(&ini, d_addr, 0x2741, 0x402, XrcReqData::any(None)).await;
    assert!(no_resources(&c), "a third TGT QP: {c:?}");
    // Attaching to a live QP creates none: served.
    let q = tgt(&a).tgt_qpn;
    let d = xrc(&ini, d_addr, 0x2741, 0x400, XrcReqData::attach(q)).await;
    assert!(d.is_ok(), "attach: {d:?}");
    // The client goes: its Explicit QPs are orphans, and still its user's.
    drop(x);
    a.closed().await;
    b.closed().await;
    let mut z = raw(&sock).await;
    xrc_listen(&mut z, 0x2742, "process", 0x30).await;
    let e = xrc(&ini, d_addr, 0x2742, 0x410, XrcReqData::any(None)).await;
    assert!(no_resources(&e), "orphans count: {e:?}");
    // The user reclaims them: room again.
    match ask(&mut z, 5, Op::XrcReclaim { qpn: None }).await {
        WireResult::Value { value } => assert_eq!(value, 2),
        r => panic!("{r:?}"),
    }
    let f = xrc(&ini, d_addr, 0x2742, 0x411, XrcReqData::any(None)).await;
    assert!(f.is_ok(), "after the reclaim: {f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_orphan_is_adopted_by_the_next_listener_of_its_service() {
    let dir = scratch("xrc-adopt");
    let (_d, sock) = daemon_with(&dir, "a", "127.0.27.51", &[]);
    let d_addr: SocketAddr = "127.0.27.51:4791".parse().unwrap();
    let ini = initiator("127.0.27.52").await;
    let mut x = raw(&sock).await;
    xrc_listen(&mut x, 0x2751, "explicit", 0x10).await;
    let first = xrc(&ini, d_addr, 0x2751, 0x500, XrcReqData::any(None))
        .await
        .unwrap();
    let q = tgt(&first).tgt_qpn;
    // The client dies: its SRQs are gone (DREQ), its Explicit QP stays, an orphan.
    drop(x);
    first.closed().await;

    // The next client of the same user listening on the service adopts it: the same INI's
    // REQ is answered with the orphan, and the REP names the new client's SRQ. (The same INI
    // QP, through another endpoint of the same CA GUID: the first keeps QPN 0x500 in its
    // TimeWait quarantine.)
    let mut y = raw(&sock).await;
    xrc_listen(&mut y, 0x2751, "explicit", 0x40).await;
    let ini2 = initiator("127.0.27.53").await;
    let second = xrc(&ini2, d_addr, 0x2751, 0x500, XrcReqData::any(None))
        .await
        .unwrap();
    let rep = tgt(&second);
    println!(
        "xrc adopt: first tgt_qpn {q}, after the new listener {} (created: {:?})",
        rep.tgt_qpn,
        rep.data.as_ref().map(|d| d.created)
    );
    assert_eq!(rep.tgt_qpn, q, "the orphan is reached again");
    assert_eq!(rep.srqns(), vec![ibcm_xrc::SrqNum::new(0x40).unwrap()]);
    assert_eq!(rep.data.as_ref().map(|d| d.created), Some(false));

    // Orphaned again when it goes; listed (the protocol and `ibcmd leaks`), then reclaimed.
    drop(y);
    second.closed().await;
    let mut w = raw(&sock).await;
    match ask(&mut w, 2, Op::XrcOrphans).await {
        WireResult::XrcQps { qps } => {
            assert_eq!(qps.len(), 1, "{qps:?}");
            assert_eq!(qps[0].qpn, q.get());
            assert!(qps[0].orphan && qps[0].leak, "{qps:?}");
        }
        r => panic!("{r:?}"),
    }
    let out = std::process::Command::new(common::ibcmd_bin())
        .args(["leaks", "--socket", sock.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("orphan qp {:#08x}", q.get())),
        "ibcmd leaks: {text}"
    );
    match ask(&mut w, 3, Op::XrcReclaim { qpn: Some(q.get()) }).await {
        WireResult::Value { value } => assert_eq!(value, 1),
        r => panic!("{r:?}"),
    }
    match ask(&mut w, 4, Op::XrcOrphans).await {
        WireResult::XrcQps { qps } => assert!(qps.is_empty(), "{qps:?}"),
        r => panic!("{r:?}"),
    }
}

/// `ibcmd ARGS…` as uid/gid 65534 (through `setpriv`): its exit status, stdout, stderr.
fn ibcmd_as_nobody(args: &[&str]) -> (bool, String, String) {
    let bin = common::ibcmd_bin();
    let mut a = vec![
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        bin.to_str().unwrap(),
    ];
    a.extend_from_slice(args);
    let out = std::process::Command::new("setpriv")
        .args(&a)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_may_list_but_not_reclaim_an_orphan() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        println!("SKIPPED: running a second user needs root");
        return;
    }
    let dir = scratch("xrc-reclaim-user");
    std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_d, sock) = daemon_with(&dir, "a", "127.0.27.56", &["--mode", "666"]);
    let s = sock.to_str().unwrap().to_string();
    let d_addr: SocketAddr = "127.0.27.56:4791".parse().unwrap();
    let ini = initiator("127.0.27.57").await;
    let mut x = raw(&sock).await;
    xrc_listen(&mut x, 0x2756, "explicit", 0x10).await;
    let c = xrc(&ini, d_addr, 0x2756, 0x560, XrcReqData::any(None))
        .await
        .unwrap();
    let q = format!("{:#x}", tgt(&c).tgt_qpn.get());
    drop(x);
    c.closed().await;

    let nobody = tokio::task::spawn_blocking({
        let (s, q) = (s.clone(), q.clone());
        move || {
            (
                ibcmd_as_nobody(&["reclaim", "--socket", &s, "--qpn", &q]),
                ibcmd_as_nobody(&["reclaim", "--socket", &s]),
                ibcmd_as_nobody(&["leaks", "--socket", &s]),
            )
        }
    })
    .await
    .unwrap();
    let (named, all, list) = nobody;
    assert!(!named.0, "{named:?}");
    assert!(named.2.contains("not an orphan of uid 65534"), "{named:?}");
    assert!(all.0 && all.1.contains("reclaimed 0 TGT QPs"), "{all:?}");
    assert!(list.0 && list.1.contains("orphan qp"), "{list:?}");
    // Root reclaims it.
    let out = std::process::Command::new(common::ibcmd_bin())
        .args(["reclaim", "--socket", &s, "--qpn", &q])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("reclaimed 1 TGT QPs"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_but_root_cannot_take_root_s_tgt_qps() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        println!("SKIPPED: running a second user needs root");
        return;
    }
    let dir = scratch("xrc-non-root");
    std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let extra = ["--mode", "666", "--max-tgt-qps-non-root", "1"];
    let (_d, sock) = daemon_with(&dir, "a", "127.0.27.58", &extra);
    let d_addr: SocketAddr = "127.0.27.58:4791".parse().unwrap();
    let ini = initiator("127.0.27.59").await;
    // nobody's XRC service (cm-ping through setpriv), and root's.
    let mut a = vec!["--reuid", "65534", "--regid", "65534", "--clear-groups"];
    let ping = common::cm_ping_bin();
    let s = sock.to_str().unwrap();
    a.extend_from_slice(&[
        ping.to_str().unwrap(),
        "--listen",
        "127.0.27.58",
        "--daemon",
        s,
        "--xrc",
        "--policy",
        "explicit",
        "--service-id",
        "0x2758",
    ]);
    let mut nobody = common::Proc::spawn("nobody-listener", std::path::Path::new("setpriv"), &a);
    tokio::task::block_in_place(|| {
        nobody.wait_out(|l| l.starts_with("listening"), "'listening'");
    });
    let mut root = raw(&sock).await;
    xrc_listen(&mut root, 0x2759, "explicit", 0x10).await;

    let first = xrc(&ini, d_addr, 0x2758, 0x580, XrcReqData::any(None)).await;
    assert!(first.is_ok(), "nobody's first TGT QP: {first:?}");
    let second = xrc(&ini, d_addr, 0x2758, 0x581, XrcReqData::any(None)).await;
    assert!(no_resources(&second), "nobody's second: {second:?}");
    for k in 0..3 {
        let r = xrc(&ini, d_addr, 0x2759, 0x590 + k, XrcReqData::any(None)).await;
        assert!(r.is_ok(), "root's TGT QP {k}: {r:?}");
    }
}
