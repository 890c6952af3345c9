//! `ibcm-tools`: the library behind the command-line tools.
//!
//! * [`trace`]: turns capture records into CM events (used by `cm-trace` and the tests).
//! * [`render`]: the text and JSON views of those events.
#![forbid(unsafe_code)]
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod render;
pub mod trace;
