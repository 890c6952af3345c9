//! `--stats` on a live input (`-i`, a pipe): the statistics so far, on standard error, every
//! [`Options::refresh`](super::Options::refresh) (default 1 s), whether packets arrive or
//! not: the reading loop waits for input with the next refresh as its deadline
//! ([`Refresh::timer`]), and shows the statistics when the deadline passes first (and after a
//! packet when one is due). The connections still open are counted as they stand (as if the
//! capture ended there); the final report on standard output at the end (or at Ctrl-C) is
//! the same as for a file. On a terminal each refresh redraws the screen. With a zero
//! interval the statistics follow every packet, and there is no timer.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use crate::ladder::has_msg;
use crate::report::{stats_json, stats_text};
use crate::style::Palette;

use super::options::View;
use super::track::{FileCtx, LoopState};

/// When the statistics were last shown.
pub(super) struct Refresh {
    last: Option<Instant>,
    /// When the loop started (the first timed refresh is one interval after it).
    started: Instant,
    tty: bool,
}

/// Whether the run shows the statistics so far: `--stats` on a live input.
fn active(ctx: &FileCtx<'_>) -> bool {
    ctx.live && matches!(ctx.opts.view, View::Stats | View::StatsJson)
}

impl Refresh {
    pub(super) fn new() -> Self {
        Refresh {
            last: None,
            started: Instant::now(),
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// When the next refresh is due, for the wait for input; `None` when there is no timer
    /// (not `--stats` on a live input, or a zero interval: then every packet refreshes).
    #[inline]
    pub(super) fn timer(&self, ctx: &FileCtx<'_>) -> Option<Instant> {
        if !active(ctx) || ctx.opts.refresh.is_zero() {
            return None;
        }
        // No timer for an interval past the clock's range (`--refresh 1e9`).
        self.last
            .unwrap_or(self.started)
            .checked_add(ctx.opts.refresh)
    }

    /// Shows the statistics so far now (the timer ran out with no packet).
    pub(super) fn timed_out(&mut self, ctx: &mut FileCtx<'_>, st: &LoopState) {
        self.last = Some(Instant::now());
        self.show(ctx, st);
    }

    /// Shows the statistics so far when the view is `--stats`, the input live, and the
    /// interval since the last time passed.
    #[inline]
    pub(super) fn tick(&mut self, ctx: &mut FileCtx<'_>, st: &LoopState) {
        if !active(ctx) {
            return;
        }
        let now = Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < ctx.opts.refresh)
        {
            return;
        }
        self.last = Some(now);
        self.show(ctx, st);
    }

    fn show(&self, ctx: &mut FileCtx<'_>, st: &LoopState) {
        let mut s = ctx.stats.clone();
        for (attr, &n) in (0u16..).zip(st.msg_counts.iter()) {
            if n > 0 {
                *s.messages.entry(attr).or_default() += n;
            }
        }
        let f = &ctx.opts.filter;
        let expr = &ctx.expr_conns;
        let t0 = ctx.t0;
        st.tracker.each_live_settled(|c| {
            if f.expr.is_some() && !expr.contains(&c.id) {
                return;
            }
            if f.is_empty()
                || (f.matches_conn(c, |a| has_msg(c, a)) && f.in_window(c.first, c.last, t0))
            {
                s.add_conn(c);
            }
        });
        s.evicted = st.tracker.stats.evicted;
        s.peak_live = st.tracker.stats.peak_live;
        s.span = st.span();
        let mut buf = Vec::new();
        if ctx.opts.view == View::StatsJson {
            stats_json(&mut buf, &s);
        } else {
            if self.tty {
                // Home and clear: the report is redrawn in place.
                buf.extend_from_slice(b"\x1b[H\x1b[2J");
            }
            let _ = writeln!(
                buf,
                "cm-trace: {}: statistics so far ({} frames; the final report follows at the end \
                 or at Ctrl-C)",
                ctx.file, s.frames
            );
            stats_text(&mut buf, &s, &Palette { on: ctx.pal.on });
        }
        let _ = ctx.err.write_all(&buf);
        let _ = ctx.err.flush();
    }
}
