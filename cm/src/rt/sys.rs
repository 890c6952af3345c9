//! The few system calls the transports need that std, tokio and socket2 do not wrap. This is
//! the only module of the crate with `unsafe` code.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

/// Sets `IP_MTU_DISCOVER = IP_PMTUDISC_DO` on an IPv4 socket: the kernel sets DF and, for an
/// unconnected socket, IP ID 0 (see the `udp` module docs).
pub(crate) fn set_pmtudisc_do(sock: &impl AsRawFd) -> io::Result<()> {
    let val: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: `sock` is an open socket descriptor for the duration of the call; the option
    // value points to a live `c_int` whose exact size is passed as the option length.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
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
