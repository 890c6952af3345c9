//! The cm-trace run loop: inputs → records → CM events → connection tracking → the chosen
//! view. The binary (`src/bin/cm-trace.rs`) only parses the command line; the tests call
//! [`run`] directly.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::capture::Record;
use crate::conn::{Conn, Note, Outcome, Tracker, TrackerConfig};
use crate::filter::Filter;
use crate::input::{OpenError, Opened, RecordError, Source};
use crate::ladder::{conn_json, has_msg, ladder, outcome_text};
use crate::render::{json_line, text_line};
use crate::report::{stats_json, stats_text};
use crate::stats::TraceStats;
use crate::style::{Palette, Role};
use crate::timeline::Timeline;
use crate::trace::{classify, Icrc, Item};

use crate::verbose::verbose;

/// What cm-trace prints on standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    /// One line per CM MAD, then a summary per file.
    #[default]
    Text,
    /// Every field of every CM MAD (`-V`).
    Verbose,
    /// One JSON object per CM MAD (`--json`).
    Json,
    /// One ladder diagram per connection (`--ladder`).
    Ladder,
    /// One JSON object per connection (`--ladder --json`).
    LadderJson,
    /// The statistics report (`--stats`).
    Stats,
    /// The statistics as one JSON object (`--stats --json`).
    StatsJson,
}

impl View {
    fn records_events(self) -> bool {
        matches!(self, View::Ladder | View::LadderJson)
    }

    fn per_mad(self) -> bool {
        matches!(self, View::Text | View::Verbose | View::Json)
    }

    fn text_summaries(self) -> bool {
        matches!(self, View::Text | View::Verbose | View::Ladder)
    }
}

/// Run options.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The view.
    pub view: View,
    /// Filters.
    pub filter: Filter,
    /// Colour on standard output.
    pub color: bool,
    /// Show a progress bar on standard error for large files.
    pub progress: bool,
    /// Write the timeline (SVG, or HTML for a `.html` name) here.
    pub timeline: Option<PathBuf>,
    /// Largest number of connections drawn in the timeline.
    pub timeline_max: usize,
    /// Flush the output after every packet that printed something (`-l`); always done when an
    /// input is a pipe. The per-MAD JSON view then also runs on one thread, so that nothing
    /// waits for a batch of packets.
    pub live: bool,
    /// Connection tracking settings (`record_events` is set from the view).
    pub tracker: TrackerConfig,
}

/// Files larger than this get a progress bar (when enabled).
pub(crate) const PROGRESS_MIN_BYTES: u64 = 16 << 20;

/// What a run found.
#[derive(Debug, Default)]
pub struct Outcomes {
    /// Inputs that could not be read at all (the exit status is non-zero when there are any).
    pub unreadable: u64,
    /// Inputs damaged before their end (an impossible record header): the rest of the file
    /// was not read (the exit status is non-zero when there are any).
    pub damaged: u64,
    /// Statistics over all inputs.
    pub stats: TraceStats,
}

/// Said on standard error after a damaged record.
const DAMAGED: &str = "damaged record header (bytes skipped, records lost); exit status 1";
/// Said on standard error after an error that ends the input early (an I/O error, a gzip
/// stream cut short).
const UNREAD: &str = "the rest of the input could not be read; exit status 1";

