#![no_main]
//! cargo-fuzz harness for `ibcm_tests::fuzz::trace_views` (the body is shared with the stable replay
//! test `tests/tests/fuzz_replay.rs`).
libfuzzer_sys::fuzz_target!(|data: &[u8]| ibcm_tests::fuzz::trace_views(data));
