//! One input file through the loop: the summary lines, the loop of the views written on the
//! calling thread, and [`run_file`], which picks the loop (the per-file context and the
//! per-record tracking both loops share are in `track`).

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::conn::{Tracker, TrackerConfig};
use crate::input::Source;
use crate::interrupt::PumpWait;
use crate::render::{json_line, text_line};
use crate::stats::TraceStats;
use crate::style::{Palette, Role};
use crate::timefmt::TimeRef;
use crate::trace::{classify, Item};
use crate::verbose::verbose;

use super::json::{threaded_loop, Helper};
use super::options::{Options, View, PROGRESS_MIN_BYTES};
use super::refresh::Refresh;
use super::track::{track, FileCtx, LoopState};

fn summary_lines(buf: &mut Vec<u8>, s: &TraceStats, pal: &Palette) {
    let _ = write!(
        buf,
        "-- {} frames: {} CM, {} non-CM, {} malformed",
        s.frames, s.cm, s.non_cm, s.malformed
    );
    if s.cut > 0 {
        let _ = write!(
            buf,
            ", {} cut by the snaplen ({} CM decoded as far as captured, no ICRC verdict)",
            s.cut, s.cm_cut
        );
    }
    if s.skipped_bytes > 0 {
        let _ = write!(
            buf,
            ", {} bytes skipped over damaged record headers",
            s.skipped_bytes
        );
    }
    if s.bad_icrc > 0 {
        buf.extend_from_slice(b", ");
        pal.paint(buf, Role::Bad, &format!("{} CM with bad ICRC", s.bad_icrc));
    }
    buf.push(b'\n');
    let kinds = s.non_cm_sorted();
    if !kinds.is_empty() {
        buf.extend_from_slice(b"-- non-CM:");
        for (i, (k, n)) in kinds.iter().take(8).enumerate() {
            let _ = write!(buf, "{} {n} {k}", if i == 0 { "" } else { "," });
        }
        if kinds.len() > 8 {
            let rest: u64 = kinds.iter().skip(8).map(|k| k.1).sum();
            let _ = write!(buf, ", {rest} other");
        }
        buf.push(b'\n');
    }
    sa_summary(buf, s, pal);
    let a = &s.all;
    if a.attempted + a.partial + s.sidr.requests > 0 {
        let _ = write!(
            buf,
            "-- connections: {} attempted, {} established, {} rejected, {} timed out, {} retransmissions, {} MRAs",
            a.attempted,
            a.established,
            a.rejected_total(),
            a.timed_out,
            a.retransmissions,
            a.mras
        );
        if a.duplicates > 0 {
            let _ = write!(buf, ", {} duplicate captures", a.duplicates);
        }
        if a.partial > 0 {
            let _ = write!(buf, ", {} without REQ", a.partial);
        }
        if s.sidr.requests > 0 {
            let _ = write!(buf, ", {} SIDR", s.sidr.requests);
        }
        buf.push(b'\n');
    }
}

/// `-- SA: …` after the non-CM line, for a file with SA MADs.
fn sa_summary(buf: &mut Vec<u8>, s: &TraceStats, pal: &Palette) {
    let sa = &s.sa;
    if sa.mads == 0 {
        return;
    }
    let _ = write!(
        buf,
        "-- SA: {} MAD(s), {} PathRecord exchange(s): {} served a connection, {} served none",
        sa.mads, sa.exchanges, sa.served, sa.served_none
    );
    if sa.unanswered > 0 {
        let _ = write!(buf, ", {} unanswered", sa.unanswered);
    }
    if sa.failed > 0 {
        buf.extend_from_slice(b", ");
        pal.paint(buf, Role::Bad, &format!("{} failed", sa.failed));
    }
    if sa.reqs_differing > 0 {
        buf.extend_from_slice(b", ");
        pal.paint(
            buf,
            Role::Bad,
            &format!(
                "{} REQ(s) disagree with their PathRecord",
                sa.reqs_differing
            ),
        );
    }
    buf.push(b'\n');
}

fn open_progress(opts: &Options, size: Option<u64>) -> Option<indicatif::ProgressBar> {
    let size = size?;
    if !opts.progress || size < PROGRESS_MIN_BYTES {
        return None;
    }
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(size),
        indicatif::ProgressDrawTarget::stderr_with_hz(8),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
    ) {
        pb.set_style(style);
    }
    Some(pb)
}

