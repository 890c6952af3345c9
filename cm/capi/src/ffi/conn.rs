//! Connections: parameters, connect, accept, reject, establish, disconnect, QP attributes.

use std::ffi::c_int;

use super::ctx::ibcm_ctx;
use super::types::ibcm_status::*;
use super::types::{
    ibcm_accept_param, ibcm_conn_param, ibcm_port, ibcm_qp_attr, ibcm_sidr_param,
    ibcm_sidr_rep_param, IBCM_DREQ_PRIVATE_DATA_MAX, IBCM_REJ_PRIVATE_DATA_MAX,
    IBCM_RTU_PRIVATE_DATA_MAX,
};
use super::{bytes, context, guard, opt, put, string};
use crate::error::{Error, Result};
use crate::params;

fn fits(what: &str, len: u32, max: u32) -> Result<()> {
    if len > max {
        return Err(Error::new(
            IBCM_ETOOLONG,
            format!("{what} of {len} bytes exceeds the {max}-byte limit"),
        ));
    }
    Ok(())
}

/// Fills `*param` with the defaults (rdma_cm's: RC, responder resources and initiator depth
/// 16, retry counts 7, MTU 1024, connect timeout 10 s, no flags); set `peer`, `service_id`
/// and `qp_num` after.
///
/// # Safety
/// `param` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_conn_param_init(param: *mut ibcm_conn_param) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { put(param, params::conn_param_default(), "param") })
}

/// Fills `*param` with the defaults (responder resources and initiator depth 16, RNR retry
/// 7) and a random starting PSN (drawn here, from keys the OS seeded: no round trip to the
/// daemon); set `qp_num` after.
///
/// # Safety
/// `ctx` is NULL or a live context; `param` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_accept_param_init(
    ctx: *mut ibcm_ctx,
    param: *mut ibcm_accept_param,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        unsafe { context(ctx) }?.live()?;
        if param.is_null() {
            return Err(Error::new(IBCM_EINVAL, "param is NULL"));
        }
        let mut p = params::accept_param_default();
        p.starting_psn = params::random_psn();
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(param, p, "param") }
    })
}

/// Starts a connection (sends the REQ through the daemon) and returns its handle in
/// `*conn` at once. Then: `IBCM_EVENT_ESTABLISHED`, or with `IBCM_CONNECT_MANUAL_RTU`
/// `IBCM_EVENT_CONNECT_RESPONSE` first; or a final event (`REJECTED`, `UNREACHABLE`,
/// `CONNECT_ERROR`). For XRC (`IBCM_TRANSPORT_XRC`), `qp_num` is the INI QP and the REP
/// names the TGT QP (`remote_qpn`). A "lid:N" / "gid:G" peer's path is asked of the daemon
/// first (it does not block here): without one the handle ends with `CONNECT_ERROR`, status
/// `IBCM_ENOPATH` (the SA's error, no answer, no SM, a path outside the daemon port's P_Key 0)
/// or `IBCM_EUNSUPPORTED` (a daemon not on an InfiniBand port). Errors here: `IBCM_EINVAL`
/// (NULL, bad address or value, a peer that is no unicast host: unspecified, broadcast,
/// multicast, LID 0 or ≥ 0xC000, a zero or multicast GID; a peer of the other address family
/// than the daemon's CM address, such as IPv6 through an IPv4 daemon), `IBCM_ETOOLONG`,
/// `IBCM_EGONE` (the node service connection is gone); the daemon's refusals (QPN in use, an
/// IP peer through a daemon on an InfiniBand port, …) come as `CONNECT_ERROR`.
///
/// # Safety
/// `ctx` is NULL or a live context; `param` is NULL or readable, with its `peer` and
/// `private_data` pointers as its field docs say; `conn` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_connect(
    ctx: *mut ibcm_ctx,
    param: *const ibcm_conn_param,
    conn: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let p = unsafe { opt(param) }.ok_or_else(|| Error::new(IBCM_EINVAL, "param is NULL"))?;
        if conn.is_null() {
            return Err(Error::new(IBCM_EINVAL, "conn is NULL"));
        }
        // SAFETY: the field contracts of ibcm_conn_param.
        let peer = unsafe { string(p.peer, "param->peer") }?;
        // SAFETY: as above.
        let pd = unsafe { bytes(p.private_data, p.private_data_len, "param->private_data") }?;
        let cp = params::connect_params(p, &peer, pd, c.daemon_ip())?;
        // An address the application gave: only handed back in events.
        let h = c.connect(cp, p.context as usize)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(conn, h, "conn") }
    })
}

