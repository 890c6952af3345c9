//! Capture input: pcap and pcapng (through `crate::capture`), and raw ERF record files
//! (what Endace/DAG tools and Wireshark's "ERF" format write: ERF records back to back, no
//! file header). Reads a file or standard input (`-`) in constant memory, and counts the
//! bytes read for the progress bar.

use std::fs::File;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::capture::erf::{looks_like_erf, read_full, ErfReader};
use crate::capture::{CaptureError, CaptureReader, Record, RecordError};
use crate::interrupt::{Pump, PumpWait};

/// A reader that counts the bytes it delivers.
pub(crate) struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A reader that first replays bytes already read (the sniffed magic number).
struct Replay<R> {
    head: Vec<u8>,
    pos: usize,
    inner: R,
}

impl<R: Read> Read for Replay<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(rest) = self.head.get(self.pos..).filter(|r| !r.is_empty()) {
            let n = rest.len().min(buf.len());
            if let (Some(dst), Some(src)) = (buf.get_mut(..n), rest.get(..n)) {
                dst.copy_from_slice(src);
            }
            self.pos += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

type Boxed = Box<dyn Read + Send>;

/// An open capture.
pub(crate) enum Source {
    /// pcap or pcapng.
    Pcap(CaptureReader<Boxed>),
    /// Raw ERF records.
    Erf(ErfReader<Boxed>),
    /// A live capture (`-i`).
    #[cfg(feature = "live")]
    Live(crate::live::Live),
}

/// Why an input could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The file could not be opened or read.
    Io(io::Error),
    /// Not a capture this tool reads.
    Format(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Io(e) => write!(f, "cannot read: {e}"),
            OpenError::Format(s) => f.write_str(s),
        }
    }
}

/// Reads the first 16 bytes of `reader` (fewer at its end); returns them and the reader,
/// which goes on after them (see [`Replay`]).
fn sniff(mut reader: Boxed) -> Result<(Vec<u8>, Boxed), OpenError> {
    let mut head = vec![0u8; 16];
    let n = read_full(&mut reader, &mut head).map_err(OpenError::Io)?;
    head.truncate(n);
    Ok((head, reader))
}

/// An opened input.
pub(crate) struct Opened {
    /// The records.
    pub(crate) src: Source,
    /// Bytes read so far (for the progress bar).
    pub(crate) counter: Arc<AtomicU64>,
    /// The file size, when known.
    pub(crate) size: Option<u64>,
    /// The input is a pipe (a FIFO: `tcpdump -U -w - | cm-trace -`, or a named pipe): its
    /// packets arrive over time, and the output is flushed after each one.
    pub(crate) pipe: bool,
    /// For a pipe: waits for its input with a deadline (see [`Source::wait_input`]). `None`
    /// for other inputs, and for a gzip-compressed pipe, whose decompressor may hold whole
    /// records that no wait on the pipe sees (`gzip` says so).
    pub(crate) wait: Option<PumpWait>,
    /// The input is gzip-compressed.
    pub(crate) gzip: bool,
}

/// Whether a file type is a pipe or a socket (input that arrives over time).
fn is_pipe(t: std::fs::FileType) -> bool {
    use std::os::unix::fs::FileTypeExt;
    t.is_fifo() || t.is_socket()
}

impl Source {
    /// Opens `path` (`-` = standard input). Returns the source, the byte counter, and the
    /// file size when known.
    ///
    /// # Errors
    /// The file cannot be opened or read, or is not pcap, pcapng or ERF.
    pub(crate) fn open(path: &str) -> Result<Opened, OpenError> {
        let mut wait = None;
        let (reader, size, pipe): (Boxed, Option<u64>, bool) = if path == "-" {
            // Standard input's type, from its descriptor (/dev/stdin names it on Linux).
            let pipe = std::fs::metadata("/dev/stdin").is_ok_and(|m| is_pipe(m.file_type()));
            if pipe {
                crate::interrupt::install();
                let (pump, w) = Pump::start(io::stdin()).map_err(OpenError::Io)?;
                wait = Some(w);
                (Box::new(pump), None, pipe)
            } else {
                (Box::new(io::stdin()), None, pipe)
            }
        } else {
            let f = File::open(path).map_err(OpenError::Io)?;
            let meta = f.metadata().map_err(OpenError::Io)?;
            if meta.is_dir() {
                return Err(OpenError::Format("is a directory".to_string()));
            }
            let pipe = is_pipe(meta.file_type());
            let size = (!pipe).then_some(meta.len());
            if pipe {
                crate::interrupt::install();
                let (pump, w) = Pump::start(f).map_err(OpenError::Io)?;
                wait = Some(w);
                (Box::new(pump), size, pipe)
            } else {
                (Box::new(f), size, pipe)
            }
        };
        Self::from_reader(reader).map(|(src, counter, gzip)| Opened {
            src,
            counter,
            size,
            pipe,
            wait: wait.filter(|_| !gzip),
            gzip,
        })
    }

