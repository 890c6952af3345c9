//! The FFI half of [`super`]: the declarations of `csrc/rc.c`, the mirrors of its structs,
//! and one owner type per libibverbs object, each released exactly once in `Drop`.
//!
//! With `../ffi.rs` the only place of the crate with `unsafe`. Every block states why it is
//! sound. Rust never looks inside a libibverbs structure: it holds opaque pointers and passes
//! them back to the shim. Memory-region contents are only ever copied in and out by the shim
//! (`ibcm_rc_mr_write` / `ibcm_rc_mr_read`), so no Rust reference ever aliases memory that
//! the device (or a remote peer with the rkey) may write.
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_char, c_int, CString};
use std::io;
use std::marker::{PhantomData, PhantomPinned};

use crate::verbs::ffi::{ibcm_xrc_modify_qp, IbvQp, ShimQpAttr};
use crate::verbs::VerbsError;

macro_rules! opaque {
    ($name:ident) => {
        #[repr(C)]
        pub(super) struct $name {
            _data: [u8; 0],
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    };
}

opaque!(RcDev);
opaque!(RcCq);
opaque!(RcMr);

/// Mirror of `struct ibcm_rc_dev_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct DevAttr {
    pub(super) max_mr_size: u64,
    pub(super) max_qp_wr: u32,
    pub(super) max_cqe: u32,
    pub(super) max_sge: u32,
    pub(super) max_qp_rd_atom: u8,
    pub(super) max_qp_init_rd_atom: u8,
    pub(super) phys_port_cnt: u8,
    pub(super) pad: u8,
}

/// Mirror of `struct ibcm_rc_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PortAttr {
    pub(super) state: u32,
    pub(super) max_mtu: u32,
    pub(super) active_mtu: u32,
    pub(super) gid_tbl_len: u32,
    pub(super) link_layer: u8,
    pub(super) pad: [u8; 3],
}

/// Mirror of `struct ibcm_rc_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Wc {
    pub(super) wr_id: u64,
    pub(super) status: u32,
    pub(super) opcode: u32,
    pub(super) byte_len: u32,
    pub(super) qp_num: u32,
    pub(super) vendor_err: u32,
    pub(super) pad: u32,
}

extern "C" {
    fn ibcm_rc_open(name: *const c_char, out: *mut *mut RcDev, attr: *mut DevAttr) -> c_int;
    fn ibcm_rc_close(d: *mut RcDev);
    fn ibcm_rc_query_port(d: *mut RcDev, port: u8, out: *mut PortAttr) -> c_int;
    fn ibcm_rc_query_gid(d: *mut RcDev, port: u8, index: c_int, gid: *mut u8) -> c_int;
    fn ibcm_rc_cq_create(d: *mut RcDev, cqe: c_int, out: *mut *mut RcCq, fd: *mut c_int) -> c_int;
    fn ibcm_rc_cq_destroy(c: *mut RcCq) -> c_int;
    fn ibcm_rc_cq_arm(c: *mut RcCq) -> c_int;
    fn ibcm_rc_cq_take_event(c: *mut RcCq) -> c_int;
    fn ibcm_rc_cq_poll(c: *mut RcCq, out: *mut Wc, n: c_int) -> c_int;
    fn ibcm_rc_mr_reg(
        d: *mut RcDev,
        len: usize,
        access: c_int,
        out: *mut *mut RcMr,
        addr: *mut u64,
        lkey: *mut u32,
        rkey: *mut u32,
    ) -> c_int;
    fn ibcm_rc_mr_dereg(m: *mut RcMr) -> c_int;
    fn ibcm_rc_mr_write(m: *mut RcMr, off: usize, src: *const u8, len: usize) -> c_int;
    fn ibcm_rc_mr_read(m: *mut RcMr, off: usize, dst: *mut u8, len: usize) -> c_int;
    fn ibcm_rc_qp_create(
        d: *mut RcDev,
        send_cq: *mut RcCq,
        recv_cq: *mut RcCq,
        max_send_wr: u32,
        max_recv_wr: u32,
        max_inline: u32,
        out: *mut *mut IbvQp,
        qpn: *mut u32,
    ) -> c_int;
    fn ibcm_rc_qp_to_error(qp: *mut IbvQp) -> c_int;
    fn ibcm_rc_qp_state(qp: *mut IbvQp, state: *mut u32) -> c_int;
    fn ibcm_xrc_destroy_qp(qp: *mut IbvQp) -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn ibcm_rc_post_send(
        qp: *mut IbvQp,
        wr_id: u64,
        op: c_int,
        m: *mut RcMr,
        off: usize,
        len: u32,
        raddr: u64,
        rkey: u32,
        signaled: c_int,
    ) -> c_int;
    fn ibcm_rc_post_recv(qp: *mut IbvQp, wr_id: u64, m: *mut RcMr, off: usize, len: u32) -> c_int;
    #[cfg(test)]
    fn ibcm_rc_dev_attr_size() -> usize;
    #[cfg(test)]
    fn ibcm_rc_port_attr_size() -> usize;
    #[cfg(test)]
    fn ibcm_rc_wc_size() -> usize;
}

