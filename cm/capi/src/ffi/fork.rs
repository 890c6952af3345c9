//! `fork()` without exec: a child must not hold its parent's sessions. A context's session
//! with `ibcmd` ends when every copy of its socket is closed; a child's copy would keep it
//! open (the daemon would not end the parent's connections when the parent dies). A
//! `pthread_atfork` child handler, registered by the first `ibcm_open`, closes the child's
//! copy of every open context's socket; the contexts themselves are the parent's, and calls
//! on them in the child fail with `IBCM_EGONE` (`Context::live`).
//!
//! The sockets are kept in a fixed table of atomics, so that the handler, which runs in the
//! child where only the forking thread exists, takes no lock and allocates nothing.

use std::ffi::c_int;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

use crate::error::{Error, Result};
use crate::ffi::types::ibcm_status::*;

/// How many contexts a process may have open at once.
pub(crate) const MAX_CONTEXTS: usize = 1024;

/// The open contexts' sockets; -1: a free slot.
static SOCKETS: [AtomicI32; MAX_CONTEXTS] = [const { AtomicI32::new(-1) }; MAX_CONTEXTS];

static INSTALL: Once = Once::new();

extern "C" {
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> c_int;
    fn close(fd: c_int) -> c_int;
}

/// In the child, after `fork()`: closes every registered socket (async-signal-safe: atomics
/// and `close` only).
unsafe extern "C" fn in_child() {
    for s in &SOCKETS {
        let fd = s.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            // SAFETY: `fd` is this process's copy of a context's socket, inherited from the
            // parent; nothing in the child uses it (the parent's context is never run here),
            // and the slot was cleared first, so it is closed once.
            unsafe { close(fd) };
        }
    }
}

/// Registers the socket of a newly opened context (installing the handler on first use).
pub(crate) fn register(fd: RawFd) -> Result<()> {
    let mut installed = 0;
    INSTALL.call_once(|| {
        // SAFETY: registers a handler with the signature pthread_atfork expects; the
        // handler only touches statics and calls `close`.
        installed = unsafe { pthread_atfork(None, None, Some(in_child)) };
    });
    if installed != 0 {
        return Err(Error::new(
            IBCM_EIO,
            format!("pthread_atfork failed ({installed})"),
        ));
    }
    for s in &SOCKETS {
        if s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Ok(());
        }
    }
    Err(Error::new(
        IBCM_EREFUSED,
        format!("{MAX_CONTEXTS} contexts are open in this process already"),
    ))
}

/// Forgets the socket of a context being closed.
pub(crate) fn unregister(fd: RawFd) {
    for s in &SOCKETS {
        if s.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
}
