//! `ibcm-tools`: the library behind the command-line tools.
//!
//! cm-trace, the CM capture decoder:
//! * [`trace`]: turns capture records into CM events (used by `cm-trace` and the tests).
//! * [`conn`]: connection tracking (REQ … DREP by CA GUID and comm IDs) in bounded memory.
//! * [`render`] (one line per MAD, JSON lines), [`verbose`] (`-V`), [`ladder`] (`--ladder`),
//!   [`report`] and [`stats`] (`--stats`), [`timeline`] (`--timeline`): the views.
//! * [`filter`]: message type, Service ID, comm ID, address, XRC and problem filters.
//! * [`input`]: pcap / pcapng / raw ERF input, files or standard input.
//! * [`app`]: the run loop the `cm-trace` binary and the tests share.
//! * [`gen`]: builds large synthetic CM captures from the real ones (benchmarks).
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

pub mod app;
pub mod conn;
pub mod filter;
pub mod gen;
pub mod hash;
pub mod input;
pub mod ladder;
pub mod render;
pub mod report;
pub mod stats;
pub mod style;
pub mod timeline;
pub mod trace;
pub mod verbose;
