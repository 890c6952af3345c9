//! `RdmaVerbs`: the [`Verbs`] backend over rdma-core's libibverbs (feature `rdma`).
//!
//! The XRC verbs are `static inline` functions in `<infiniband/verbs.h>`, so they are
//! compiled into a small C shim (`csrc/shim.c`, built by `build.rs` with the `cc` crate)
//! instead of being re-implemented in Rust — the re-implementation is exactly what is broken
//! in rdma-sys 0.3.0 (docs/xrc.md §6.1). The shim exposes flat functions that return an errno
//! and never lets Rust look inside a libibverbs structure; the only shared layout is the
//! shim's own attribute struct, checked against the C `sizeof` in the tests.
//!
//! This module and `rc/sys.rs` (the RC data path) are the only places in the crate with
//! `unsafe`. Every block states why it is
//! sound. The pointers it holds are owned by one [`RdmaVerbs`] value and released exactly once
//! (by the matching destroy verb, or in `Drop`).
//!
//! [`RdmaVerbs::open`] refuses a device without `IBV_DEVICE_XRC` with
//! [`VerbsError::NoXrc`] — what Soft-RoCE (rxe) gives (docs/xrc.md §5).
//!
//! Scope: this is the control-plane backend (domains, TGT QPs, open by number, XRC SRQs and
//! their numbers, INI QPs, modify/query/destroy). INI QPs and SRQs share one PD and one CQ
//! owned by the backend; posting work requests and polling completions are not offered here.
#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::fs::OpenOptions;
use std::io;
use std::marker::{PhantomData, PhantomPinned};
use std::os::fd::AsRawFd;

use crate::types::{DomainSpec, ProcessId, QpHandle, Qpn, SrqHandle, SrqNum, XrcdHandle};
use crate::verbs::model::IBV_DEVICE_XRC;
use crate::verbs::qp::{check_modify, AddressVector, QpAttr, QpState, QpType};
use crate::verbs::{DeviceInfo, IniQpCaps, QpInfo, SrqAttr, Verbs, VerbsError};

macro_rules! opaque {
    ($vis:vis $name:ident) => {
        #[repr(C)]
        $vis struct $name {
            _data: [u8; 0],
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    };
}

opaque!(ShimDev);
opaque!(IbvXrcd);
opaque!(pub(super) IbvQp);
opaque!(IbvSrq);

/// Mirror of `struct ibcm_xrc_av` in `csrc/shim.c` (same fields, same order).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ShimAv {
    pub(super) dgid: [u8; 16],
    pub(super) flow_label: u32,
    pub(super) dlid: u16,
    pub(super) sgid_index: u8,
    pub(super) hop_limit: u8,
    pub(super) traffic_class: u8,
    pub(super) sl: u8,
    pub(super) src_path_bits: u8,
    pub(super) static_rate: u8,
    pub(super) is_global: u8,
    pub(super) port_num: u8,
}

/// Mirror of `struct ibcm_xrc_qp_attr` in `csrc/shim.c`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ShimQpAttr {
    pub(super) qp_state: u32,
    pub(super) cur_qp_state: u32,
    pub(super) path_mtu: u32,
    pub(super) path_mig_state: u32,
    pub(super) qkey: u32,
    pub(super) rq_psn: u32,
    pub(super) sq_psn: u32,
    pub(super) dest_qp_num: u32,
    pub(super) qp_access_flags: u32,
    pub(super) pkey_index: u16,
    pub(super) alt_pkey_index: u16,
    pub(super) en_sqd_async_notify: u8,
    pub(super) max_rd_atomic: u8,
    pub(super) max_dest_rd_atomic: u8,
    pub(super) min_rnr_timer: u8,
    pub(super) port_num: u8,
    pub(super) timeout: u8,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    pub(super) alt_port_num: u8,
    pub(super) alt_timeout: u8,
    pub(super) av: ShimAv,
    pub(super) alt_av: ShimAv,
}

