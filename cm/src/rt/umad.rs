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
//! MAD per call ([`DatagramTransport`]'s default `recv_batch`/`send_batch`); the driver still
//! takes every ready command per turn and sends a turn's MADs together.
//!
//! umad rewrites the high 32 bits of the TID of every request MAD it sends with the agent's
//! `hi_tid` (docs/interop.md §8.10); the core never compares TIDs, so this is harmless.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use ibcm_mad::{Gid, Lid, Qkey, Qpn, MAD_LEN};
use tokio::io::unix::AsyncFd;

use super::sys;
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
}

/// Counters of a [`UmadTransport`] (reported through [`DatagramTransport::stats`]).
#[derive(Debug, Default, Clone, Copy)]
struct UmadCounts {
    rx: u64,
    tx: u64,
    /// Records shorter than a header and a MAD.
    short: u64,
    /// Completions of failed sends (non-zero status).
    send_failed: u64,
}

impl UmadTransport {
    /// Opens `path` (e.g. `/dev/infiniband/umad0`) and registers the CM agent. `local_gid` is
    /// this port's GID at `gid_index` (on RoCE: the IPv4-mapped GID of the netdev's address;
    /// see `/sys/class/infiniband/<dev>/ports/1/gids/<index>`).
    ///
    /// # Errors
    /// [`UmadError`]; [`UmadError::CmClassTaken`] when the kernel CM is loaded.
    pub fn open(path: impl AsRef<Path>, gid_index: u8, local_gid: Gid) -> Result<Self, UmadError> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(|source| UmadError::Open {
                path: path.clone(),
                source,
            })?;
        sys::umad_enable_pkey(&file).map_err(|source| UmadError::Ioctl {
            what: "IB_USER_MAD_ENABLE_PKEY",
            path: path.clone(),
            source,
        })?;
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
        let fd = sys::async_fd(file).map_err(|source| UmadError::Ioctl {
            what: "registering with the tokio reactor",
            path: path.clone(),
            source,
        })?;
        Ok(UmadTransport {
            fd,
            agent,
            gid_index,
            local: PeerAddr::Ib(IbAddr::roce(local_gid)),
            buf: Box::new([0; UMAD_HDR_LEN + MAD_LEN]),
            counts: UmadCounts::default(),
        })
    }

    /// The agent ID the kernel assigned.
    pub fn agent(&self) -> u32 {
        self.agent
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
        let hdr = UmadHdr::for_send(self.agent, &ib, self.gid_index).encode();
        let mut rec = [0u8; UMAD_HDR_LEN + MAD_LEN];
        rec.get_mut(..UMAD_HDR_LEN)
            .unwrap_or(&mut [])
            .copy_from_slice(&hdr);
        let n = mad.len().min(MAD_LEN);
        if let (Some(dst), Some(src)) = (rec.get_mut(UMAD_HDR_LEN..UMAD_HDR_LEN + n), mad.get(..n))
        {
            dst.copy_from_slice(src);
        }
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|f| f.get_ref().write(&rec)) {
                Ok(r) => {
                    r?;
                    self.counts.tx += 1;
                    return Ok(());
                }
                Err(_would_block) => continue,
            }
        }
    }

    async fn recv(&mut self) -> io::Result<(PeerAddr, Bytes)> {
        loop {
            let mut guard = self.fd.readable().await?;
            let buf = &mut self.buf[..];
            match guard.try_io(|f| f.get_ref().read(buf)) {
                Ok(Ok(n)) => {
                    let Some(hdr) = self.buf.first_chunk::<UMAD_HDR_LEN>() else {
                        continue;
                    };
                    let hdr = UmadHdr::decode(hdr);
                    if hdr.status != 0 {
                        // A failed send's completion.
                        self.counts.send_failed += 1;
                        continue;
                    }
                    self.counts.rx += 1;
                    if n < UMAD_HDR_LEN + MAD_LEN {
                        self.counts.short += 1;
                        continue;
                    }
                    let mad = self
                        .buf
                        .get(UMAD_HDR_LEN..UMAD_HDR_LEN + MAD_LEN)
                        .unwrap_or(&[]);
                    return Ok((PeerAddr::Ib(hdr.peer()), Bytes::copy_from_slice(mad)));
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    fn local_addr(&self) -> PeerAddr {
        self.local
    }

    fn stats(&self) -> TransportStats {
        let c = self.counts;
        TransportStats {
            rx: c.rx,
            tx: c.tx,
            dropped: vec![("short_record", c.short)],
            other: vec![("send_failed", c.send_failed)],
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

    #[test]
    fn missing_device_is_a_clear_error() {
        let e = UmadTransport::open("/nonexistent/umad9", 0, Gid::ZERO).unwrap_err();
        assert!(matches!(e, UmadError::Open { .. }));
        assert!(e.to_string().contains("/nonexistent/umad9"));
    }
}
