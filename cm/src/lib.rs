//! `ibcm`: the InfiniBand Communication Manager protocol engine.
//!
//! **Status: not implemented yet.** This crate is a placeholder in the workspace; the CM
//! engine (sans-IO state machine, tokio driver, transports) is tracked by its own issue.
//! Nothing here claims to work. The wire codec it will use is [`ibcm_mad`].

#![forbid(unsafe_code)]

pub use ibcm_mad as mad;
