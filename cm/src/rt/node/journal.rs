//! The journal of live connections: a small state file (one JSON object per line: a
//! connection noted — comm ID, the peer's comm ID and QPN, the peer's address — or
//! forgotten), appended to as connections come and go and compacted now and then, so
//! that a daemon killed and restarted can tell every peer that its connections are gone
//! (a DREQ per entry, retransmitted until answered) instead of leaving them believing in
//! them.
//!
//! The file is a secret (it names comm IDs and QPNs: enough to forge a DREQ), so it lives in
//! a [`StateDir`] the daemon owns, mode 0600, and every file in there is opened relative to
//! the open directory with `O_NOFOLLOW`; a journal that is not a regular file of the
//! daemon's user with no group or other permissions is refused, never replayed.
//!
//! Durability: each line is written with one `write(2)` whose result is checked before the
//! caller goes on (a connection whose line failed is refused: [`JournalTx::add`]); there is
//! no `fsync`. The journal must survive the daemon's death, which a write in the page cache
//! does; a machine's crash loses what the cache held (and the default directory,
//! `/run/ibcmd`, is a tmpfs that a reboot empties anyway).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::proto::WirePeer;
use crate::proto::PeerAddr;
use crate::rt::sys::at;

/// One live connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Our comm ID.
    pub comm_id: u32,
    /// The peer's comm ID.
    pub remote_comm_id: u32,
    /// The peer's QPN (the DREQ's Remote QPN/EECN field).
    pub remote_qpn: u32,
    /// The peer's CM.
    pub peer: WirePeer,
    /// Whether it sat on a TGT QP of this daemon (the DREQ then carries the XRC "target gone
    /// (keeper lost)" block).
    pub xrc_tgt: bool,
}

impl JournalEntry {
    /// The peer's address.
    pub fn peer(&self) -> PeerAddr {
        self.peer.to_peer()
    }
}

/// One line of the file: a connection noted live, or forgotten.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Line {
    Add(JournalEntry),
    Del(u32),
}

/// Appends between two compactions (the file is then rewritten with the live entries only).
const COMPACT_EVERY: usize = 4096;

/// The journal's name in the state directory.
pub const JOURNAL_NAME: &str = "journal";

/// The compaction's temporary file in the state directory (created with `O_EXCL`).
const TMP_NAME: &str = "journal.tmp";

/// The default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/ibcmd";

fn refuse(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

/// The daemon's state directory, open: created mode 0700 if missing; refused if it is not a
/// directory (a symlink included), is owned by another user than the daemon's (effective
/// uid), or is writable by its group or by others; locked (`flock`) while open, so that a
/// second daemon on the same directory is refused.
#[derive(Debug)]
pub struct StateDir {
    dir: File,
    path: PathBuf,
}

impl StateDir {
    /// Opens (or creates, mode 0700, its parent must exist) the state directory at `path`.
    ///
    /// # Errors
    /// It cannot be created or opened, or it is refused (the type's docs), with a message
    /// that says why.
    pub fn open(path: &Path) -> io::Result<StateDir> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        match std::fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => info!(dir = %path.display(), "state directory created (mode 0700)"),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot create the state directory {}: {e}", path.display()),
                ))
            }
        }
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOTDIR | libc::ELOOP) => refuse(format!(
                    "the state directory {} is not a directory (a symlink is refused too)",
                    path.display()
                )),
                _ => io::Error::new(
                    e.kind(),
                    format!("cannot open the state directory {}: {e}", path.display()),
                ),
            })?;
        let m = dir.metadata()?;
        let me = at::euid();
        if m.uid() != me {
            return Err(refuse(format!(
                "the state directory {} is owned by uid {}, not by this daemon's uid {me}",
                path.display(),
                m.uid()
            )));
        }
        if m.mode() & 0o022 != 0 {
            return Err(refuse(format!(
                "the state directory {} is writable by others (mode {:o})",
                path.display(),
                m.mode() & 0o7777
            )));
        }
        // One daemon per directory: the lock goes with the open directory (this process's
        // life).
        if !at::try_lock(&dir)? {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "the state directory {} is in use by another daemon",
                    path.display()
                ),
            ));
        }
        Ok(StateDir {
            dir,
            path: path.to_path_buf(),
        })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[derive(Debug)]
