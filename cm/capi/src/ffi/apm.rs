//! Path migration (LAP/APR, Automatic Path Migration): who answers the LAPs, a LAP sent and
//! the answers to one received, a migration reported, a connection's paths and the QP
//! attributes of its alternate path.

use std::ffi::c_int;

use super::ctx::ibcm_ctx;
use super::types::ibcm_status::*;
use super::types::{
    ibcm_path, ibcm_port, ibcm_qp_attr, IBCM_APR_INFO_MAX, IBCM_APR_PRIVATE_DATA_MAX,
    IBCM_LAP_PRIVATE_DATA_MAX,
};
use super::{bytes, context, guard, opt, put};
use crate::context::Answer;
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

/// Sets who answers the LAPs that arrive on this context's connections (`ibcm_lap_policy`):
/// `IBCM_LAP_UNSUPPORTED` (the default: the daemon answers each at once with APR status 2
/// "unsupported") or `IBCM_LAP_APPLICATION` (each comes as an `IBCM_EVENT_LAP` of its
/// connection, for ibcm_lap_accept or ibcm_lap_reject). It applies to this context's
/// connections only, those it has and those it will have; set it before they are
/// established. Back to `IBCM_LAP_UNSUPPORTED`, the LAPs not answered yet are answered
/// "unsupported" by the daemon (answering one then fails with `IBCM_ESTATE`). Waits for the
/// daemon. Errors: `IBCM_EINVAL` (another value), `IBCM_EUNSUPPORTED` (`IBCM_LAP_APPLICATION`
/// through a daemon that does not serve path migration), `IBCM_EGONE`.
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_lap_policy(ctx: *mut ibcm_ctx, policy: c_int) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { context(ctx) }?.lap_policy(policy))
}

/// Proposes `*path` (written from this side's view: `local_*` is this side's port) as the
/// established connection's alternate path: sends a LAP with up to
/// `IBCM_LAP_PRIVATE_DATA_MAX` (168) bytes of private data, returning without waiting. Then
/// `IBCM_EVENT_APR` (the peer's answer: `apr_status` 0 when it loaded the path, then load it
/// into this side's QP with ibcm_init_alt_path_attr) or `IBCM_EVENT_LAP_ERROR` (no answer:
/// `IBCM_ETIMEDOUT`; the connection could not take a LAP: `IBCM_ESTATE`), unless the
/// connection's final event comes first. The path's `local_ack_timeout` is what the peer's
/// QP gets. Errors here: `IBCM_EINVAL` (NULL, a field over its width), `IBCM_ETOOLONG`,
/// `IBCM_ENOENT`, `IBCM_ECLOSED`, `IBCM_ESTATE` (not accepted or established),
/// `IBCM_EBUSY` (this side's previous LAP on it has no answer yet), `IBCM_EUNSUPPORTED` (a
/// daemon that does not serve path migration), `IBCM_EGONE`.
///
/// # Safety
/// `ctx` is NULL or a live context; `path` is NULL or readable; `private_data` is NULL or
/// readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibcm_load_alt_path(
    ctx: *mut ibcm_ctx,
    conn: u64,
    path: *const ibcm_path,
    private_data: *const u8,
    len: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let p = unsafe { opt(path) }.ok_or_else(|| Error::new(IBCM_EINVAL, "path is NULL"))?;
        let p = params::path_of(p)?;
        fits("LAP private data", len, IBCM_LAP_PRIVATE_DATA_MAX)?;
        // SAFETY: the caller's contract.
        let pd = unsafe { bytes(private_data, len, "private_data") }?;
        c.load_alt_path(conn, p, pd)
    })
}

/// Accepts the LAP of `conn` (its `IBCM_EVENT_LAP`): sends the APR with status 0, "path
/// loaded", and up to `IBCM_APR_PRIVATE_DATA_MAX` (148) bytes of private data. Load the path
/// into the QP first (ibcm_init_alt_path_attr): the peer loads it into its own when this APR
/// arrives. The path is then the connection's alternate one. Waits for the daemon. Errors:
/// `IBCM_ESTATE` (no LAP waits for an answer), `IBCM_EBUSY` (another answer or MRA for it is
/// under way), `IBCM_ETOOLONG` (the LAP stays to be answered), `IBCM_ENOENT`,
/// `IBCM_ECLOSED`, `IBCM_EGONE`.
///
/// # Safety
/// `ctx` is NULL or a live context; `private_data` is NULL or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibcm_lap_accept(
    ctx: *mut ibcm_ctx,
    conn: u64,
    private_data: *const u8,
    len: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        fits("APR private data", len, IBCM_APR_PRIVATE_DATA_MAX)?;
        // SAFETY: the caller's contract.
        let pd = unsafe { bytes(private_data, len, "private_data") }?;
        c.lap_answer(conn, Answer::Accept(pd), "ibcm_lap_accept")
    })
}

