//! Unit tests of [`KeeperCore`](super::KeeperCore).

use std::time::Duration;

use serde_json::Value;

use super::args::gid_arg;
use super::*;
use crate::keeper::proto::ModifyAttr;
use crate::verbs::model::{KernelModel, ModelConfig};

fn keeper() -> (KeeperCore, Instant) {
    let k = KernelModel::new(ModelConfig::mlx5());
    let now = Instant::now();
    (
        KeeperCore::new(
            Box::new(k.spawn()),
            RegistryConfig::default(),
            "e1".into(),
            "sim",
            now,
        ),
        now,
    )
}

fn ok(k: &mut KeeperCore, now: Instant, s: SessionId, req: Request) -> Value {
    let (r, _) = k.handle(now, s, Some(1), req);
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.epoch, "e1");
    r.result.unwrap()
}

fn fail(k: &mut KeeperCore, now: Instant, s: SessionId, req: Request) -> ErrorKind {
    let (r, _) = k.handle(now, s, Some(1), req);
    assert!(!r.ok);
    r.error.unwrap().kind
}

#[test]
fn shared_hold_counts_follow_session_deaths() {
    let (mut k, now) = keeper();
    let a = k.open_session(Some(100));
    let b = k.open_session(Some(200));
    ok(
        &mut k,
        now,
        a,
        Request::OpenDomain {
            domain: "d".into(),
            path: Some("/x".into()),
            create: true,
            exclusive: false,
        },
    );
    let r1 = ok(
        &mut k,
        now,
        a,
        Request::CreateOrRegister {
            domain: "d".into(),
            key: "default".into(),
        },
    );
    let r2 = ok(
        &mut k,
        now,
        b,
        Request::CreateOrRegister {
            domain: "d".into(),
            key: "default".into(),
        },
    );
    assert_eq!(r1["qpn"], r2["qpn"]);
    assert_eq!(
        (r1["created"].as_bool(), r2["created"].as_bool()),
        (Some(true), Some(false))
    );
    let st = k.status();
    assert_eq!(st.qps.len(), 1);
    assert_eq!(st.qps[0].holders.len(), 2);
    let ev = k.close_session(now, a);
    assert!(ev.is_empty());
    assert_eq!(k.status().qps[0].holders.len(), 1);
    let ev = k.close_session(now, b);
    assert_eq!(
        ev,
        vec![(
            Target::All,
            KeeperEvent::QpGone {
                qpn: r1["qpn"].as_u64().unwrap() as u32,
                cause: "last registration dropped".into()
            }
        )]
    );
    assert_eq!(k.status().qps[0].life, "gone: last registration dropped");
    k.tick(now + Duration::from_secs(10));
    assert!(k.status().qps.is_empty());
}

#[test]
fn process_bound_dies_with_its_session_and_dreqs_other_sessions_conns() {
    let (mut k, now) = keeper();
    let a = k.open_session(Some(100));
    let b = k.open_session(Some(200));
    ok(
        &mut k,
        now,
        a,
        Request::OpenDomain {
            domain: "d".into(),
            path: None,
            create: true,
            exclusive: false,
        },
    );
    let r = ok(
        &mut k,
        now,
        a,
        Request::Create {
            domain: "d".into(),
            policy: "process-bound".into(),
        },
    );
    let qpn = r["qpn"].as_u64().unwrap() as u32;
    let acc = ok(
        &mut k,
        now,
        b,
        Request::AcceptReq {
            conn: "c1".into(),
            domain: "d".into(),
            ini_ca_guid: 7,
            ini_qpn: 0x99,
            mode: Some("attach".into()),
            tgt_qpn: Some(qpn),
            policy: None,
            srqns: vec![0x10],
            timewait_ms: Some(100),
        },
    );
    assert_eq!(acc["accept"], true);
    assert_eq!(acc["tgt_qpn"], qpn);
    let ev = k.close_session(now, a);
    assert!(ev.contains(&(
        Target::Session(b),
        KeeperEvent::EndConnection {
            conn: "c1".into(),
            qpn,
            cause: "creator exited".into()
        }
    )));
    // A reconnect to the gone QP is rejected with reason 1 and the cause.
    let rej = ok(
        &mut k,
        now,
        b,
        Request::AcceptReq {
            conn: "c2".into(),
            domain: "d".into(),
            ini_ca_guid: 7,
            ini_qpn: 0x99,
            mode: Some("attach".into()),
            tgt_qpn: Some(qpn),
            policy: None,
            srqns: vec![0x10],
            timewait_ms: None,
        },
    );
    assert_eq!(rej["accept"], false);
    assert_eq!(rej["rej_reason"], 1);
    assert!(rej["ari"].as_str().unwrap().starts_with("585243010103"));
}

