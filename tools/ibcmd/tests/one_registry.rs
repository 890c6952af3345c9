//! One registry, one protocol (issue 25 §2): the keeper's operations served on `ibcmd`'s
//! socket act on the registry its CM answers XRC REQs from. Each job is its own process
//! (`ibcmd xrc --socket S`, a session driven by JSON lines), the initiator an in-process
//! endpoint of the test: a TGT QP that two jobs hold is connected to through `ibcmd`'s CM,
//! and outlives or dies with its jobs per its policy. Addresses 127.0.30.1x–3x.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ibcm::proto::EndpointConfig;
use ibcm::rt::{Cm, CmError, ConnStatus, Connection, UdpTransport};
use ibcm_mad::xrc::GoneCause;
use ibcm_mad::{Guid, Qpn, ServiceId};
use ibcm_xrc::cm::{xrc_connect_params, GoneSignal, IniOutcome, IniRep};
use ibcm_xrc::XrcReqData;
use serde_json::Value;

use common::{daemon_with, ibcmd_bin, scratch, Proc};

/// One job: an `ibcmd xrc` session of its own process (as root, or as uid 65534).
struct Job(Proc);

impl Job {
    fn start(name: &str, sock: &Path) -> Job {
        let s = sock.to_str().unwrap();
        Job(Proc::spawn_piped(
            name,
            &ibcmd_bin(),
            &["xrc", "--socket", s],
        ))
    }

    fn start_as_nobody(name: &str, sock: &Path) -> Job {
        let bin = ibcmd_bin();
        let args = [
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            bin.to_str().unwrap(),
            "xrc",
            "--socket",
            sock.to_str().unwrap(),
        ];
        Job(Proc::spawn_piped(name, Path::new("setpriv"), &args))
    }

    /// Sends one request line; its reply (events are skipped).
    fn ask(&mut self, line: &str) -> Value {
        self.0.send(line);
        let l = self.0.wait_out(
            |l| {
                serde_json::from_str::<Value>(l)
                    .is_ok_and(|v| v.get("event").is_none() && v.get("xrc-event").is_none())
            },
            "a reply",
        );
        serde_json::from_str(&l).unwrap()
    }

    /// [`Job::ask`], which must succeed.
    fn ok(&mut self, line: &str) -> Value {
        let v = self.ask(line);
        assert_eq!(v["ok"], Value::Bool(true), "{line} → {v}");
        v
    }

    /// [`Job::ask`], which must be refused with the keeper's `kind`.
    fn refused(&mut self, line: &str, kind: &str) -> String {
        let v = self.ask(line);
        assert_eq!(v["ok"], Value::Bool(false), "{line} → {v}");
        let msg = v["error"]["message"]
            .as_str()
            .or_else(|| v["error"].as_str())
            .unwrap_or_default()
            .to_owned();
        if v["error"]["kind"].is_string() {
            assert_eq!(v["error"]["kind"], kind, "{line} → {v}");
        } else {
            assert!(msg.contains(kind), "{line} → {v}");
        }
        msg
    }
}

fn open_domain(name: &str, path: &Path) -> String {
    format!(
        r#"{{"op":"open-domain","domain":"{name}","path":"{}"}}"#,
        path.display()
    )
}

fn serve(sid: u64, policy: &str, domain: &str, qpn: u64) -> String {
    format!(
        r#"{{"op":"xrc-listen","service_id":{sid},"policy":"{policy}","srqns":[16],"domain":"{domain}","tgt_qpn":{qpn}}}"#
    )
}

async fn initiator(ip: &str) -> Cm {
    let t = UdpTransport::bind(ip.parse().unwrap()).await.unwrap();
    let cfg = EndpointConfig {
        local_ca_guid: Guid(0x3011),
        ..EndpointConfig::default()
    };
    Cm::bind(t, cfg).0
}

/// An XRC connect in mode `any` from INI QP `ini` to `sid`.
async fn xrc(cm: &Cm, to: &str, sid: u64, ini: u32) -> Result<Connection, CmError> {
    let to: SocketAddr = to.parse().unwrap();
    let data = XrcReqData::any(None);
    let p = xrc_connect_params(to, ServiceId(sid), Qpn::new(ini).unwrap(), &data, &[]).unwrap();
    cm.connect(p).await
}

fn tgt_qpn(c: &Connection) -> u64 {
    u64::from(IniRep::from_rep_info(&c.rep().unwrap()).tgt_qpn.get())
}

/// Whether `c` ended with the target-gone DREQ for `qpn` with `cause`.
async fn gone_by_dreq(c: &Connection, qpn: u64, cause: GoneCause) {
    let e = c.closed().await;
    match IniOutcome::from_close(&e) {
        IniOutcome::TargetGone {
            cause: got,
            qpn: Some(q),
            by: GoneSignal::Dreq,
        } => {
            assert_eq!((got, u64::from(q.get())), (cause, qpn), "{e:?}");
        }
        other => panic!("expected a target-gone DREQ ({cause}), got {other:?} ({e:?})"),
    }
}

