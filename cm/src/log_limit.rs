//! One rate limit for log lines about what peers make the CM do (a malformed MAD, a REQ, a
//! close, a send failure): [`LOG_BURST`] lines per second, the rest counted and summed up in one
//! line when the next second starts. The sans-IO endpoint runs it on endpoint time (its inputs'
//! `now`), the tokio driver on the runtime's clock; neither reads a clock here.

use std::time::{Duration, Instant};

use tracing::debug;

/// Log lines allowed per second.
pub(crate) const LOG_BURST: u32 = 16;

/// A per-second window of [`LOG_BURST`] lines.
#[derive(Debug, Default)]
pub(crate) struct LogLimit {
    window: Option<Instant>,
    used: u32,
    suppressed_now: u64,
    /// Lines suppressed in all.
    pub(crate) suppressed: u64,
}

impl LogLimit {
    /// Whether a line may be logged at `now`.
    pub(crate) fn ok(&mut self, now: Instant) -> bool {
        if self
            .window
            .is_none_or(|w| now >= w + Duration::from_secs(1) || now < w)
        {
            if self.suppressed_now > 0 {
                debug!(
                    suppressed = self.suppressed_now,
                    "log lines suppressed (rate limit)"
                );
            }
            self.window = Some(now);
            self.used = 0;
            self.suppressed_now = 0;
        }
        if self.used < LOG_BURST {
            self.used += 1;
            true
        } else {
            self.suppressed_now += 1;
            self.suppressed += 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{LogLimit, LOG_BURST};

    #[test]
    fn log_limit_allows_a_burst_per_second() {
        let mut l = LogLimit::default();
        #[allow(clippy::disallowed_methods)]
        let t = Instant::now();
        let n = (0..100).filter(|_| l.ok(t)).count();
        assert_eq!(n, LOG_BURST as usize);
        assert_eq!(l.suppressed, 100 - u64::from(LOG_BURST));
        assert!(l.ok(t + Duration::from_secs(1)));
    }
}
