//! The `sim` backend's XRC data path (docs/capi.md §3.4): a runtime's own XRC SRQs in a
//! domain it shares by file with the node service, and SENDs on its XRC INI connections,
//! so that a C runtime is an XRC target receiving into its own SRQs without an XRC device.
//! With `--backend verbs` the runtime does this with rdma-core; these calls then fail with
//! `IBCM_EUNSUPPORTED`.

use std::ffi::{c_char, c_int};

use super::ctx::ibcm_ctx;
use super::types::ibcm_status::*;
use super::types::{IBCM_XRC_MESSAGE_MAX, IBCM_XRC_SRQ_MAX_WR};
use super::xrc::domain_arg;
use super::{context, guard, put};
use crate::error::Error;

/// Creates an XRC SRQ of this process in domain `domain` (one this context opened or may
/// use, named by a file: `ibcm_xrcd_open` with a path) with room for `max_wr` unpolled
/// messages (1..=`IBCM_XRC_SRQ_MAX_WR`; 0: the most), as `ibv_create_srq_ex` in a domain
/// opened on that file would; its number goes to `*srqn`, for an XRC listen's SRQ numbers.
/// It is destroyed by ibcm_xrc_srq_destroy or the context's end. Errors: `IBCM_ENOENT` (no
/// such domain), `IBCM_EINVAL` (a private domain), `IBCM_EREFUSED` (another user's domain,
/// or 16 SRQs already), `IBCM_EUNSUPPORTED` (the daemon's backend is verbs).
///
/// # Safety
/// `ctx` is NULL or a live context; `domain` is NULL or a NUL-terminated string; `srqn` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_srq_create(
    ctx: *mut ibcm_ctx,
    domain: *const c_char,
    max_wr: u32,
    srqn: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let domain = unsafe { domain_arg(domain, "domain") }?;
        if max_wr > IBCM_XRC_SRQ_MAX_WR {
            return Err(Error::new(
                IBCM_EINVAL,
                format!("max_wr {max_wr} (1..={IBCM_XRC_SRQ_MAX_WR}, 0: the most)"),
            ));
        }
        if srqn.is_null() {
            return Err(Error::new(IBCM_EINVAL, "srqn is NULL"));
        }
        let max_wr = if max_wr == 0 {
            IBCM_XRC_SRQ_MAX_WR
        } else {
            max_wr
        };
        let n = c.xrc_srq_create(&domain, max_wr)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(srqn, n, "srqn") }
    })
}

/// Destroys this process's XRC SRQ `srqn`; messages not taken go with it. `IBCM_ENOENT` for
/// an SRQ this context did not create.
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_srq_destroy(ctx: *mut ibcm_ctx, srqn: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        c.xrc_srq_destroy(srqn)
    })
}

/// Takes the oldest message received into this process's XRC SRQ `srqn` (its receive
/// completion) into `buf`, its length into `*len`. `buf` has room for `cap` bytes, at least
/// `IBCM_XRC_MESSAGE_MAX` (so that no message is lost to a short buffer). `IBCM_EAGAIN` when
/// none is there; `IBCM_ENOENT` for an SRQ this context did not create.
///
/// # Safety
/// `ctx` is NULL or a live context; `buf` is NULL or writable for `cap` bytes; `len` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_srq_recv(
    ctx: *mut ibcm_ctx,
    srqn: u32,
    buf: *mut u8,
    cap: u32,
    len: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        if buf.is_null() || len.is_null() {
            return Err(Error::new(IBCM_EINVAL, "buf or len is NULL"));
        }
        if cap < IBCM_XRC_MESSAGE_MAX {
            return Err(Error::new(
                IBCM_EINVAL,
                format!("a buffer of {cap} bytes: a message may have {IBCM_XRC_MESSAGE_MAX}"),
            ));
        }
        let Some(m) = c.xrc_srq_recv(srqn)? else {
            return Err(Error::new(IBCM_EAGAIN, "no message received"));
        };
        let n = u32::try_from(m.len())
            .ok()
            .filter(|&n| n <= cap)
            .ok_or_else(|| Error::new(IBCM_EIO, "a message longer than a SEND carries"))?;
        // SAFETY: `buf` is writable for `cap` >= `n` bytes by the caller's contract, and a
        // fresh Vec never overlaps it.
        unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), buf, m.len()) };
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(len, n, "len") }
    })
}

/// Sends the `len` bytes at `data` (1..=`IBCM_XRC_MESSAGE_MAX`, and at most the connection's
/// path MTU: one SEND Only) on XRC connection `conn` —
/// established, this side its initiator (INI) — to the target's SRQ `srqn`: an XRC SEND
/// Only to the connection's TGT QP with the INI QP's next PSN (its RTS `sq_psn` from
/// ibcm_init_qp_attr, then one more per SEND), from the daemon's address, as the INI QP
/// would send it. Delivery is not confirmed: the target receives it into `srqn` when the
/// TGT QP is ready, the PSN in sequence and the SRQ in the TGT QP's domain. Errors:
/// `IBCM_EINVAL` (not an XRC INI connection, a bad length or SRQ number), `IBCM_ESTATE`
/// (not established), `IBCM_EUNSUPPORTED` (a peer not on RoCEv2/UDP), `IBCM_EIO`.
///
/// # Safety
/// `ctx` is NULL or a live context; `data` is NULL or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_send(
    ctx: *mut ibcm_ctx,
    conn: u64,
    srqn: u32,
    data: *const u8,
    len: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let data = unsafe { super::bytes(data, len, "data") }?;
        c.xrc_send(conn, srqn, &data)
    })
}
