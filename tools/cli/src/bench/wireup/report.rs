//! Printing a run: figures with the method each came from, and the last line.

use std::time::Duration;

use super::fabric::{Method, Outcome, Setup};

/// The nearest-rank percentile `pct` of sorted `v`.
pub(crate) fn percentile(v: &[Duration], pct: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((pct / 100.0) * v.len() as f64).ceil() as usize;
    v.get(rank.clamp(1, v.len()) - 1)
        .copied()
        .unwrap_or_default()
}

/// Peak resident set of this process in bytes (`VmHWM` of `/proc/self/status`), if known.
pub(crate) fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Everything one run prints.
pub(crate) struct Report<'a> {
    pub setup: &'a Setup,
    pub out: &'a Outcome,
    pub conn_bytes: u64,
    pub wall: Duration,
    pub rss: Option<u64>,
}

impl Report<'_> {
    /// CM state of one node in bytes.
    pub(crate) fn state_bytes(&self) -> u64 {
        self.out.conns * self.conn_bytes
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        let s = self.setup;
        let o = self.out;
        let sh = s.shape;
        let tag = o.method.tag();
        let mut done = o.proc_done.clone();
        done.sort_unstable();
        let who = match o.method {
            Method::Full => format!("all {} processes", done.len()),
            Method::Model => format!("node 0's {} processes, every node alike", done.len()),
        };
        let closed = |got: u64, want: u64| {
            if got == want {
                format!("= closed form {want}")
            } else {
                format!("closed form without loss {want}")
            }
        };
        let mut v = vec![
            format!(
                "method: {tag}{}",
                match o.method {
                    Method::Full => format!(" ({} nodes, every connection)", sh.nodes),
                    Method::Model => format!(
                        " (node 0 in full against {} peers holding only their connections \
                         with it; peers' CM queues mirror node 0's)",
                        sh.nodes.saturating_sub(1)
                    ),
                }
            ),
            format!(
                "MADs sent: {} [{tag}; {}]",
                o.mads,
                closed(o.mads, sh.mads())
            ),
            format!("retransmissions: {} [{tag}]", o.retransmits),
            format!(
                "QPs/node: {} [{tag}; {}]",
                o.qps,
                closed(o.qps, sh.qps_per_node())
            ),
            format!(
                "CM state/node: {} B = {} connections [{tag}; {}] × {} B/connection [parameter]",
                self.state_bytes(),
                o.conns,
                closed(o.conns, sh.conns_per_node()),
                self.conn_bytes
            ),
            format!(
                "time to full mesh: p50 {:.6} s, p99 {:.6} s per process ({who}); last {:.6} s [{tag}]",
                percentile(&done, 50.0).as_secs_f64(),
                percentile(&done, 99.0).as_secs_f64(),
                o.last.as_secs_f64()
            ),
            format!("operations started again after a failure: {} [{tag}]", o.restarts),
            format!(
                "operations the endpoint refused to start (not retried): {}; QPNs refused and replaced: {}; operations that waited for a QPN: {} [{tag}]",
                o.refused, o.qpn_retries, o.qpn_waits
            ),
            format!(
                "simulator: wall {:.2} s, {} steps, peak RSS {}",
                self.wall.as_secs_f64(),
                o.steps,
                match self.rss {
                    Some(b) => format!("{} MiB (VmHWM)", b / (1 << 20)),
                    None => "unknown (no /proc/self/status)".into(),
                }
            ),
        ];
        if !o.complete {
            v.push(format!(
                "INCOMPLETE: the mesh was not up after {:.1} s of simulated time",
                s.max_time.as_secs_f64()
            ));
        }
        v.push(format!(
            "wireup: {} {}×{}: {:.6} s to full mesh; {} QPs/node; {} B CM state/node; {} MADs",
            sh.mode.name(),
            sh.nodes,
            sh.ppn,
            o.last.as_secs_f64(),
            o.qps,
            self.state_bytes(),
            o.mads
        ));
        v
    }
}