extern "C" {
    fn ibcm_xrc_open(
        name: *const c_char,
        out: *mut *mut ShimDev,
        name_out: *mut c_char,
        name_len: usize,
        cap_flags: *mut u64,
    ) -> c_int;
    fn ibcm_xrc_close(d: *mut ShimDev);
    fn ibcm_xrc_open_xrcd(
        d: *mut ShimDev,
        fd: c_int,
        create: c_int,
        exclusive: c_int,
        out: *mut *mut IbvXrcd,
    ) -> c_int;
    fn ibcm_xrc_close_xrcd(x: *mut IbvXrcd) -> c_int;
    fn ibcm_xrc_create_tgt_qp(
        d: *mut ShimDev,
        x: *mut IbvXrcd,
        out: *mut *mut IbvQp,
        qpn: *mut u32,
    ) -> c_int;
    fn ibcm_xrc_open_tgt_qp(
        d: *mut ShimDev,
        x: *mut IbvXrcd,
        qpn: u32,
        out: *mut *mut IbvQp,
    ) -> c_int;
    fn ibcm_xrc_create_ini_qp(
        d: *mut ShimDev,
        max_send_wr: u32,
        max_send_sge: u32,
        max_inline: u32,
        out: *mut *mut IbvQp,
        qpn: *mut u32,
    ) -> c_int;
    fn ibcm_xrc_create_srq(
        d: *mut ShimDev,
        x: *mut IbvXrcd,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
        out: *mut *mut IbvSrq,
        srqn: *mut u32,
    ) -> c_int;
    fn ibcm_xrc_destroy_srq(s: *mut IbvSrq) -> c_int;
    pub(super) fn ibcm_xrc_modify_qp(qp: *mut IbvQp, a: *const ShimQpAttr, mask: c_int) -> c_int;
    fn ibcm_xrc_query_qp(
        qp: *mut IbvQp,
        state: *mut u32,
        dest_qpn: *mut u32,
        qp_type: *mut u32,
        qpn: *mut u32,
    ) -> c_int;
    fn ibcm_xrc_destroy_qp(qp: *mut IbvQp) -> c_int;
    #[cfg(test)]
    fn ibcm_xrc_av_size() -> usize;
    #[cfg(test)]
    fn ibcm_xrc_qp_attr_size() -> usize;
}

const ENOENT: c_int = 2;
const ENOMEM: c_int = 12;
const EBUSY: c_int = 16;
const ENODEV: c_int = 19;
const EINVAL: c_int = 22;
const ENOSYS: c_int = 38;
const EOPNOTSUPP: c_int = 95;

fn os(op: &'static str, errno: c_int) -> VerbsError {
    VerbsError::Os {
        op,
        errno,
        message: io::Error::from_raw_os_error(errno).to_string(),
    }
}

#[derive(Debug)]
struct XrcdEntry {
    ptr: *mut IbvXrcd,
    users: usize,
}

#[derive(Debug)]
struct QpEntry {
    ptr: *mut IbvQp,
    via: Option<u32>,
    qp_type: QpType,
    qpn: Qpn,
}

#[derive(Debug)]
struct SrqEntry {
    ptr: *mut IbvSrq,
    via: u32,
    srqn: SrqNum,
}

/// The rdma-core backend: one opened device in this process.
#[derive(Debug)]
pub struct RdmaVerbs {
    dev: *mut ShimDev,
    name: String,
    cap_flags: u64,
    xrcds: BTreeMap<u32, XrcdEntry>,
    qps: BTreeMap<u32, QpEntry>,
    srqs: BTreeMap<u32, SrqEntry>,
    next: u32,
}

// SAFETY: every pointer in `RdmaVerbs` is owned by it alone and only used through `&mut self`
// or `&self` methods, so it is never used from two threads at once. libibverbs objects may be
// used from any thread (rdma-core's verbs are thread-safe); none is tied to the creating thread.
unsafe impl Send for RdmaVerbs {}

