//! `-i IFACE`: live capture through libpcap (feature `live`).
//!
//! The interface is opened in immediate mode (each packet is delivered as it arrives, not in
//! buffered batches), with nanosecond timestamps where the kernel gives them, and a kernel BPF
//! filter, [`FILTER`], so that only RoCE traffic is copied to cm-trace: RoCEv2 (UDP port
//! 4791) and RoCEv1 (Ethertype 0x8915). The records then go through the same loop as a file's
//! and every view works live (the output is flushed after each packet that prints something).
//! The capture ends after `--count N` packets (that passed the filter), or when interrupted.

use std::time::{Duration, Instant};

use crate::capture::{Record, RecordError};

/// The kernel filter: RoCEv2 and RoCEv1.
pub const FILTER: &str = "udp port 4791 or ether proto 0x8915";

/// An open live capture.
pub(crate) struct Live {
    cap: pcap::Capture<pcap::Active>,
    link_type: u32,
    number: u64,
    /// Packets still to read (`--count`).
    left: Option<u64>,
    /// Timestamps are nanoseconds (else microseconds).
    nanos: bool,
    /// The last packet's bytes (copied out of libpcap's buffer).
    buf: Vec<u8>,
}

impl Live {
    /// Opens `iface` for capture with [`FILTER`] (`count`: stop after that many packets).
    ///
    /// # Errors
    /// libpcap's message: no such interface, no permission (capturing needs root or
    /// CAP_NET_RAW), a filter the link type cannot take.
    pub(crate) fn open(iface: &str, count: Option<u64>) -> Result<Live, String> {
        let open = |precision| {
            pcap::Capture::from_device(iface)
                .map_err(|e| e.to_string())?
                .immediate_mode(true)
                .snaplen(65_535)
                .timeout(200)
                .precision(precision)
                .open()
                .map_err(|e| e.to_string())
        };
        // Nanosecond timestamps where the kernel has them, else microseconds (said nowhere:
        // only the resolution of the times shown differs).
        let (mut cap, nanos) = match open(pcap::Precision::Nano) {
            Ok(c) => (c, true),
            Err(_) => (open(pcap::Precision::Micro)?, false),
        };
        cap.filter(FILTER, true)
            .map_err(|e| format!("BPF filter {FILTER:?}: {e}"))?;
        // libpcap's wait for packets is not ended by a signal (nor, in immediate mode, by its
        // read timeout): a thread that receives Ctrl-C / SIGTERM breaks it off
        // (`pcap_breakloop`), and the next read ends the capture.
        let brk = cap.breakloop_handle();
        let sigs = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ]);
        let spawned = sigs.and_then(|mut sigs| {
            std::thread::Builder::new()
                .name("cm-trace-signals".to_string())
                .spawn(move || {
                    for _ in sigs.forever() {
                        brk.breakloop();
                    }
                })
        });
        if let Err(e) = spawned {
            eprintln!(
                "cm-trace: Ctrl-C cannot interrupt a wait for packets ({e}): it acts at the next \
                 packet"
            );
        }
        let link_type = u32::try_from(cap.get_datalink().0).unwrap_or(0);
        Ok(Live {
            cap,
            link_type,
            number: 0,
            left: count,
            nanos,
            buf: Vec::with_capacity(65_536),
        })
    }

    /// Waits until a packet can be read or the capture ends (`true`), or until `until` passes
    /// first (`false`): `poll` on the capture's descriptor (libpcap's own wait in immediate
    /// mode ends only with a packet), waking at most every [`POLL`](crate::interrupt::POLL)
    /// to look at the stop flag. Only packets that passed the kernel filter wake it.
    pub(crate) fn wait(&mut self, until: Instant) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        loop {
            if self.left == Some(0) || crate::interrupt::requested() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            let Ok(timeout) = Timespec::try_from((until - now).min(crate::interrupt::POLL)) else {
                return true;
            };
            let mut fds = [PollFd::new(&self.cap, PollFlags::IN)];
            match poll(&mut fds, Some(&timeout)) {
                // Readable, or an error or hang-up that the next read reports.
                Ok(n) if n > 0 => return true,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => {}
                // A failed poll: the next read waits in libpcap (and reports its errors).
                Err(_) => return true,
            }
        }
    }

    /// The next packet; `None` after `--count` packets or when the capture ends.
    pub(crate) fn next_record(&mut self) -> Option<Result<Record<'_>, RecordError>> {
        if self.left == Some(0) || crate::interrupt::requested() {
            return None;
        }
        let (ts, orig_len) = loop {
            match self.cap.next_packet() {
                Ok(p) => {
                    if let Some(n) = &mut self.left {
                        *n -= 1;
                    }
                    self.number += 1;
                    let secs = u64::try_from(p.header.ts.tv_sec).unwrap_or(0);
                    let frac = u32::try_from(p.header.ts.tv_usec).unwrap_or(0);
                    let nanos = if self.nanos {
                        frac
                    } else {
                        frac.saturating_mul(1000)
                    };
                    self.buf.clear();
                    self.buf.extend_from_slice(p.data);
                    break (Duration::new(secs, nanos.min(999_999_999)), p.header.len);
                }
                // No packet within the read timeout: wait on, unless interrupted.
                Err(pcap::Error::TimeoutExpired) if crate::interrupt::requested() => return None,
                Err(pcap::Error::TimeoutExpired) => {}
                Err(_) if crate::interrupt::requested() => return None,
                Err(pcap::Error::NoMorePackets) => return None,
                Err(e) => {
                    return Some(Err(RecordError {
                        msg: format!("live capture: {e}"),
                        damaged: true,
                        resumes: false,
                        skipped: 0,
                    }))
                }
            }
        };
        Some(Ok(Record {
            number: self.number,
            timestamp: ts,
            link_type: self.link_type,
            interface: 0,
            orig_len,
            data: &self.buf,
        }))
    }
}
