//! The boundary: NULL and invalid pointers are error codes, every code has a text.

use std::ffi::{c_int, CStr};
use std::ptr::{null, null_mut};

use super::api::*;
use super::apm::*;
use super::conn::*;
use super::data::*;
use super::status;
use super::types::ibcm_status::{self, *};
use super::types::*;
use super::xrc::*;

fn st(c: c_int) -> ibcm_status {
    status(c).unwrap_or_else(|| panic!("{c} is not a status"))
}

fn last() -> String {
    // SAFETY: (test) ibcm_last_error returns a NUL-terminated string of this thread.
    unsafe { CStr::from_ptr(ibcm_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn strerror_names_every_code() {
    for c in crate::error::ALL {
        // SAFETY: (test) static NUL-terminated strings.
        let t = unsafe { CStr::from_ptr(ibcm_strerror(c as c_int)) };
        assert!(!t.to_bytes().is_empty(), "{c:?}");
        assert_ne!(t.to_str().unwrap(), "unknown ibcm status", "{c:?}");
    }
    // SAFETY: (test) as above.
    let t = unsafe { CStr::from_ptr(ibcm_strerror(42)) };
    assert_eq!(t.to_str().unwrap(), "unknown ibcm status");
    for e in 1..=14 {
        // SAFETY: (test) as above.
        let t = unsafe { CStr::from_ptr(ibcm_event_str(e)) };
        assert_ne!(t.to_str().unwrap(), "UNKNOWN", "{e}");
    }
}

#[test]
fn null_context_is_einval_everywhere() {
    let ctx = null_mut();
    let mut ev = null_mut();
    let mut attr = ibcm_qp_attr::default();
    let mut mask = 0;
    let mut conn = 0u64;
    let mut n = 0u64;
    let mut buf = [0u8; 1024];
    let mut len = 0u32;
    let p = crate::params::conn_param_default();
    let a = crate::params::accept_param_default();
    let mut ap = a;
    let sp = crate::params::sidr_param_default();
    let rp = ibcm_sidr_rep_param {
        status: 0,
        qp_num: 1,
        qkey: 0,
        private_data: null(),
        private_data_len: 0,
    };
    let (mut count, mut qpn) = (0u32, 0u32);
    // SAFETY: (test) an all-zero C struct of integers and a byte array is a valid value.
    let mut info: ibcm_xrc_tgt_info = unsafe { std::mem::zeroed() };
    let mut path = ibcm_path::default();
    // SAFETY: (test) every pointer is NULL or points to a live local.
    let codes = unsafe {
        [
            ibcm_close(ctx),
            ibcm_get_fd(ctx),
            ibcm_get_event(ctx, &mut ev),
            ibcm_wait_event(ctx, 0, &mut ev),
            ibcm_ack_event(ctx, null_mut()),
            ibcm_listen(ctx, 1),
            ibcm_unlisten(ctx, 1),
            ibcm_xrc_listen(ctx, 1, 2, [16u32].as_ptr(), 1),
            ibcm_xrc_unlisten(ctx, 1),
            ibcm_xrc_destroy(ctx, &mut n),
            ibcm_accept_param_init(ctx, &mut ap),
            ibcm_connect(ctx, &p, &mut conn),
            ibcm_accept(ctx, 1, &a),
            ibcm_reject(ctx, 1, 28, null(), 0),
            ibcm_mra(ctx, 1, 20),
            ibcm_establish(ctx, 1, null(), 0),
            ibcm_disconnect(ctx, 1, null(), 0),
            ibcm_init_qp_attr(ctx, 1, 2, null(), null(), &mut attr, &mut mask),
            ibcm_listen_context(ctx, 1, null_mut()),
            ibcm_set_context(ctx, 1, null_mut()),
            ibcm_sidr_query(ctx, &sp, &mut conn),
            ibcm_sidr_reply(ctx, 1, &rp),
            ibcm_query_counters(ctx, null_mut(), 0, &mut count),
            ibcm_xrc_listen_domain(ctx, 1, 2, [16u32].as_ptr(), 1, c"d".as_ptr(), 0),
            ibcm_xrcd_open(ctx, c"d".as_ptr(), null(), 0),
            ibcm_xrcd_close(ctx, c"d".as_ptr()),
            ibcm_xrc_tgt_create(ctx, c"d".as_ptr(), 0, &mut qpn),
            ibcm_xrc_tgt_register(ctx, 72),
            ibcm_xrc_tgt_unregister(ctx, 72),
            ibcm_xrc_tgt_destroy(ctx, 72),
            ibcm_xrc_tgt_query(ctx, 72, &mut info),
            ibcm_xrc_tgt_modify(ctx, 72, &attr, 1),
            ibcm_xrc_srq_create(ctx, c"d".as_ptr(), 0, &mut qpn),
            ibcm_xrc_srq_destroy(ctx, 16),
            ibcm_xrc_srq_recv(ctx, 16, buf.as_mut_ptr(), 1024, &mut len),
            ibcm_xrc_send(ctx, 1, 16, buf.as_ptr(), 1),
            ibcm_lap_policy(ctx, 1),
            ibcm_load_alt_path(ctx, 1, &path, null(), 0),
            ibcm_lap_accept(ctx, 1, null(), 0),
            ibcm_lap_reject(ctx, 1, 3, null(), 0, null(), 0),
            ibcm_path_migrated(ctx, 1),
            ibcm_query_path(ctx, 1, 0, &mut path),
            ibcm_init_alt_path_attr(ctx, 1, null(), &mut attr, &mut mask),
        ]
    };
    for (i, c) in codes.into_iter().enumerate() {
        assert_eq!(st(c), IBCM_EINVAL, "call {i}");
    }
    assert_eq!(last(), "ctx is NULL");
    assert!(ev.is_null());
}

#[test]
fn null_out_pointers_and_paths_are_einval() {
    let mut ctx = null_mut();
    // SAFETY: (test) NULL or live locals.
    unsafe {
        assert_eq!(st(ibcm_open(null(), &mut ctx)), IBCM_EINVAL);
        assert_eq!(last(), "socket_path is NULL");
        assert_eq!(
            st(ibcm_open(c"/nonexistent".as_ptr(), null_mut())),
            IBCM_EINVAL
        );
        assert_eq!(st(ibcm_conn_param_init(null_mut())), IBCM_EINVAL);
    }
    assert!(ctx.is_null());
}

#[test]
fn no_daemon_is_eattach() {
    let dir = std::env::temp_dir().join(format!("ibcm-capi-test-{}", std::process::id()));
    let sock = dir.join("none.sock");
    let path = std::ffi::CString::new(sock.to_str().unwrap()).unwrap();
    let mut ctx = null_mut();
    // SAFETY: (test) a NUL-terminated path and a live local.
    let c = unsafe { ibcm_open(path.as_ptr(), &mut ctx) };
    assert_eq!(st(c), IBCM_EATTACH);
    assert!(last().contains("none.sock"), "{}", last());
    assert!(ctx.is_null());
}

#[test]
fn conn_param_init_sets_the_defaults() {
    let mut p = std::mem::MaybeUninit::<ibcm_conn_param>::uninit();
    // SAFETY: (test) a writable local; init writes the whole struct.
    let p = unsafe {
        assert_eq!(st(ibcm_conn_param_init(p.as_mut_ptr())), IBCM_OK);
        p.assume_init()
    };
    assert_eq!(
        (p.responder_resources, p.retry_count, p.path_mtu),
        (16, 7, 3)
    );
    assert_eq!((p.timeout_ms, p.flags, p.transport), (10_000, 0, 0));
    assert!(p.peer.is_null() && p.private_data.is_null());
}

/// A context attached to a stand-in daemon: a socket that answers the hello, so the calls
/// that need no further answer can be tried.
mod attached {
    use super::*;
    use ibcm::rt::node::proto::{
        encode_frame, read_frame, write_frame, ClientMsg, DaemonMsg, WireResult,
    };

    fn serve(sock: std::path::PathBuf) -> std::thread::JoinHandle<()> {
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let (s, _) = l.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            rt.block_on(async move {
                let s = tokio::net::UnixStream::from_std(s).unwrap();
                let (mut rd, mut wr) = s.into_split();
                let hello: ClientMsg = read_frame(&mut rd).await.unwrap();
                let ok = DaemonMsg::Reply {
                    seq: hello.seq,
                    result: WireResult::Ok,
                };
                write_frame(&mut wr, &encode_frame(&ok).unwrap())
                    .await
                    .unwrap();
                // Until the client closes the socket.
                while read_frame::<ClientMsg, _>(&mut rd).await.is_ok() {}
            });
        })
    }

    #[test]
    fn calls_check_their_pointers_and_handles() {
        let dir = std::env::temp_dir().join(format!("ibcm-capi-att-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("d.sock");
        let daemon = serve(sock.clone());
        let path = std::ffi::CString::new(sock.to_str().unwrap()).unwrap();
        let mut ctx = null_mut();
        // SAFETY: (test) live locals and the context ibcm_open returns, closed once at the end.
        unsafe {
            assert_eq!(
                st(ibcm_open(path.as_ptr(), &mut ctx)),
                IBCM_OK,
                "{}",
                last()
            );
            assert!(ibcm_get_fd(ctx) >= 0);
            let mut ev = null_mut();
            assert_eq!(st(ibcm_get_event(ctx, &mut ev)), IBCM_EAGAIN);
            assert_eq!(st(ibcm_wait_event(ctx, 1, &mut ev)), IBCM_EAGAIN);
            assert_eq!(st(ibcm_get_event(ctx, null_mut())), IBCM_EINVAL);
            let mut bogus = 0u64;
            let fake = (&mut bogus as *mut u64).cast::<ibcm_event>();
            assert_eq!(st(ibcm_ack_event(ctx, fake)), IBCM_EINVAL);
            assert_eq!(st(ibcm_ack_event(ctx, null_mut())), IBCM_EINVAL);
            let mut attr = ibcm_qp_attr::default();
            let mut mask = 0;
            let r = ibcm_init_qp_attr(ctx, 77, 2, null(), null(), &mut attr, &mut mask);
            assert_eq!(st(r), IBCM_ENOENT);
            let r = ibcm_init_qp_attr(ctx, 77, 2, null(), null(), null_mut(), &mut mask);
            assert_eq!(st(r), IBCM_EINVAL);
            assert_eq!(st(ibcm_disconnect(ctx, 77, null(), 0)), IBCM_ENOENT);
            assert_eq!(st(ibcm_establish(ctx, 77, null(), 0)), IBCM_ENOENT);
            assert_eq!(st(ibcm_accept(ctx, 77, null())), IBCM_EINVAL);
            assert_eq!(st(ibcm_reject(ctx, 77, 28, null(), 0)), IBCM_ENOENT);
            assert_eq!(st(ibcm_mra(ctx, 77, 20)), IBCM_ENOENT);
            assert_eq!(st(ibcm_mra(ctx, 77, 32)), IBCM_EINVAL);
            assert_eq!(st(ibcm_reject(ctx, 77, 28, null(), 149)), IBCM_ETOOLONG);
            assert_eq!(st(ibcm_disconnect(ctx, 77, null(), 4)), IBCM_EINVAL);
            assert_eq!(st(ibcm_unlisten(ctx, 5)), IBCM_ENOENT);
            assert_eq!(
                st(ibcm_xrc_listen(ctx, 5, 9, [16u32].as_ptr(), 1)),
                IBCM_EINVAL
            );
            assert_eq!(st(ibcm_xrc_listen(ctx, 5, 2, null(), 0)), IBCM_EINVAL);
            // The data path's calls check their arguments before asking anyone.
            let mut srqn = 0u32;
            let mut buf = [0u8; 1024];
            let mut len = 0u32;
            let sc = |max_wr, out: *mut u32| ibcm_xrc_srq_create(ctx, c"d".as_ptr(), max_wr, out);
            assert_eq!(st(sc(257, &mut srqn)), IBCM_EINVAL, "max_wr over 256");
            assert_eq!(st(sc(1, null_mut())), IBCM_EINVAL);
            let recv = |b: *mut u8, cap, l: *mut u32| ibcm_xrc_srq_recv(ctx, 16, b, cap, l);
            assert_eq!(
                st(recv(buf.as_mut_ptr(), 1023, &mut len)),
                IBCM_EINVAL,
                "a short buffer"
            );
            assert_eq!(st(recv(null_mut(), 1024, &mut len)), IBCM_EINVAL);
            assert_eq!(st(recv(buf.as_mut_ptr(), 1024, null_mut())), IBCM_EINVAL);
            assert_eq!(st(ibcm_xrc_send(ctx, 77, 16, buf.as_ptr(), 1)), IBCM_ENOENT);
            assert_eq!(
                st(ibcm_xrc_send(ctx, 77, 1 << 24, buf.as_ptr(), 1)),
                IBCM_EINVAL
            );
            assert_eq!(st(ibcm_xrc_send(ctx, 77, 16, null(), 1)), IBCM_EINVAL);
            let mut p = crate::params::conn_param_default();
            let mut conn = 0u64;
            assert_eq!(
                st(ibcm_connect(ctx, &p, &mut conn)),
                IBCM_EINVAL,
                "peer NULL"
            );
            p.peer = c"10.0.0.2".as_ptr();
            p.qp_num = 0x11;
            p.private_data_len = 3;
            assert_eq!(
                st(ibcm_connect(ctx, &p, &mut conn)),
                IBCM_EINVAL,
                "data NULL"
            );
            assert_eq!(st(ibcm_connect(ctx, &p, null_mut())), IBCM_EINVAL);
            assert_eq!(conn, 0);
            // A daemon that predates path migration (its hello said no `apm`): the calls
            // that need it are refused at once, the others check their handles.
            let path = ibcm_path::default();
            assert_eq!(st(ibcm_lap_policy(ctx, 1)), IBCM_EUNSUPPORTED);
            assert!(last().contains("path migration"), "{}", last());
            assert_eq!(st(ibcm_lap_policy(ctx, 0)), IBCM_OK, "what it does anyway");
            assert_eq!(st(ibcm_lap_policy(ctx, -1)), IBCM_EINVAL);
            assert_eq!(
                st(ibcm_load_alt_path(ctx, 77, &path, null(), 0)),
                IBCM_EUNSUPPORTED
            );
            assert_eq!(st(ibcm_path_migrated(ctx, 77)), IBCM_EUNSUPPORTED);
            assert_eq!(st(ibcm_lap_accept(ctx, 77, null(), 0)), IBCM_ENOENT);
            assert_eq!(
                st(ibcm_lap_reject(ctx, 77, 3, null(), 0, null(), 0)),
                IBCM_ENOENT
            );
            assert_eq!(
                st(ibcm_lap_reject(ctx, 77, 256, null(), 0, null(), 0)),
                IBCM_EINVAL
            );
            assert_eq!(
                st(ibcm_lap_reject(ctx, 77, 3, null(), 73, null(), 0)),
                IBCM_ETOOLONG
            );
            assert_eq!(st(ibcm_lap_accept(ctx, 77, null(), 4)), IBCM_EINVAL);
            let mut qp = ibcm_path::default();
            assert_eq!(st(ibcm_query_path(ctx, 77, 0, &mut qp)), IBCM_ENOENT);
            let r = ibcm_init_alt_path_attr(ctx, 77, null(), &mut attr, &mut mask);
            assert_eq!(st(r), IBCM_ENOENT);
            let r = ibcm_init_alt_path_attr(ctx, 77, null(), &mut attr, null_mut());
            assert_eq!(st(r), IBCM_EINVAL);
            p.peer = c"lid:5".as_ptr();
            p.private_data_len = 0;
            p.flags = IBCM_CONNECT_ALT_PATH;
            assert_eq!(st(ibcm_connect(ctx, &p, &mut conn)), IBCM_EUNSUPPORTED);
            p.flags = 1 << 5;
            assert_eq!(st(ibcm_connect(ctx, &p, &mut conn)), IBCM_EINVAL, "a flag");
            // An event lent and given back once; its strings and data live until then.
            let mut e = crate::event::Event::new(ibcm_event_type::IBCM_EVENT_DISCONNECTED, 5);
            e.reason = "target gone (creator exited)".into();
            e.private_data = vec![1, 2, 3];
            let c = &*ctx;
            c.inner.shared.events.push(e.clone());
            c.inner.shared.events.push(e);
            let mut ev = null_mut();
            assert_eq!(st(ibcm_get_event(ctx, &mut ev)), IBCM_OK);
            let r = &*ev;
            assert_eq!(
                (r.event, r.conn),
                (ibcm_event_type::IBCM_EVENT_DISCONNECTED, 5)
            );
            assert_eq!(
                CStr::from_ptr(r.reason).to_str(),
                Ok("target gone (creator exited)")
            );
            assert_eq!(CStr::from_ptr(r.peer).to_str(), Ok(""));
            let pd = std::slice::from_raw_parts(r.private_data, r.private_data_len as usize);
            assert_eq!(pd, [1, 2, 3]);
            assert_eq!(st(ibcm_ack_event(ctx, ev)), IBCM_OK);
            assert_eq!(st(ibcm_ack_event(ctx, ev)), IBCM_EINVAL);
            // The second stays unacknowledged: ibcm_close frees it.
            assert_eq!(st(ibcm_wait_event(ctx, -1, &mut ev)), IBCM_OK);
            assert_eq!(st(ibcm_close(ctx)), IBCM_OK);
        }
        daemon.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