impl RdmaVerbs {
    /// Opens `device` (or the first device) and checks `IBV_DEVICE_XRC`.
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`], [`VerbsError::DeviceNotFound`], or [`VerbsError::NoXrc`]
    /// ("device rxe0 has no XRC") when the capability flag is absent.
    pub fn open(device: Option<&str>) -> Result<Self, VerbsError> {
        let v = Self::open_unchecked(device)?;
        if v.cap_flags & IBV_DEVICE_XRC == 0 {
            return Err(VerbsError::NoXrc {
                device: v.name.clone(),
                cap_flags: v.cap_flags,
                provider_errno: None,
            });
        }
        Ok(v)
    }

    /// Opens the device without checking for XRC (the verbs then fail one by one; used by
    /// `xrc-probe --force` to show what the provider answers).
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`], [`VerbsError::DeviceNotFound`], [`VerbsError::Os`].
    pub fn open_unchecked(device: Option<&str>) -> Result<Self, VerbsError> {
        let cname = match device {
            Some(n) => Some(
                CString::new(n).map_err(|_| VerbsError::DeviceNotFound { name: n.to_owned() })?,
            ),
            None => None,
        };
        let mut dev: *mut ShimDev = std::ptr::null_mut();
        let mut name_buf = [0 as c_char; 64];
        let mut cap_flags = 0u64;
        let name_ptr = cname.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        // SAFETY: `name_ptr` is null or a NUL-terminated string alive for the call; the out
        // pointers point to live locals; `name_buf` has the length passed, and the shim
        // always NUL-terminates within it.
        let rc = unsafe {
            ibcm_xrc_open(
                name_ptr,
                &mut dev,
                name_buf.as_mut_ptr(),
                name_buf.len(),
                &mut cap_flags,
            )
        };
        match rc {
            0 => {}
            ENODEV => return Err(VerbsError::NoDevice),
            ENOENT => {
                return Err(VerbsError::DeviceNotFound {
                    name: device.unwrap_or_default().to_owned(),
                })
            }
            e => return Err(os("ibv_open_device", e)),
        }
        // SAFETY: the shim wrote a NUL-terminated name into `name_buf` (zero-initialised, so
        // a NUL exists even if it wrote nothing).
        let name = unsafe { CStr::from_ptr(name_buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(Self {
            dev,
            name,
            cap_flags,
            xrcds: BTreeMap::new(),
            qps: BTreeMap::new(),
            srqs: BTreeMap::new(),
            next: 1,
        })
    }

    /// The raw `device_cap_flags`.
    pub fn cap_flags(&self) -> u64 {
        self.cap_flags
    }

    /// Calls `ibv_open_xrcd` for a private domain regardless of the capability flag and
    /// closes it again: shows what the provider itself answers (rxe: EOPNOTSUPP).
    ///
    /// # Errors
    /// The provider's error as [`VerbsError::NotSupported`] or [`VerbsError::Os`].
    pub fn probe_open_xrcd(&mut self) -> Result<(), VerbsError> {
        let h = self.open_xrcd_raw(&DomainSpec::Private)?;
        self.close_xrcd(h)
    }

    fn handle(&mut self) -> u32 {
        let h = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        h
    }

    fn map(&self, op: &'static str, e: c_int) -> VerbsError {
        match e {
            EOPNOTSUPP | ENOSYS => VerbsError::NotSupported {
                op,
                device: self.name.clone(),
                errno: e,
            },
            ENOMEM => VerbsError::NoResources { what: op },
            _ => os(op, e),
        }
    }

    fn xrcd_ptr(&self, h: XrcdHandle) -> Result<*mut IbvXrcd, VerbsError> {
        self.xrcds
            .get(&h.0)
            .map(|e| e.ptr)
            .ok_or(VerbsError::BadHandle {
                what: "xrcd",
                raw: h.0,
            })
    }

    fn qp_entry(&self, h: QpHandle) -> Result<&QpEntry, VerbsError> {
        self.qps.get(&h.0).ok_or(VerbsError::BadHandle {
            what: "qp",
            raw: h.0,
        })
    }

    fn bump(&mut self, via: u32, up: bool) {
        if let Some(x) = self.xrcds.get_mut(&via) {
            x.users = if up {
                x.users.saturating_add(1)
            } else {
                x.users.saturating_sub(1)
            };
        }
    }

    fn open_xrcd_raw(&mut self, spec: &DomainSpec) -> Result<XrcdHandle, VerbsError> {
        let mut ptr: *mut IbvXrcd = std::ptr::null_mut();
        let (rc, create, exclusive) = match spec {
            DomainSpec::Private => {
                // SAFETY: `self.dev` is the live device record from `ibcm_xrc_open`; `ptr` is
                // a live local.
                let rc = unsafe { ibcm_xrc_open_xrcd(self.dev, -1, 1, 0, &mut ptr) };
                (rc, true, false)
            }
            DomainSpec::File {
                path,
                create,
                exclusive,
            } => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(*create)
                    .open(path)
                    .or_else(|_| OpenOptions::new().read(true).open(path))
                    .map_err(|e| match e.kind() {
                        io::ErrorKind::NotFound => VerbsError::DomainNotFound {
                            path: path.display().to_string(),
                        },
                        _ => os("open", e.raw_os_error().unwrap_or(EINVAL)),
                    })?;
                // SAFETY: as above; the fd stays open (owned by `file`) for the whole call,
                // and the kernel takes its own reference on the inode.
                let rc = unsafe {
                    ibcm_xrc_open_xrcd(
                        self.dev,
                        file.as_raw_fd(),
                        c_int::from(*create),
                        c_int::from(*exclusive),
                        &mut ptr,
                    )
                };
                (rc, *create, *exclusive)
            }
        };
        match rc {
            0 => {}
            EINVAL if spec.path().is_some() && !create => {
                return Err(VerbsError::DomainNotFound {
                    path: spec
                        .path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                })
            }
            EINVAL if exclusive => {
                return Err(VerbsError::DomainExists {
                    path: spec
                        .path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                })
            }
            e => return Err(self.map("ibv_open_xrcd", e)),
        }
        let h = self.handle();
        self.xrcds.insert(h, XrcdEntry { ptr, users: 0 });
        Ok(XrcdHandle(h))
    }
}

