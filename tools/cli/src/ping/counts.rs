//! cm-ping's summary counters: the line `cm-ping: N established, R rejected, T timed out, D
//! disconnected, X disconnect timed out` (with `--verbs`, the data counters appended).

use std::sync::atomic::{AtomicU64, Ordering};

use ibcm::proto::ConnectionError;
use ibcm_mad::RejReason;

/// What happened to the connections, counted as they end.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) established: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) timed_out: AtomicU64,
    pub(crate) disconnected: AtomicU64,
    pub(crate) disconnect_timed_out: AtomicU64,
    /// Connections whose REQ carried an alternate path (sent with `--alt-path`, or received).
    pub(crate) alt_paths: AtomicU64,
    /// LAPs whose APR said the path was loaded (sent with `--migrate`, or accepted with
    /// `--accept-laps`).
    pub(crate) laps: AtomicU64,
}

impl Counts {
    pub(crate) fn line(&self) -> String {
        // Path migration's counts only when there was any (the line other tools read stays).
        let (alt, laps) = (
            self.alt_paths.load(Ordering::Relaxed),
            self.laps.load(Ordering::Relaxed),
        );
        let apm = if alt + laps > 0 {
            format!(", {alt} alternate paths, {laps} LAPs loaded")
        } else {
            String::new()
        };
        format!(
            "cm-ping: {} established, {} rejected, {} timed out, {} disconnected, {} disconnect timed out{apm}{}",
            self.established.load(Ordering::Relaxed),
            self.rejected.load(Ordering::Relaxed),
            self.timed_out.load(Ordering::Relaxed),
            self.disconnected.load(Ordering::Relaxed),
            self.disconnect_timed_out.load(Ordering::Relaxed),
            super::data::summary_suffix()
        )
    }

    /// Counts how a connection ended: a completed disconnect (ours answered by a DREP, or the
    /// peer's DREQ) or a DREQ of ours that was never answered.
    pub(crate) fn count_end(&self, why: &ConnectionError) {
        match why {
            ConnectionError::Disconnected { .. } => {
                self.disconnected.fetch_add(1, Ordering::Relaxed);
            }
            ConnectionError::DisconnectTimedOut => {
                self.disconnect_timed_out.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    pub(crate) fn count_error(&self, e: &ConnectionError) {
        match e {
            ConnectionError::Rejected { reason, .. } if *reason == RejReason::Timeout => {
                self.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            ConnectionError::Rejected { .. }
            | ConnectionError::LocallyRejected { .. }
            | ConnectionError::Stale => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
            }
            ConnectionError::TimedOut => {
                self.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_timed_out_disconnects_apart() {
        let counts = Counts::default();
        counts.established.fetch_add(3, Ordering::Relaxed);
        counts.count_end(&ConnectionError::Disconnected {
            by_peer: false,
            private_data: Vec::new(),
        });
        counts.count_end(&ConnectionError::Disconnected {
            by_peer: true,
            private_data: vec![1],
        });
        counts.count_end(&ConnectionError::DisconnectTimedOut);
        counts.count_end(&ConnectionError::TimedOut);
        assert_eq!(
            counts.line(),
            "cm-ping: 3 established, 0 rejected, 0 timed out, 2 disconnected, \
             1 disconnect timed out"
        );
    }
}