struct JFile {
    dir: StateDir,
    out: File,
    /// The file's length up to its last complete line (a failed write is cut back to it).
    len: u64,
    live: BTreeMap<u32, JournalEntry>,
    appends: usize,
    /// A test's way to make the next writes fail.
    #[cfg(test)]
    fail: bool,
}

impl JFile {
    fn shown(&self) -> String {
        self.dir.path.join(JOURNAL_NAME).display().to_string()
    }

    /// Appends one line; compacts after [`COMPACT_EVERY`] appends (the compaction writes the
    /// live set, which the caller has updated already, so the line is in either file).
    fn append(&mut self, l: &Line) -> io::Result<()> {
        let mut text = serde_json::to_vec(l).map_err(io::Error::other)?;
        text.push(b'\n');
        #[cfg(test)]
        if self.fail {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        if let Err(e) = self.out.write_all(&text) {
            // A line cut short would spoil the next one: back to the last complete line.
            if let Err(e2) = self.out.set_len(self.len) {
                warn!(path = %self.shown(), error = %e2, "journal: cannot cut a failed line");
            }
            warn!(path = %self.shown(), error = %e, "journal write failed");
            return Err(e);
        }
        self.len += text.len() as u64;
        self.appends += 1;
        if self.appends >= COMPACT_EVERY {
            self.appends = 0;
            if let Err(e) = self.compact() {
                // The line is in the old file, which stays the journal.
                warn!(path = %self.shown(), error = %e, "journal compaction failed");
            }
        }
        Ok(())
    }

    /// Rewrites the file with the live entries (a new file, `O_CREAT|O_EXCL`, renamed over
    /// the journal), and appends from there.
    fn compact(&mut self) -> io::Result<()> {
        let (out, len) = write_live(&self.dir, &self.live)?;
        self.out = out;
        self.len = len;
        Ok(())
    }
}

/// Writes `live` to a new temporary file and renames it over the journal; the new journal,
/// open for appending, and its length.
fn write_live(dir: &StateDir, live: &BTreeMap<u32, JournalEntry>) -> io::Result<(File, u64)> {
    let mut text = Vec::new();
    for e in live.values() {
        let mut l = serde_json::to_vec(&Line::Add(e.clone())).map_err(io::Error::other)?;
        l.push(b'\n');
        text.extend(l);
    }
    // A leftover (a crash during a compaction) or anything planted there: the name is
    // removed, never followed.
    at::unlink(&dir.dir, TMP_NAME)?;
    let mut f = at::open(
        &dir.dir,
        TMP_NAME,
        libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o600,
    )?;
    let r = f
        .write_all(&text)
        .and_then(|()| at::rename(&dir.dir, TMP_NAME, JOURNAL_NAME));
    if let Err(e) = r {
        let _ = at::unlink(&dir.dir, TMP_NAME);
        return Err(e);
    }
    Ok((f, text.len() as u64))
}

/// Where the server notes connections: each change is appended to the file at once (module
/// docs: one checked `write(2)`, no `fsync`), so a connection is in the file before its
/// client hears it is established.
#[derive(Debug, Clone)]
pub struct JournalTx {
    file: Arc<Mutex<JFile>>,
    empty: Arc<tokio::sync::Notify>,
}

impl JournalTx {
    fn lock(&self) -> std::sync::MutexGuard<'_, JFile> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a live connection.
    ///
    /// # Errors
    /// The line could not be written (a full file system, say): the connection is not in
    /// the journal and must not be reported established.
    pub fn add(&self, e: JournalEntry) -> io::Result<()> {
        let mut f = self.lock();
        let id = e.comm_id;
        let line = Line::Add(e.clone());
        let before = f.live.insert(id, e);
        if let Err(err) = f.append(&line) {
            match before {
                Some(b) => f.live.insert(id, b),
                None => f.live.remove(&id),
            };
            return Err(err);
        }
        Ok(())
    }