    /// Opens the interface `iface` for a live capture (`count`: stop after that many packets).
    ///
    /// # Errors
    /// libpcap's, or (without the `live` feature) that live capture is not built in.
    pub(crate) fn open_live(iface: &str, count: Option<u64>) -> Result<Opened, OpenError> {
        #[cfg(feature = "live")]
        {
            let live = crate::live::Live::open(iface, count).map_err(OpenError::Format)?;
            crate::interrupt::install();
            Ok(Opened {
                src: Source::Live(live),
                counter: Arc::new(AtomicU64::new(0)),
                size: None,
                pipe: true,
                wait: None,
                gzip: false,
            })
        }
        #[cfg(not(feature = "live"))]
        {
            let _ = (iface, count);
            Err(OpenError::Format(
                "live capture is not built in: build cm-trace with `--features live` \
                 (needs libpcap-dev)"
                    .to_string(),
            ))
        }
    }

    /// Sniffs the format of `reader` and opens it.
    ///
    /// # Errors
    /// As [`Source::open`].
    /// Also says whether the input is gzip-compressed.
    pub(crate) fn from_reader(reader: Boxed) -> Result<(Source, Arc<AtomicU64>, bool), OpenError> {
        // The bytes of the input as stored (compressed for a gzip file: the progress bar
        // compares them with the file size).
        let count = Arc::new(AtomicU64::new(0));
        let counting: Boxed = Box::new(Counting {
            inner: reader,
            count: Arc::clone(&count),
        });
        let (head, reader) = sniff(counting)?;
        // gzip (`.pcap.gz`, `.pcapng.gz`, whatever the name): decompressed as it is read, every
        // member of a multi-member file in turn (as `gzip -c a b >> f` writes them).
        let gzip = head.starts_with(&[0x1f, 0x8b]);
        let (head, reader) = if gzip {
            let whole: Boxed = Box::new(Replay {
                head,
                pos: 0,
                inner: reader,
            });
            sniff(Box::new(flate2::read::MultiGzDecoder::new(whole))).map_err(|e| match e {
                OpenError::Io(e) => OpenError::Format(format!("gzip: {e}")),
                e => e,
            })?
        } else {
            (head, reader)
        };
        let n = head.len();
        let magic = head
            .first_chunk::<4>()
            .map(|m| u32::from_be_bytes(*m))
            .unwrap_or(0);
        let known = matches!(
            magic,
            0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1 | 0x0a0d_0d0a
        );
        let is_erf = !known && looks_like_erf(&head);
        let counting: Boxed = Box::new(Replay {
            head,
            pos: 0,
            inner: reader,
        });
        if n == 0 {
            return Err(OpenError::Format("empty file".to_string()));
        }
        if is_erf {
            return Ok((Source::Erf(ErfReader::new(counting)), count, gzip));
        }
        match CaptureReader::new(counting) {
            Ok(r) => Ok((Source::Pcap(r), count, gzip)),
            Err(CaptureError::UnknownFormat { magic }) => Err(OpenError::Format(format!(
                "not a pcap, pcapng or ERF capture (starts with {magic:#010x})"
            ))),
            Err(CaptureError::Io { source, .. }) => Err(OpenError::Io(source)),
            Err(e) => Err(OpenError::Format(format!("not a readable capture: {e}"))),
        }
    }

    /// Waits until the next record can be read, or the input ended (`true`), or until `until`
    /// passes first (`false`), sleeping meanwhile (no polling loop). A live capture waits in
    /// libpcap; a pipe in `wait` (its [`PumpWait`]), unless the reader holds unparsed bytes
    /// already (then a record, or the start of one, is there: `true` at once; a writer
    /// stopped in the middle of a record then delays until the rest comes). Other inputs are
    /// always ready.
    pub(crate) fn wait_input(
        &mut self,
        wait: Option<&PumpWait>,
        until: std::time::Instant,
    ) -> bool {
        match self {
            Source::Pcap(r) if r.buffered() > 0 => true,
            #[cfg(feature = "live")]
            Source::Live(l) => l.wait(until),
            _ => wait.is_none_or(|w| w.wait(until)),
        }
    }

    /// The next record, or an error; after an error that does not resume, `None`.
    pub(crate) fn next_record(&mut self) -> Option<Result<Record<'_>, RecordError>> {
        match self {
            Source::Pcap(r) => r.next_record().map(|x| {
                x.map_err(|e| {
                    let (resumes, skipped) = match e {
                        CaptureError::Skipped {
                            resumed, skipped, ..
                        } => (resumed, skipped),
                        _ => (false, 0),
                    };
                    RecordError {
                        damaged: !matches!(e, CaptureError::Truncated { .. }),
                        resumes,
                        skipped,
                        msg: e.to_string(),
                    }
                })
            }),
            #[cfg(feature = "live")]
            Source::Live(l) => l.next_record(),
            Source::Erf(r) => r.next_record().map(|x| {
                x.map_err(|e| RecordError {
                    damaged: false,
                    resumes: false,
                    skipped: 0,
                    msg: e.to_string(),
                })
            }),
        }
    }
}
