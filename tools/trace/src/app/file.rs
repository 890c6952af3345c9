//! One input file through the loop: the per-file context (what it prints, its statistics),
//! the summary lines, the per-record tracking shared by both loops, the loop of the views
//! written on the calling thread, and [`run_file`], which picks the loop.

use std::collections::HashSet;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::capture::RecordError;
use crate::conn::{Conn, Note, Outcome, Tracker, TrackerConfig};
use crate::input::Source;
use crate::interrupt::PumpWait;
use crate::ladder::{conn_json, has_msg, ladder, outcome_text};
use crate::render::{json_line, text_line};
use crate::stats::TraceStats;
use crate::style::{Palette, Role};
use crate::timefmt::TimeRef;
use crate::timeline::Timeline;
use crate::trace::{classify, Icrc, Item};
use crate::verbose::verbose;

use super::json::{threaded_loop, Helper};
use super::refresh::Refresh;
use super::{Options, View, PROGRESS_MIN_BYTES};

/// Said on standard error after a damaged record.
const DAMAGED: &str = "damaged record header (bytes skipped, records lost); exit status 1";
/// Said on standard error after an error that ends the input early (an I/O error, a gzip
/// stream cut short).
const UNREAD: &str = "the rest of the input could not be read; exit status 1";

pub(super) struct FileCtx<'a> {
    /// A damaged record ended the file early.
    pub(super) damaged: bool,
    pub(super) opts: &'a Options,
    pub(super) pal: Palette,
    /// Flush the output after every packet (`-l`, or the input is a pipe).
    pub(super) live: bool,
    pub(super) err: &'a mut dyn Write,
    pub(super) file: &'a str,
    pub(super) multi: bool,
    pub(super) buf: Vec<u8>,
    pub(super) stats: TraceStats,
    pub(super) timeline: Option<&'a mut Timeline>,
    pub(super) timeline_file: usize,
    /// Connections with a message that matched `-Y` (connection views), until they finish.
    pub(super) expr_conns: HashSet<u64>,
    /// The file's first frame time (for `--from +S` / `--to +S`).
    pub(super) t0: Duration,
}

