//! Ctrl-C (SIGINT) and SIGTERM during a live capture or a pipe read: the input ends there,
//! and cm-trace prints the final summary and statistics of what it read, and exits as after
//! the end of the input (status 0 unless inputs were unreadable or damaged). A second signal
//! kills at once (status 130), in case the ending hangs.
//!
//! The handlers are installed only when an input arrives over time (`-i`, a pipe): reading a
//! file, Ctrl-C kills as usual. A pipe is read on a thread of its own ([`Pump`]) so that the
//! reading loop is not stuck in a `read` the signal does not interrupt; a live capture's wait
//! for packets is broken off by a thread that receives the signal (`crate::live`).

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

/// Set by the first SIGINT / SIGTERM.
static STOP: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// Installs the handlers (once). A failure is said on standard error: the signals then kill
/// as usual (no summary).
pub(crate) fn install() {
    INSTALL.call_once(|| {
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // The shutdown first: it acts only when the flag is already set (second signal).
            let r = signal_hook::flag::register_conditional_shutdown(sig, 130, &STOP)
                .and_then(|_| signal_hook::flag::register(sig, &STOP));
            if let Err(e) = r {
                eprintln!(
                    "cm-trace: cannot handle signal {sig} ({e}): it ends cm-trace without the \
                     final summary"
                );
            }
        }
    });
}

/// Whether a SIGINT / SIGTERM asked to stop.
#[inline]
pub(crate) fn requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// How long a reader waits for data before looking at the stop flag again.
pub(crate) const POLL: Duration = Duration::from_millis(100);

/// Chunks read from a pipe by a thread of its own; reads from it end (end of input) at the
/// pipe's end or, once the chunks already read are consumed, when [`requested`]. Its
/// [`PumpWait`] lets the reading loop wait for input with a deadline.
pub(crate) struct Pump(Arc<Mutex<PumpState>>);

/// The receiving end of a [`Pump`], shared by the reader and its [`PumpWait`] (both used by
/// the one reading thread: the lock is never contended).
struct PumpState {
    rx: Receiver<io::Result<Vec<u8>>>,
    /// The chunk being consumed, and the position in it.
    cur: Vec<u8>,
    pos: usize,
    done: bool,
    /// An error [`PumpWait::wait`] received, for the next read.
    pending: Option<io::Error>,
}

/// Waits for a [`Pump`]'s input with a deadline: how the `--stats` refresh comes on time
/// while a pipe is idle.
pub(crate) struct PumpWait(Arc<Mutex<PumpState>>);

impl PumpWait {
    /// Waits until the pump has bytes to read, its input ended, or a stop is [`requested`]
    /// (`true`), or until `until` passes with none of these (`false`). It sleeps in the
    /// channel's wait, waking at most every [`POLL`] to look at the stop flag.
    pub(crate) fn wait(&self, until: Instant) -> bool {
        let mut st = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if st.pos < st.cur.len() || st.done || st.pending.is_some() || requested() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            match st.rx.recv_timeout(POLL.min(until - now)) {
                Ok(Ok(chunk)) => {
                    st.cur = chunk;
                    st.pos = 0;
                }
                // The error (or the end) is the reader's to see, at its next read.
                Ok(Err(e)) => {
                    st.pending = Some(e);
                    return true;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return true,
            }
        }
    }
}

impl Pump {
    /// Starts reading `inner` on a thread (chunks of up to 64 KiB, as they arrive). The
    /// thread ends at the end of the input, or when the pump is dropped and a read returns
    /// (a thread blocked in `read` on a pipe that never ends is left to the process's exit).
    pub(crate) fn start<R: Read + Send + 'static>(mut inner: R) -> io::Result<(Pump, PumpWait)> {
        let (tx, rx) = mpsc::sync_channel::<io::Result<Vec<u8>>>(16);
        std::thread::Builder::new()
            .name("cm-trace-pipe".to_string())
            .spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    let r = match inner.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => Ok(buf.get(..n).unwrap_or(&[]).to_vec()),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => Err(e),
                    };
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        break;
                    }
                }
            })?;
        let st = Arc::new(Mutex::new(PumpState {
            rx,
            cur: Vec::new(),
            pos: 0,
            done: false,
            pending: None,
        }));
        Ok((Pump(Arc::clone(&st)), PumpWait(st)))
    }
}

impl Read for Pump {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let st = &mut *guard;
        while st.pos >= st.cur.len() {
            if st.done {
                return Ok(0);
            }
            if let Some(e) = st.pending.take() {
                st.done = true;
                return Err(e);
            }
            // Chunks already read come first; then the stop flag; then wait for more.
            let next = match st.rx.try_recv() {
                Ok(c) => Ok(c),
                Err(_) if requested() => {
                    st.done = true;
                    return Ok(0);
                }
                Err(_) => st.rx.recv_timeout(POLL),
            };
            match next {
                Ok(Ok(chunk)) => {
                    st.cur = chunk;
                    st.pos = 0;
                }
                Ok(Err(e)) => {
                    st.done = true;
                    return Err(e);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    st.done = true;
                    return Ok(0);
                }
            }
        }
        let rest = st.cur.get(st.pos..).unwrap_or(&[]);
        let n = rest.len().min(buf.len());
        if let (Some(dst), Some(src)) = (buf.get_mut(..n), rest.get(..n)) {
            dst.copy_from_slice(src);
        }
        st.pos += n;
        Ok(n)
    }
}
