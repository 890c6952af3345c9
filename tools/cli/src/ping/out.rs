//! What `cm-ping` prints: event lines (`--quiet` drops them), the listener's rate-limited.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::args::Args;

/// Prints `line` unless `--quiet`.
pub(crate) fn out(args: &Args, line: std::fmt::Arguments<'_>) {
    if !args.quiet {
        println!("{line}");
    }
}

/// Event lines the listener prints per second; the rest are counted, and the count is printed
/// when the next second starts.
const LINES_PER_SEC: u32 = 200;

/// (window start, lines in it, suppressed in it)
static LINE_LIMIT: Mutex<(Option<Instant>, u32, u64)> = Mutex::new((None, 0, 0));

/// [`out`], rate-limited to [`LINES_PER_SEC`]: the listener's lines about what peers do.
pub(crate) fn out_limited(args: &Args, line: std::fmt::Arguments<'_>) {
    if args.quiet {
        return;
    }
    let Ok(mut l) = LINE_LIMIT.lock() else {
        return;
    };
    let now = Instant::now();
    if l.0
        .is_none_or(|w| now.duration_since(w) >= Duration::from_secs(1))
    {
        if l.2 > 0 {
            println!("({} lines suppressed: rate limit)", l.2);
        }
        *l = (Some(now), 0, 0);
    }
    if l.1 < LINES_PER_SEC {
        l.1 += 1;
        println!("{line}");
    } else {
        l.2 += 1;
    }
}

/// Hex of `b` without its trailing zero bytes ("-" when nothing is left).
pub(crate) fn hex_trim(b: &[u8]) -> String {
    let n = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    if n == 0 {
        return "-".into();
    }
    b.iter().take(n).map(|x| format!("{x:02x}")).collect()
}
