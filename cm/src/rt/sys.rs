//! The few system calls the transports need that std, tokio and socket2 do not wrap. This and
//! the core's `proto/sys.rs` (huge-page advice) are the only modules of the crate with
//! `unsafe` code.
#![allow(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use socket2::{SockAddr, SockAddrStorage};

/// `setsockopt(level, name)` with an `int` value.
fn setsockopt_int(
    sock: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `sock` is an open socket descriptor for the duration of the call; the option
    // value points to a live `c_int` whose exact size is passed as the option length.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&val as *const libc::c_int).cast(),
            core::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets `IP_MTU_DISCOVER = IP_PMTUDISC_DO` on an IPv4 socket: the kernel sets DF and, for an
/// unconnected socket, IP ID 0 (see the `udp` module docs).
pub(crate) fn set_pmtudisc_do(sock: &impl AsRawFd) -> io::Result<()> {
    setsockopt_int(
        sock,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DO,
    )
}

/// Sets `UDP_NO_CHECK6_RX` on an IPv6 UDP socket: datagrams with UDP checksum 0 (rxe's RoCEv2
/// over IPv6) are delivered instead of dropped (see the `udp` module docs).
pub(crate) fn set_udp_no_check6_rx(sock: &impl AsRawFd) -> io::Result<()> {
    setsockopt_int(sock, libc::IPPROTO_UDP, libc::UDP_NO_CHECK6_RX, 1)
}

/// Sets `UDP_NO_CHECK6_TX` on an IPv6 UDP socket: it sends UDP checksum 0, as rxe does (tests
/// of the receive side only).
#[cfg(test)]
pub(crate) fn set_udp_no_check6_tx(sock: &impl AsRawFd) -> io::Result<()> {
    setsockopt_int(sock, libc::IPPROTO_UDP, libc::UDP_NO_CHECK6_TX, 1)
}

/// Datagrams moved per `recvmmsg`/`sendmmsg` call.
pub(crate) const MMSG_BATCH: usize = 64;

/// What `recv_mmsg` reports about one received datagram.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received {
    /// Bytes stored in the datagram's buffer.
    pub(crate) len: usize,
    /// The source address (`None` for a family other than IPv4/IPv6).
    pub(crate) from: Option<SocketAddr>,
    /// The datagram was longer than its buffer (`MSG_TRUNC`).
    pub(crate) truncated: bool,
}

/// The socket address the kernel wrote into `storage` (`len` bytes), if IPv4 or IPv6.
fn socket_addr_of(storage: SockAddrStorage, len: libc::socklen_t) -> Option<SocketAddr> {
    // SAFETY: `storage` is a socket address storage (size and alignment fit every family)
    // of which the kernel initialised the first `len` bytes, the rest being zeroed.
    let sa = unsafe { SockAddr::new(storage, len) };
    sa.as_socket()
}

/// Receives up to `bufs.len()` (at most [`MMSG_BATCH`]) datagrams with one `recvmmsg`
/// without blocking (`MSG_DONTWAIT`). Returns how many arrived, described in `out` (in
/// order); `WouldBlock` if none was waiting.
pub(crate) fn recv_mmsg<const N: usize>(
    sock: &impl AsRawFd,
    bufs: &mut [[u8; N]],
    out: &mut [Received; MMSG_BATCH],
) -> io::Result<usize> {
    let n = bufs.len().min(MMSG_BATCH);
    let mut addrs: [SockAddrStorage; MMSG_BATCH] =
        core::array::from_fn(|_| SockAddrStorage::zeroed());
    // SAFETY: all-zero bytes are valid for these C structs (null pointers, zero lengths).
    let mut iovs: [libc::iovec; MMSG_BATCH] = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; MMSG_BATCH] = unsafe { core::mem::zeroed() };
    for (((buf, iov), hdr), addr) in bufs
        .iter_mut()
        .zip(iovs.iter_mut())
        .zip(hdrs.iter_mut())
        .zip(addrs.iter_mut())
        .take(n)
    {
        iov.iov_base = buf.as_mut_ptr().cast();
        iov.iov_len = N;
        hdr.msg_hdr.msg_iov = iov;
        hdr.msg_hdr.msg_iovlen = 1;
        hdr.msg_hdr.msg_namelen = addr.size_of();
        hdr.msg_hdr.msg_name = (addr as *mut SockAddrStorage).cast();
    }
    // SAFETY: `sock` is an open socket for the duration of the call. The first `n` headers
    // each point to one live iovec (over a distinct `N`-byte buffer of `bufs`, borrowed
    // mutably for the call) and to a distinct live `sockaddr_storage` whose size is given;
    // no control buffer. The kernel writes at most those bytes and the headers' lengths and
    // flags. `n <= MMSG_BATCH` is the length of `hdrs`. A null timeout is allowed.
    let rc = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            core::ptr::null_mut(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = (rc as usize).min(n);
    for ((hdr, addr), o) in hdrs.iter().zip(addrs).zip(out.iter_mut()).take(got) {
        *o = Received {
            len: (hdr.msg_len as usize).min(N),
            from: socket_addr_of(addr, hdr.msg_hdr.msg_namelen),
            truncated: hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
        };
    }
    Ok(got)
}