/// Accepts the REQ of `conn` (a handle from `IBCM_EVENT_CONNECT_REQUEST`): sends the REP,
/// returning without waiting for the daemon. Move the QP to RTR before (ibcm_init_qp_attr
/// with the same `param`), and to RTS on `IBCM_EVENT_ESTABLISHED` (the RTU). Errors here are
/// the parameters' and the handle's (`IBCM_EINVAL`, `IBCM_ETOOLONG`, `IBCM_ENOENT`,
/// `IBCM_ESTATE`, …); an accept the daemon refuses (a QPN in use, the REQ gone) rejects the
/// REQ (REJ 28) and ends the handle with `CONNECT_ERROR` (`status` and `reason` say why).
///
/// # Safety
/// `ctx` is NULL or a live context; `param` is NULL or readable, its `private_data` as its
/// field docs say.
#[no_mangle]
pub unsafe extern "C" fn ibcm_accept(
    ctx: *mut ibcm_ctx,
    conn: u64,
    param: *const ibcm_accept_param,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let a = unsafe { accept_param(param) }?
            .ok_or_else(|| Error::new(IBCM_EINVAL, "param is NULL"))?;
        c.accept(conn, a)
    })
}

/// The accept parameters at `p`, if any.
///
/// # Safety
/// `p` is NULL or readable, its `private_data` as its field docs say.
unsafe fn accept_param(p: *const ibcm_accept_param) -> Result<Option<ibcm::proto::AcceptParams>> {
    // SAFETY: the caller's contract.
    let Some(p) = (unsafe { opt(p) }) else {
        return Ok(None);
    };
    // SAFETY: the field contract of ibcm_accept_param.
    let pd = unsafe { bytes(p.private_data, p.private_data_len, "param->private_data") }?;
    params::accept_params(p, pd).map(Some)
}

/// Sends an MRA for the REQ of a `CONNECT_REQUEST` handle, for the REP of a
/// `CONNECT_RESPONSE` one (`IBCM_CONNECT_MANUAL_RTU`), or for the LAP of an established
/// connection whose `IBCM_EVENT_LAP` waits for an answer: the answer (accept or reject; the
/// RTU or a reject; ibcm_lap_accept or ibcm_lap_reject) will take up to 4.096 µs ×
/// 2^`service_timeout` (0..31), so the peer waits that long instead of retransmitting. The
/// REQ, REP or LAP stays to be answered.
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_mra(ctx: *mut ibcm_ctx, conn: u64, service_timeout: u8) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { context(ctx) }?.mra(conn, service_timeout))
}

/// Rejects the REQ of a `CONNECT_REQUEST` handle, or the REP of a `CONNECT_RESPONSE` one,
/// with `reason` (IBTA table 112; 28 = consumer reject) and up to 148 bytes of private data.
/// The handle ends (`CONNECT_ERROR`, "rejected locally").
///
/// # Safety
/// `ctx` is NULL or a live context; `private_data` is NULL or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibcm_reject(
    ctx: *mut ibcm_ctx,
    conn: u64,
    reason: u16,
    private_data: *const u8,
    len: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        fits("REJ private data", len, IBCM_REJ_PRIVATE_DATA_MAX)?;
        // SAFETY: the caller's contract.
        let pd = unsafe { bytes(private_data, len, "private_data") }?;
        c.reject(conn, reason, &pd)
    })
}

/// Sends the RTU of a `CONNECT_RESPONSE` handle (`IBCM_CONNECT_MANUAL_RTU`), with up to 224
/// bytes of private data, once the QP is in RTS. `IBCM_EVENT_ESTABLISHED` is queued too.
/// `IBCM_ECLOSED` when the connection ended meanwhile (its final event says why).
///
/// # Safety
/// `ctx` is NULL or a live context; `private_data` is NULL or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibcm_establish(
    ctx: *mut ibcm_ctx,
    conn: u64,
    private_data: *const u8,
    len: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        fits("RTU private data", len, IBCM_RTU_PRIVATE_DATA_MAX)?;
        // SAFETY: the caller's contract.
        let pd = unsafe { bytes(private_data, len, "private_data") }?;
        c.establish(conn, pd)
    })
}

/// Ends a connection: a DREQ (up to 220 bytes of private data) when established, a REJ
/// while it is being set up (a REQ not answered yet is rejected with reason 28; a connect
/// waiting for its REP is cancelled). Never `IBCM_EBUSY`: while another call on the
/// connection (or the automatic RTU) is in progress, the disconnect is queued and carried out
/// when it is done (after the RTU: `ESTABLISHED`, then `DISCONNECTED`). Returns at once; the
/// final event follows (`DISCONNECTED` with `by_peer` 0 once the DREP arrived or the DREQ
/// timed out).
///
/// # Safety
/// `ctx` is NULL or a live context; `private_data` is NULL or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibcm_disconnect(
    ctx: *mut ibcm_ctx,
    conn: u64,
    private_data: *const u8,
    len: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        fits("DREQ private data", len, IBCM_DREQ_PRIVATE_DATA_MAX)?;
        // SAFETY: the caller's contract.
        let pd = unsafe { bytes(private_data, len, "private_data") }?;
        c.disconnect(conn, pd)
    })
}

