//! Linux umad: CM MADs on QP1 through `/dev/infiniband/umadN`.
//!
//! The transport registers a MAD agent for the CM class (0x07), class version 2, method Send,
//! on QP1, with P_Key indexes enabled, then reads and writes `struct ib_user_mad` records: a
//! 64-byte header (addressing) followed by the 256-byte MAD. On RoCE every MAD needs a GRH:
//! the header carries the peer's GID and the local GID index.
//!
//! Only one agent can own (class 0x07, version 2, method Send) on a port. When the kernel's
//! own CM (`ib_cm`) is loaded it owns it, registration fails with `EINVAL`, and
//! [`UmadTransport::open`] returns [`UmadError::CmClassTaken`] naming that cause. Load only
//! `rdma_rxe` (or the HCA driver), `ib_uverbs` and `ib_umad`.
//!
//! # One MAD per system call
//! The umad device has no batched calls: each `read` dequeues exactly one MAD record from the
//! file's receive list (`ib_umad_read` in `drivers/infiniband/core/user_mad.c`) and each
//! `write` posts exactly one send (`ib_umad_write`); there is no `recvmmsg`-like call and no
//! ioctl for several MADs. `readv`/`writev` are no interface either: where the device's file
//! operations have only `read`/`write`, the VFS runs them once per iovec
//! (`do_loop_readv_writev` in `fs/read_write.c`), so iovecs of exactly one record would move
//! several MADs per call, but that is a fallback whose behaviour changes with the file
//! operations of the running kernel (converting umad to `read_iter`/`write_iter` has been
//! proposed), and it stops at the first short record. This transport therefore stays at one
//! MAD per call, but reads ahead: `try_recv_batch` reads up to 64 records while the file has
//! them. The kernel's receive list is first come first served and unbounded; read into the
//! driver, the requests wait in its backlog instead, where the newest are answered first and
//! the excess is dropped and counted (`driver.rs`, `TURN_REQS`). Before, one record per turn
//! left a REQ flood queued in the kernel, and a legitimate REQ waited behind all of it.
//!
//! # Writes that would wait for ARP
//! On RoCE the kernel resolves each write's destination MAC address inside `write`, waiting
//! up to 1 s when the neighbour entry is not valid (module `neigh`). The transport checks
//! the kernel's neighbour table first and holds a MAD whose destination is being resolved
//! (at most 16 per destination, 256 destinations, 1 s; then dropped and counted as
//! `neigh_unresolved`; `neigh_held` counts those that waited). Held MADs are written at the
//! next check once the entry is valid: checks 1 ms after the first hold, then doubling to
//! 64 ms, run by the transport's own receive. The kernel is asked to resolve a destination
//! only when there is room to hold its MADs: a flood from spoofed sources costs at most 256
//! resolutions (ARP requests) at a time, not one per REQ.
//!
//! # Reads that wait for ARP, which this transport cannot avoid
//! The kernel resolves the sender of every received MAD the same way before it queues the
//! MAD for `read` (`recv_handler` in `drivers/infiniband/core/user_mad.c` calls
//! `ib_init_ah_attr_from_wc`), in the port's MAD receive path: a sender without a valid
//! neighbour entry holds up every MAD of the port for up to 1 s, and one that never answers
//! ARP keeps doing so with each MAD it sends (measured in the lab, kernel CM alike:
//! docs/protocol.md §5.11).
//!
//! umad rewrites the high 32 bits of the TID of every request MAD it sends with the agent's
//! `hi_tid` (docs/interop.md §8.10); the core never compares TIDs, so this is harmless.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ibcm_mad::{Gid, Lid, Qkey, Qpn, MAD_LEN};
use tokio::io::unix::AsyncFd;
use tracing::debug;

mod port;

pub use port::{IbPort, LinkLayer};

use super::neigh::{roce_ip, Neighbours, Reach};
use super::{now, sleep_until, sys};
use super::{DatagramTransport, TransportStats};
use crate::proto::{IbAddr, PeerAddr};

/// Size of `struct ib_user_mad_hdr` with P_Key indexes enabled.
pub const UMAD_HDR_LEN: usize = 64;

