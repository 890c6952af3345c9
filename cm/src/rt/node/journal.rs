//! The journal of live connections: a small state file (one JSON object per line: comm ID,
//! the peer's comm ID and QPN, the peer's address), rewritten as connections come and go, so
//! that a daemon killed and restarted can tell every peer that its connections are gone
//! ([`stale_dreq`]: a DREQ per entry) instead of leaving them believing in them.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use ibcm_mad::{CmMessage, CommId, Dreq, Mad, PrivateData, Qpn, Tid};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
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

enum Change {
    Add(JournalEntry),
    Remove(u32),
}

/// Where the server notes connections; a task writes the file.
#[derive(Debug, Clone)]
pub struct JournalTx {
    tx: mpsc::UnboundedSender<Change>,
}

impl std::fmt::Debug for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Add(e) => write!(f, "add {}", e.comm_id),
            Change::Remove(c) => write!(f, "remove {c}"),
        }
    }
}

impl JournalTx {
    /// Notes a live connection.
    pub fn add(&self, e: JournalEntry) {
        let _ = self.tx.send(Change::Add(e));
    }

    /// Forgets a connection.
    pub fn remove(&self, comm_id: u32) {
        let _ = self.tx.send(Change::Remove(comm_id));
    }
}

/// The journal file.
#[derive(Debug)]
pub struct Journal;

impl Journal {
    /// Reads what a previous run left at `path` (nothing if there is no file; unreadable
    /// lines are skipped with a warning), empties the file, and starts the task that keeps it
    /// up to date. Call inside a tokio runtime.
    ///
    /// # Errors
    /// The file exists but cannot be read, or cannot be written.
    pub fn open(path: &Path) -> io::Result<(Vec<JournalEntry>, JournalTx)> {
        let old = match std::fs::read_to_string(path) {
            Ok(s) => s
                .lines()
                .filter(|l| !l.trim().is_empty())
                .filter_map(|l| match serde_json::from_str::<JournalEntry>(l) {
                    Ok(e) => Some(e),
                    Err(e) => {
                        warn!(error = %e, "journal line skipped");
                        None
                    }
                })
                .collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        write_atomic(path, "")?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(writer(path.to_path_buf(), rx));
        Ok((old, JournalTx { tx }))
    }
}

fn write_atomic(path: &Path, text: &str) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

async fn writer(path: PathBuf, mut rx: mpsc::UnboundedReceiver<Change>) {
    let mut live: BTreeMap<u32, JournalEntry> = BTreeMap::new();
    while let Some(c) = rx.recv().await {
        let mut apply = |c: Change| match c {
            Change::Add(e) => {
                live.insert(e.comm_id, e);
            }
            Change::Remove(id) => {
                live.remove(&id);
            }
        };
        apply(c);
        // One rewrite per batch of changes.
        while let Ok(c) = rx.try_recv() {
            apply(c);
        }
        let text: String = live
            .values()
            .filter_map(|e| serde_json::to_string(e).ok())
            .map(|l| l + "\n")
            .collect();
        let p = path.clone();
        let r = tokio::task::spawn_blocking(move || write_atomic(&p, &text)).await;
        if !matches!(r, Ok(Ok(()))) {
            warn!(path = %path.display(), "journal write failed");
        }
    }
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
