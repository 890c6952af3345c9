//! The opaque handle of one attachment, `ibcm_ctx`, as C holds it (`ibcm.h` declares it
//! without fields): the library's context and the events lent out on it.

#![allow(non_camel_case_types)]

use std::collections::HashSet;
use std::sync::Mutex;

use crate::context::Context;

/// Opaque: one attachment to a node's `ibcmd` (ibcm_open … ibcm_close).
pub struct ibcm_ctx {
    pub(crate) inner: Context,
    /// The events handed out and not yet acknowledged (their addresses).
    pub(crate) outstanding: Mutex<HashSet<usize>>,
}

// The header promises that a context may be used from any thread, concurrently.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ibcm_ctx>();
};