/// Sends `msgs` (at most [`MMSG_BATCH`] are taken), each datagram to its address, with
/// one `sendmmsg` without blocking (`MSG_DONTWAIT`). Returns how many were sent, from the
/// first on: fewer than offered when the next one failed (sending it alone reports why), an
/// error when the first one failed (`WouldBlock` when the send buffer is full).
pub(crate) fn send_mmsg<'a>(
    sock: &impl AsRawFd,
    msgs: impl IntoIterator<Item = (SocketAddr, &'a [u8])>,
) -> io::Result<usize> {
    let mut n = 0;
    let mut addrs: [SockAddrStorage; MMSG_BATCH] =
        core::array::from_fn(|_| SockAddrStorage::zeroed());
    // SAFETY: all-zero bytes are valid for these C structs (null pointers, zero lengths).
    let mut iovs: [libc::iovec; MMSG_BATCH] = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; MMSG_BATCH] = unsafe { core::mem::zeroed() };
    for ((((to, data), iov), hdr), addr) in msgs
        .into_iter()
        .zip(iovs.iter_mut())
        .zip(hdrs.iter_mut())
        .zip(addrs.iter_mut())
    {
        n += 1;
        let sa = SockAddr::from(to);
        let len = sa.len();
        *addr = sa.as_storage();
        // The kernel only reads through this pointer (`sendmmsg`).
        iov.iov_base = data.as_ptr().cast_mut().cast();
        iov.iov_len = data.len();
        hdr.msg_hdr.msg_iov = iov;
        hdr.msg_hdr.msg_iovlen = 1;
        hdr.msg_hdr.msg_name = (addr as *mut SockAddrStorage).cast();
        hdr.msg_hdr.msg_namelen = len;
    }
    // SAFETY: `sock` is an open socket for the duration of the call. The first `n` headers
    // each point to one live iovec over a datagram borrowed for `'a` (beyond the call; read
    // only) and to a live socket address of the given length; no control buffer. The kernel
    // writes only the headers' `msg_len`. `n <= MMSG_BATCH` (the zip stops at the length of
    // the arrays), the length of `hdrs`.
    let rc = unsafe {
        libc::sendmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((rc as usize).min(n))
}

/// `struct ib_user_mad_reg_req` (include/uapi/rdma/ib_user_mad.h), 28 bytes with padding.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct UmadRegReq {
    pub(crate) id: u32,
    pub(crate) method_mask: [u32; 4],
    pub(crate) qpn: u8,
    pub(crate) mgmt_class: u8,
    pub(crate) mgmt_class_version: u8,
    pub(crate) oui: [u8; 3],
    pub(crate) rmpp_version: u8,
}

const IB_IOCTL_MAGIC: u64 = 0x1b;

/// `_IOC(dir, type, nr, size)` for Linux (x86, arm: dir bits 30-31, size bits 16-29).
const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (IB_IOCTL_MAGIC << 8) | nr
}

/// `IB_USER_MAD_REGISTER_AGENT = _IOWR(0x1b, 1, struct ib_user_mad_reg_req)`.
pub(crate) const IB_USER_MAD_REGISTER_AGENT: u64 =
    ioc(3, 1, core::mem::size_of::<UmadRegReq>() as u64);
/// `IB_USER_MAD_ENABLE_PKEY = _IO(0x1b, 3)`.
pub(crate) const IB_USER_MAD_ENABLE_PKEY: u64 = ioc(0, 3, 0);