impl Drop for RdmaVerbs {
    fn drop(&mut self) {
        for (_, q) in std::mem::take(&mut self.qps) {
            // SAFETY: each QP pointer came from the shim and is destroyed exactly once here
            // (it was removed from the table).
            unsafe { ibcm_xrc_destroy_qp(q.ptr) };
        }
        for (_, s) in std::mem::take(&mut self.srqs) {
            // SAFETY: as above, for SRQs.
            unsafe { ibcm_xrc_destroy_srq(s.ptr) };
        }
        for (_, x) in std::mem::take(&mut self.xrcds) {
            // SAFETY: as above, for XRCDs; their QPs and SRQs are already gone.
            unsafe { ibcm_xrc_close_xrcd(x.ptr) };
        }
        // SAFETY: `self.dev` came from `ibcm_xrc_open` and is closed exactly once, after
        // every object created on it.
        unsafe { ibcm_xrc_close(self.dev) };
    }
}

fn shim_av(av: &AddressVector) -> ShimAv {
    let mut s = ShimAv {
        dlid: av.dlid,
        sl: av.sl,
        src_path_bits: av.src_path_bits,
        static_rate: av.static_rate,
        port_num: av.port,
        ..ShimAv::default()
    };
    if let Some(g) = &av.grh {
        s.is_global = 1;
        s.dgid = g.dgid;
        s.flow_label = g.flow_label;
        s.sgid_index = g.sgid_index;
        s.hop_limit = g.hop_limit;
        s.traffic_class = g.traffic_class;
    }
    s
}

