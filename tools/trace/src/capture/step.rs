//! What one parser step over buffered capture bytes yields: shared by the classic pcap reader
//! (`reader.rs`) and the pcapng parser (`pcapng.rs`), so neither imports the other's types.

use std::time::Duration;

/// A packet found by a parser step: where its data is and what describes it.
#[derive(Clone, Copy)]
pub(super) struct Meta {
    /// Offset of the data from the start of the record/block.
    pub(super) data_off: usize,
    pub(super) caplen: usize,
    pub(super) orig_len: u32,
    pub(super) timestamp: Duration,
    pub(super) link_type: u32,
    pub(super) interface: u32,
}

/// Outcome of one parser step on the buffered bytes.
pub(super) enum Step {
    /// A packet record/block of `len` bytes.
    Packet { len: usize, meta: Meta },
    /// A non-packet block of `len` bytes.
    Skip(usize),
    /// More bytes are needed; the record claims `need` bytes.
    Incomplete(usize),
    /// Unrecoverable.
    Fatal(String),
}
