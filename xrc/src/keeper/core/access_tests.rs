//! Unit tests of the keeper's per-uid rules (module `access`), its bounds and its slot
//! bookkeeping. Sessions get their uid from `open_session_as`, so these run as any user.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

use super::access::{check_path, Cred};
use super::*;
use crate::keeper::proto::{ErrorBody, ErrorKind, ModifyAttr};
use crate::verbs::model::{KernelModel, ModelConfig};

const ROOT: Cred = Cred { uid: 0, gid: 0 };
const NOBODY: Cred = Cred {
    uid: 65534,
    gid: 65534,
};

fn keeper(backend: &str) -> (KeeperCore, Instant) {
    let k = KernelModel::new(ModelConfig::mlx5());
    let now = Instant::now();
    (
        KeeperCore::new(
            Box::new(k.spawn()),
            RegistryConfig::default(),
            "e1".into(),
            backend,
            now,
        ),
        now,
    )
}

fn call(k: &mut KeeperCore, now: Instant, s: SessionId, req: Request) -> Result<Value, ErrorBody> {
    let (r, _) = k.handle(now, s, Some(1), req);
    match (r.ok, r.result, r.error) {
        (true, v, _) => Ok(v.unwrap_or(Value::Null)),
        (false, _, e) => Err(e.unwrap()),
    }
}

fn open(domain: &str, path: Option<&str>) -> Request {
    Request::OpenDomain {
        domain: domain.into(),
        path: path.map(Into::into),
        create: true,
        exclusive: false,
    }
}

fn denied(r: Result<Value, ErrorBody>) -> String {
    match r {
        Err(e) if e.kind == ErrorKind::PermissionDenied => e.message,
        other => panic!("expected permission-denied, got {other:?}"),
    }
}

/// uid 65534 can neither modify, register on, adopt, close nor create in root's objects;
/// its own work is unaffected.
#[test]
fn another_uid_cannot_act_on_roots_objects() {
    let (mut k, now) = keeper("sim");
    let root = k.open_session_as(Some(1), ROOT);
    let nobody = k.open_session_as(Some(2), NOBODY);
    call(&mut k, now, root, open("job", None)).unwrap();
    let q1 = call(
        &mut k,
        now,
        root,
        Request::Create {
            domain: "job".into(),
            policy: "explicit".into(),
        },
    )
    .unwrap()["qpn"]
        .as_u64()
        .unwrap() as u32;
    let q2 = call(
        &mut k,
        now,
        root,
        Request::CreateOrRegister {
            domain: "job".into(),
            key: "default".into(),
        },
    )
    .unwrap()["qpn"]
        .as_u64()
        .unwrap() as u32;
    let to_init = ModifyAttr {
        state: Some("init".into()),
        port: Some(1),
        pkey_index: Some(0),
        access_flags: Some(0),
        ..ModifyAttr::default()
    };
    for qpn in [q1, q2] {
        let m = denied(call(
            &mut k,
            now,
            nobody,
            Request::Modify {
                qpn,
                attr: to_init.clone(),
            },
        ));
        assert!(m.contains("belongs to uid 0"), "{m}");
        denied(call(&mut k, now, nobody, Request::Register { qpn }));
    }
    denied(call(&mut k, now, nobody, Request::Adopt { qpn: q1 }));
    denied(call(
        &mut k,
        now,
        nobody,
        Request::CloseDomain {
            domain: "job".into(),
        },
    ));
    denied(call(
        &mut k,
        now,
        nobody,
        Request::Create {
            domain: "job".into(),
            policy: "shared".into(),
        },
    ));
    denied(call(
        &mut k,
        now,
        nobody,
        Request::CreateOrRegister {
            domain: "job".into(),
            key: "default".into(),
        },
    ));
    denied(call(
        &mut k,
        now,
        nobody,
        Request::AcceptReq {
            conn: "c".into(),
            domain: "job".into(),
            ini_ca_guid: 7,
            ini_qpn: 0x99,
            mode: Some("attach".into()),
            tgt_qpn: Some(q2),
            policy: None,
            srqns: vec![0x10],
            timewait_ms: None,
        },
    ));
    // Root's objects are as they were.
    let st = k.status();
    assert!(st
        .qps
        .iter()
        .all(|q| q.state == "RESET" && q.life == "live"));
    assert_eq!(st.domains.len(), 1);
    // Its own domain and QPs work.
    call(&mut k, now, nobody, open("mine", None)).unwrap();
    let mine = call(
        &mut k,
        now,
        nobody,
        Request::Create {
            domain: "mine".into(),
            policy: "explicit".into(),
        },
    )
    .unwrap()["qpn"]
        .as_u64()
        .unwrap() as u32;
    call(
        &mut k,
        now,
        nobody,
        Request::Modify {
            qpn: mine,
            attr: to_init,
        },
    )
    .unwrap();
    // And root cannot close nobody's domain either.
    denied(call(
        &mut k,
        now,
        root,
        Request::CloseDomain {
            domain: "mine".into(),
        },
    ));
    // Root's Explicit QP, orphaned when its session leaves, is not nobody's to destroy or
    // adopt; a later root session may.
    k.close_session(now, root);
    denied(call(&mut k, now, nobody, Request::Destroy { qpn: q1 }));
    denied(call(&mut k, now, nobody, Request::Adopt { qpn: q1 }));
    let root2 = k.open_session_as(Some(3), ROOT);
    call(&mut k, now, root2, Request::Adopt { qpn: q1 }).unwrap();
}

