//! The context, the event channel, listeners, XRC target services and error texts.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use super::ctx::ibcm_ctx;
use super::types::ibcm_event_type::{IBCM_EVENT_LAP, IBCM_EVENT_SIDR_REQUEST};
use super::types::ibcm_status::*;
use super::types::{ibcm_counter, ibcm_event, ibcm_path};
use super::{c_string, context, ctx_ref, guard, put, string};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::is_final;
use crate::event::Event;

/// An event with the storage its pointers point into. `ev` comes first: a pointer to the
/// box is a pointer to the event.
#[repr(C)]
struct EventBox {
    ev: ibcm_event,
    peer: CString,
    reason: CString,
    rdma_cm_src: CString,
    rdma_cm_dst: CString,
    private_data: Vec<u8>,
    path: Option<Box<ibcm_path>>,
    additional_info: Vec<u8>,
    /// A LAP event's LAP (its acknowledgement rejects that one if unanswered).
    lap_serial: u64,
}

/// Hands `e` to C: boxed, registered as outstanding on `ctx`.
fn lend(ctx: &ibcm_ctx, e: Event) -> *mut ibcm_event {
    let mut b = Box::new(EventBox {
        ev: ibcm_event {
            event: e.kind,
            status: e.status,
            conn: e.conn,
            comm_id: e.comm_id,
            transport: e.transport,
            service_id: e.service_id,
            remote_qpn: e.remote_qpn,
            remote_psn: e.remote_psn,
            rej_reason: e.rej_reason,
            by_peer: u8::from(e.by_peer),
            target_gone: u8::from(e.target_gone),
            xrc_report: e.xrc_report,
            peer: std::ptr::null(),
            reason: std::ptr::null(),
            private_data: std::ptr::null(),
            private_data_len: u32::try_from(e.private_data.len()).unwrap_or(0),
            // An address the application gave: only handed back.
            context: e.context as *mut c_void,
            rdma_cm_src: std::ptr::null(),
            rdma_cm_dst: std::ptr::null(),
            sidr_status: e.sidr_status,
            qkey: e.qkey,
            path: std::ptr::null(),
            apr_status: e.apr_status,
            additional_info: std::ptr::null(),
            additional_info_len: u32::try_from(e.additional_info.len()).unwrap_or(0),
            responder_resources: e.conn_param.responder_resources,
            initiator_depth: e.conn_param.initiator_depth,
            flow_control: u8::from(e.conn_param.flow_control),
            retry_count: e.conn_param.retry_count,
            rnr_retry_count: e.conn_param.rnr_retry_count,
            srq: u8::from(e.conn_param.srq),
            path_mtu: e.conn_param.path_mtu,
        },
        peer: c_string(&e.peer),
        reason: c_string(&e.reason),
        rdma_cm_src: c_string(e.rdma_cm.as_ref().map_or("", |a| &a.0)),
        rdma_cm_dst: c_string(e.rdma_cm.as_ref().map_or("", |a| &a.1)),
        private_data: e.private_data,
        path: e.path.map(Box::new),
        additional_info: e.additional_info,
        lap_serial: e.lap_serial,
    });
    // Heap buffers: they stay where they are while the box lives, wherever it moves.
    b.ev.peer = b.peer.as_ptr();
    b.ev.reason = b.reason.as_ptr();
    b.ev.rdma_cm_src = b.rdma_cm_src.as_ptr();
    b.ev.rdma_cm_dst = b.rdma_cm_dst.as_ptr();
    b.ev.private_data = b.private_data.as_ptr();
    b.ev.additional_info = b.additional_info.as_ptr();
    b.ev.path = b
        .path
        .as_deref()
        .map_or(std::ptr::null(), |p| p as *const ibcm_path);
    let p = Box::into_raw(b);
    outstanding(ctx).insert(p as usize);
    p.cast()
}

fn outstanding(ctx: &ibcm_ctx) -> std::sync::MutexGuard<'_, HashSet<usize>> {
    ctx.outstanding.lock().unwrap_or_else(|e| e.into_inner())
}

