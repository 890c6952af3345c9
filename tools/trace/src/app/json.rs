//! The `--json` view on three threads: the helper thread that classifies batches of records
//! ahead of the tracking and formats the JSON lines, the writer thread that writes them, and
//! the loop that reads and tracks on the calling thread.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::capture::{Record, RecordError};
use crate::conn::Note;
use crate::input::Source;
use crate::render::json_line;
use crate::timefmt::{TimeFormat, TimeRef};
use crate::trace::{classify, Item};

use super::track::{track, FileCtx, LoopState};

/// Records per batch handed to the JSON formatting thread.
pub(super) const BATCH: usize = 256;
/// How many records ahead of the one being tracked the tracker is asked to prefetch the index
/// positions of (`KEYS_AHEAD`) and the connection (`CONN_AHEAD`).
const KEYS_AHEAD: usize = 8;
const CONN_AHEAD: usize = 2;

/// A classified record in a batch; `note` is set for the CM (and SA) MADs to print.
struct Slot {
    ts: Duration,
    item: Item,
    note: Option<Note>,
    /// What the time is shown relative to (`-t`), set with `note`.
    when: TimeRef,
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

/// The `--json` view's other two threads. The calling thread reads the records and tracks the
/// connections (both strictly in order); the helper classifies (decodes) batches of records
/// ahead of the tracking (the calling thread classifies a batch itself when the helper is
/// behind) and formats the JSON lines of the batches tracked; the writer writes them. Batches
/// and output chunks are reused.
pub(super) struct Helper<'s> {
    tx: mpsc::SyncSender<Job>,
    classified: mpsc::Receiver<(RawBatch, Vec<Slot>)>,
    ack: mpsc::Receiver<()>,
    handle: std::thread::ScopedJoinHandle<'s, io::Result<()>>,
    writer: std::thread::ScopedJoinHandle<'s, io::Result<()>>,
    /// Classify and format jobs sent and not yet done by the helper.
    backlog: Arc<AtomicUsize>,
    /// Emptied batches the helper hands back, for the batches classified on this thread.
    spare_slots: mpsc::Receiver<Vec<Slot>>,
}

/// The error of a helper thread that stopped early (it failed writing).
fn helper_gone() -> io::Error {
    io::Error::other("the JSON helper thread stopped")
}

/// Raw batches in flight (read, not yet tracked).
const IN_FLIGHT: usize = 6;

/// The helper is behind when it has more jobs than this waiting: the tracking thread then
/// classifies the batches it reads itself (it would only wait for them otherwise), so the
/// two threads share the classifying as their loads allow.
const BEHIND: usize = 8;

/// Formatted chunks waiting for the writer thread.
const CHUNKS: usize = 4;

/// The helper thread writes its output in chunks of about this size: few large writes (a
/// pipe's reader is woken once per chunk, not once per 64 KiB).
pub(crate) const WRITE_CHUNK: usize = 1 << 20;

