//! What both loops of a file share: the per-file context (what it prints, its statistics),
//! the state kept between records, and [`track`], which counts a record and tracks its CM MAD.

use std::collections::HashSet;
use std::io::{self, Write};
use std::time::Duration;

use crate::capture::RecordError;
use crate::conn::{Conn, Exchange, Note, Outcome, Tracker};
use crate::ladder::{conn_json, has_msg, ladder, outcome_text};
use crate::stats::TraceStats;
use crate::style::{Palette, Role};
use crate::timefmt::TimeRef;
use crate::timeline::Timeline;
use crate::trace::{Icrc, Item};

use super::options::{Options, View};

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
    pub(super) fn flush_buf(&mut self, out: &mut impl Write) -> io::Result<()> {
        out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    pub(super) fn malformed(&mut self, out: &mut impl Write, what: &str) -> io::Result<()> {
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

    pub(super) fn finished(&mut self, c: &Conn) -> io::Result<()> {
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

impl FileCtx<'_> {
    /// A PathRecord exchange is finished: counted, and in the ladder views listed when it
    /// served no connection.
    pub(super) fn sa_finished(&mut self, x: &Exchange) -> io::Result<()> {
        let f = &self.opts.filter;
        if !(f.is_empty() || f.shows_exchange(x, self.t0)) {
            return Ok(());
        }
        self.stats.sa.add_exchange(x);
        if x.served > 0 {
            return Ok(());
        }
        match self.opts.view {
            View::Ladder => crate::sa::view::exchange_ladder(&mut self.buf, &self.pal, x),
            View::LadderJson => {
                crate::sa::view::exchange_json(&mut self.buf, x, self.multi.then_some(self.file));
            }
            _ => {}
        }
        Ok(())
    }
}

/// What `run_file`'s loops keep between records.
pub(super) struct LoopState {
    pub(super) tracker: Tracker,
    /// CM messages by attribute ID (the common ones; added to the statistics at the end).
    pub(super) msg_counts: [u64; 0x20],
    pub(super) t0: Option<Duration>,
    pub(super) last: Duration,
    /// The previous record's time, and the previous shown MAD's (for `-t d` / `-t dd`).
    pub(super) prev: Option<Duration>,
    pub(super) prev_shown: Option<Duration>,
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

/// Counts a record and tracks its CM MAD (or SA MAD); returns the MAD's note when the per-MAD
/// view shows it (an empty note for an SA MAD). Reporting a malformed record is left to the
/// caller.
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
        Item::Sa(ev) => {
            st.tracker.observe_sa(ev);
            // Counted as the non-CM MAD it is.
            ctx.stats.non_cm += 1;
            ctx.stats
                .count_non_cm(crate::trace::NonCm::Mad(ev.mad.header.mgmt_class));
            if st.tracker.has_sa_done() {
                st.tracker.drain_sa(|x| ctx.sa_finished(x))?;
            }
            let shown = opts.view.per_mad()
                && (st.filter_empty
                    || (opts.filter.matches_sa(ev) && opts.filter.in_window(ev.time, ev.time, t0)));
            if shown {
                st.when = TimeRef {
                    t0,
                    prev,
                    prev_shown: st.prev_shown.replace(ts).unwrap_or(ts),
                };
            }
            // A note (empty) says the per-MAD view shows it.
            Ok(shown.then(Note::default))
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