/// A domain name squatted by another uid is not handed out: root's open of that name (with
/// a path or without) fails and names the holder.
#[test]
fn squatted_domain_name_is_refused() {
    let (mut k, now) = keeper("sim");
    let nobody = k.open_session_as(Some(2), NOBODY);
    let root = k.open_session_as(Some(1), ROOT);
    call(&mut k, now, nobody, open("job", None)).unwrap();
    let m = denied(call(
        &mut k,
        now,
        root,
        open("job", Some("/var/lib/job.xrcd")),
    ));
    assert!(m.contains("held by uid 65534"), "{m}");
    assert!(m.contains("not a capability"), "{m}");
    denied(call(&mut k, now, root, open("job", None)));
    // The same with a path: another path is refused too.
    call(&mut k, now, nobody, open("f", Some("/tmp/nobody.xrcd"))).unwrap();
    denied(call(&mut k, now, root, open("f", Some("/tmp/root.xrcd"))));
}

/// A file-named domain is shared by opening it with the same path (the software backend:
/// the path names a domain of the model, no file is checked when none exists on disk); the
/// admitted uid may then register on its Shared QP, but not modify root's Explicit one.
#[test]
fn file_domain_is_shared_by_path() {
    let (mut k, now) = keeper("sim");
    let root = k.open_session_as(Some(1), ROOT);
    let nobody = k.open_session_as(Some(2), NOBODY);
    let path = "/nonexistent-ibcm-test/shared.xrcd";
    call(&mut k, now, root, open("f", Some(path))).unwrap();
    let shared = call(
        &mut k,
        now,
        root,
        Request::CreateOrRegister {
            domain: "f".into(),
            key: "k".into(),
        },
    )
    .unwrap()["qpn"]
        .as_u64()
        .unwrap() as u32;
    denied(call(&mut k, now, nobody, Request::Register { qpn: shared }));
    call(&mut k, now, nobody, open("f", Some(path))).unwrap();
    let again = call(
        &mut k,
        now,
        nobody,
        Request::CreateOrRegister {
            domain: "f".into(),
            key: "k".into(),
        },
    )
    .unwrap();
    assert_eq!(again["qpn"].as_u64(), Some(u64::from(shared)));
    assert_eq!(again["created"].as_bool(), Some(false));
}

/// Slot entries go with their QP: 4,000 keys of a client that leaves leave nothing behind.
#[test]
fn slots_of_a_client_that_left_are_removed() {
    let (mut k, now) = keeper("sim");
    let a = k.open_session_as(Some(1), ROOT);
    call(&mut k, now, a, open("d", None)).unwrap();
    for i in 0..4000 {
        call(
            &mut k,
            now,
            a,
            Request::CreateOrRegister {
                domain: "d".into(),
                key: format!("key-{i}"),
            },
        )
        .unwrap();
    }
    assert_eq!(k.slots.len(), 4000);
    k.close_session(now, a);
    assert!(k.slots.is_empty(), "{} slots left", k.slots.len());
    assert!(k.owners.qps.len() <= 4000);
    k.tick(now + std::time::Duration::from_secs(60));
    assert!(k.owners.qps.is_empty(), "owners forgotten with the QPs");
}

/// `timewait_ms` is bounded: `u64::MAX` is refused, the limit itself is accepted.
#[test]
fn timewait_is_bounded() {
    let (mut k, now) = keeper("sim");
    let a = k.open_session_as(Some(1), ROOT);
    call(&mut k, now, a, open("d", None)).unwrap();
    let req = |conn: &str, tw: u64| Request::AcceptReq {
        conn: conn.into(),
        domain: "d".into(),
        ini_ca_guid: 7,
        ini_qpn: 0x99,
        mode: None,
        tgt_qpn: None,
        policy: Some("domain-bound".into()),
        srqns: vec![0x10],
        timewait_ms: Some(tw),
    };
    match call(&mut k, now, a, req("c1", u64::MAX)) {
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::BadRequest);
            assert!(e.message.contains("limit"), "{}", e.message);
        }
        Ok(v) => panic!("accepted {v}"),
    }
    assert!(k.status().qps.is_empty(), "nothing created");
    let v = call(&mut k, now, a, req("c2", dispatch::MAX_TIMEWAIT_MS)).unwrap();
    assert_eq!(v["accept"].as_bool(), Some(true));
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ibcm-access-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn file(dir: &Path, name: &str, mode: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, b"").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