const ENOENT: c_int = 2;
const ENOMEM: c_int = 12;
const ENODEV: c_int = 19;
const EAGAIN: c_int = 11;

/// An OS error from verb `op`.
pub(super) fn os(op: &'static str, errno: c_int) -> VerbsError {
    match errno {
        ENOMEM => VerbsError::NoResources { what: op },
        _ => VerbsError::Os {
            op,
            errno,
            message: io::Error::from_raw_os_error(errno).to_string(),
        },
    }
}

fn check(op: &'static str, rc: c_int) -> Result<(), VerbsError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(os(op, rc))
    }
}

/// An opened device and its protection domain.
#[derive(Debug)]
pub(super) struct DevRaw {
    ptr: *mut RcDev,
}

// SAFETY: the pointer is owned by this value and released once in Drop; libibverbs contexts
// and PDs may be used from any thread and concurrently (rdma-core's verbs are thread-safe).
unsafe impl Send for DevRaw {}
// SAFETY: as above: every call through `&self` is a thread-safe libibverbs call.
unsafe impl Sync for DevRaw {}

impl DevRaw {
    pub(super) fn open(name: &str) -> Result<(Self, DevAttr), VerbsError> {
        let cname = CString::new(name).map_err(|_| VerbsError::DeviceNotFound {
            name: name.to_owned(),
        })?;
        let mut ptr: *mut RcDev = std::ptr::null_mut();
        let mut attr = DevAttr::default();
        // SAFETY: `cname` is NUL-terminated and alive for the call; the out pointers point to
        // live locals.
        let rc = unsafe { ibcm_rc_open(cname.as_ptr(), &mut ptr, &mut attr) };
        match rc {
            0 => Ok((Self { ptr }, attr)),
            ENODEV => Err(VerbsError::NoDevice),
            ENOENT => Err(VerbsError::DeviceNotFound {
                name: name.to_owned(),
            }),
            e => Err(os("ibv_open_device", e)),
        }
    }

    pub(super) fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        let mut a = PortAttr::default();
        // SAFETY: `self.ptr` is live; `a` is a live local laid out like the C struct.
        check("ibv_query_port", unsafe {
            ibcm_rc_query_port(self.ptr, port, &mut a)
        })?;
        Ok(a)
    }

    pub(super) fn query_gid(&self, port: u8, index: u8) -> Result<[u8; 16], VerbsError> {
        let mut gid = [0u8; 16];
        // SAFETY: `self.ptr` is live; `gid` has the 16 bytes the shim writes.
        check("ibv_query_gid", unsafe {
            ibcm_rc_query_gid(self.ptr, port, c_int::from(index), gid.as_mut_ptr())
        })?;
        Ok(gid)
    }
}

impl Drop for DevRaw {
    fn drop(&mut self) {
        // SAFETY: `self.ptr` came from `ibcm_rc_open` and is closed once, here. Every object
        // created on it holds an `Arc` of its owner, so none is left.
        unsafe { ibcm_rc_close(self.ptr) };
    }
}

/// A CQ with its completion channel.
#[derive(Debug)]
pub(super) struct CqRaw {
    ptr: *mut RcCq,
    fd: c_int,
}

// SAFETY: owned pointer, released once in Drop; CQ polling, arming and the channel's
// non-blocking reads are thread-safe in libibverbs.
unsafe impl Send for CqRaw {}
// SAFETY: as above.
unsafe impl Sync for CqRaw {}

impl CqRaw {
    pub(super) fn create(dev: &DevRaw, cqe: u32) -> Result<Self, VerbsError> {
        let mut ptr: *mut RcCq = std::ptr::null_mut();
        let mut fd: c_int = -1;
        let cqe = c_int::try_from(cqe).unwrap_or(c_int::MAX);
        // SAFETY: `dev.ptr` is live (the caller holds the device); out pointers are locals.
        check("ibv_create_cq", unsafe {
            ibcm_rc_cq_create(dev.ptr, cqe, &mut ptr, &mut fd)
        })?;
        Ok(Self { ptr, fd })
    }

    pub(super) fn fd(&self) -> c_int {
        self.fd
    }

    pub(super) fn arm(&self) -> Result<(), VerbsError> {
        // SAFETY: `self.ptr` is a live CQ.
        check("ibv_req_notify_cq", unsafe { ibcm_rc_cq_arm(self.ptr) })
    }