    /// Forgets a connection. A line that cannot be written leaves the entry in the file: the
    /// next start sends its peer a DREQ it answers as an unknown connection's.
    pub fn remove(&self, comm_id: u32) {
        let mut f = self.lock();
        if f.live.remove(&comm_id).is_some() {
            let _ = f.append(&Line::Del(comm_id));
            if f.live.is_empty() {
                self.empty.notify_waiters();
            }
        }
    }

    /// Live connections noted now.
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    /// Whether no live connection is noted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once no live connection is noted.
    pub async fn drained(&self) {
        loop {
            let n = self.empty.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.is_empty() {
                return;
            }
            n.await;
        }
    }

    /// Makes the next writes fail (`true`) or succeed again (tests).
    #[cfg(test)]
    fn fail_writes(&self, fail: bool) {
        self.lock().fail = fail;
    }
}

/// What a journal's replay found: the live entries, and how many lines were skipped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replay {
    /// The connections the previous run left live.
    pub entries: Vec<JournalEntry>,
    /// Lines that were not a journal line (not UTF-8, not JSON, not a known line), the last
    /// line cut short included.
    pub skipped: usize,
}

/// Reads every line of `bytes`: each valid one applied, the others counted.
fn replay(bytes: &[u8]) -> Replay {
    let mut live: BTreeMap<u32, JournalEntry> = BTreeMap::new();
    let mut skipped = 0;
    for l in bytes.split(|&b| b == b'\n') {
        if l.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Line>(l) {
            Ok(Line::Add(e)) => {
                live.insert(e.comm_id, e);
            }
            Ok(Line::Del(id)) => {
                live.remove(&id);
            }
            Err(_) => skipped += 1,
        }
    }
    Replay {
        entries: live.into_values().collect(),
        skipped,
    }
}

/// The journal file.
#[derive(Debug)]
pub struct Journal;

