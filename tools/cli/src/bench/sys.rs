//! The system calls of `cm-bench rate`: `sendmmsg`/`recvmmsg` for its raw UDP baseline (IPv4
//! only) and `getrusage` for CPU time; and the thread's CPU clock of `cm-bench scale`. This and nothing else in the tools has `unsafe` code:
//! it is the benchmark's sys module, as `cm/src/rt/sys.rs` is ibcm's (where the transport's
//! own batched calls live).
#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Datagrams per call: the same batch as ibcm's UDP transport.
pub(crate) const BATCH: usize = 64;

/// Room for one received datagram.
pub(crate) const RECV_LEN: usize = 2048;

fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Sets `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, as ibcm's UDP transport does (DF, IP ID 0).
pub(crate) fn set_pmtudisc_do(sock: &UdpSocket) -> io::Result<()> {
    set_int_opt(
        sock,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DO,
    )
}

/// Sends `count` (at most [`BATCH`]) copies of `payload` to `to` on an unconnected socket
/// with one blocking `sendmmsg`, each with its destination address as ibcm's transport sends
/// them. Returns how many were sent.
pub(crate) fn send_batch(
    sock: &UdpSocket,
    to: SocketAddrV4,
    payload: &[u8],
    count: usize,
) -> io::Result<usize> {
    let n = count.min(BATCH);
    let mut addrs = [sockaddr_in(to); BATCH];
    // SAFETY: all-zero bytes are valid for these C structs (null pointers, zero lengths).
    let mut iovs: [libc::iovec; BATCH] = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { core::mem::zeroed() };
    for ((iov, hdr), addr) in iovs.iter_mut().zip(hdrs.iter_mut()).zip(addrs.iter_mut()) {
        // The kernel only reads through this pointer (`sendmmsg`).
        iov.iov_base = payload.as_ptr().cast_mut().cast();
        iov.iov_len = payload.len();
        hdr.msg_hdr.msg_iov = iov;
        hdr.msg_hdr.msg_iovlen = 1;
        hdr.msg_hdr.msg_name = (addr as *mut libc::sockaddr_in).cast();
        hdr.msg_hdr.msg_namelen = core::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    }
    // SAFETY: `sock` is open for the call; the first `n <= BATCH` headers each point to one
    // live iovec over `payload` (borrowed for the call, read only) and to a live
    // `sockaddr_in` of the given size; no control buffer. The kernel writes only `msg_len`.
    let rc = unsafe { libc::sendmmsg(sock.as_raw_fd(), hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// Receives up to [`BATCH`] datagrams with one `recvmmsg`: with `wait`, it blocks for the
/// first one only (`MSG_WAITFORONE`; the socket's receive timeout applies); without, it
/// never blocks (`MSG_DONTWAIT`: `WouldBlock` when nothing is there). Returns how many
/// arrived.
pub(crate) fn recv_batch(
    sock: &UdpSocket,
    bufs: &mut [[u8; RECV_LEN]],
    wait: bool,
) -> io::Result<usize> {
    let flags = if wait {
        libc::MSG_WAITFORONE
    } else {
        libc::MSG_DONTWAIT
    };
    let n = bufs.len().min(BATCH);
    // SAFETY: all-zero bytes are valid for these C structs (null pointers, zero lengths).
    let mut iovs: [libc::iovec; BATCH] = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut addrs: [libc::sockaddr_in; BATCH] = unsafe { core::mem::zeroed() };
    for (((buf, iov), hdr), addr) in bufs
        .iter_mut()
        .zip(iovs.iter_mut())
        .zip(hdrs.iter_mut())
        .zip(addrs.iter_mut())
    {
        iov.iov_base = buf.as_mut_ptr().cast();
        iov.iov_len = RECV_LEN;
        hdr.msg_hdr.msg_iov = iov;
        hdr.msg_hdr.msg_iovlen = 1;
        // The source address is read back as ibcm's transport does (it costs a copy).
        hdr.msg_hdr.msg_name = (addr as *mut libc::sockaddr_in).cast();
        hdr.msg_hdr.msg_namelen = core::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    }
    // SAFETY: `sock` is open for the call; the first `n <= BATCH` headers each point to one
    // live iovec over a distinct `RECV_LEN`-byte buffer of `bufs` (borrowed mutably for the
    // call) and to a distinct live `sockaddr_in` whose size is given; no control buffer. The
    // kernel writes at most those bytes and the headers' lengths and flags. A null timeout
    // is allowed.
    let rc = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            flags,
            core::ptr::null_mut(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// Sets an `int` socket option (`SO_RCVBUF`, `SO_SNDBUF`).
pub(crate) fn set_int_opt(
    sock: &UdpSocket,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `sock` is an open socket for the duration of the call; the option value points
    // to a live `c_int` whose exact size is passed as the option length.
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

/// CPU time used so far (user, system), by the calling thread (`thread`) or the whole
/// process.
pub(crate) fn cpu_time(thread: bool) -> io::Result<(Duration, Duration)> {
    let who = if thread {
        libc::RUSAGE_THREAD
    } else {
        libc::RUSAGE_SELF
    };
    // SAFETY: all-zero bytes are a valid `rusage` (plain integers).
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `ru` is a live, writable `rusage` for the kernel to fill.
    let rc = unsafe { libc::getrusage(who, &mut ru) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let d = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Ok((d(ru.ru_utime), d(ru.ru_stime)))
}

/// The calling thread's CPU time from `CLOCK_THREAD_CPUTIME_ID` (nanosecond resolution;
/// `getrusage` may advance only once per scheduler tick, too coarse for a batch of a few
/// milliseconds).
pub(crate) fn thread_cpu_clock() -> io::Result<Duration> {
    // SAFETY: all-zero bytes are a valid `timespec` (plain integers).
    let mut ts: libc::timespec = unsafe { core::mem::zeroed() };
    // SAFETY: `ts` is a live, writable `timespec` for the kernel to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    ))
}