/// Frees an event `lend` made, if `ctx` lent it.
fn take_back(ctx: &ibcm_ctx, p: *mut ibcm_event) -> Result<()> {
    // The parent's context: nothing of it is touched in a child.
    ctx.inner.not_forked()?;
    if !outstanding(ctx).remove(&(p as usize)) {
        return Err(Error::new(
            IBCM_EINVAL,
            "not an event of this context, or acknowledged already",
        ));
    }
    // SAFETY: `p` came from Box::into_raw of an EventBox in `lend` (registered there, and
    // removed from the set just now, so it is freed once).
    let b = unsafe { Box::from_raw(p.cast::<EventBox>()) };
    if is_final(b.ev.event) {
        ctx.inner.shared.acknowledged(b.ev.conn);
    } else if b.ev.event == IBCM_EVENT_SIDR_REQUEST {
        ctx.inner.shared.sidr_acknowledged(b.ev.conn);
    } else if b.ev.event == IBCM_EVENT_LAP {
        ctx.inner.lap_acknowledged(b.ev.conn, b.lap_serial);
    }
    Ok(())
}

/// Attaches to the node's CM service (`ibcmd`) listening on the Unix socket
/// `socket_path`, and returns the context in `*ctx`. The daemon must run as root or as this
/// process's user. Errors: `IBCM_EINVAL` (NULL), `IBCM_EATTACH` (no daemon there, another
/// user's, another protocol version), `IBCM_EREFUSED` (1,024 contexts open in this process),
/// `IBCM_EIO`.
///
/// A `fork()` child does not hold its parent's contexts: the child's copies of their sockets
/// are closed at the fork (a `pthread_atfork` handler), so the daemon ends a context's
/// connections when the parent exits or dies, whatever its children do. In the child, calls
/// on an inherited context fail with `IBCM_EGONE` and ibcm_close of it returns `IBCM_OK`
/// without freeing anything (the parent's thread and locks are not the child's); the child
/// opens contexts of its own.
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string; `ctx` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_open(socket_path: *const c_char, ctx: *mut *mut ibcm_ctx) -> c_int {
    guard(|| {
        if ctx.is_null() {
            return Err(Error::new(IBCM_EINVAL, "ctx is NULL"));
        }
        // SAFETY: the caller's contract for socket_path.
        let path = unsafe { string(socket_path, "socket_path") }?;
        let inner = Context::open(Path::new(&path))?;
        // A fork() child closes its copy of the socket (the session is the parent's).
        super::fork::register(inner.socket_fd())?;
        let b = Box::new(ibcm_ctx {
            inner,
            outstanding: Mutex::new(HashSet::new()),
        });
        // SAFETY: ctx is non-null and writable by the caller's contract.
        unsafe { put(ctx, Box::into_raw(b), "ctx") }
    })
}

/// Detaches: the daemon ends this context's connections (DREQ, or REJ while being set up),
/// listeners and XRC holdings (per policy), as when the process exits. Frees the context
/// and every event not yet acknowledged. It must be the last call on `ctx`: no other call
/// on it may be running or follow. In a `fork()` child, on a context inherited from the
/// parent, it only forgets the context (see ibcm_open).
///
/// # Safety
/// `ctx` is NULL or a live context from ibcm_open, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn ibcm_close(ctx: *mut ibcm_ctx) -> c_int {
    guard(|| {
        if ctx.is_null() {
            return Err(Error::new(IBCM_EINVAL, "ctx is NULL"));
        }
        // SAFETY: from Box::into_raw in ibcm_open, not freed yet, used by no one else.
        let b = unsafe { Box::from_raw(ctx) };
        if b.inner.forked() {
            // Inherited through fork(): the parent's context. Its thread is not in this
            // process and a lock may have been held at the fork, so nothing of it is run or
            // freed here; the child's copy of its socket was closed at the fork.
            std::mem::forget(b);
            return Ok(());
        }
        super::fork::unregister(b.inner.socket_fd());
        let lent: Vec<usize> = outstanding(&b).drain().collect();
        for p in lent {
            // SAFETY: each address came from Box::into_raw in `lend` and was still
            // registered, so it is live and freed here once.
            drop(unsafe { Box::from_raw(p as *mut EventBox) });
        }
        drop(b);
        Ok(())
    })
}