struct FileCtx<'a> {
    /// A damaged record ended the file early.
    damaged: bool,
    opts: &'a Options,
    pal: Palette,
    /// Flush the output after every packet (`-l`, or the input is a pipe).
    live: bool,
    err: &'a mut dyn Write,
    file: &'a str,
    multi: bool,
    buf: Vec<u8>,
    stats: TraceStats,
    timeline: Option<&'a mut Timeline>,
    timeline_file: usize,
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
    fn read_error(&mut self, out: &mut impl Write, e: &RecordError) -> io::Result<()> {
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
        if !self.opts.filter.is_empty() && !self.opts.filter.matches_conn(c, |a| has_msg(c, a)) {
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

/// Records per batch handed to the JSON formatting thread.
const BATCH: usize = 256;
/// How many records ahead of the one being tracked the tracker is asked to prefetch the index
/// positions of (`KEYS_AHEAD`) and the connection (`CONN_AHEAD`).
const KEYS_AHEAD: usize = 8;
const CONN_AHEAD: usize = 2;

/// A classified record in a batch; `note` is set for the CM MADs to print.
struct Slot {
    ts: Duration,
    item: Item,
    note: Option<Note>,
}

/// Records as read (their bytes copied out of the reader's buffer), for the second thread to
/// classify.
#[derive(Default)]
struct RawBatch {
    data: Vec<u8>,
    /// Per record: frame number, timestamp, link type, original length, end of its bytes in
    /// `data`.
    recs: Vec<(u64, Duration, u32, u32, usize)>,
}

/// What the tracking thread sends the helper thread.
enum Job {
    /// Classify these records (the result goes back as a batch of [`Slot`]s).
    Classify(RawBatch),
    /// Format and write these records (the CM MADs with a note).
    Format(Vec<Slot>),
    /// Write and flush everything so far, then acknowledge.
    Flush,
}

/// The `--json` view on two threads. This one reads the records and tracks the connections
/// (both strictly in order); the helper classifies (decodes) batches of records ahead of the
/// tracking and formats and writes the JSON lines of the batches tracked. Batches are reused.
struct Helper<'s> {
    tx: mpsc::SyncSender<Job>,
    classified: mpsc::Receiver<(RawBatch, Vec<Slot>)>,
    ack: mpsc::Receiver<()>,
    handle: std::thread::ScopedJoinHandle<'s, io::Result<()>>,
}

/// The error of a helper thread that stopped early (it failed writing).
fn helper_gone() -> io::Error {
    io::Error::other("the JSON helper thread stopped")
}

/// Raw batches in flight (read, not yet tracked).
const IN_FLIGHT: usize = 6;

impl<'s> Helper<'s> {
    fn start<W: Write + Send>(
        scope: &'s std::thread::Scope<'s, '_>,
        out: &'s mut W,
        file: Option<&'s str>,
    ) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Job>(2 * IN_FLIGHT + 4);
        let (classified_tx, classified) = mpsc::channel();
        let (ack_tx, ack) = mpsc::channel();
        let handle = scope.spawn(move || -> io::Result<()> {
            let mut buf = Vec::with_capacity(1 << 17);
            let mut spare: Vec<Vec<Slot>> = Vec::new();
            for job in rx {
                match job {
                    Job::Classify(raw) => {
                        let mut slots = spare.pop().unwrap_or_default();
                        let mut start = 0;
                        for &(number, ts, link_type, orig_len, end) in &raw.recs {
                            let data = raw.data.get(start..end).unwrap_or(&[]);
                            start = end;
                            let rec = Record {
                                number,
                                timestamp: ts,
                                link_type,
                                interface: 0,
                                orig_len,
                                data,
                            };
                            slots.push(Slot {
                                ts,
                                item: classify(&rec),
                                note: None,
                            });
                        }
                        if classified_tx.send((raw, slots)).is_err() {
                            break;
                        }
                    }
                    Job::Format(mut b) => {
                        for s in &b {
                            if let (Item::Cm(ev), Some(note)) = (&s.item, &s.note) {
                                json_line(&mut buf, ev, note, file);
                                if buf.len() >= 1 << 16 {
                                    out.write_all(&buf)?;
                                    buf.clear();
                                }
                            }
                        }
                        b.clear();
                        if spare.len() < 2 * IN_FLIGHT {
                            spare.push(b);
                        }
                    }
                    Job::Flush => {
                        out.write_all(&buf)?;
                        buf.clear();
                        out.flush()?;
                        let _ = ack_tx.send(());
                    }
                }
            }
            out.write_all(&buf)
        });
        Helper {
            tx,
            classified,
            ack,
            handle,
        }
    }

    fn send(&self, job: Job) -> io::Result<()> {
        self.tx.send(job).map_err(|_| helper_gone())
    }

    fn format(&self, batch: Vec<Slot>) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.send(Job::Format(batch))
    }

    /// Waits until everything sent so far is written and flushed.
    fn flush(&self) -> io::Result<()> {
        self.send(Job::Flush)?;
        self.ack.recv().map_err(|_| helper_gone())
    }

    /// Waits for the thread to write the rest and finish.
    fn finish(self) -> io::Result<()> {
        drop(self.tx);
        self.handle
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the JSON helper thread failed")))
    }
}