    /// One pending completion event taken and acknowledged: `Ok(true)`; none: `Ok(false)`.
    pub(super) fn take_event(&self) -> Result<bool, VerbsError> {
        // SAFETY: `self.ptr` is a live CQ; the channel fd is non-blocking.
        match unsafe { ibcm_rc_cq_take_event(self.ptr) } {
            0 => Ok(true),
            EAGAIN => Ok(false),
            e => Err(os("ibv_get_cq_event", e)),
        }
    }

    pub(super) fn poll(&self, out: &mut [Wc]) -> Result<usize, VerbsError> {
        let n = c_int::try_from(out.len().min(16)).unwrap_or(16);
        // SAFETY: `self.ptr` is a live CQ; `out` has room for `n` entries (n <= out.len()).
        let got = unsafe { ibcm_rc_cq_poll(self.ptr, out.as_mut_ptr(), n) };
        usize::try_from(got).map_err(|_| os("ibv_poll_cq", got.saturating_neg()))
    }
}

impl Drop for CqRaw {
    fn drop(&mut self) {
        // SAFETY: `self.ptr` came from `ibcm_rc_cq_create` and is destroyed once, here; every
        // QP on it holds an `Arc` of its owner and is gone already. Every event taken was
        // acknowledged at once, so ibv_destroy_cq does not wait.
        unsafe { ibcm_rc_cq_destroy(self.ptr) };
    }
}

/// A registered buffer, allocated (and freed) by the shim.
#[derive(Debug)]
pub(super) struct MrRaw {
    ptr: *mut RcMr,
    pub(super) addr: u64,
    pub(super) len: usize,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
}

// SAFETY: owned pointer, released once in Drop. The buffer is only read or written by the
// shim's copies (plain memcpy of bytes: any bit pattern is valid) and by the device.
unsafe impl Send for MrRaw {}
// SAFETY: as above; concurrent copies of bytes race at worst with each other or the device
// inside C, never through a Rust reference.
unsafe impl Sync for MrRaw {}

impl MrRaw {
    pub(super) fn register(dev: &DevRaw, len: usize, access: u32) -> Result<Self, VerbsError> {
        let mut ptr: *mut RcMr = std::ptr::null_mut();
        let (mut addr, mut lkey, mut rkey) = (0u64, 0u32, 0u32);
        let access = c_int::try_from(access).unwrap_or(0);
        // SAFETY: `dev.ptr` is live; out pointers are live locals.
        check("ibv_reg_mr", unsafe {
            ibcm_rc_mr_reg(
                dev.ptr, len, access, &mut ptr, &mut addr, &mut lkey, &mut rkey,
            )
        })?;
        Ok(Self {
            ptr,
            addr,
            len,
            lkey,
            rkey,
        })
    }

    pub(super) fn write(&self, off: usize, src: &[u8]) -> Result<(), VerbsError> {
        // SAFETY: `self.ptr` is live; `src` is valid for `src.len()` bytes; the shim checks
        // `off + len` against the buffer's length.
        check("write", unsafe {
            ibcm_rc_mr_write(self.ptr, off, src.as_ptr(), src.len())
        })
    }

    pub(super) fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), VerbsError> {
        // SAFETY: `self.ptr` is live; `dst` is valid for writes of `dst.len()` bytes; the shim
        // checks the range.
        check("read", unsafe {
            ibcm_rc_mr_read(self.ptr, off, dst.as_mut_ptr(), dst.len())
        })
    }
}

impl Drop for MrRaw {
    fn drop(&mut self) {
        // SAFETY: `self.ptr` came from `ibcm_rc_mr_reg`, deregistered and freed once, here.
        // Every QP that had work on it keeps an `Arc` of its owner until the QP is destroyed.
        unsafe { ibcm_rc_mr_dereg(self.ptr) };
    }
}

/// An RC QP.
#[derive(Debug)]
pub(super) struct QpRaw {
    ptr: *mut IbvQp,
    pub(super) qpn: u32,
}

// SAFETY: owned pointer, destroyed once in Drop; posting and modifying are thread-safe in
// libibverbs.
unsafe impl Send for QpRaw {}
// SAFETY: as above.
unsafe impl Sync for QpRaw {}

impl QpRaw {
    pub(super) fn create(
        dev: &DevRaw,
        cq: &CqRaw,
        max_send_wr: u32,
        max_recv_wr: u32,
        max_inline: u32,
    ) -> Result<Self, VerbsError> {
        let mut ptr: *mut IbvQp = std::ptr::null_mut();
        let mut qpn = 0u32;
        // SAFETY: the device and CQ are live (the caller holds both and the QP owner keeps
        // them alive); out pointers are locals.
        check("ibv_create_qp", unsafe {
            ibcm_rc_qp_create(
                dev.ptr,
                cq.ptr,
                cq.ptr,
                max_send_wr,
                max_recv_wr,
                max_inline,
                &mut ptr,
                &mut qpn,
            )
        })?;
        Ok(Self { ptr, qpn })
    }