/// The event channel's fd: readable (poll/epoll/select, POLLIN) exactly while events are
/// queued. Only poll it; never read, write or close it. Returns the fd (>= 0), or
/// `IBCM_EINVAL` for a NULL context.
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_get_fd(ctx: *const ibcm_ctx) -> c_int {
    let mut fd = 0;
    let r = guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        c.not_forked()?;
        fd = c.shared.events.fd();
        Ok(())
    });
    if r == 0 {
        fd
    } else {
        r
    }
}

fn deliver(ctx: &ibcm_ctx, e: Result<Event>, out: *mut *mut ibcm_event) -> Result<()> {
    let p = lend(ctx, e?);
    // SAFETY: `out` was checked non-null by the caller of deliver and is writable by the
    // API's contract.
    unsafe { put(out, p, "event") }
}

/// Takes the next event without waiting: `IBCM_OK` and `*event`, or `IBCM_EAGAIN` when none
/// is queued. Each event must be given back with ibcm_ack_event. Once the node service
/// connection is gone and its events (`IBCM_EVENT_SERVICE_GONE` last) are taken:
/// `IBCM_EGONE`.
///
/// # Safety
/// `ctx` is NULL or a live context; `event` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_get_event(ctx: *mut ibcm_ctx, event: *mut *mut ibcm_event) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ctx_ref(ctx) }?;
        if event.is_null() {
            return Err(Error::new(IBCM_EINVAL, "event is NULL"));
        }
        let e = c.inner.wait(Some(Duration::ZERO));
        deliver(c, e, event)
    })
}

/// Takes the next event, waiting up to `timeout_ms` milliseconds for one (-1: for ever;
/// 0: as ibcm_get_event). `IBCM_EAGAIN` when none came in time. `IBCM_EGONE` at once when
/// the node service connection is gone and its events are taken, for a wait blocked when
/// it went too.
///
/// # Safety
/// As ibcm_get_event.
#[no_mangle]
pub unsafe extern "C" fn ibcm_wait_event(
    ctx: *mut ibcm_ctx,
    timeout_ms: c_int,
    event: *mut *mut ibcm_event,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ctx_ref(ctx) }?;
        if event.is_null() {
            return Err(Error::new(IBCM_EINVAL, "event is NULL"));
        }
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        let e = c.inner.wait(timeout);
        deliver(c, e, event)
    })
}

/// Gives an event back (frees it). Acknowledging a connection's final event (`REJECTED`,
/// `UNREACHABLE`, `CONNECT_ERROR`, `DISCONNECTED`) also forgets its handle: calls on it then
/// return `IBCM_ENOENT` (before, `IBCM_ECLOSED`). `IBCM_EINVAL` for a pointer this context
/// did not hand out or that was acknowledged already.
///
/// # Safety
/// `ctx` is NULL or a live context; `event` any pointer (it is only compared until found).
#[no_mangle]
pub unsafe extern "C" fn ibcm_ack_event(ctx: *mut ibcm_ctx, event: *mut ibcm_event) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ctx_ref(ctx) }?;
        take_back(c, event)
    })
}

/// Listens on `service_id` for RC and UC REQs, each an `IBCM_EVENT_CONNECT_REQUEST`, and
/// SIDR_REQs, each an `IBCM_EVENT_SIDR_REQUEST`. For rdma_cm clients, listen on
/// ibcm_rdma_cm_service_id(`IBCM_PS_TCP`, port). `IBCM_EREFUSED` when another client of the
/// daemon (or this context) listens there.
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_listen(ctx: *mut ibcm_ctx, service_id: u64) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { context(ctx) }?.listen(service_id, 0))
}

/// As ibcm_listen, and each request's handle gets `context` (its events carry it in
/// `ibcm_event.context`, until ibcm_set_context changes it), as a request of an rdma_cm
/// listener inherits the listener's `id->context`.
///
/// # Safety
/// `ctx` is NULL or a live context; `context` is only handed back, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibcm_listen_context(
    ctx: *mut ibcm_ctx,
    service_id: u64,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { super::context(ctx) }?.listen(service_id, context as usize))
}

/// Sets the context pointer of handle `conn` (NULL: none): the events queued from now on
/// carry it. `IBCM_ENOENT` for an unknown handle (or one whose final event was
/// acknowledged).
///
/// # Safety
/// `ctx` is NULL or a live context; `context` is only handed back, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibcm_set_context(
    ctx: *mut ibcm_ctx,
    conn: u64,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { super::context(ctx) }?.set_context(conn, context as usize))
}