fn shim_attr(a: &QpAttr) -> ShimQpAttr {
    let mut s = ShimQpAttr::default();
    if let Some(v) = a.state {
        s.qp_state = v.raw();
    }
    if let Some(v) = a.cur_state {
        s.cur_qp_state = v.raw();
    }
    if let Some(v) = a.path_mtu {
        s.path_mtu = v.raw();
    }
    if let Some(v) = a.path_mig_state {
        s.path_mig_state = v.raw();
    }
    s.qkey = a.qkey.unwrap_or(0);
    s.rq_psn = a.rq_psn.map_or(0, |p| p.get());
    s.sq_psn = a.sq_psn.map_or(0, |p| p.get());
    s.dest_qp_num = a.dest_qpn.map_or(0, Qpn::get);
    s.qp_access_flags = a.access_flags.map_or(0, |f| f.0);
    s.pkey_index = a.pkey_index.unwrap_or(0);
    s.en_sqd_async_notify = u8::from(a.en_sqd_async_notify.unwrap_or(false));
    s.max_rd_atomic = a.max_rd_atomic.unwrap_or(0);
    s.max_dest_rd_atomic = a.max_dest_rd_atomic.unwrap_or(0);
    s.min_rnr_timer = a.min_rnr_timer.unwrap_or(0);
    s.port_num = a.port.unwrap_or(0);
    s.timeout = a.timeout.unwrap_or(0);
    s.retry_cnt = a.retry_cnt.map_or(0, |r| r.get());
    s.rnr_retry = a.rnr_retry.map_or(0, |r| r.get());
    if let Some(av) = &a.av {
        s.av = shim_av(av);
    }
    if let Some(alt) = &a.alt_path {
        s.alt_av = shim_av(&alt.av);
        s.alt_pkey_index = alt.pkey_index;
        s.alt_port_num = alt.port;
        s.alt_timeout = alt.timeout;
    }
    s
}

fn qp_type_from_raw(v: u32) -> Option<QpType> {
    match v {
        2 => Some(QpType::Rc),
        9 => Some(QpType::XrcIni),
        10 => Some(QpType::XrcTgt),
        _ => None,
    }
}