impl<'s> Helper<'s> {
    pub(super) fn start<W: Write + Send>(
        scope: &'s std::thread::Scope<'s, '_>,
        out: &'s mut W,
        file: Option<&'s str>,
        time: Option<TimeFormat>,
    ) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Job>(2 * IN_FLIGHT + 4);
        let (classified_tx, classified) = mpsc::channel();
        let (ack_tx, ack) = mpsc::channel();
        let (spare_slots_tx, spare_slots) = mpsc::channel();
        let backlog = Arc::new(AtomicUsize::new(0));
        let queued = Arc::clone(&backlog);
        let (chunk_tx, chunks) = mpsc::sync_channel::<Option<Vec<u8>>>(CHUNKS);
        let (spare_chunk_tx, spare_chunks) = mpsc::channel::<Vec<u8>>();
        // The writer: writes the formatted chunks in order (`None`: flush and acknowledge),
        // and hands the emptied buffers back. Writing to a pipe (the kernel's copy, waiting
        // for the reader) is then off the formatting thread.
        let writer = scope.spawn(move || -> io::Result<()> {
            for chunk in chunks {
                match chunk {
                    Some(mut c) => {
                        out.write_all(&c)?;
                        c.clear();
                        let _ = spare_chunk_tx.send(c);
                    }
                    None => {
                        out.flush()?;
                        let _ = ack_tx.send(());
                    }
                }
            }
            out.flush()
        });
        let handle = scope.spawn(move || -> io::Result<()> {
            let new_chunk = || Vec::with_capacity(WRITE_CHUNK + (1 << 16));
            let mut buf = new_chunk();
            // Hands the chunk to the writer, and takes an emptied one back (or a new one).
            let ship = |buf: &mut Vec<u8>| -> io::Result<()> {
                let next = spare_chunks.try_recv().unwrap_or_else(|_| new_chunk());
                let full = std::mem::replace(buf, next);
                chunk_tx.send(Some(full)).map_err(|_| helper_gone())
            };
            let mut spare: Vec<Vec<Slot>> = Vec::new();
            for job in rx {
                match job {
                    Job::Classify(raw) => {
                        let mut slots = spare.pop().unwrap_or_default();
                        classify_batch(&raw, &mut slots);
                        backlog.fetch_sub(1, Ordering::Relaxed);
                        if classified_tx.send((raw, slots)).is_err() {
                            break;
                        }
                    }
                    Job::Format(mut b) => {
                        for s in &b {
                            match (&s.item, &s.note) {
                                (Item::Cm(ev), Some(note)) => {
                                    json_line(&mut buf, ev, note, file, (time, s.when));
                                }
                                (Item::Sa(ev), Some(_)) => {
                                    crate::sa::view::json_line(&mut buf, ev, file, (time, s.when));
                                }
                                _ => {}
                            }
                            if buf.len() >= WRITE_CHUNK {
                                ship(&mut buf)?;
                            }
                        }
                        b.clear();
                        backlog.fetch_sub(1, Ordering::Relaxed);
                        // Emptied batches for this thread's classifying, then for the
                        // tracking thread's own (see `threaded_loop`).
                        if spare.len() < IN_FLIGHT {
                            spare.push(b);
                        } else {
                            let _ = spare_slots_tx.send(b);
                        }
                    }
                    Job::Flush => {
                        if !buf.is_empty() {
                            ship(&mut buf)?;
                        }
                        chunk_tx.send(None).map_err(|_| helper_gone())?;
                    }
                }
            }
            if !buf.is_empty() {
                ship(&mut buf)?;
            }
            Ok(())
        });
        Helper {
            tx,
            classified,
            ack,
            handle,
            writer,
            backlog: queued,
            spare_slots,
        }
    }

    fn send(&self, job: Job) -> io::Result<()> {
        if !matches!(job, Job::Flush) {
            self.backlog.fetch_add(1, Ordering::Relaxed);
        }
        self.tx.send(job).map_err(|_| helper_gone())
    }

    /// Whether the helper is behind: then the tracking thread classifies the next batch
    /// itself instead of waiting.
    fn behind(&self) -> bool {
        self.backlog.load(Ordering::Relaxed) > BEHIND
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

    /// Waits for the threads to write the rest and finish.
    pub(super) fn finish(self) -> io::Result<()> {
        drop(self.tx);
        let formatted = self
            .handle
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the JSON helper thread failed")));
        let written = self
            .writer
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the JSON writer thread failed")));
        // The writer's own error (a closed pipe) explains a failed hand-over best.
        written.and(formatted)
    }
}

/// Classifies the records of `raw` into `slots`.
fn classify_batch(raw: &RawBatch, slots: &mut Vec<Slot>) {
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
            when: TimeRef::default(),
        });
    }
}

/// A batch read and not yet tracked.
enum Pending {
    /// Sent to the helper to classify.
    Sent,
    /// To be classified on the tracking thread (the helper was behind).
    Local(RawBatch),
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
/// ahead (or here, when `h` is behind), tracked here, and formatted and written by `h`.
pub(super) fn threaded_loop(
    ctx: &mut FileCtx<'_>,
    st: &mut LoopState,
    h: &Helper<'_>,
    src: &mut Source,
    progress: &dyn Fn(),
) -> io::Result<()> {
    let mut errs: Vec<RecordError> = Vec::new();
    let mut more = true;
    let mut pending: VecDeque<Pending> = VecDeque::with_capacity(IN_FLIGHT + 1);
    let mut spare_raw: Vec<RawBatch> = Vec::new();
    // Reads the next batch, and sends it to the helper to classify unless it is behind.
    let mut read_next = |ctx: &mut FileCtx<'_>,
                         pending: &mut VecDeque<Pending>,
                         spare_raw: &mut Vec<RawBatch>,
                         more: &mut bool|
     -> io::Result<bool> {
        let mut raw = spare_raw.pop().unwrap_or_default();
        *more = read_batch(src, &mut raw, &mut errs);
        report_read_errors(ctx, h, &mut errs)?;
        if raw.recs.is_empty() {
            spare_raw.push(raw);
            return Ok(false);
        }
        if h.behind() {
            pending.push_back(Pending::Local(raw));
        } else {
            h.send(Job::Classify(raw))?;
            pending.push_back(Pending::Sent);
        }
        Ok(true)
    };
    loop {
        while more && pending.len() < IN_FLIGHT {
            if !read_next(ctx, &mut pending, &mut spare_raw, &mut more)? {
                break;
            }
        }
        let Some(next) = pending.pop_front() else {
            break;
        };
        let (raw, mut batch) = match next {
            Pending::Sent => h.classified.recv().map_err(|_| helper_gone())?,
            Pending::Local(raw) => {
                let mut slots = h.spare_slots.try_recv().unwrap_or_default();
                classify_batch(&raw, &mut slots);
                (raw, slots)
            }
        };
        spare_raw.push(raw);
        // Read (and have classified) the next batch while this one is tracked.
        if more {
            read_next(ctx, &mut pending, &mut spare_raw, &mut more)?;
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
            slot.when = st.when;
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
