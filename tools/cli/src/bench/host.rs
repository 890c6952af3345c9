//! What else the machine did while a benchmark ran: the load average, and the shares of all
//! CPUs' time that were idle and that the hypervisor gave to other guests (steal), from
//! `/proc/loadavg` and the `cpu` line of `/proc/stat`.
//!
//! On a shared virtual machine these move a rate by tens of percent from one minute to the
//! next, so a rate is printed with them: a reader can tell a slow run of a busy host from a
//! slow program.

use std::fmt;
use std::io;

/// One reading of the machine's counters.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    /// The 1-minute load average.
    load1: f64,
    /// The `cpu` line's times, in clock ticks: user, nice, system, idle, iowait, irq,
    /// softirq, steal (the first eight fields).
    ticks: [u64; 8],
}

/// Field positions in [`Sample::ticks`].
const IDLE: usize = 3;
const IOWAIT: usize = 4;
const STEAL: usize = 7;

impl Sample {
    /// Reads the counters now.
    pub(crate) fn now() -> io::Result<Sample> {
        let load = std::fs::read_to_string("/proc/loadavg")?;
        let stat = std::fs::read_to_string("/proc/stat")?;
        parse(&load, &stat).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "unexpected /proc/loadavg or /proc/stat",
            )
        })
    }
}

/// The machine between two samples.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Span {
    load_start: f64,
    load_end: f64,
    /// Percent of all CPUs' time: idle, iowait, steal.
    idle: f64,
    iowait: f64,
    steal: f64,
}

/// The machine from `start` to `end` (`None` if no clock tick passed).
pub(crate) fn between(start: &Sample, end: &Sample) -> Option<Span> {
    let d: Vec<u64> = start
        .ticks
        .iter()
        .zip(end.ticks.iter())
        .map(|(a, b)| b.saturating_sub(*a))
        .collect();
    let total: u64 = d.iter().sum();
    if total == 0 {
        return None;
    }
    let pct = |i: usize| d.get(i).map_or(0.0, |&v| 100.0 * v as f64 / total as f64);
    Some(Span {
        load_start: start.load1,
        load_end: end.load1,
        idle: pct(IDLE),
        iowait: pct(IOWAIT),
        steal: pct(STEAL),
    })
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "load average (1 min) {:.2} at the start, {:.2} at the end; of all CPUs' time: \
             idle {:.1} %, iowait {:.1} %, steal {:.1} % (given by the hypervisor to others)",
            self.load_start, self.load_end, self.idle, self.iowait, self.steal
        )
    }
}

/// Parses `/proc/loadavg` and `/proc/stat` text.
fn parse(loadavg: &str, stat: &str) -> Option<Sample> {
    let load1 = loadavg.split_whitespace().next()?.parse().ok()?;
    let cpu = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some("cpu"))?;
    let mut ticks = [0u64; 8];
    let mut fields = cpu.split_whitespace().skip(1);
    for t in &mut ticks {
        *t = fields.next()?.parse().ok()?;
    }
    Some(Sample { load1, ticks })
}

/// The machine's figures between `start` and now, or why there are none.
pub(crate) fn since(start: &io::Result<Sample>) -> String {
    match (start, Sample::now()) {
        (Ok(s), Ok(e)) => between(s, &e).map_or_else(
            || "no clock tick passed; no figures".to_string(),
            |span| span.to_string(),
        ),
        (Err(err), _) => format!("no figures (/proc unreadable: {err})"),
        (_, Err(err)) => format!("no figures (/proc unreadable: {err})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_A: &str = "cpu  100 0 50 800 10 0 20 20 0 0\ncpu0 50 0 25 400 5 0 10 10 0 0\n";
    const STAT_B: &str = "cpu  200 0 150 900 10 0 20 120 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n";

    #[test]
    fn shares_are_of_the_ticks_between_the_samples() {
        let a = parse("0.50 0.40 0.30 1/100 42\n", STAT_A).unwrap();
        let b = parse("1.25 0.50 0.30 2/100 43\n", STAT_B).unwrap();
        // Between them: user 100, system 100, idle 100, steal 100: 400 ticks.
        let s = between(&a, &b).unwrap();
        assert_eq!(
            s,
            Span {
                load_start: 0.5,
                load_end: 1.25,
                idle: 25.0,
                iowait: 0.0,
                steal: 25.0
            }
        );
        assert!(s.to_string().contains("steal 25.0 %"), "{s}");
        assert_eq!(between(&a, &a), None);
    }

    #[test]
    fn malformed_proc_text_is_none() {
        assert!(parse("", STAT_A).is_none());
        assert!(parse("0.5 0.4 0.3", "cpu0 1 2 3 4 5 6 7 8\n").is_none());
        assert!(parse("0.5", "cpu 1 2 3\n").is_none());
        assert!(parse("x", STAT_A).is_none());
    }
}