/// What [`run_file`]'s loops keep between records.
struct LoopState {
    tracker: Tracker,
    /// CM messages by attribute ID (the common ones; added to the statistics at the end).
    msg_counts: [u64; 0x20],
    t0: Option<Duration>,
    last: Duration,
    filter_empty: bool,
}

/// Counts a record and tracks its CM MAD; returns the MAD's note when the per-MAD view shows
/// it. Reporting a malformed record is left to the caller.
#[inline]
fn track(
    ctx: &mut FileCtx<'_>,
    st: &mut LoopState,
    ts: Duration,
    item: &Item,
) -> io::Result<Option<Note>> {
    let opts = ctx.opts;
    ctx.stats.frames += 1;
    st.t0.get_or_insert(ts);
    st.last = st.last.max(ts);
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
            if st.tracker.has_finished() {
                st.tracker.drain_finished(|c| ctx.finished(c))?;
            }
            let shown =
                opts.view.per_mad() && (st.filter_empty || opts.filter.matches_event(ev, &note));
            Ok(shown.then_some(note))
        }
        Item::NonCm { what, cut } => {
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

/// The per-record loop of the views written on this thread.
fn inline_loop<W: Write>(
    ctx: &mut FileCtx<'_>,
    st: &mut LoopState,
    out: &mut W,
    src: &mut Source,
    progress: &dyn Fn(),
) -> io::Result<()> {
    let opts = ctx.opts;
    let file = ctx.multi.then_some(ctx.file);
    let mut records = 0u64;
    loop {
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
                let t = st.t0.unwrap_or(ts);
                match opts.view {
                    View::Json => json_line(&mut ctx.buf, ev, &note, file),
                    View::Verbose => verbose(&mut ctx.buf, ev, &note, t, &ctx.pal),
                    _ => text_line(&mut ctx.buf, ev, &note, t, &ctx.pal),
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
    }
}

/// Reads up to [`BATCH`] records into `raw`; `false` at the end of the input. The reader's
/// errors go into `errs` (reading goes on after those that resume).
fn read_batch(src: &mut Source, raw: &mut RawBatch, errs: &mut Vec<RecordError>) -> bool {
    raw.data.clear();
    raw.recs.clear();
    while raw.recs.len() < BATCH {
        match src.next_record() {
            None => return false,
            Some(Err(e)) => {
                let resumes = e.resumes;
                errs.push(e);
                if !resumes {
                    return false;
                }
            }
            Some(Ok(r)) => {
                raw.data.extend_from_slice(r.data);
                raw.recs.push((
                    r.number,
                    r.timestamp,
                    r.link_type,
                    r.orig_len,
                    raw.data.len(),
                ));
            }
        }
    }
    true
}

/// The per-record loop of `--json`: records are read here and classified by `h` a few batches
/// ahead, tracked here, and formatted and written by `h`.
fn threaded_loop(
    ctx: &mut FileCtx<'_>,
    st: &mut LoopState,
    h: &Helper<'_>,
    src: &mut Source,
    progress: &dyn Fn(),
) -> io::Result<()> {
    let mut errs: Vec<RecordError> = Vec::new();
    let mut more = true;
    let mut in_flight = 0usize;
    let mut spare_raw: Vec<RawBatch> = Vec::new();
    loop {
        while more && in_flight < IN_FLIGHT {
            let mut raw = spare_raw.pop().unwrap_or_default();
            more = read_batch(src, &mut raw, &mut errs);
            report_read_errors(ctx, h, &mut errs)?;
            if raw.recs.is_empty() {
                spare_raw.push(raw);
                break;
            }
            h.send(Job::Classify(raw))?;
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        let (raw, mut batch) = h.classified.recv().map_err(|_| helper_gone())?;
        in_flight -= 1;
        spare_raw.push(raw);
        // Read (and have classified) the next batch while this one is tracked.
        if more {
            let mut raw = spare_raw.pop().unwrap_or_default();
            more = read_batch(src, &mut raw, &mut errs);
            report_read_errors(ctx, h, &mut errs)?;
            if raw.recs.is_empty() {
                spare_raw.push(raw);
            } else {
                h.send(Job::Classify(raw))?;
                in_flight += 1;
            }
        }
        // The tracker's index and connections are too large to stay cached: it is asked to
        // prefetch what it will look up a few records ahead, so that the memory accesses of
        // several records overlap.
        for s in batch.iter().take(KEYS_AHEAD) {
            if let Item::Cm(ev) = &s.item {
                st.tracker.prefetch_keys(ev);
            }
        }
        let mut i = 0;
        while i < batch.len() {
            if let Some(Slot {
                item: Item::Cm(ev), ..
            }) = batch.get(i + KEYS_AHEAD)
            {
                st.tracker.prefetch_keys(ev);
            }
            if let Some(Slot {
                item: Item::Cm(ev), ..
            }) = batch.get(i + CONN_AHEAD)
            {
                st.tracker.prefetch_conn(ev);
            }
            let Some(slot) = batch.get_mut(i) else {
                break;
            };
            slot.note = track(ctx, st, slot.ts, &slot.item)?;
            if let Item::Malformed { frame, reason } = &slot.item {
                // Everything before it is written first.
                let what = format!("frame {frame}: {reason}");
                let rest = batch.split_off(i + 1);
                h.format(std::mem::replace(&mut batch, rest))?;
                h.flush()?;
                let _ = writeln!(ctx.err, "cm-trace: {}: malformed: {what}", ctx.file);
                i = 0;
                continue;
            }
            i += 1;
        }
        h.format(batch)?;
        progress();
    }
    Ok(())
}

/// Reports the reader's errors in the `--json` view (on `err`, after the lines so far).
fn report_read_errors(
    ctx: &mut FileCtx<'_>,
    h: &Helper<'_>,
    errs: &mut Vec<RecordError>,
) -> io::Result<()> {
    if errs.is_empty() {
        return Ok(());
    }
    h.flush()?;
    for e in errs.drain(..) {
        ctx.read_error(&mut io::sink(), &e)?;
    }
    Ok(())
}

fn run_file<W: Write + Send>(
    ctx: &mut FileCtx<'_>,
    out: &mut W,
    src: &mut Source,
    counter: &Arc<AtomicU64>,
    size: Option<u64>,
) -> io::Result<()> {
    let opts = ctx.opts;
    let pb = open_progress(opts, size);
    let mut st = LoopState {
        tracker: Tracker::new(TrackerConfig {
            record_events: opts.tracker.record_events
                || opts.view.records_events()
                || opts.timeline.is_some(),
            ..opts.tracker
        }),
        msg_counts: [0; 0x20],
        t0: None,
        last: Duration::ZERO,
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
            let h = Helper::start(scope, &mut *out, file);
            let looped = threaded_loop(ctx, &mut st, &h, src, &progress);
            // The thread's own error (a closed pipe) explains a failed send best.
            h.finish().and(looped)
        })?;
    } else {
        inline_loop(ctx, &mut st, out, src, &progress)?;
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

/// `--timeline PATH: error`.
fn path_error(path: &std::path::Path, e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("--timeline {}: {e}", path.display()))
}

/// Checks the timeline's file name (`.svg`, or `.html` / `.htm` for an HTML page: no other
/// format is written, so `out.png` is refused) and creates the file; says whether it is HTML.
fn open_timeline(path: &std::path::Path) -> io::Result<(std::fs::File, bool)> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let html = match ext.as_deref() {
        Some("svg") => false,
        Some("html" | "htm") => true,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "--timeline {}: not written: the timeline is SVG (.svg) or HTML (.html) only",
                    path.display()
                ),
            ))
        }
    };
    let file = std::fs::File::create(path).map_err(|e| path_error(path, &e))?;
    Ok((file, html))
}