impl FileCtx<'_> {
    fn flush_buf(&mut self, out: &mut impl Write) -> io::Result<()> {
        out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    fn malformed(&mut self, out: &mut impl Write, what: &str) -> io::Result<()> {
        if self.opts.view.text_summaries() {
            self.pal.paint(&mut self.buf, Role::Bad, "!! malformed:");
            let _ = writeln!(self.buf, " {what}");
            self.flush_buf(out)
        } else {
            self.flush_buf(out)?;
            out.flush()?;
            let _ = writeln!(self.err, "cm-trace: {}: malformed: {what}", self.file);
            Ok(())
        }
    }

    /// Reports an error of the reader (a damaged record skipped over, a last record cut
    /// short): as a malformed record, and for damage also on `err`.
    pub(super) fn read_error(&mut self, out: &mut impl Write, e: &RecordError) -> io::Result<()> {
        self.stats.malformed += 1;
        self.stats.skipped_bytes += e.skipped;
        self.damaged |= e.damaged;
        self.malformed(out, &e.msg)?;
        if e.damaged {
            out.flush()?;
            let what = if e.skipped > 0 { DAMAGED } else { UNREAD };
            let _ = writeln!(self.err, "cm-trace: {}: {what}", self.file);
        }
        Ok(())
    }

    fn finished(&mut self, c: &Conn) -> io::Result<()> {
        let f = &self.opts.filter;
        if f.expr.is_some() && !self.expr_conns.remove(&c.id) {
            return Ok(());
        }
        let shown = f.is_empty()
            || (f.matches_conn(c, |a| has_msg(c, a)) && f.in_window(c.first, c.last, self.t0));
        if !shown {
            return Ok(());
        }
        self.stats.add_conn(c);
        if let Some(t) = self.timeline.as_deref_mut() {
            t.add(self.timeline_file, c);
        }
        match self.opts.view {
            View::Ladder => ladder(&mut self.buf, c, &self.pal),
            View::LadderJson => {
                conn_json(&mut self.buf, c, self.multi.then_some(self.file));
            }
            View::Text | View::Verbose => {
                if matches!(c.outcome, Outcome::TimedOut { .. }) {
                    self.pal.paint(&mut self.buf, Role::Bad, "!! timeout:");
                    let _ = writeln!(self.buf, " conn {}: {}", c.id, outcome_text(c));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

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

/// What [`run_file`]'s loops keep between records.
pub(super) struct LoopState {
    pub(super) tracker: Tracker,
    /// CM messages by attribute ID (the common ones; added to the statistics at the end).
    pub(super) msg_counts: [u64; 0x20],
    pub(super) t0: Option<Duration>,
    pub(super) last: Duration,
    /// The previous record's time, and the previous shown MAD's (for `-t d` / `-t dd`).
    prev: Option<Duration>,
    prev_shown: Option<Duration>,
    /// What the last record tracked is shown relative to (set by [`track`]).
    pub(super) when: TimeRef,
    pub(super) filter_empty: bool,
    /// The view counts each connection's data path (not the per-MAD views).
    pub(super) data: bool,
}

impl LoopState {
    /// The capture time covered so far.
    pub(super) fn span(&self) -> Duration {
        self.t0
            .map_or(Duration::ZERO, |t| self.last.saturating_sub(t))
    }
}

/// Counts a record and tracks its CM MAD; returns the MAD's note when the per-MAD view shows
/// it. Reporting a malformed record is left to the caller.
#[inline]
pub(super) fn track(
    ctx: &mut FileCtx<'_>,
    st: &mut LoopState,
    ts: Duration,
    item: &Item,
) -> io::Result<Option<Note>> {
    let opts = ctx.opts;
    ctx.stats.frames += 1;
    let t0 = *st.t0.get_or_insert(ts);
    ctx.t0 = t0;
    st.last = st.last.max(ts);
    let prev = st.prev.replace(ts).unwrap_or(ts);
    match item {
        Item::Cm(ev) => {
            ctx.stats.cm += 1;
            if ev.icrc == Icrc::Bad {
                ctx.stats.bad_icrc += 1;
            }
            if ev.captured.is_some() {
                ctx.stats.cut += 1;
                ctx.stats.cm_cut += 1;
            }
            let attr = ev.mad.msg.attr_id();
            match st.msg_counts.get_mut(usize::from(attr.raw())) {
                Some(n) => *n += 1,
                None => ctx.stats.count_message(attr),
            }
            let note = st.tracker.observe(ev);
            if let (Some(e), Some(c), false) = (&opts.filter.expr, note.conn, opts.view.per_mad()) {
                if e.matches(ev, &note) {
                    ctx.expr_conns.insert(c);
                }
            }
            if st.tracker.has_finished() {
                st.tracker.drain_finished(|c| ctx.finished(c))?;
            }
            let shown = opts.view.per_mad()
                && (st.filter_empty
                    || (opts.filter.matches_event(ev, &note)
                        && opts.filter.in_window(ev.time, ev.time, t0)));
            if shown {
                st.when = TimeRef {
                    t0,
                    prev,
                    prev_shown: st.prev_shown.replace(ts).unwrap_or(ts),
                };
            }
            Ok(shown.then_some(note))
        }
        Item::NonCm { what, cut, rc } => {
            if let (Some(p), true) = (rc, st.data) {
                st.tracker.observe_data(p);
            }
            ctx.stats.non_cm += 1;
            ctx.stats.cut += u64::from(*cut);
            ctx.stats.count_non_cm(*what);
            Ok(None)
        }
        Item::Malformed { .. } => {
            ctx.stats.malformed += 1;
            Ok(None)
        }
    }
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
