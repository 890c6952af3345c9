//! The journal of live connections: a small state file (one JSON object per line: a
//! connection noted — comm ID, the peer's comm ID and QPN, the peer's address — or
//! forgotten), appended to as connections come and go and compacted now and then, so
//! that a daemon killed and restarted can tell every peer that its connections are gone
//! ([`stale_dreq`]: a DREQ per entry) instead of leaving them believing in them.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ibcm_mad::{CmMessage, CommId, Dreq, Mad, PrivateData, Qpn, Tid};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::proto::WirePeer;
use crate::proto::PeerAddr;

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

#[derive(Debug)]
struct File {
    path: PathBuf,
    out: Option<std::fs::File>,
    live: BTreeMap<u32, JournalEntry>,
    appends: usize,
}

impl File {
    fn append(&mut self, l: &Line) {
        let Ok(mut text) = serde_json::to_string(l) else {
            return;
        };
        text.push('\n');
        self.appends += 1;
        if self.appends >= COMPACT_EVERY {
            self.appends = 0;
            if let Err(e) = self.compact() {
                warn!(path = %self.path.display(), error = %e, "journal compaction failed");
            }
            return;
        }
        let r = match self.out.as_mut() {
            Some(f) => f.write_all(text.as_bytes()),
            None => Err(io::ErrorKind::NotConnected.into()),
        };
        if let Err(e) = r {
            warn!(path = %self.path.display(), error = %e, "journal write failed");
        }
    }

    /// Rewrites the file with the live entries, and appends from there.
    fn compact(&mut self) -> io::Result<()> {
        let text: String = self
            .live
            .values()
            .filter_map(|e| serde_json::to_string(&Line::Add(e.clone())).ok())
            .map(|l| l + "\n")
            .collect();
        write_atomic(&self.path, &text)?;
        self.out = Some(std::fs::OpenOptions::new().append(true).open(&self.path)?);
        Ok(())
    }
}

/// Where the server notes connections: each change is appended to the file at once (a
/// small write, no `fsync`: the journal survives the daemon's death, not the machine's), so
/// a connection is in the file before its client hears it is established.
#[derive(Debug, Clone)]
pub struct JournalTx {
    file: Arc<Mutex<File>>,
    empty: Arc<tokio::sync::Notify>,
}

impl JournalTx {
    fn lock(&self) -> std::sync::MutexGuard<'_, File> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a live connection.
    pub fn add(&self, e: JournalEntry) {
        let mut f = self.lock();
        f.append(&Line::Add(e.clone()));
        f.live.insert(e.comm_id, e);
    }

    /// Forgets a connection.
    pub fn remove(&self, comm_id: u32) {
        let mut f = self.lock();
        if f.live.remove(&comm_id).is_some() {
            f.append(&Line::Del(comm_id));
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
}

/// The journal file.
#[derive(Debug)]
pub struct Journal;

impl Journal {
    /// Reads what a previous run left at `path` (nothing if there is no file; unreadable
    /// lines are skipped with a warning) and starts an empty journal there.
    ///
    /// # Errors
    /// The file exists but cannot be read, or cannot be written.
    pub fn open(path: &Path) -> io::Result<(Vec<JournalEntry>, JournalTx)> {
        let mut old: BTreeMap<u32, JournalEntry> = BTreeMap::new();
        match std::fs::read_to_string(path) {
            Ok(s) => {
                for l in s.lines().filter(|l| !l.trim().is_empty()) {
                    match serde_json::from_str::<Line>(l) {
                        Ok(Line::Add(e)) => {
                            old.insert(e.comm_id, e);
                        }
                        Ok(Line::Del(id)) => {
                            old.remove(&id);
                        }
                        Err(e) => warn!(error = %e, "journal line skipped"),
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut f = File {
            path: path.to_path_buf(),
            out: None,
            live: BTreeMap::new(),
            appends: 0,
        };
        f.compact()?;
        Ok((
            old.into_values().collect(),
            JournalTx {
                file: Arc::new(Mutex::new(f)),
                empty: Arc::new(tokio::sync::Notify::new()),
            },
        ))
    }
}

fn write_atomic(path: &Path, text: &str) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The DREQ that ends `e` at its peer, with `private_data` (e.g. the XRC target-gone block);
/// the peer's DREP finds no connection here and is dropped.
pub fn stale_dreq(e: &JournalEntry, private_data: &[u8]) -> Vec<u8> {
    let dreq = Dreq {
        local_comm_id: CommId(e.comm_id),
        remote_comm_id: CommId(e.remote_comm_id),
        remote_qpn_eecn: Qpn::masked(e.remote_qpn),
        private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
    };
    let tid = Tid(u64::from(e.comm_id) << 32 | 0xdead);
    Mad::new(tid, CmMessage::Dreq(dreq)).to_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
    use super::*;

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

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ibcm-journal-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_compacting_append_keeps_its_entry() {
        let d = scratch("compact");
        let p = d.join("journal");
        let (_, j) = Journal::open(&p).unwrap();
        for id in 1..=COMPACT_EVERY as u32 {
            j.add(entry(id));
        }
        drop(j);
        let (old, _) = Journal::open(&p).unwrap();
        assert_eq!(old.len(), COMPACT_EVERY, "entries replayed after {COMPACT_EVERY} adds");
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
        let (old, _) = Journal::open(&p).unwrap();
        assert_eq!(old, vec![entry(1), entry(2)]);
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
        let (old, _) = Journal::open(&p).unwrap();
        assert_eq!(old, vec![entry(1), entry(2)]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