#[test]
fn errors_have_kinds() {
    let (mut k, now) = keeper();
    let a = k.open_session(None);
    assert_eq!(
        fail(
            &mut k,
            now,
            a,
            Request::Create {
                domain: "nope".into(),
                policy: "shared".into()
            }
        ),
        "unknown-domain"
    );
    ok(
        &mut k,
        now,
        a,
        Request::OpenDomain {
            domain: "d".into(),
            path: None,
            create: true,
            exclusive: false,
        },
    );
    assert_eq!(
        fail(
            &mut k,
            now,
            a,
            Request::Create {
                domain: "d".into(),
                policy: "forever".into()
            }
        ),
        "bad-request"
    );
    assert_eq!(
        fail(&mut k, now, a, Request::Register { qpn: 5 }),
        "unknown-qpn"
    );
    assert_eq!(
        fail(&mut k, now, a, Request::Register { qpn: 1 << 24 }),
        "bad-request"
    );
    let b = k.open_session(None);
    let r = ok(
        &mut k,
        now,
        a,
        Request::Create {
            domain: "d".into(),
            policy: "explicit".into(),
        },
    );
    let qpn = r["qpn"].as_u64().unwrap() as u32;
    assert_eq!(fail(&mut k, now, b, Request::Destroy { qpn }), "not-owner");
    assert_eq!(
        fail(
            &mut k,
            now,
            a,
            Request::Modify {
                qpn,
                attr: ModifyAttr {
                    state: Some("RTR".into()),
                    ..ModifyAttr::default()
                }
            }
        ),
        "bad-modify"
    );
    let m = ok(
        &mut k,
        now,
        b,
        Request::Modify {
            qpn,
            attr: ModifyAttr {
                state: Some("INIT".into()),
                pkey_index: Some(0),
                port: Some(1),
                access_flags: Some(0),
                ..ModifyAttr::default()
            },
        },
    );
    assert_eq!(m["state"], "INIT");
    let q = ok(&mut k, now, b, Request::Query { qpn });
    assert_eq!(q["state"], "INIT");
}

#[test]
fn explicit_orphan_is_a_leak_until_adopted() {
    let (mut k, now) = keeper();
    let a = k.open_session(Some(1));
    let b = k.open_session(Some(2));
    ok(
        &mut k,
        now,
        a,
        Request::OpenDomain {
            domain: "d".into(),
            path: None,
            create: true,
            exclusive: false,
        },
    );
    let r = ok(
        &mut k,
        now,
        a,
        Request::Create {
            domain: "d".into(),
            policy: "explicit".into(),
        },
    );
    let qpn = r["qpn"].as_u64().unwrap() as u32;
    let ev = k.close_session(now, a);
    assert_eq!(ev, vec![(Target::All, KeeperEvent::QpOrphaned { qpn })]);
    let leaks = ok(&mut k, now, b, Request::Leaks);
    assert_eq!(leaks.as_array().unwrap().len(), 1);
    ok(&mut k, now, b, Request::Adopt { qpn });
    assert_eq!(
        ok(&mut k, now, b, Request::Leaks).as_array().unwrap().len(),
        0
    );
    let d = ok(&mut k, now, b, Request::Destroy { qpn });
    assert_eq!(d["verdict"], "released");
}

#[test]
fn log_lines_name_real_pids() {
    let (mut k, now) = keeper();
    let a = k.open_session(Some(4242));
    ok(
        &mut k,
        now,
        a,
        Request::OpenDomain {
            domain: "d".into(),
            path: None,
            create: true,
            exclusive: false,
        },
    );
    ok(
        &mut k,
        now,
        a,
        Request::Create {
            domain: "d".into(),
            policy: "shared".into(),
        },
    );
    let log = k.take_log().join("\n");
    assert!(
        log.contains("create shared by pid 4242 (session 1)"),
        "{log}"
    );
    assert_eq!(
        k.humanize("pid 99 and pid x"),
        "pid ? (session 99) and pid x"
    );
    k.close_session(now, a);
    assert!(k
        .take_log()
        .iter()
        .any(|l| l.contains("session 1 (pid 4242) closed")));
}

#[test]
fn gid_parsing() {
    assert_eq!(
        gid_arg("fe80:0000:0000:0000:0000:0000:0000:0001").unwrap()[15],
        1
    );
    assert!(gid_arg("xyz").is_err());
    assert!(gid_arg(&"é".repeat(16)).is_err());
}