impl Journal {
    /// Reads what a previous run left in `dir` (nothing if there is no journal; lines that
    /// cannot be read are skipped and counted in the log) and starts the journal there with
    /// those entries still live: each stays until [`JournalTx::remove`] (its DREQ answered,
    /// or its retries over).
    ///
    /// # Errors
    /// The journal is not a regular file (a symlink included), is owned by another user
    /// than the daemon's, or has group or other permissions (refused, never read); it cannot
    /// be read; the new file cannot be written.
    pub fn open(dir: StateDir) -> io::Result<(Replay, JournalTx)> {
        let shown = dir.path.join(JOURNAL_NAME).display().to_string();
        let old = match at::open(
            &dir.dir,
            JOURNAL_NAME,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        ) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(refuse(format!(
                    "the journal {shown} is not a regular file (a symlink): refused"
                )))
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{shown}: {e}"))),
        };
        let replayed = match old {
            None => Replay::default(),
            Some(mut f) => {
                let m = f.metadata()?;
                if !m.file_type().is_file() {
                    return Err(refuse(format!(
                        "the journal {shown} is not a regular file: refused"
                    )));
                }
                let me = at::euid();
                if m.uid() != me {
                    return Err(refuse(format!(
                        "the journal {shown} is owned by uid {}, not by this daemon's uid {me}: refused, not replayed",
                        m.uid()
                    )));
                }
                if m.mode() & 0o077 != 0 {
                    return Err(refuse(format!(
                        "the journal {shown} has group or other permissions (mode {:o}): refused, not replayed",
                        m.mode() & 0o7777
                    )));
                }
                let mut bytes = Vec::new();
                f.read_to_end(&mut bytes)?;
                replay(&bytes)
            }
        };
        if replayed.skipped > 0 {
            warn!(
                path = %shown,
                replayed = replayed.entries.len(),
                skipped = replayed.skipped,
                "journal lines skipped (not a journal line, or cut short)"
            );
        }
        let live: BTreeMap<u32, JournalEntry> = replayed
            .entries
            .iter()
            .map(|e| (e.comm_id, e.clone()))
            .collect();
        let (out, len) = write_live(&dir, &live)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot write {shown}: {e}")))?;
        let f = JFile {
            dir,
            out,
            len,
            live,
            appends: 0,
            #[cfg(test)]
            fail: false,
        };
        Ok((
            replayed,
            JournalTx {
                file: Arc::new(Mutex::new(f)),
                empty: Arc::new(tokio::sync::Notify::new()),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )]
    use super::*;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

    fn entry(id: u32) -> JournalEntry {
        JournalEntry {
            comm_id: id,
            remote_comm_id: id ^ 0xffff,
            remote_qpn: 0x100 + id,
            peer: WirePeer::from_peer(&PeerAddr::from(std::net::SocketAddr::from((
                [127, 0, 25, 9],
                4791,
            )))),
            xrc_tgt: false,
        }
    }

    fn open(d: &Path) -> (Replay, JournalTx) {
        Journal::open(StateDir::open(d).unwrap()).unwrap()
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ibcm-journal-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        d
    }

    #[test]
    fn the_compacting_append_keeps_its_entry() {
        let d = scratch("compact");
        let (_, j) = open(&d);
        for id in 1..=COMPACT_EVERY as u32 {
            j.add(entry(id)).unwrap();
        }
        drop(j);
        let (old, _) = open(&d);
        assert_eq!(
            old.entries.len(),
            COMPACT_EVERY,
            "entries replayed after {COMPACT_EVERY} adds"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn line(e: &JournalEntry) -> Vec<u8> {
        let mut l = serde_json::to_vec(&Line::Add(e.clone())).unwrap();
        l.push(b'\n');
        l
    }

    #[test]
    fn a_non_utf8_byte_spoils_one_line_only() {
        let d = scratch("utf8");
        let p = d.join("journal");
        let mut text = line(&entry(1));
        text.extend_from_slice(b"{\"add\":\xff}\n");
        text.extend(line(&entry(2)));
        std::fs::write(&p, &text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let (old, _) = open(&d);
        assert_eq!(old.entries, vec![entry(1), entry(2)]);
        assert_eq!(old.skipped, 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_cut_last_line_and_garbage_are_skipped() {
        let d = scratch("cut");
        let p = d.join("journal");
        let mut text = line(&entry(1));
        text.extend_from_slice(b"garbage here\n");
        text.extend(line(&entry(2)));
        let cut = line(&entry(3));
        text.extend_from_slice(&cut[..cut.len() / 2]);
        std::fs::write(&p, &text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let (old, _) = open(&d);
        assert_eq!(old.entries, vec![entry(1), entry(2)]);
        assert_eq!(old.skipped, 2);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_state_directory_serves_one_daemon_at_a_time() {
        let d = scratch("lock");
        let first = StateDir::open(&d).unwrap();
        let e = StateDir::open(&d).unwrap_err();
        assert!(e.to_string().contains("in use by another daemon"), "{e}");
        drop(first);
        StateDir::open(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn replayed_entries_stay_live_until_removed() {
        let d = scratch("stay");
        let (_, j) = open(&d);
        j.add(entry(1)).unwrap();
        j.add(entry(2)).unwrap();
        drop(j);
        let (old, j) = open(&d);
        assert_eq!(old.entries.len(), 2);
        assert_eq!(j.len(), 2, "still live in the new run");
        j.remove(1);
        drop(j);
        let (old, j) = open(&d);
        assert_eq!(old.entries, vec![entry(2)]);
        j.remove(2);
        drop(j);
        assert!(open(&d).0.entries.is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_write_is_reported_and_leaves_no_entry() {
        let d = scratch("fail");
        let (_, j) = open(&d);
        j.add(entry(1)).unwrap();
        j.fail_writes(true);
        assert!(j.add(entry(2)).is_err());
        assert_eq!(j.len(), 1);
        j.fail_writes(false);
        j.add(entry(3)).unwrap();
        drop(j);
        let (old, _) = open(&d);
        assert_eq!(old.entries, vec![entry(1), entry(3)]);
        assert_eq!(old.skipped, 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_are_private_and_symlinks_are_never_followed() {
        let d = scratch("private");
        let victim = d.with_extension("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, d.join(TMP_NAME)).unwrap();
        let (_, j) = open(&d);
        j.add(entry(1)).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let m = std::fs::symlink_metadata(d.join(JOURNAL_NAME)).unwrap();
        assert!(m.is_file());
        assert_eq!(m.mode() & 0o777, 0o600);
        drop(j);
        // The journal a symlink, or readable by others: refused.
        std::fs::set_permissions(d.join(JOURNAL_NAME), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let e = Journal::open(StateDir::open(&d).unwrap()).unwrap_err();
        assert!(e.to_string().contains("group or other permissions"), "{e}");
        std::fs::remove_file(d.join(JOURNAL_NAME)).unwrap();
        std::os::unix::fs::symlink(&victim, d.join(JOURNAL_NAME)).unwrap();
        let e = Journal::open(StateDir::open(&d).unwrap()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // The directory writable by others, or a symlink: refused.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = StateDir::open(&d).unwrap_err();
        assert!(e.to_string().contains("writable by others"), "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = d.with_extension("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = StateDir::open(&link).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        // Missing: created 0700.
        let fresh = d.join("fresh");
        StateDir::open(&fresh).unwrap();
        let m = std::fs::symlink_metadata(&fresh).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700);
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_file(&victim).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// The cost of the durability policy (module docs), measured: `cargo test -p ibcm --features
/// rt --release --lib journal_sync_cost -- --ignored --nocapture` (directory:
/// `IBCM_JOURNAL_DIR`, default the temporary directory).
#[cfg(test)]
mod cost {
    // A measurement reads the clock.
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::disallowed_methods
    )]
    use std::os::unix::fs::DirBuilderExt;
    use std::time::Instant;

    use super::*;

    #[test]
    #[ignore = "a measurement"]
    fn journal_sync_cost() {
        const N: u32 = 1000;
        let base =
            std::env::var_os("IBCM_JOURNAL_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        let d = base.join(format!("ibcm-journal-cost-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        let entry = |id: u32| JournalEntry {
            comm_id: id,
            remote_comm_id: id,
            remote_qpn: id,
            peer: WirePeer::from_peer(&PeerAddr::from(std::net::SocketAddr::from((
                [127, 0, 25, 9],
                4791,
            )))),
            xrc_tgt: false,
        };
        let (_, j) = Journal::open(StateDir::open(&d).unwrap()).unwrap();
        let t = Instant::now();
        for id in 1..=N {
            j.add(entry(id)).unwrap();
        }
        let plain = t.elapsed();
        drop(j);
        // The same lines, each followed by fdatasync.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(d.join("synced"))
            .unwrap();
        let t = Instant::now();
        for id in 1..=N {
            let mut l = serde_json::to_vec(&Line::Add(entry(id))).unwrap();
            l.push(b'\n');
            f.write_all(&l).unwrap();
            f.sync_data().unwrap();
        }
        let synced = t.elapsed();
        println!(
            "{N} adds in {}: write only {:.1} ms ({:.1} µs each); write + fdatasync {:.1} ms ({:.1} µs each)",
            base.display(),
            plain.as_secs_f64() * 1e3,
            plain.as_secs_f64() * 1e6 / f64::from(N),
            synced.as_secs_f64() * 1e3,
            synced.as_secs_f64() * 1e6 / f64::from(N),
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