    pub(super) fn modify(&self, attr: &ShimQpAttr, mask: u32) -> Result<(), VerbsError> {
        let mask = c_int::try_from(mask).map_err(|_| os("ibv_modify_qp", 22))?;
        // SAFETY: `self.ptr` is a live QP; `attr` is a fully initialised struct laid out like
        // the shim's (checked by ffi.rs's `layout_matches_the_shim`).
        check("ibv_modify_qp", unsafe {
            ibcm_xrc_modify_qp(self.ptr, attr, mask)
        })
    }

    pub(super) fn to_error(&self) -> Result<(), VerbsError> {
        // SAFETY: `self.ptr` is a live QP.
        check("ibv_modify_qp", unsafe { ibcm_rc_qp_to_error(self.ptr) })
    }

    pub(super) fn state(&self) -> Result<u32, VerbsError> {
        let mut s = 0u32;
        // SAFETY: `self.ptr` is a live QP; `s` a live local.
        check("ibv_query_qp", unsafe {
            ibcm_rc_qp_state(self.ptr, &mut s)
        })?;
        Ok(s)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn post_send(
        &self,
        wr_id: u64,
        op: c_int,
        mr: &MrRaw,
        off: usize,
        len: u32,
        raddr: u64,
        rkey: u32,
        signaled: bool,
    ) -> Result<(), VerbsError> {
        // SAFETY: the QP and MR are live; the MR stays registered until the QP is destroyed
        // (the safe owner keeps it); the shim checks `off + len` against the MR.
        check("ibv_post_send", unsafe {
            ibcm_rc_post_send(
                self.ptr,
                wr_id,
                op,
                mr.ptr,
                off,
                len,
                raddr,
                rkey,
                c_int::from(signaled),
            )
        })
    }

    pub(super) fn post_recv(
        &self,
        wr_id: u64,
        mr: &MrRaw,
        off: usize,
        len: u32,
    ) -> Result<(), VerbsError> {
        // SAFETY: as for `post_send`.
        check("ibv_post_recv", unsafe {
            ibcm_rc_post_recv(self.ptr, wr_id, mr.ptr, off, len)
        })
    }
}

impl Drop for QpRaw {
    fn drop(&mut self) {
        // SAFETY: `self.ptr` came from `ibcm_rc_qp_create` and is destroyed once, here,
        // before the CQ, MRs and device its owner holds.
        unsafe { ibcm_xrc_destroy_qp(self.ptr) };
    }
}

/// The completion channel's fd as tokio's reactor sees it (never closed by it).
struct ChannelFd(c_int);

impl std::os::fd::AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

/// A CQ's completion channel registered with the tokio reactor.
pub(super) struct ChannelWaiter {
    // Dropped (deregistered) before `_cq`, whose drop closes the fd.
    fd: tokio::io::unix::AsyncFd<ChannelFd>,
    _cq: std::sync::Arc<CqRaw>,
}

impl std::fmt::Debug for ChannelWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChannelWaiter(fd {})", self._cq.fd)
    }
}

impl ChannelWaiter {
    /// Registers `cq`'s channel fd (non-blocking) with the current tokio runtime's reactor.
    pub(super) fn new(cq: std::sync::Arc<CqRaw>) -> io::Result<Self> {
        // SAFETY: the fd is the CQ's completion channel, opened by ibv_create_comp_channel and
        // closed only by `CqRaw`'s Drop; this value holds an `Arc` of that `CqRaw` and drops
        // the registration first (field order), so the fd stays open and is not replaced
        // while it is registered.
        let fd = unsafe { tokio::io::unix::AsyncFd::register(ChannelFd(cq.fd)) }
            .map_err(|e| e.into_parts().1)?;
        Ok(ChannelWaiter { fd, _cq: cq })
    }

    /// Waits until the channel is readable and clears the readiness; the caller then takes
    /// every pending event (an event that arrives after the clear makes it readable again).
    pub(super) async fn readable(&self) -> io::Result<()> {
        let mut g = self.fd.readable().await?;
        g.clear_ready();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_shim() {
        // SAFETY: the three functions only return a constant.
        let (d, p, w) = unsafe {
            (
                ibcm_rc_dev_attr_size(),
                ibcm_rc_port_attr_size(),
                ibcm_rc_wc_size(),
            )
        };
        assert_eq!(d, std::mem::size_of::<DevAttr>());
        assert_eq!(p, std::mem::size_of::<PortAttr>());
        assert_eq!(w, std::mem::size_of::<Wc>());
    }
}