/// The service ID rdma_cm uses for `port` in `port_space` (`IBCM_PS_TCP`, `IBCM_PS_UDP`,
/// `IBCM_PS_IB`): `port_space << 16 | port`, as Linux's `rdma_get_service_id`. An rdma_cm
/// client of `rdma_connect` to port 7174 (`rping -s -p 7174`) asks for
/// ibcm_rdma_cm_service_id(`IBCM_PS_TCP`, 7174).
#[no_mangle]
pub extern "C" fn ibcm_rdma_cm_service_id(port_space: u16, port: u16) -> u64 {
    (u64::from(port_space) << 16) | u64::from(port)
}

/// The counters of the node service's CM endpoint (the daemon's, shared by every client:
/// connections, REJs, drops by reason, gauges; docs/ibcmd.md): the first `cap` of them into
/// `counters` (NULL when `cap` is 0), and how many there are into `*n` (so a call with `cap`
/// 0 sizes the array).
///
/// # Safety
/// `ctx` is NULL or a live context; `counters` is NULL or writable for `cap` entries; `n` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_query_counters(
    ctx: *mut ibcm_ctx,
    counters: *mut ibcm_counter,
    cap: u32,
    n: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { super::context(ctx) }?;
        if n.is_null() {
            return Err(Error::new(IBCM_EINVAL, "n is NULL"));
        }
        if counters.is_null() && cap > 0 {
            return Err(Error::new(IBCM_EINVAL, "counters is NULL"));
        }
        let all = c.counters()?;
        for (i, (name, value)) in all.iter().take(cap as usize).enumerate() {
            let entry = ibcm_counter {
                name: static_name(name),
                value: *value,
            };
            // SAFETY: `counters` is writable for `cap` entries and `i < cap`.
            unsafe { counters.add(i).write(entry) };
        }
        let total = u32::try_from(all.len()).unwrap_or(u32::MAX);
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(n, total, "n") }
    })
}

/// `name` as a NUL-terminated string that lives as long as the library: the counter names
/// are a fixed set, each kept once.
fn static_name(name: &str) -> *const c_char {
    static NAMES: Mutex<Vec<&'static std::ffi::CStr>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = names.iter().find(|c| c.to_bytes() == name.as_bytes()) {
        return c.as_ptr();
    }
    let c: &'static std::ffi::CStr = Box::leak(c_string(name).into_boxed_c_str());
    names.push(c);
    c.as_ptr()
}

/// Stops listening on `service_id` (REQs waiting for an answer stay to be answered).
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_unlisten(ctx: *mut ibcm_ctx, service_id: u64) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { context(ctx) }?.unlisten(service_id))
}

/// The text of a status code (a static string; "unknown ibcm status" for other values).
#[no_mangle]
pub extern "C" fn ibcm_strerror(status: c_int) -> *const c_char {
    super::strerror(status)
}

/// What this thread's last failed call said, in words (valid until the thread's next failed
/// call; "" before any).
#[no_mangle]
pub extern "C" fn ibcm_last_error() -> *const c_char {
    super::last_ptr()
}

/// The name of an `ibcm_event_type` ("CONNECT_REQUEST", …; "UNKNOWN" for other values).
#[no_mangle]
pub extern "C" fn ibcm_event_str(event: c_int) -> *const c_char {
    let t: &'static str = match event {
        1 => "CONNECT_REQUEST\0",
        2 => "CONNECT_RESPONSE\0",
        3 => "ESTABLISHED\0",
        4 => "REJECTED\0",
        5 => "UNREACHABLE\0",
        6 => "CONNECT_ERROR\0",
        7 => "DISCONNECTED\0",
        8 => "XRC_REPORT\0",
        9 => "SERVICE_GONE\0",
        10 => "SIDR_REQUEST\0",
        11 => "SIDR_REPLY\0",
        12 => "LAP\0",
        13 => "APR\0",
        14 => "LAP_ERROR\0",
        _ => "UNKNOWN\0",
    };
    t.as_ptr().cast::<c_char>()
}