/// The path check judges the client's uid by the file's bits: a 0600 file of another user
/// cannot be opened, a 0644 one can; a file cannot be created in a 0755 directory of
/// another user, but can in a 01777 one.
#[test]
fn path_check_uses_the_clients_permissions() {
    let d = scratch("path");
    let private = file(&d, "private.xrcd", 0o600);
    let public = file(&d, "public.xrcd", 0o644);
    assert!(check_path(&private, NOBODY, false).is_err());
    assert_eq!(check_path(&public, NOBODY, false).ok(), Some(false));
    let new = d.join("new.xrcd");
    let e = check_path(&new, NOBODY, true).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(e.message.contains("may not create"), "{}", e.message);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert_eq!(check_path(&new, NOBODY, true).ok(), Some(true));
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    let m = check_path(&public, NOBODY, false).unwrap_err().message;
    assert!(m.contains("may not reach"), "{m}");
    let _ = std::fs::remove_dir_all(&d);
}

/// With the verbs backend the keeper refuses a domain file the client could not open.
#[test]
fn verbs_backend_refuses_a_file_the_client_cannot_open() {
    let d = scratch("verbs");
    let private = file(&d, "private.xrcd", 0o600);
    let (mut k, now) = keeper("verbs");
    let nobody = k.open_session_as(Some(2), NOBODY);
    let m = denied(call(
        &mut k,
        now,
        nobody,
        open("x", Some(private.to_str().unwrap())),
    ));
    assert!(m.contains("may not read"), "{m}");
    assert!(k.status().domains.is_empty());
    let _ = std::fs::remove_dir_all(&d);
}

/// 3,000 sessions: the status reply (far over the 64 kB request limit) is one line a client
/// reads.
#[test]
fn status_of_3000_sessions_is_one_reply() {
    let (mut k, now) = keeper("sim");
    let mut last = 0;
    for i in 0..3000 {
        last = k.open_session_as(Some(1000 + i), ROOT);
        call(
            &mut k,
            now,
            last,
            Request::Hello {
                pid: None,
                name: Some(format!("client-{i}")),
            },
        )
        .unwrap();
    }
    let v = call(&mut k, now, last, Request::Status).unwrap();
    let line = serde_json::to_string(&v).unwrap();
    assert!(
        line.len() > crate::keeper::server::MAX_LINE,
        "{}",
        line.len()
    );
    assert!(line.len() < crate::keeper::client::MAX_REPLY_LINE);
    assert_eq!(v["sessions"].as_array().map(Vec::len), Some(3000));
}

fn quota_hit(r: Result<Value, ErrorBody>) -> String {
    match r {
        Err(e) if e.kind == ErrorKind::QuotaExceeded => e.message,
        other => panic!("expected quota-exceeded, got {other:?}"),
    }
}

/// One user's sessions, domains and TGT QPs are bounded (over all its sessions); another
/// user is not affected, and what a user gives back counts no more.
#[test]
fn one_user_cannot_take_more_than_its_quota() {
    let (mut k, now) = keeper("sim");
    k.set_limits(crate::keeper::core::KeeperLimits {
        sessions_per_user: 2,
        domains_per_user: 2,
        qps_per_user: 3,
    });
    let a = k.open_session_as(Some(1), NOBODY);
    let b = k.open_session_as(Some(2), NOBODY);
    let third = k.session_quota(NOBODY).unwrap();
    assert_eq!(third.error.unwrap().kind, ErrorKind::QuotaExceeded);
    assert!(k.session_quota(ROOT).is_none());
    call(&mut k, now, a, open("d1", None)).unwrap();
    call(&mut k, now, b, open("d2", None)).unwrap();
    let m = quota_hit(call(&mut k, now, a, open("d3", None)));
    assert!(m.contains("2 domains"), "{m}");
    // Joining a domain the user already holds is no new domain.
    call(&mut k, now, b, open("d1", None)).unwrap();
    let create = |d: &str| Request::Create {
        domain: d.into(),
        policy: "explicit".into(),
    };
    let q = call(&mut k, now, a, create("d1")).unwrap()["qpn"]
        .as_u64()
        .unwrap() as u32;
    call(&mut k, now, b, create("d2")).unwrap();
    let slot = Request::CreateOrRegister {
        domain: "d2".into(),
        key: "k".into(),
    };
    call(&mut k, now, b, slot.clone()).unwrap();
    let m = quota_hit(call(&mut k, now, a, create("d1")));
    assert!(m.contains("3 TGT QPs"), "{m}");
    let other_key = Request::CreateOrRegister {
        domain: "d2".into(),
        key: "k2".into(),
    };
    quota_hit(call(&mut k, now, b, other_key.clone()));
    // Registering on an existing slot creates nothing: allowed.
    call(&mut k, now, a, Request::Register { qpn: q }).unwrap();
    // Root is not counted against nobody.
    let r = k.open_session_as(Some(3), ROOT);
    call(&mut k, now, r, open("rootd", None)).unwrap();
    call(&mut k, now, r, create("rootd")).unwrap();
    // A destroyed QP frees its share.
    call(&mut k, now, a, Request::Destroy { qpn: q }).unwrap();
    call(&mut k, now, b, other_key).unwrap();
}