/// The addressing header of a umad record (`struct ib_user_mad_hdr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UmadHdr {
    /// Agent ID.
    pub id: u32,
    /// Status (non-zero on a failed send).
    pub status: u32,
    /// Response timeout for sends expecting a response (0 for CM Sends).
    pub timeout_ms: u32,
    /// Retries.
    pub retries: u32,
    /// Length (set by the kernel on receive).
    pub length: u32,
    /// Remote QP.
    pub qpn: Qpn,
    /// Q_Key.
    pub qkey: Qkey,
    /// Remote LID.
    pub lid: Lid,
    /// Service level.
    pub sl: u8,
    /// Path bits.
    pub path_bits: u8,
    /// Whether `gid`, `gid_index`, `hop_limit`, `traffic_class` and `flow_label` apply.
    pub grh_present: bool,
    /// Local GID index.
    pub gid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Remote GID.
    pub gid: Gid,
    /// Flow label (20 bits in a 32-bit field).
    pub flow_label: u32,
    /// P_Key index.
    pub pkey_index: u16,
}

impl UmadHdr {
    /// Encodes the header (host byte order for the `__u32`/`__u16` fields, network order for
    /// the `__be` ones, as the kernel header declares).
    pub fn encode(&self) -> [u8; UMAD_HDR_LEN] {
        let mut b = [0u8; UMAD_HDR_LEN];
        let mut put = |off: usize, bytes: &[u8]| {
            if let Some(dst) = b.get_mut(off..off + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        };
        put(0, &self.id.to_ne_bytes());
        put(4, &self.status.to_ne_bytes());
        put(8, &self.timeout_ms.to_ne_bytes());
        put(12, &self.retries.to_ne_bytes());
        put(16, &self.length.to_ne_bytes());
        put(20, &self.qpn.get().to_be_bytes());
        put(24, &self.qkey.0.to_be_bytes());
        put(28, &self.lid.0.to_be_bytes());
        put(30, &[self.sl]);
        put(31, &[self.path_bits]);
        put(32, &[u8::from(self.grh_present)]);
        put(33, &[self.gid_index]);
        put(34, &[self.hop_limit]);
        put(35, &[self.traffic_class]);
        put(36, &self.gid.0);
        put(52, &self.flow_label.to_be_bytes());
        put(56, &self.pkey_index.to_ne_bytes());
        b
    }

    /// Decodes a header.
    pub fn decode(b: &[u8; UMAD_HDR_LEN]) -> Self {
        let u32ne = |o: usize| {
            b.get(o..o + 4)
                .and_then(|s| s.first_chunk::<4>())
                .map_or(0, |a| u32::from_ne_bytes(*a))
        };
        let u32be = |o: usize| {
            b.get(o..o + 4)
                .and_then(|s| s.first_chunk::<4>())
                .map_or(0, |a| u32::from_be_bytes(*a))
        };
        let byte = |o: usize| b.get(o).copied().unwrap_or(0);
        let mut gid = [0u8; 16];
        if let Some(s) = b.get(36..52) {
            gid.copy_from_slice(s);
        }
        UmadHdr {
            id: u32ne(0),
            status: u32ne(4),
            timeout_ms: u32ne(8),
            retries: u32ne(12),
            length: u32ne(16),
            qpn: Qpn::masked(u32be(20)),
            qkey: Qkey(u32be(24)),
            lid: Lid(u16::from_be_bytes([byte(28), byte(29)])),
            sl: byte(30),
            path_bits: byte(31),
            grh_present: byte(32) != 0,
            gid_index: byte(33),
            hop_limit: byte(34),
            traffic_class: byte(35),
            gid: Gid(gid),
            flow_label: u32be(52),
            pkey_index: u16::from_ne_bytes([byte(56), byte(57)]),
        }
    }

    /// The header to send a CM MAD to `to` from agent `agent`, using local GID index
    /// `gid_index` for the GRH (RoCE).
    pub fn for_send(agent: u32, to: &IbAddr, gid_index: u8) -> Self {
        UmadHdr {
            id: agent,
            qpn: to.qpn,
            qkey: to.qkey,
            lid: to.lid,
            sl: to.sl,
            grh_present: to.gid.is_some(),
            gid_index,
            hop_limit: 64,
            gid: to.gid.unwrap_or_default(),
            pkey_index: to.pkey_index,
            ..UmadHdr::default()
        }
    }

    /// The peer address of a received record.
    ///
    /// On RoCE (a GRH and source LID 0: there are no LIDs) the address is canonical,
    /// [`IbAddr::roce`] of the source GID, so that it equals the address an application gives
    /// for the same peer: the core drops a REP from any other address than the one its REQ
    /// went to, and rxe reports LID 0 where [`IbAddr::roce`] has the permissive LID (found by
    /// the conformance lab: every kernel REP was dropped as coming from a wrong peer).
    pub fn peer(&self) -> IbAddr {
        if self.grh_present && self.lid.0 == 0 {
            return IbAddr {
                qpn: self.qpn,
                ..IbAddr::roce(self.gid)
            };
        }
        IbAddr {
            lid: self.lid,
            gid: self.grh_present.then_some(self.gid),
            qpn: self.qpn,
            qkey: if self.qkey.0 == 0 {
                Qkey::GSI
            } else {
                self.qkey
            },
            sl: self.sl,
            pkey_index: self.pkey_index,
        }
    }
}

/// Why the umad transport could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UmadError {
    /// The device file could not be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        /// Device path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The CM class is already registered on this port.
    #[error(
        "the CM class (0x07, version 2, method Send) is already registered on {path}: the \
         kernel's ib_cm module is loaded{loaded} and owns it. Unload ib_cm (and rdma_cm, \
         rdma_ucm, ib_ipoib, ...) and keep only the device driver, ib_uverbs and ib_umad"
    )]
    CmClassTaken {
        /// Device path.
        path: PathBuf,
        /// Whether /sys/module/ib_cm was seen.
        loaded: &'static str,
    },
    /// A sysfs file of the port could not be read, or holds something else than it should.
    #[error("{path}: {what}")]
    Sysfs {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
    /// Another ioctl failed.
    #[error("{what} on {path}: {source}")]
    Ioctl {
        /// What was attempted.
        what: &'static str,
        /// Device path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// The umad transport.
#[derive(Debug)]
pub struct UmadTransport {
    fd: AsyncFd<File>,
    agent: u32,
    gid_index: u8,
    local: PeerAddr,
    buf: Box<[u8; UMAD_HDR_LEN + MAD_LEN]>,
    counts: UmadCounts,
    /// Whether a RoCE destination can be written to without the kernel waiting for ARP.
    neigh: Neighbours,
    /// MADs held until their destination's neighbour entry is resolved, by destination.
    held: HashMap<IpAddr, Held>,
    /// `timeout_ms` of every send: 0 for the CM (no answer expected); the SA agent's requests
    /// wait for their answers ([`UmadTransport::open_sa`]).
    send_timeout_ms: u32,
}

/// The MADs held for one destination ([`UmadTransport::send`]).
#[derive(Debug)]
struct Held {
    since: Instant,
    next_check: Instant,
    /// Time to the next check (doubling).
    backoff: Duration,
    recs: Vec<Record>,
}

/// A umad record: header and MAD.
type Record = [u8; UMAD_HDR_LEN + MAD_LEN];

/// How long a MAD waits for its destination's address to resolve at most (the kernel's own
/// resolution gives up after 1 s, `rdma_addr_find_l2_eth_by_grh`).
const HOLD_MAX: Duration = Duration::from_secs(1);

/// Destinations with held MADs at most, and MADs held per destination at most; beyond, the
/// MAD is dropped (`neigh_unresolved`). A spoofed-source flood fills this, not the driver.
const HELD_DESTS_MAX: usize = 256;
const HELD_PER_DEST: usize = 16;

/// The first check of a held destination after this; then doubling, at most `CHECK_MAX`.
const CHECK_FIRST: Duration = Duration::from_millis(1);
const CHECK_MAX: Duration = Duration::from_millis(64);

/// A write that takes this long is counted as a stall (`write_stalls`).
const WRITE_STALL: Duration = Duration::from_millis(100);

/// Counters of a [`UmadTransport`] (reported through [`DatagramTransport::stats`]).
#[derive(Debug, Default, Clone, Copy)]
struct UmadCounts {
    rx: u64,
    tx: u64,
    /// Records shorter than a header and a MAD.
    short: u64,
    /// Completions of failed sends (non-zero status).
    send_failed: u64,
    /// MADs that waited for their destination's address resolution.
    neigh_held: u64,
    /// MADs dropped because their destination did not resolve within [`HOLD_MAX`], or too
    /// many waited.
    neigh_unresolved: u64,
    /// Held MADs whose write failed once their destination had resolved.
    held_send_error: u64,
    /// Writes that took [`WRITE_STALL`] or longer (the kernel waited in them).
    write_stalls: u64,
}

/// Opens a umad device file non-blocking and enables P_Key indexes in its records.
fn open_device(path: &Path) -> Result<File, UmadError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| UmadError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    sys::umad_enable_pkey(&file).map_err(|source| UmadError::Ioctl {
        what: "IB_USER_MAD_ENABLE_PKEY",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(file)
}

/// `file` (a registered umad device) with the tokio reactor.
fn reactor_fd(file: File, path: &Path) -> Result<AsyncFd<File>, UmadError> {
    sys::async_fd(file).map_err(|source| UmadError::Ioctl {
        what: "registering with the tokio reactor",
        path: path.to_path_buf(),
        source,
    })
}

/// Opens `path` and registers the CM agent (class 0x07 version 2, method Send, on QP1).
fn open_cm(path: &Path) -> Result<(AsyncFd<File>, u32), UmadError> {
    let path = path.to_path_buf();
    let file = open_device(&path)?;
    let mut req = sys::UmadRegReq {
        qpn: 1,
        mgmt_class: 0x07,
        mgmt_class_version: 2,
        ..Default::default()
    };
    // Method Send (3).
    req.method_mask[0] = 1 << 3;
    let agent = match sys::umad_register(&file, &mut req) {
        Ok(id) => id,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let loaded = if Path::new("/sys/module/ib_cm").exists() {
                " (/sys/module/ib_cm exists)"
            } else {
                ""
            };
            return Err(UmadError::CmClassTaken { path, loaded });
        }
        Err(source) => {
            return Err(UmadError::Ioctl {
                what: "IB_USER_MAD_REGISTER_AGENT",
                path,
                source,
            })
        }
    };
    Ok((reactor_fd(file, &path)?, agent))
}

impl UmadTransport {
    /// Opens `path` (e.g. `/dev/infiniband/umad0`) and registers the CM agent. `local_gid` is
    /// this port's GID at `gid_index` (on RoCE: the IPv4-mapped GID of the netdev's address;
    /// see `/sys/class/infiniband/<dev>/ports/1/gids/<index>`).
    ///
    /// # Errors
    /// [`UmadError`]; [`UmadError::CmClassTaken`] when the kernel CM is loaded.
    pub fn open(path: impl AsRef<Path>, gid_index: u8, local_gid: Gid) -> Result<Self, UmadError> {
        let path = path.as_ref();
        let (fd, agent) = open_cm(path)?;
        Ok(UmadTransport::with(
            fd,
            agent,
            gid_index,
            PeerAddr::Ib(IbAddr::roce(local_gid)),
            Neighbours::open(),
        ))
    }

    /// Opens `path`, the umad device file of the native InfiniBand port `port`
    /// ([`IbPort::of_umad`]), and registers the CM agent. Peers are LID-routed: a MAD goes
    /// with a GRH only to an address that has a GID (a path that leaves the subnet), from
    /// GID index 0.
    ///
    /// # Errors
    /// [`UmadError`]; [`UmadError::CmClassTaken`] when the kernel CM is loaded.
    pub fn open_ib(path: impl AsRef<Path>, port: &IbPort) -> Result<Self, UmadError> {
        let path = path.as_ref();
        let (fd, agent) = open_cm(path)?;
        let local = IbAddr {
            lid: port.lid,
            gid: None,
            ..IbAddr::roce(port.gid)
        };
        Ok(UmadTransport::with(
            fd,
            agent,
            0,
            PeerAddr::Ib(local),
            Neighbours::open(),
        ))
    }

    /// The transport over an open, registered device file.
    fn with(
        fd: AsyncFd<File>,
        agent: u32,
        gid_index: u8,
        local: PeerAddr,
        neigh: Neighbours,
    ) -> Self {
        UmadTransport {
            fd,
            agent,
            gid_index,
            local,
            buf: Box::new([0; UMAD_HDR_LEN + MAD_LEN]),
            counts: UmadCounts::default(),
            neigh,
            held: HashMap::new(),
            send_timeout_ms: 0,
        }
    }

    /// Opens `path` and registers an agent for Subnet Administration (class 0x03, version 2)
    /// on QP1 that takes answers only (no method registered: requests to this port are not
    /// its business): the transport of [`crate::rt::sa::Sa`]. Each request is sent with
    /// `timeout_ms` (the client's per-attempt timeout; the kernel's own retries are 0), because
    /// the kernel's MAD layer gives an answer to an agent only while the request it answers is
    /// outstanding (`ib_mad_complete_recv` in `drivers/infiniband/core/mad.c`); the completion
    /// of a request that timed out is counted as `send_failed` and dropped, and the client's
    /// own timer resends it.
    ///
    /// The agent does not do RMPP (`rmpp_version` 0): an answer of several MADs (a GetTable
    /// with more records than one MAD holds) reaches it only up to its first segment. The
    /// client's RMPP reassembly needs the user-RMPP registration
    /// (`IB_USER_MAD_REGISTER_AGENT2` with `IB_USER_MAD_USER_RMPP`), which this transport
    /// does not make yet.
    ///
    /// # Errors
    /// [`UmadError`].
    pub fn open_sa(
        path: impl AsRef<Path>,
        timeout_ms: u32,
        local_gid: Gid,
    ) -> Result<Self, UmadError> {
        let path = path.as_ref().to_path_buf();
        let file = open_device(&path)?;
        let mut req = sys::UmadRegReq {
            qpn: 1,
            mgmt_class: 0x03,
            mgmt_class_version: 2,
            ..Default::default()
        };
        let agent = sys::umad_register(&file, &mut req).map_err(|source| UmadError::Ioctl {
            what: "IB_USER_MAD_REGISTER_AGENT (class 0x03)",
            path: path.clone(),
            source,
        })?;
        let fd = reactor_fd(file, &path)?;
        let local = PeerAddr::Ib(IbAddr::roce(local_gid));
        let mut t = UmadTransport::with(fd, agent, 0, local, Neighbours::open());
        t.send_timeout_ms = timeout_ms;
        Ok(t)
    }

    /// The agent ID the kernel assigned.
    pub fn agent(&self) -> u32 {
        self.agent
    }

    /// Writes one record. umad never refuses a write for lack of room (its poll is always
    /// writable), so the call does not wait, except in the kernel's address resolution,
    /// which [`UmadTransport::send`] avoids.
    fn write_record(&mut self, rec: &Record) -> io::Result<()> {
        let t = now();
        let r = self.fd.get_ref().write_all(rec);
        let took = now().duration_since(t);
        if took >= WRITE_STALL {
            self.counts.write_stalls += 1;
            let to = UmadHdr::decode(rec.first_chunk().unwrap_or(&[0; UMAD_HDR_LEN])).peer();
            debug!(
                ?to,
                ?took,
                ok = r.is_ok(),
                "umad write waited in the kernel"
            );
        }
        r?;
        self.counts.tx += 1;
        Ok(())
    }

    /// The held destinations whose check is due: written if resolved now, dropped when held
    /// too long.
    fn flush_held(&mut self, now: Instant) {
        if self.held.is_empty() {
            return;
        }
        let due: Vec<IpAddr> = self
            .held
            .iter()
            .filter(|(_, h)| h.next_check <= now)
            .map(|(ip, _)| *ip)
            .collect();
        for ip in due {
            let reach = self.neigh.reach(ip, now, true);
            let Some(h) = self.held.get_mut(&ip) else {
                continue;
            };
            if reach == Reach::Later && now.duration_since(h.since) < HOLD_MAX {
                h.backoff = (h.backoff * 2).min(CHECK_MAX);
                h.next_check = now + h.backoff;
                continue;
            }
            let Some(h) = self.held.remove(&ip) else {
                continue;
            };
            if reach == Reach::Later {
                self.counts.neigh_unresolved += h.recs.len() as u64;
                continue;
            }
            for rec in h.recs {
                if self.write_record(&rec).is_err() {
                    self.counts.held_send_error += 1;
                }
            }
        }
    }

    /// When the next held destination is to be checked.
    fn next_check(&self) -> Option<Instant> {
        self.held.values().map(|h| h.next_check).min()
    }
}

/// Most records [`UmadTransport`]'s `try_recv_batch` reads in one call.
const UMAD_BATCH: usize = 64;

/// The MAD of a record `read` returned (`n` bytes of `buf`), or `None` for a record that is
/// not one (a failed send's completion, a short record), counted.
fn take_record(buf: &[u8], n: usize, counts: &mut UmadCounts) -> Option<(PeerAddr, Bytes)> {
    let hdr = UmadHdr::decode(buf.first_chunk::<UMAD_HDR_LEN>()?);
    if hdr.status != 0 {
        // A failed send's completion.
        counts.send_failed += 1;
        return None;
    }
    counts.rx += 1;
    if n < UMAD_HDR_LEN + MAD_LEN {
        counts.short += 1;
        return None;
    }
    let mad = buf.get(UMAD_HDR_LEN..UMAD_HDR_LEN + MAD_LEN)?;
    Some((PeerAddr::Ib(hdr.peer()), Bytes::copy_from_slice(mad)))
}

/// Holds `rec` for its destination (dropped, counted, when the destination holds its most).
fn hold(h: &mut Held, rec: Record, counts: &mut UmadCounts) {
    if h.recs.len() >= HELD_PER_DEST {
        counts.neigh_unresolved += 1;
    } else {
        counts.neigh_held += 1;
        h.recs.push(rec);
    }
}

impl DatagramTransport for UmadTransport {
    async fn send(&mut self, to: PeerAddr, mad: &[u8]) -> io::Result<()> {
        let PeerAddr::Ib(ib) = to else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the umad transport needs an IB peer address",
            ));
        };
        let hdr = UmadHdr {
            timeout_ms: self.send_timeout_ms,
            ..UmadHdr::for_send(self.agent, &ib, self.gid_index)
        }
        .encode();
        let mut rec: Record = [0u8; UMAD_HDR_LEN + MAD_LEN];
        rec.get_mut(..UMAD_HDR_LEN)
            .unwrap_or(&mut [])
            .copy_from_slice(&hdr);
        let n = mad.len().min(MAD_LEN);
        if let (Some(dst), Some(src)) = (rec.get_mut(UMAD_HDR_LEN..UMAD_HDR_LEN + n), mad.get(..n))
        {
            dst.copy_from_slice(src);
        }
        let t = now();
        self.flush_held(t);
        // On RoCE: never let the kernel wait for ARP in this call (module `neigh`).
        if let Some(ip) = ib.gid.and_then(roce_ip) {
            if let Some(h) = self.held.get_mut(&ip) {
                hold(h, rec, &mut self.counts);
                return Ok(());
            }
            // With every hold in use, a destination not resolved yet is not even asked for.
            let room = self.held.len() < HELD_DESTS_MAX;
            if self.neigh.reach(ip, t, room) == Reach::Later {
                if !room {
                    self.counts.neigh_unresolved += 1;
                    return Ok(());
                }
                let h = self.held.entry(ip).or_insert(Held {
                    since: t,
                    next_check: t + CHECK_FIRST,
                    backoff: CHECK_FIRST,
                    recs: Vec::new(),
                });
                hold(h, rec, &mut self.counts);
                return Ok(());
            }
        }
        self.write_record(&rec)
    }

    async fn recv(&mut self) -> io::Result<(PeerAddr, Bytes)> {
        loop {
            // While MADs are held, wake for their checks too.
            let check = self.next_check();
            let ready = tokio::select! {
                g = self.fd.readable() => Some(g?),
                () = sleep_until(check), if check.is_some() => None,
            };
            let Some(mut guard) = ready else {
                self.flush_held(now());
                continue;
            };
            let buf = &mut self.buf[..];
            match guard.try_io(|f| f.get_ref().read(buf)) {
                Ok(Ok(n)) => {
                    if let Some(m) = take_record(&self.buf[..], n, &mut self.counts) {
                        return Ok(m);
                    }
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    async fn recv_batch(&mut self, out: &mut Vec<(PeerAddr, Bytes)>) -> io::Result<()> {
        let m = self.recv().await?;
        out.push(m);
        self.try_recv_batch(out)
    }

    /// Up to 64 records, one `read` each (umad returns one MAD per call): the
    /// kernel's queue of received MADs is first come first served and unbounded, so that the
    /// driver must take them into its own backlog of requests, where the newest are answered
    /// first and the excess is dropped and counted, instead of letting them wait there.
    fn try_recv_batch(&mut self, out: &mut Vec<(PeerAddr, Bytes)>) -> io::Result<()> {
        // The noop waker takes the fd's poll-slot waker only; `recv` waits through
        // `readable()`, whose waiters are kept apart.
        self.flush_held(now());
        let mut cx = Context::from_waker(Waker::noop());
        // One readiness poll per batch: tokio's cooperative budget (128 polls of I/O
        // resources per poll of the task) is spent once per batch, not once per MAD, so that
        // under a flood the driver reads far more than it handles and the excess waits (and
        // is dropped) in its backlog rather than in the kernel.
        let mut guard = match self.fd.poll_read_ready(&mut cx) {
            Poll::Ready(Ok(g)) => g,
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok(()),
        };
        for _ in 0..UMAD_BATCH {
            let buf = &mut self.buf[..];
            match guard.try_io(|f| f.get_ref().read(buf)) {
                Ok(Ok(n)) => {
                    if let Some(m) = take_record(&self.buf[..], n, &mut self.counts) {
                        out.push(m);
                    }
                }
                Ok(Err(e)) => return Err(e),
                // Empty: readiness cleared, the next `recv` waits.
                Err(_would_block) => return Ok(()),
            }
        }
        Ok(())
    }

    fn local_addr(&self) -> PeerAddr {
        self.local
    }

    fn stats(&self) -> TransportStats {
        let c = self.counts;
        TransportStats {
            rx: c.rx,
            tx: c.tx,
            dropped: vec![
                ("short_record", c.short),
                ("neigh_unresolved", c.neigh_unresolved),
                ("held_send_error", c.held_send_error),
            ],
            other: vec![
                ("send_failed", c.send_failed),
                ("neigh_held", c.neigh_held),
                ("write_stalls", c.write_stalls),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout() {
        let to = IbAddr::roce(Gid::from_ip("10.77.0.2".parse().unwrap()));
        let h = UmadHdr::for_send(7, &to, 1);
        let b = h.encode();
        assert_eq!(&b[0..4], &7u32.to_ne_bytes(), "agent id, host order");
        assert_eq!(&b[20..24], &[0, 0, 0, 1], "qpn 1, big-endian");
        assert_eq!(
            &b[24..28],
            &[0x80, 0x01, 0x00, 0x00],
            "QP1 Q_Key, big-endian"
        );
        assert_eq!(&b[28..30], &[0xff, 0xff], "permissive LID");
        assert_eq!(b[32], 1, "GRH present");
        assert_eq!(b[33], 1, "GID index");
        assert_eq!(b[34], 64, "hop limit");
        assert_eq!(&b[36..52], &to.gid.unwrap().0);
        assert_eq!(&b[46..52], &[0xff, 0xff, 10, 77, 0, 2]);
        assert_eq!(UmadHdr::decode(&b), h);
        assert_eq!(h.peer(), to);
    }

    #[test]
    fn roce_receive_is_the_address_an_application_gives() {
        // What ib_umad reports for a MAD from rxe: source LID 0, a GRH, SL/P_Key index as the
        // work completion says.
        let gid = Gid::from_ip("10.77.0.1".parse().unwrap());
        let rx = UmadHdr {
            qpn: Qpn::masked(1),
            lid: Lid(0),
            grh_present: true,
            gid_index: 1,
            hop_limit: 64,
            gid,
            ..UmadHdr::default()
        };
        assert_eq!(rx.peer(), IbAddr::roce(gid));
        // Native IB keeps its LID.
        let ib = UmadHdr { lid: Lid(7), ..rx };
        assert_eq!(ib.peer().lid, Lid(7));
    }

    #[test]
    fn decode_is_total() {
        let b = [0xffu8; UMAD_HDR_LEN];
        let h = UmadHdr::decode(&b);
        assert_eq!(h.qpn.get(), 0xff_ffff);
        assert!(h.grh_present);
        assert_eq!(UmadHdr::decode(&h.encode()), h);
    }

    /// A transport whose "device" is one end of a datagram socket pair (one record per
    /// read, like umad); the other end plays the kernel.
    fn over_socket() -> (UmadTransport, std::os::unix::net::UnixDatagram) {
        over_socket_with(Neighbours::open())
    }

    fn over_socket_with(neigh: Neighbours) -> (UmadTransport, std::os::unix::net::UnixDatagram) {
        let (dev, kernel) = std::os::unix::net::UnixDatagram::pair().unwrap();
        dev.set_nonblocking(true).unwrap();
        let file = File::from(std::os::fd::OwnedFd::from(dev));
        let t = UmadTransport::with(
            sys::async_fd(file).unwrap(),
            0,
            0,
            PeerAddr::Ib(IbAddr::roce(Gid::ZERO)),
            neigh,
        );
        (t, kernel)
    }

    /// A received record from `ip` whose MAD is filled with `fill`.
    fn record(ip: &str, fill: u8) -> Vec<u8> {
        let from = IbAddr::roce(Gid::from_ip(ip.parse().unwrap()));
        let mut r = UmadHdr::for_send(0, &from, 0).encode().to_vec();
        r.extend_from_slice(&[fill; MAD_LEN]);
        r
    }

    #[tokio::test]
    async fn a_receive_takes_what_the_kernel_has_queued_in_batches() {
        let (mut t, kernel) = over_socket();
        // 150 MADs, a failed send's completion and a short record among them.
        for i in 0..150u8 {
            kernel.send(&record("10.77.0.1", i)).unwrap();
            if i == 10 {
                let mut done = record("10.77.0.1", 0xee);
                done[4..8].copy_from_slice(&110u32.to_ne_bytes()); // status ETIMEDOUT
                kernel.send(&done).unwrap();
                kernel
                    .send(&record("10.77.0.1", 0xdd)[..UMAD_HDR_LEN + 8])
                    .unwrap();
            }
        }
        let mut got = Vec::new();
        t.recv_batch(&mut got).await.unwrap();
        assert_eq!(
            got.len(),
            1 + UMAD_BATCH - 2,
            "the first MAD and one batch of records"
        );
        while got.len() < 150 {
            let before = got.len();
            t.try_recv_batch(&mut got).unwrap();
            assert!(got.len() > before, "records were left");
        }
        let fills: Vec<u8> = got.iter().map(|(_, m)| m[0]).collect();
        assert_eq!(fills, (0..150u8).collect::<Vec<_>>(), "in order");
        assert!(got.iter().all(|(from, m)| m.len() == MAD_LEN
            && *from == PeerAddr::Ib(IbAddr::roce(Gid::from_ip("10.77.0.1".parse().unwrap())))));
        assert_eq!(
            (t.counts.rx, t.counts.short, t.counts.send_failed),
            (151, 1, 1)
        );
        // Empty: nothing more, no error; the next record still wakes a receive.
        t.try_recv_batch(&mut got).unwrap();
        assert_eq!(got.len(), 150);
        kernel.send(&record("10.77.0.2", 7)).unwrap();
        let (from, m) = t.recv().await.unwrap();
        assert_eq!(m[0], 7);
        assert_eq!(
            from,
            PeerAddr::Ib(IbAddr::roce(Gid::from_ip("10.77.0.2".parse().unwrap())))
        );
    }

    /// The MADs of `kernel`'s queue (non-blocking), by their first MAD byte.
    fn written(kernel: &std::os::unix::net::UnixDatagram) -> Vec<u8> {
        kernel.set_nonblocking(true).unwrap();
        let mut buf = [0u8; UMAD_HDR_LEN + MAD_LEN + 1];
        let mut got = Vec::new();
        while let Ok(n) = kernel.recv(&mut buf) {
            assert_eq!(n, UMAD_HDR_LEN + MAD_LEN);
            got.push(buf[UMAD_HDR_LEN]);
        }
        got
    }

    /// MADs to a destination the kernel would have to resolve wait, without a blocking
    /// write, and go out in order once it is resolved; those to one that does not resolve
    /// within a second are dropped and counted.
    #[tokio::test(start_paused = true)]
    async fn writes_wait_for_address_resolution_outside_the_kernel() {
        use Reach::{Later, Now};
        // 10.1.2.3: unresolved at the first MAD and at the first check, resolved at the
        // second; 10.9.9.9 (asked next): never.
        let (mut t, kernel) = over_socket_with(Neighbours::scripted(&[Later, Later, Now]));
        let to = |ip: &str| PeerAddr::Ib(IbAddr::roce(Gid::from_ip(ip.parse().unwrap())));
        t.send(to("10.1.2.3"), &[1; MAD_LEN]).await.unwrap();
        t.send(to("10.1.2.3"), &[2; MAD_LEN]).await.unwrap();
        assert_eq!(written(&kernel), [0u8; 0], "nothing written yet");
        assert_eq!(t.counts.neigh_held, 2);
        // The transport's receive runs the checks (1 ms, then 2 ms later).
        let _ = tokio::time::timeout(Duration::from_millis(10), t.recv()).await;
        assert_eq!(written(&kernel), [1, 2], "written in order once resolved");
        assert_eq!(t.counts.tx, 2);
        t.send(to("10.9.9.9"), &[3; MAD_LEN]).await.unwrap();
        let _ = tokio::time::timeout(HOLD_MAX * 2, t.recv()).await;
        assert_eq!(written(&kernel), [0u8; 0]);
        assert_eq!((t.counts.neigh_held, t.counts.neigh_unresolved), (3, 1));
        assert!(t.held.is_empty());
        // A link-local (RoCE v1 / IB) destination is not checked: written at once.
        t.send(to("fe80::1"), &[4; MAD_LEN]).await.unwrap();
        assert_eq!(written(&kernel), [4]);
    }

    /// An SA request goes LID-routed (no GRH) to QP1 with the agent's send timeout, which
    /// keeps it outstanding in the kernel until its answer comes.
    #[tokio::test]
    async fn sa_requests_are_lid_routed_and_wait_for_their_answer() {
        let (mut t, kernel) = over_socket();
        t.send_timeout_ms = 250;
        let to = PeerAddr::Ib(IbAddr {
            lid: Lid(1),
            gid: None,
            qpn: Qpn::masked(1),
            qkey: Qkey::GSI,
            sl: 0,
            pkey_index: 0,
        });
        t.send(to, &[3; MAD_LEN]).await.unwrap();
        let mut buf = [0u8; UMAD_HDR_LEN + MAD_LEN];
        assert_eq!(kernel.recv(&mut buf).unwrap(), buf.len());
        let h = UmadHdr::decode(buf.first_chunk().unwrap());
        assert_eq!(
            (h.lid, h.qpn.get(), h.qkey, h.timeout_ms, h.retries),
            (Lid(1), 1, Qkey::GSI, 250, 0)
        );
        assert!(!h.grh_present);
    }

    #[test]
    fn missing_device_is_a_clear_error() {
        let e = UmadTransport::open("/nonexistent/umad9", 0, Gid::ZERO).unwrap_err();
        assert!(matches!(e, UmadError::Open { .. }));
        assert!(e.to_string().contains("/nonexistent/umad9"));
    }
}
