//! `ibcm-xrc`: XRC domains and target QPs with ownership policies.
//!
//! **Status: not implemented yet.** This crate is a placeholder in the workspace; the XRC
//! model is tracked by its own issue. Nothing here claims to work.