/// Enables the P_Key index field in the umad header (the 64-byte header layout).
pub(crate) fn umad_enable_pkey(fd: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: `fd` is an open umad descriptor; this ioctl takes no argument.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), IB_USER_MAD_ENABLE_PKEY as _) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Registers an agent; returns the agent ID the kernel assigned.
pub(crate) fn umad_register(fd: &impl AsRawFd, req: &mut UmadRegReq) -> io::Result<u32> {
    // SAFETY: `fd` is an open umad descriptor and `req` points to a live, properly sized and
    // aligned `struct ib_user_mad_reg_req` that the kernel reads and writes (the ID).
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            IB_USER_MAD_REGISTER_AGENT as _,
            req as *mut UmadRegReq,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(req.id)
}

/// Registers an owned file with the tokio reactor.
pub(crate) fn async_fd(file: std::fs::File) -> io::Result<tokio::io::unix::AsyncFd<std::fs::File>> {
    // SAFETY: the `File` owns its descriptor and moves into the `AsyncFd`, so the descriptor
    // stays open and refers to the same file description for the `AsyncFd`'s whole life, and
    // `File::as_raw_fd` always returns that same descriptor.
    unsafe { tokio::io::unix::AsyncFd::register(file) }.map_err(|e| e.into_parts().1)
}

/// The soft limit of open descriptors of this process (`RLIMIT_NOFILE`); `None` when
/// unlimited or unknown.
pub(crate) fn nofile_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a live, writable `rlimit` for the duration of the call, which only
    // writes it.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_header() {
        // _IOWR(0x1b, 1, 28-byte struct) and _IO(0x1b, 3).
        assert_eq!(core::mem::size_of::<UmadRegReq>(), 28);
        assert_eq!(IB_USER_MAD_REGISTER_AGENT, 0xc01c_1b01);
        assert_eq!(IB_USER_MAD_ENABLE_PKEY, 0x0000_1b03);
    }
}

/// The daemon's state directory (`node::journal`): opens and renames relative to an open
/// directory, so that no path component can be swapped between a check and a use.
pub(crate) mod at {
    use std::ffi::CString;
    use std::fs::File;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd};

    fn c_name(name: &str) -> io::Result<CString> {
        CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
    }

    /// `openat(dir, name, flags | O_CLOEXEC, mode)`.
    pub(crate) fn open(
        dir: &impl AsRawFd,
        name: &str,
        flags: libc::c_int,
        mode: u32,
    ) -> io::Result<File> {
        let c = c_name(name)?;
        // SAFETY: `dir` is an open descriptor for the duration of the call and `c` a
        // NUL-terminated string that outlives it; the mode is passed as the variadic
        // `mode_t` argument `openat` reads when `O_CREAT` is set.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by `openat` and is owned by nothing else: the
        // `File` becomes its only owner and closes it.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// `renameat(dir, from, dir, to)`.
    pub(crate) fn rename(dir: &impl AsRawFd, from: &str, to: &str) -> io::Result<()> {
        let (f, t) = (c_name(from)?, c_name(to)?);
        // SAFETY: `dir` is an open descriptor and both names NUL-terminated strings that
        // outlive the call.
        let rc =
            unsafe { libc::renameat(dir.as_raw_fd(), f.as_ptr(), dir.as_raw_fd(), t.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// `unlinkat(dir, name, 0)` (a symlink is removed, never followed); a missing name is no
    /// error.
    pub(crate) fn unlink(dir: &impl AsRawFd, name: &str) -> io::Result<()> {
        let c = c_name(name)?;
        // SAFETY: `dir` is an open descriptor and `c` a NUL-terminated string that outlives
        // the call.
        let rc = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::NotFound {
            Ok(())
        } else {
            Err(e)
        }
    }

    /// `flock(fd, LOCK_EX | LOCK_NB)`: `Ok(false)` if another open file holds the lock.
    pub(crate) fn try_lock(f: &impl AsRawFd) -> io::Result<bool> {
        // SAFETY: `f` is an open descriptor for the duration of the call; `flock` touches no
        // memory of ours.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(false)
        } else {
            Err(e)
        }
    }

    /// The process's effective user ID.
    pub(crate) fn euid() -> u32 {
        // SAFETY: `geteuid` takes no arguments, touches no memory and cannot fail.
        unsafe { libc::geteuid() }
    }
}
