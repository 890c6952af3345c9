//! The C ABI: every `unsafe` and `extern "C"` item of the crate is in this module set.
//!
//! * `types`: the C types of `ibcm.h` (no code);
//! * `ctx`: `ibcm_ctx`, the opaque handle of a context;
//! * `api`: the context, the event channel, listeners, SIDR, counters, error texts;
//! * `conn`: connections (connect, accept, reject, establish, disconnect), QP attributes,
//!   SIDR requests and answers;
//! * `apm`: path migration (LAPs sent and answered, migrations, a connection's paths, the
//!   alternate path's QP attributes);
//! * `xrc`: XRC target services, named XRC domains, TGT QPs by number (the persistent-server
//!   operations);
//! * `data`: the `sim` backend's XRC data path (the runtime's SRQs, SENDs on its INI
//!   connections);
//! * `fork`: the `pthread_atfork` child handler that closes a child's copies of the
//!   contexts' sockets;
//! * here: the boundary helpers — `guard` (no panic crosses into C; the error's message is
//!   kept for `ibcm_last_error`) and the pointer checks (null pointers are `IBCM_EINVAL`).

pub mod api;
pub mod apm;
pub mod conn;
pub mod ctx;
pub mod data;
mod fork;
pub mod types;
pub mod xrc;

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::context::Context;
use crate::error::{Error, Result};
use ctx::ibcm_ctx;
use types::code;
use types::ibcm_status::*;

thread_local! {
    /// The message of this thread's last failed call.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// `s` as a C string (interior NULs become spaces).
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

fn set_last(msg: &str) {
    LAST.with(|l| *l.borrow_mut() = c_string(msg));
}

/// The pointer to this thread's last error message (valid until its next failed call).
pub(crate) fn last_ptr() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// Runs `f` at the boundary: its error becomes the returned code and the thread's last
/// message; a panic becomes `IBCM_EINTERNAL` instead of unwinding into C.
pub(crate) fn guard(f: impl FnOnce() -> Result<()>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => code(IBCM_OK),
        Ok(Err(e)) => {
            set_last(&e.msg);
            code(e.code)
        }
        Err(_) => {
            set_last("libibcm: an internal error (a panic) was caught at the C boundary");
            code(IBCM_EINTERNAL)
        }
    }
}

fn null(what: &str) -> Error {
    Error::new(IBCM_EINVAL, format!("{what} is NULL"))
}

/// The context behind `ctx`.
///
/// # Safety
/// `ctx` is NULL or a pointer ibcm_open returned and ibcm_close has not freed.
pub(crate) unsafe fn ctx_ref<'a>(ctx: *const ibcm_ctx) -> Result<&'a ibcm_ctx> {
    // SAFETY: the caller's contract: NULL or a live context from ibcm_open.
    unsafe { ctx.as_ref() }.ok_or_else(|| null("ctx"))
}

/// The [`Context`] behind `ctx`.
///
/// # Safety
/// As [`ctx_ref`].
pub(crate) unsafe fn context<'a>(ctx: *const ibcm_ctx) -> Result<&'a Context> {
    // SAFETY: the caller's contract is ctx_ref's.
    Ok(&unsafe { ctx_ref(ctx) }?.inner)
}

/// A copy of `len` bytes at `p` (NULL allowed when `len` is 0).
///
/// # Safety
/// `p` is NULL or valid for reads of `len` bytes.
pub(crate) unsafe fn bytes(p: *const u8, len: u32, what: &str) -> Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-null, and the caller vouches for `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(p, len as usize) }.to_vec())
}

/// The UTF-8 string at `p`.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub(crate) unsafe fn string(p: *const c_char, what: &str) -> Result<String> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(str::to_owned)
        .map_err(|_| Error::new(IBCM_EINVAL, format!("{what} is not UTF-8")))
}

/// A shared reference to the struct at `p`, if any.
///
/// # Safety
/// `p` is NULL or valid for reads of a `T`.
pub(crate) unsafe fn opt<'a, T>(p: *const T) -> Option<&'a T> {
    // SAFETY: the caller's contract.
    unsafe { p.as_ref() }
}

/// Writes `v` to `p`.
///
/// # Safety
/// `p` is NULL or valid for writes of a `T`.
pub(crate) unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-null and writable by the caller's contract; `write` drops nothing there.
    unsafe { p.write(v) };
    Ok(())
}

/// The text of a status (`ibcm_strerror`).
pub(crate) fn strerror(c: c_int) -> *const c_char {
    let t: &'static str = match crate::error::status_of(c) {
        Some(s) => crate::error::text(s),
        None => "unknown ibcm status\0",
    };
    t.as_ptr().cast()
}

/// `ibcm_status` for tests.
#[cfg(test)]
pub(crate) fn status(c: c_int) -> Option<types::ibcm_status> {
    crate::error::status_of(c)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_ib;