/// The daemon has ended the holdings of as many clients as `n` (its log, in order).
fn ended(d: &mut Proc, n: usize) {
    for _ in 0..n {
        d.wait_err(
            |l| l.contains("client's XRC holdings ended per policy"),
            "'client's XRC holdings ended per policy'",
        );
    }
}

/// The QP's `life` as the keeper's `query` shows it.
fn life(j: &mut Job, qpn: u64) -> String {
    let v = j.ok(&format!(r#"{{"op":"query","qpn":{qpn}}}"#));
    v["result"]["life"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_qp_of_two_jobs_is_connected_through_the_cm_and_dies_with_the_last_job() {
    let dir = scratch("one-shared");
    let (mut d, sock) = daemon_with(&dir, "d", "127.0.30.11", &[]);
    let path = dir.join("job.xrcd");

    // Job 1 (process A): the domain, a Shared TGT QP, a service answering with it.
    let mut a = Job::start("A", &sock);
    a.ok(&open_domain("job", &path));
    let v = a.ok(r#"{"op":"create","domain":"job","policy":"shared"}"#);
    let q = v["result"]["qpn"].as_u64().unwrap();
    a.ok(&serve(0x3011, "shared", "job", q));
    // Job 2 (process B): the same domain (by its path), a registration on the QP.
    let mut b = Job::start("B", &sock);
    b.ok(&open_domain("job", &path));
    b.ok(&format!(r#"{{"op":"register","qpn":{q}}}"#));
    let v = b.ok(&format!(r#"{{"op":"query","qpn":{q}}}"#));
    assert_eq!(
        v["result"]["holders"].as_array().unwrap().len(),
        2,
        "A's and B's registrations: {v}"
    );

    // Process C connects through ibcmd's CM: the REP names the jobs' QP.
    let c = initiator("127.0.30.12").await;
    let conn = xrc(&c, "127.0.30.11:4791", 0x3011, 0x500).await.unwrap();
    assert_eq!(tgt_qpn(&conn), q, "the REP names the registered QP");
    println!("one registry: C connected to TGT QP {q:#x} of jobs 1 and 2");

    // Job 1 ends: the QP stays (B's registration), and so does C's connection.
    a.0.close_stdin();
    assert!(a.0.wait().success());
    ended(&mut d, 1);
    assert_eq!(life(&mut b, q), "live");
    let v = b.ok(&format!(r#"{{"op":"query","qpn":{q}}}"#));
    assert_eq!(
        v["result"]["holders"].as_array().unwrap().len(),
        1,
        "only B holds it; the connection does not: {v}"
    );
    assert!(
        matches!(conn.status(), ConnStatus::Established),
        "{:?}",
        conn.status()
    );

    // A third job watches (a keeper session: it hears of QPs gone).
    let mut e = Job::start("E", &sock);
    assert_eq!(life(&mut e, q), "live");
    // Job 2 dies (SIGKILL): its registration was the last; C hears the target went.
    b.0.signal("KILL");
    gone_by_dreq(&conn, q, GoneCause::LastUnregistered).await;
    println!("one registry: job 2 killed, C got the DREQ: target gone (last registration dropped)");
    e.0.wait_out(
        |l| l.contains(r#""event":"qp-gone""#) && l.contains("last registration dropped"),
        "qp-gone",
    );
    assert!(life(&mut e, q).starts_with("gone"), "after both jobs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_bound_qp_outlives_its_creator_s_job_until_the_domain_is_closed() {
    let dir = scratch("one-domain");
    let (mut d, sock) = daemon_with(&dir, "d", "127.0.30.21", &[]);
    let path = dir.join("jobd.xrcd");

    let mut a = Job::start("A", &sock);
    a.ok(&open_domain("jobd", &path));
    let v = a.ok(r#"{"op":"create","domain":"jobd","policy":"domain-bound"}"#);
    let q = v["result"]["qpn"].as_u64().unwrap();
    a.ok(&serve(0x3021, "domain", "jobd", q));
    let mut b = Job::start("B", &sock);
    b.ok(&open_domain("jobd", &path));

    let c = initiator("127.0.30.22").await;
    let conn = xrc(&c, "127.0.30.21:4791", 0x3021, 0x600).await.unwrap();
    assert_eq!(tgt_qpn(&conn), q);

    // Its creator's job ends: DomainBound keeps it (the domain is open), C stays connected.
    a.0.close_stdin();
    assert!(a.0.wait().success());
    ended(&mut d, 1);
    assert_eq!(life(&mut b, q), "live");
    assert!(matches!(conn.status(), ConnStatus::Established));

    // Job 2 (same uid: the domain's owner) closes the domain: released, "domain closed".
    let v = b.ok(r#"{"op":"close-domain","domain":"jobd"}"#);
    println!("one registry: close-domain → {v}");
    gone_by_dreq(&conn, q, GoneCause::DomainClosed).await;
    assert!(life(&mut b, q).starts_with("gone"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_cannot_touch_a_qp_through_ibcmd_that_the_keeper_rules_keep_from_it() {
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        println!("SKIPPED: running a second user needs root");
        return;
    }
    let dir = scratch("one-auth");
    let (_d, sock) = daemon_with(&dir, "d", "127.0.30.31", &["--mode", "666"]);
    // root's job: a private domain, a Shared QP (no path: a name is not a capability) and an
    // Explicit one, served.
    let mut a = Job::start("A", &sock);
    a.ok(r#"{"op":"open-domain","domain":"rootjob"}"#);
    let v = a.ok(r#"{"op":"create","domain":"rootjob","policy":"shared"}"#);
    let q = v["result"]["qpn"].as_u64().unwrap();
    let v = a.ok(r#"{"op":"create","domain":"rootjob","policy":"explicit"}"#);
    let x = v["result"]["qpn"].as_u64().unwrap();
    a.ok(&serve(0x3031, "shared", "rootjob", q));
    let c = initiator("127.0.30.32").await;
    let conn = xrc(&c, "127.0.30.31:4791", 0x3031, 0x700).await.unwrap();
    assert_eq!(tgt_qpn(&conn), q);

    // uid 65534, through the same socket and protocol.
    let mut n = Job::start_as_nobody("nobody", &sock);
    let m = n.refused(
        &format!(r#"{{"op":"modify","qpn":{x},"attr":{{"state":"init"}}}}"#),
        "permission-denied",
    );
    assert!(m.contains("uid 65534 may not modify"), "{m}");
    n.refused(
        &format!(r#"{{"op":"modify","qpn":{q},"attr":{{"state":"init"}}}}"#),
        "permission-denied",
    );
    n.refused(
        &format!(r#"{{"op":"register","qpn":{q}}}"#),
        "permission-denied",
    );
    n.refused(
        &format!(r#"{{"op":"destroy","qpn":{x}}}"#),
        "permission-denied",
    );
    n.refused(
        &format!(r#"{{"op":"unregister","qpn":{q}}}"#),
        "not-registered",
    );
    n.refused(
        r#"{"op":"open-domain","domain":"rootjob"}"#,
        "permission-denied",
    );
    n.refused(
        r#"{"op":"close-domain","domain":"rootjob"}"#,
        "permission-denied",
    );
    // Nor open the daemon's own domains (nor squat the name of one to come).
    let m = n.refused(
        r#"{"op":"open-domain","domain":"ibcmd-shared"}"#,
        "bad-request",
    );
    assert!(m.contains("the daemon's own"), "{m}");
    n.refused(
        r#"{"op":"open-domain","domain":"ibcmd-session-99"}"#,
        "bad-request",
    );
    // Nor serve root's QP through the CM.
    let m = n.refused(&serve(0x3032, "shared", "rootjob", q), "permission-denied");
    println!("one registry: nobody's xrc-listen on root's QP: {m}");
    // Reading is anyone's.
    assert_eq!(life(&mut n, q), "live");
    // Nothing of root's changed: the QPs live, C is connected, root may still act.
    assert_eq!(life(&mut a, x), "live");
    assert!(matches!(conn.status(), ConnStatus::Established));
    a.ok(&format!(
        r#"{{"op":"modify","qpn":{x},"attr":{{"state":"init","pkey_index":0,"port":1,"access_flags":0}}}}"#
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_job_s_unregister_releases_a_shared_qp_and_its_connection() {
    let dir = scratch("one-unreg");
    let (mut d, sock) = daemon_with(&dir, "d", "127.0.30.41", &[]);
    let path = dir.join("job.xrcd");
    let mut a = Job::start("A", &sock);
    a.ok(&open_domain("job", &path));
    let v = a.ok(r#"{"op":"create","domain":"job","policy":"shared"}"#);
    let q = v["result"]["qpn"].as_u64().unwrap();
    a.ok(&serve(0x3041, "shared", "job", q));
    let mut b = Job::start("B", &sock);
    b.ok(&open_domain("job", &path));
    b.ok(&format!(r#"{{"op":"register","qpn":{q}}}"#));
    let c = initiator("127.0.30.42").await;
    let conn = xrc(&c, "127.0.30.41:4791", 0x3041, 0x800).await.unwrap();
    assert_eq!(tgt_qpn(&conn), q);

    a.0.close_stdin();
    assert!(a.0.wait().success());
    ended(&mut d, 1);
    // B, still running, drops the last registration: released, and C hears why.
    let v = b.ok(&format!(r#"{{"op":"unregister","qpn":{q}}}"#));
    assert_eq!(v["result"]["verdict"], "released", "{v}");
    assert_eq!(v["result"]["cause"], "last registration dropped", "{v}");
    gone_by_dreq(&conn, q, GoneCause::LastUnregistered).await;
    // B is told as a registered process was (the keeper's qp-gone).
    b.0.wait_out(
        |l| l.contains(r#""event":"qp-gone""#) && l.contains(&format!(r#""qpn":{q}"#)),
        "qp-gone",
    );
}