/// The per-record loop of the views written on this thread. `wait` is a pipe's wait for
/// input (the `--stats` refresh timer).
fn inline_loop<W: Write>(
    ctx: &mut FileCtx<'_>,
    st: &mut LoopState,
    out: &mut W,
    src: &mut Source,
    wait: Option<&PumpWait>,
    progress: &dyn Fn(),
) -> io::Result<()> {
    let opts = ctx.opts;
    let file = ctx.multi.then_some(ctx.file);
    let mut records = 0u64;
    let mut refresh = Refresh::new();
    loop {
        // With a refresh timer, the wait for the next record ends at the next refresh.
        while let Some(until) = refresh.timer(ctx) {
            if src.wait_input(wait, until) {
                break;
            }
            refresh.timed_out(ctx, st);
        }
        let (ts, item) = match src.next_record() {
            None => return Ok(()),
            Some(Err(e)) => {
                ctx.read_error(out, &e)?;
                if e.resumes {
                    continue;
                }
                return Ok(());
            }
            Some(Ok(r)) => (r.timestamp, classify(&r)),
        };
        let note = track(ctx, st, ts, &item)?;
        match (&item, note) {
            (Item::Cm(ev), Some(note)) => {
                let when = (opts.time, st.when);
                let shown = (opts.time.unwrap_or_default(), st.when);
                match opts.view {
                    View::Json => json_line(&mut ctx.buf, ev, &note, file, when),
                    View::Verbose => verbose(&mut ctx.buf, ev, &note, shown, &ctx.pal),
                    _ => text_line(&mut ctx.buf, ev, &note, shown, &ctx.pal),
                }
            }
            (Item::Sa(ev), Some(_)) => {
                let when = (opts.time, st.when);
                let shown = (opts.time.unwrap_or_default(), st.when);
                match opts.view {
                    View::Json => crate::sa::view::json_line(&mut ctx.buf, ev, file, when),
                    View::Verbose => crate::sa::view::verbose(&mut ctx.buf, ev, shown, &ctx.pal),
                    _ => crate::sa::view::text_line(&mut ctx.buf, ev, shown, &ctx.pal),
                }
            }
            (Item::Malformed { frame, reason }, _) => {
                ctx.malformed(out, &format!("frame {frame}: {reason}"))?;
            }
            _ => {}
        }
        // At least the BufWriter's capacity, so the buffer is written through.
        if ctx.buf.len() >= 1 << 16 {
            ctx.flush_buf(out)?;
        } else if ctx.live && !ctx.buf.is_empty() {
            ctx.flush_buf(out)?;
            out.flush()?;
        }
        records += 1;
        if records.is_multiple_of(4096) {
            progress();
        }
        refresh.tick(ctx, st);
    }
}

pub(super) fn run_file<W: Write + Send>(
    ctx: &mut FileCtx<'_>,
    out: &mut W,
    src: &mut Source,
    wait: Option<&PumpWait>,
    counter: &Arc<AtomicU64>,
    size: Option<u64>,
) -> io::Result<()> {
    let opts = ctx.opts;
    let pb = open_progress(opts, size);
    let data = opts.tracker.data || opts.view.counts_data();
    let mut st = LoopState {
        tracker: Tracker::new(TrackerConfig {
            record_events: opts.tracker.record_events
                || opts.view.records_events()
                || opts.timeline.is_some(),
            data,
            ..opts.tracker
        }),
        data,
        msg_counts: [0; 0x20],
        t0: None,
        last: Duration::ZERO,
        prev: None,
        prev_shown: None,
        when: TimeRef::default(),
        filter_empty: opts.filter.is_empty(),
    };
    ctx.stats.files = 1;
    if ctx.multi && ctx.opts.view.text_summaries() {
        ctx.pal
            .paint(&mut ctx.buf, Role::Head, &format!("== {}", ctx.file));
        ctx.buf.push(b'\n');
    }
    let progress = || {
        if let Some(pb) = &pb {
            pb.set_position(counter.load(Ordering::Relaxed));
        }
    };
    if opts.view == View::Json && !ctx.live {
        // Formatted and written on a second thread. Nothing else writes to `out` meanwhile:
        // this view's malformed-record notes and summaries go to `err`.
        let file = ctx.multi.then_some(ctx.file);
        std::thread::scope(|scope| -> io::Result<()> {
            let h = Helper::start(scope, &mut *out, file, opts.time);
            let looped = threaded_loop(ctx, &mut st, &h, src, &progress);
            // The thread's own error (a closed pipe) explains a failed send best.
            h.finish().and(looped)
        })?;
    } else {
        inline_loop(ctx, &mut st, out, src, wait, &progress)?;
    }
    let LoopState {
        mut tracker,
        msg_counts,
        t0,
        last,
        ..
    } = st;
    for (attr, &n) in (0u16..).zip(msg_counts.iter()) {
        if n > 0 {
            *ctx.stats.messages.entry(attr).or_default() += n;
        }
    }
    tracker.finish_all();
    tracker.drain_finished(|c| ctx.finished(c))?;
    // The PathRecord exchanges after the connections they served.
    tracker.drain_sa(|x| ctx.sa_finished(x))?;
    ctx.stats.sa.add_counts(&tracker.sa_counts());
    ctx.stats.evicted = tracker.stats.evicted;
    ctx.stats.peak_live = tracker.stats.peak_live;
    ctx.stats.span = t0.map_or(Duration::ZERO, |t| last.saturating_sub(t));
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if opts.view.text_summaries() {
        let stats = std::mem::take(&mut ctx.stats);
        summary_lines(&mut ctx.buf, &stats, &ctx.pal);
        ctx.stats = stats;
    } else if opts.view == View::Json || opts.view == View::LadderJson {
        ctx.flush_buf(out)?;
        out.flush()?;
        let mut line = Vec::new();
        summary_lines(&mut line, &ctx.stats, &Palette::default());
        for l in String::from_utf8_lossy(&line).lines() {
            let _ = writeln!(
                ctx.err,
                "cm-trace: {}: {}",
                ctx.file,
                l.trim_start_matches("-- ")
            );
        }
    }
    ctx.flush_buf(out)
}