impl Verbs for RdmaVerbs {
    fn device(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.name.clone(),
            xrc: self.cap_flags & IBV_DEVICE_XRC != 0,
            // Not discoverable without trying; qedr answers EOPNOTSUPP at call time.
            open_qp: true,
            cap_flags: self.cap_flags,
        }
    }

    fn process(&self) -> ProcessId {
        ProcessId(std::process::id())
    }

    fn open_xrcd(&mut self, spec: &DomainSpec) -> Result<XrcdHandle, VerbsError> {
        if self.cap_flags & IBV_DEVICE_XRC == 0 {
            // Without the flag the provider is still asked (a private domain: no file is
            // created), so that the refusal carries its own errno (rxe: EOPNOTSUPP).
            let provider_errno = match self.probe_open_xrcd() {
                Ok(()) => return self.open_xrcd_raw(spec),
                Err(VerbsError::NotSupported { errno, .. } | VerbsError::Os { errno, .. }) => {
                    Some(errno)
                }
                Err(_) => None,
            };
            return Err(VerbsError::NoXrc {
                device: self.name.clone(),
                cap_flags: self.cap_flags,
                provider_errno,
            });
        }
        self.open_xrcd_raw(spec)
    }

    fn close_xrcd(&mut self, xrcd: XrcdHandle) -> Result<(), VerbsError> {
        let e = self.xrcds.get(&xrcd.0).ok_or(VerbsError::BadHandle {
            what: "xrcd",
            raw: xrcd.0,
        })?;
        if e.users > 0 {
            return Err(VerbsError::Busy {
                what: "XRCD",
                users: e.users,
            });
        }
        let ptr = e.ptr;
        // SAFETY: `ptr` is a live XRCD of this backend with no QP or SRQ of ours on it.
        let rc = unsafe { ibcm_xrc_close_xrcd(ptr) };
        match rc {
            0 => {
                self.xrcds.remove(&xrcd.0);
                Ok(())
            }
            EBUSY => Err(VerbsError::Busy {
                what: "XRCD",
                users: 0,
            }),
            e => Err(self.map("ibv_close_xrcd", e)),
        }
    }

    fn create_tgt_qp(&mut self, xrcd: XrcdHandle) -> Result<QpHandle, VerbsError> {
        let x = self.xrcd_ptr(xrcd)?;
        let mut ptr: *mut IbvQp = std::ptr::null_mut();
        let mut qpn = 0u32;
        // SAFETY: `self.dev` and `x` are live objects of this backend; out pointers are
        // live locals.
        let rc = unsafe { ibcm_xrc_create_tgt_qp(self.dev, x, &mut ptr, &mut qpn) };
        if rc != 0 {
            return Err(self.map("ibv_create_qp_ex(XRC_RECV)", rc));
        }
        let h = self.handle();
        self.qps.insert(
            h,
            QpEntry {
                ptr,
                via: Some(xrcd.0),
                qp_type: QpType::XrcTgt,
                qpn: Qpn::masked(qpn),
            },
        );
        self.bump(xrcd.0, true);
        Ok(QpHandle(h))
    }

    fn open_tgt_qp(&mut self, xrcd: XrcdHandle, qpn: Qpn) -> Result<QpHandle, VerbsError> {
        let x = self.xrcd_ptr(xrcd)?;
        let mut ptr: *mut IbvQp = std::ptr::null_mut();
        // SAFETY: as in `create_tgt_qp`.
        let rc = unsafe { ibcm_xrc_open_tgt_qp(self.dev, x, qpn.get(), &mut ptr) };
        match rc {
            0 => {}
            EINVAL => return Err(VerbsError::UnknownQpn { qpn }),
            e => return Err(self.map("ibv_open_qp", e)),
        }
        let h = self.handle();
        self.qps.insert(
            h,
            QpEntry {
                ptr,
                via: Some(xrcd.0),
                qp_type: QpType::XrcTgt,
                qpn,
            },
        );
        self.bump(xrcd.0, true);
        Ok(QpHandle(h))
    }

    fn create_ini_qp(&mut self, caps: &IniQpCaps) -> Result<QpHandle, VerbsError> {
        let mut ptr: *mut IbvQp = std::ptr::null_mut();
        let mut qpn = 0u32;
        // SAFETY: `self.dev` is live; out pointers are live locals.
        let rc = unsafe {
            ibcm_xrc_create_ini_qp(
                self.dev,
                caps.max_send_wr,
                caps.max_send_sge,
                caps.max_inline_data,
                &mut ptr,
                &mut qpn,
            )
        };
        if rc != 0 {
            return Err(self.map("ibv_create_qp_ex(XRC_SEND)", rc));
        }
        let h = self.handle();
        self.qps.insert(
            h,
            QpEntry {
                ptr,
                via: None,
                qp_type: QpType::XrcIni,
                qpn: Qpn::masked(qpn),
            },
        );
        Ok(QpHandle(h))
    }

    fn create_xrc_srq(
        &mut self,
        xrcd: XrcdHandle,
        attr: &SrqAttr,
    ) -> Result<SrqHandle, VerbsError> {
        let x = self.xrcd_ptr(xrcd)?;
        let mut ptr: *mut IbvSrq = std::ptr::null_mut();
        let mut srqn = 0u32;
        // SAFETY: `self.dev` and `x` are live objects of this backend; out pointers are
        // live locals.
        let rc = unsafe {
            ibcm_xrc_create_srq(
                self.dev,
                x,
                attr.max_wr,
                attr.max_sge,
                attr.srq_limit,
                &mut ptr,
                &mut srqn,
            )
        };
        if rc != 0 {
            return Err(self.map("ibv_create_srq_ex(XRC)", rc));
        }
        let h = self.handle();
        self.srqs.insert(
            h,
            SrqEntry {
                ptr,
                via: xrcd.0,
                srqn: SrqNum::new(srqn & SrqNum::MAX).unwrap_or_default(),
            },
        );
        self.bump(xrcd.0, true);
        Ok(SrqHandle(h))
    }

    fn srq_num(&self, srq: SrqHandle) -> Result<SrqNum, VerbsError> {
        self.srqs
            .get(&srq.0)
            .map(|s| s.srqn)
            .ok_or(VerbsError::BadHandle {
                what: "srq",
                raw: srq.0,
            })
    }

    fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), VerbsError> {
        let e = self.srqs.get(&srq.0).ok_or(VerbsError::BadHandle {
            what: "srq",
            raw: srq.0,
        })?;
        let (ptr, via) = (e.ptr, e.via);
        // SAFETY: `ptr` is a live SRQ of this backend, destroyed once (removed below on
        // success).
        let rc = unsafe { ibcm_xrc_destroy_srq(ptr) };
        if rc != 0 {
            return Err(self.map("ibv_destroy_srq", rc));
        }
        self.srqs.remove(&srq.0);
        self.bump(via, false);
        Ok(())
    }

    fn qp_num(&self, qp: QpHandle) -> Result<Qpn, VerbsError> {
        self.qp_entry(qp).map(|e| e.qpn)
    }

    fn modify_qp(&mut self, qp: QpHandle, attr: &QpAttr) -> Result<(), VerbsError> {
        let info = self.query_qp(qp)?;
        check_modify(info.qp_type, info.state, attr)?;
        let ptr = self.qp_entry(qp)?.ptr;
        let s = shim_attr(attr);
        let mask = c_int::try_from(attr.mask().bits()).unwrap_or(0);
        // SAFETY: `ptr` is a live QP of this backend; `s` is a fully initialised struct laid
        // out like the shim's (checked by `layout_matches_the_shim`).
        let rc = unsafe { ibcm_xrc_modify_qp(ptr, &s, mask) };
        if rc != 0 {
            return Err(self.map("ibv_modify_qp", rc));
        }
        Ok(())
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpInfo, VerbsError> {
        let e = self.qp_entry(qp)?;
        let (mut state, mut dest, mut ty, mut qpn) = (0u32, 0u32, 0u32, 0u32);
        // SAFETY: `e.ptr` is a live QP of this backend; out pointers are live locals.
        let rc = unsafe { ibcm_xrc_query_qp(e.ptr, &mut state, &mut dest, &mut ty, &mut qpn) };
        if rc != 0 {
            return Err(self.map("ibv_query_qp", rc));
        }
        let state = QpState::from_raw(state).ok_or_else(|| os("ibv_query_qp", EINVAL))?;
        Ok(QpInfo {
            qpn: Qpn::masked(qpn),
            qp_type: qp_type_from_raw(ty).unwrap_or(e.qp_type),
            state,
            dest_qpn: (state != QpState::Reset && state != QpState::Init)
                .then(|| Qpn::masked(dest)),
        })
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), VerbsError> {
        let e = self.qp_entry(qp)?;
        let (ptr, via) = (e.ptr, e.via);
        // SAFETY: `ptr` is a live QP handle of this backend, destroyed once (removed below on
        // success). For a TGT QP this closes our handle; the kernel destroys the QP only with
        // its last handle.
        let rc = unsafe { ibcm_xrc_destroy_qp(ptr) };
        if rc != 0 {
            return Err(self.map("ibv_destroy_qp", rc));
        }
        self.qps.remove(&qp.0);
        if let Some(v) = via {
            self.bump(v, false);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_shim() {
        // SAFETY: both functions only return a constant.
        let (av, attr) = unsafe { (ibcm_xrc_av_size(), ibcm_xrc_qp_attr_size()) };
        assert_eq!(av, std::mem::size_of::<ShimAv>());
        assert_eq!(attr, std::mem::size_of::<ShimQpAttr>());
    }

    #[test]
    fn open_gives_a_typed_error_or_a_device() {
        // This host may have no RDMA device (CI), an rxe device (the lab) or real hardware.
        match RdmaVerbs::open(None) {
            Err(VerbsError::NoDevice) => {}
            Err(e @ VerbsError::NoXrc { .. }) => assert!(e.to_string().contains("has no XRC")),
            Err(e) => panic!("unexpected error {e}"),
            Ok(v) => assert!(v.device().xrc),
        }
        assert!(matches!(
            RdmaVerbs::open(Some("no-such-device-xyz")),
            Err(VerbsError::NoDevice | VerbsError::DeviceNotFound { .. })
        ));
    }

    #[test]
    fn attributes_are_flattened() {
        let a = QpAttr::tgt_to_rts(14, ibcm_mad::Psn::new(0x12_3456).unwrap());
        let s = shim_attr(&a);
        assert_eq!((s.qp_state, s.timeout, s.sq_psn), (3, 14, 0x12_3456));
        assert_eq!(a.mask().bits(), 1 | (1 << 9) | (1 << 16));
    }
}