/// The attributes and `ibv_modify_qp` mask that move this side's QP of `conn` to
/// `qp_state` (`ibcm_qp_state`: INIT, RTR, RTS), computed as the kernel's
/// `ib_cm_init_qp_attr` does from the connection's REQ and REP. `port`: the local port
/// (NULL: port 1, indexes 0, RoCE). `accept`: the passive side before ibcm_accept gives the
/// parameters it will accept with (the REP is not sent yet); NULL otherwise. Available from
/// `CONNECT_REQUEST` (passive, with `accept`) or `CONNECT_RESPONSE` (active) until the final
/// event; `IBCM_ESTATE` before the REP.
///
/// # Safety
/// `ctx` is NULL or a live context; `port` and `accept` NULL or readable; `attr` and `mask`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_init_qp_attr(
    ctx: *mut ibcm_ctx,
    conn: u64,
    qp_state: c_int,
    port: *const ibcm_port,
    accept: *const ibcm_accept_param,
    attr: *mut ibcm_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        if attr.is_null() || mask.is_null() {
            return Err(Error::new(IBCM_EINVAL, "attr or mask is NULL"));
        }
        let state = u32::try_from(qp_state).unwrap_or(0);
        // SAFETY: the caller's contract.
        let port = unsafe { opt(port) };
        // SAFETY: the caller's contract.
        let accept = unsafe { accept_param(accept) }?;
        let (a, m) = c.qp_attr(conn, state, port, accept)?;
        // SAFETY: both non-null and writable by the caller's contract.
        unsafe { put(attr, a, "attr") }?;
        // SAFETY: as above.
        unsafe { put(mask, m, "mask") }
    })
}

/// Fills `*param` with the defaults (rdma_cm's timing: 4096 ms per attempt, 15 retries);
/// set `peer` and `service_id` after.
///
/// # Safety
/// `param` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_sidr_param_init(param: *mut ibcm_sidr_param) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { put(param, params::sidr_param_default(), "param") })
}

/// Resolves a service ID with SIDR (a SIDR_REQ through the daemon) and returns its handle in
/// `*handle` at once. Its one event follows: `IBCM_EVENT_SIDR_REPLY` (`sidr_status`,
/// `remote_qpn`, `qkey`, `private_data`) or `IBCM_EVENT_UNREACHABLE` (no answer after every
/// retry), or `CONNECT_ERROR` (cancelled with ibcm_disconnect, refused by the daemon).
/// Errors here: `IBCM_EINVAL` (NULL, a bad address, `timeout_ms` 0), `IBCM_EUNSUPPORTED` (a
/// "lid:" or "gid:" peer: SIDR takes IP peers), `IBCM_ETOOLONG`,
/// `IBCM_EGONE`.
///
/// # Safety
/// `ctx` is NULL or a live context; `param` is NULL or readable, with its `peer` and
/// `private_data` pointers as its field docs say; `handle` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_sidr_query(
    ctx: *mut ibcm_ctx,
    param: *const ibcm_sidr_param,
    handle: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let p = unsafe { opt(param) }.ok_or_else(|| Error::new(IBCM_EINVAL, "param is NULL"))?;
        if handle.is_null() {
            return Err(Error::new(IBCM_EINVAL, "handle is NULL"));
        }
        // SAFETY: the field contracts of ibcm_sidr_param.
        let peer = unsafe { string(p.peer, "param->peer") }?;
        // SAFETY: as above.
        let pd = unsafe { bytes(p.private_data, p.private_data_len, "param->private_data") }?;
        let sp = params::sidr_params(p, &peer, pd)?;
        // An address the application gave: only handed back in events.
        let h = c.sidr_query(sp, p.context as usize)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(handle, h, "handle") }
    })
}

/// Answers the SIDR_REQ of a `SIDR_REQUEST` handle with a SIDR_REP (`param`: status, the UD
/// QP and its Q_Key, private data); the handle is then forgotten. A refused answer (bad
/// values) leaves the request to be answered; the peer's request gone meanwhile is
/// `IBCM_ECLOSED`.
///
/// # Safety
/// `ctx` is NULL or a live context; `param` is NULL or readable, its `private_data` as its
/// field docs say.
#[no_mangle]
pub unsafe extern "C" fn ibcm_sidr_reply(
    ctx: *mut ibcm_ctx,
    conn: u64,
    param: *const ibcm_sidr_rep_param,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let p = unsafe { opt(param) }.ok_or_else(|| Error::new(IBCM_EINVAL, "param is NULL"))?;
        // SAFETY: the field contract of ibcm_sidr_rep_param.
        let pd = unsafe { bytes(p.private_data, p.private_data_len, "param->private_data") }?;
        let rep = params::sidr_rep_params(p, pd)?;
        c.sidr_reply(conn, rep)
    })
}
