//! What the cm-trace integration tests share: the binary, the bundled captures, running it.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The cm-trace binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_cm-trace");

/// A capture under `fixtures/captures/`.
pub(crate) fn cap(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/captures")
        .join(rel)
}

/// Runs cm-trace with `args`, colour off.
pub(crate) fn cm_trace(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// Its standard output.
pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Its standard error.
pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}