/// Decodes `files` (`-` = standard input) and writes the chosen view to `out`; errors and
/// (for JSON views) summaries go to `err`.
///
/// # Errors
/// I/O errors writing `out` (a closed pipe included); a timeline file name other than `.svg` /
/// `.html` / `.htm`, or one that cannot be created (both before any input is read), or an
/// error writing it (the message names the file). Unreadable
/// inputs are reported on `err` and counted in [`Outcomes::unreadable`].
pub fn run<W: Write + Send>(
    opts: &Options,
    files: &[String],
    out: &mut W,
    err: &mut dyn Write,
) -> io::Result<Outcomes> {
    let pal = Palette { on: opts.color };
    let mut result = Outcomes::default();
    // The timeline file is checked and created before any input is read.
    let mut timeline_out = match &opts.timeline {
        Some(path) => Some(open_timeline(path)?),
        None => None,
    };
    let mut timeline = opts
        .timeline
        .as_ref()
        .map(|_| Timeline::new(opts.timeline_max.max(1)));
    let multi = files.len() > 1;
    for file in files {
        let Opened {
            mut src,
            counter,
            size,
            pipe,
        } = match Source::open(file) {
            Ok(x) => x,
            Err(e) => {
                out.flush()?;
                let what = match &e {
                    OpenError::Io(_) => e.to_string(),
                    OpenError::Format(s) => s.clone(),
                };
                let _ = writeln!(err, "cm-trace: {file}: {what}");
                result.unreadable += 1;
                continue;
            }
        };
        let timeline_file = timeline.as_mut().map_or(0, |t| t.file(file));
        let mut ctx = FileCtx {
            live: opts.live || pipe,
            damaged: false,
            opts,
            pal,
            err: &mut *err,
            file,
            multi,
            buf: Vec::with_capacity(1 << 16),
            stats: TraceStats::default(),
            timeline: timeline.as_mut(),
            timeline_file,
        };
        run_file(&mut ctx, out, &mut src, &counter, size)?;
        if ctx.damaged {
            result.damaged += 1;
        }
        let stats = std::mem::take(&mut ctx.stats);
        result.stats.merge(&stats);
    }
    let mut buf = Vec::new();
    match opts.view {
        View::Stats => stats_text(&mut buf, &result.stats, &pal),
        View::StatsJson => stats_json(&mut buf, &result.stats),
        _ => {}
    }
    out.write_all(&buf)?;
    out.flush()?;
    if let (Some(path), Some(t), Some((file, html))) =
        (&opts.timeline, &timeline, timeline_out.as_mut())
    {
        let doc = if *html { t.html() } else { t.svg() };
        file.write_all(doc.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| path_error(path, &e))?;
        let _ = write!(
            err,
            "cm-trace: timeline with {} connection(s) written to {}",
            t.len(),
            path.display()
        );
        if t.dropped > 0 {
            let _ = write!(
                err,
                "; {} more connection(s) not drawn (at most {} drawn: --timeline-max N, or -p \
                 for the problems only)",
                t.dropped,
                opts.timeline_max.max(1)
            );
        }
        let _ = writeln!(err);
    }
    Ok(result)
}

#[cfg(test)]
mod tests;