/// Rejects the LAP of `conn` (its `IBCM_EVENT_LAP`): sends the APR with `status` (1..13,
/// IBTA table 121: 3 "rejected", 7 "invalid LID", …; 0 is ibcm_lap_accept's), up to
/// `IBCM_APR_INFO_MAX` (72) bytes of additional information and up to
/// `IBCM_APR_PRIVATE_DATA_MAX` (148) of private data. The connection keeps the paths it had.
/// Waits for the daemon. Errors as ibcm_lap_accept's, and `IBCM_EINVAL` for status 0 or
/// above 255.
///
/// # Safety
/// `ctx` is NULL or a live context; `info` is NULL or readable for `info_len` bytes,
/// `private_data` for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibcm_lap_reject(
    ctx: *mut ibcm_ctx,
    conn: u64,
    status: u32,
    info: *const u8,
    info_len: u32,
    private_data: *const u8,
    len: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        let status = u8::try_from(status)
            .ok()
            .filter(|s| *s != 0)
            .ok_or_else(|| {
                Error::new(
                    IBCM_EINVAL,
                    format!("APR status {status} (1..255; 0 is ibcm_lap_accept's)"),
                )
            })?;
        fits("APR additional information", info_len, IBCM_APR_INFO_MAX)?;
        fits("APR private data", len, IBCM_APR_PRIVATE_DATA_MAX)?;
        // SAFETY: the caller's contract.
        let info = unsafe { bytes(info, info_len, "info") }?;
        // SAFETY: the caller's contract.
        let pd = unsafe { bytes(private_data, len, "private_data") }?;
        let answer = Answer::Reject {
            status: ibcm_mad::AprStatus::from_raw(status),
            info,
            private_data: pd,
        };
        c.lap_answer(conn, answer, "ibcm_lap_reject")
    })
}

/// Reports that the QP of `conn` has migrated to its alternate path (the verbs'
/// `IBV_EVENT_PATH_MIG`): the alternate path is the primary one now (ibcm_query_path), and
/// a new LAP (either way) may load the next alternate. Waits for the daemon. Errors:
/// `IBCM_ESTATE` (not established, or a LAP exchange is under way on it), `IBCM_ENOENT`,
/// `IBCM_ECLOSED`, `IBCM_EUNSUPPORTED` (a daemon that does not serve path migration),
/// `IBCM_EGONE`.
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_path_migrated(ctx: *mut ibcm_ctx, conn: u64) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { context(ctx) }?.path_migrated(conn))
}

/// The primary (`IBCM_PATH_PRIMARY`) or alternate (`IBCM_PATH_ALTERNATE`) path of `conn`,
/// from this side's view (`local_*` is this side's port), into `*path`: the REQ's (from
/// `CONNECT_REQUEST` on the passive side, `CONNECT_RESPONSE` or `ESTABLISHED` on the
/// active side), then as LAP exchanges load alternate paths (APR status 0, either way) and
/// ibcm_path_migrated makes the alternate the primary. Until the final event is
/// acknowledged. Errors: `IBCM_ESTATE` (no alternate path; before the REP), `IBCM_EINVAL`
/// (NULL, another `which`), `IBCM_ENOENT`, `IBCM_EBUSY`.
///
/// # Safety
/// `ctx` is NULL or a live context; `path` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_query_path(
    ctx: *mut ibcm_ctx,
    conn: u64,
    which: c_int,
    path: *mut ibcm_path,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        if path.is_null() {
            return Err(Error::new(IBCM_EINVAL, "path is NULL"));
        }
        let p = c.query_path(conn, which)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(path, p, "path") }
    })
}

/// The attributes and `ibv_modify_qp` mask that load the alternate path into this side's QP
/// of `conn` (in RTS): `IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE` (no `IBV_QP_STATE`), the
/// `alt_*` fields and `path_mig_state` `IBV_MIG_REARM`, as `ibcm::qp_attr::alt_path_attr`
/// (the kernel's `ib_cm_init_qp_attr` once a LAP was exchanged) computes them. The path is
/// the LAP's while one waits for this side's answer (`IBCM_EVENT_LAP`: load it, then
/// ibcm_lap_accept), else the connection's alternate path (after `IBCM_EVENT_APR` with
/// status 0, the one this side proposed; or the REQ's). `port`: the local port (NULL: port
/// 1 on RoCE, where there is no alternate path to load: `IBCM_EINVAL`). Errors:
/// `IBCM_ESTATE` (no alternate path; not accepted or established), `IBCM_EINVAL` (NULL, a
/// path without a destination LID, RoCE), `IBCM_ENOENT`, `IBCM_EBUSY`.
///
/// # Safety
/// `ctx` is NULL or a live context; `port` NULL or readable; `attr` and `mask` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_init_alt_path_attr(
    ctx: *mut ibcm_ctx,
    conn: u64,
    port: *const ibcm_port,
    attr: *mut ibcm_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        if attr.is_null() || mask.is_null() {
            return Err(Error::new(IBCM_EINVAL, "attr or mask is NULL"));
        }
        // SAFETY: the caller's contract.
        let port = unsafe { opt(port) };
        let (a, m) = c.alt_path_attr(conn, port)?;
        // SAFETY: both non-null and writable by the caller's contract.
        unsafe { put(attr, a, "attr") }?;
        // SAFETY: as above.
        unsafe { put(mask, m, "mask") }
    })
}
