//! The umad device through libc's `open`, `read`, `write`, `ioctl` and `poll` symbols, which
//! ibsim's umad2sim preload wraps (it does not wrap `open64`/`openat`, which `std::fs` calls,
//! so `ibcm::rt::umad` cannot open its simulated device).

use std::ffi::CString;
use std::io;

/// `struct ib_user_mad_reg_req` (include/uapi/rdma/ib_user_mad.h), 28 bytes with padding.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UmadRegReq {
    pub id: u32,
    pub method_mask: [u32; 4],
    pub qpn: u8,
    pub mgmt_class: u8,
    pub mgmt_class_version: u8,
    pub oui: [u8; 3],
    pub rmpp_version: u8,
}

/// `IB_USER_MAD_REGISTER_AGENT = _IOWR(0x1b, 1, struct ib_user_mad_reg_req)`.
const IB_USER_MAD_REGISTER_AGENT: u64 =
    (3 << 30) | ((core::mem::size_of::<UmadRegReq>() as u64) << 16) | (0x1b << 8) | 1;

/// An open umad device file (closed on drop).
pub struct Umad {
    fd: libc::c_int,
}

impl Umad {
    /// `open(path, O_RDWR)` through the `open` symbol.
    pub fn open(path: &str) -> io::Result<Self> {
        let c = CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `c` is a NUL-terminated string alive for the call; `open` reads it only.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Umad { fd })
    }

    /// Registers an agent; returns its ID.
    pub fn register(&self, req: &mut UmadRegReq) -> io::Result<u32> {
        // SAFETY: `self.fd` is open; `req` is a live, properly sized and aligned
        // `struct ib_user_mad_reg_req` that the call reads and writes (the ID).
        let rc = unsafe {
            libc::ioctl(
                self.fd,
                IB_USER_MAD_REGISTER_AGENT as _,
                req as *mut UmadRegReq,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(req.id)
    }

    /// Writes one record.
    pub fn write(&self, rec: &[u8]) -> io::Result<usize> {
        // SAFETY: `rec` is a live buffer of `rec.len()` readable bytes.
        let n = unsafe { libc::write(self.fd, rec.as_ptr().cast(), rec.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Waits up to `timeout_ms` for a record and reads it; `Ok(None)` when none came.
    /// (umad2sim's `read` returns a negative count without errno on an empty queue.)
    pub fn read_timeout(&self, buf: &mut [u8], timeout_ms: i32) -> io::Result<Option<usize>> {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `p` is one live, writable `pollfd` for the duration of the call.
        let rc = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            // umad2sim's poll can fail without setting errno (as its read does): nothing read
            return if e.raw_os_error() == Some(0) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        if rc == 0 {
            return Ok(None);
        }
        // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes.
        let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
        Ok((n > 0).then_some(n as usize))
    }
}

impl Drop for Umad {
    fn drop(&mut self) {
        // SAFETY: `self.fd` is the descriptor this value opened and owns; closed once here.
        unsafe { libc::close(self.fd) };
    }
}
