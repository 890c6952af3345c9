//! A software model of the modern kernel's XRC object model (docs/xrc.md §1.2–1.4), for tests,
//! the CM simulator and machines without an XRC device.
//!
//! One [`KernelModel`] is one device shared by any number of simulated processes; each
//! [`ModelVerbs`] is one process's context on it. What the model reproduces:
//!
//! * **Domains by inode.** A shared domain is keyed by its file path (the kernel keys it by
//!   inode): `O_CREAT` creates it, no `O_CREAT` on an unknown file is
//!   [`VerbsError::DomainNotFound`], `O_CREAT|O_EXCL` on a known one is
//!   [`VerbsError::DomainExists`]. Every open counts one reference.
//! * **Per-process handles.** A TGT QP is one kernel object with one *handle* per creator or
//!   opener. [`Verbs::destroy_qp`] closes the caller's handle and destroys the QP only when no
//!   handle is left, in any process: the creator has no special power.
//! * **The domain is pinned** by each TGT QP and each XRC SRQ. Closing an XRCD handle through
//!   which this process still holds QPs or SRQs is [`VerbsError::Busy`] (EBUSY).
//! * **Process exit** ([`KernelModel::kill`], or dropping the [`ModelVerbs`]) destroys every
//!   handle of the process, as `uverbs_free_qp` does on modern kernels: a TGT QP that only the
//!   exiting process held is destroyed; one that others opened survives.
//! * **Open by number** from another process that opened the same domain ([`Verbs::open_tgt_qp`]);
//!   an unknown QPN or another domain's QPN is [`VerbsError::UnknownQpn`] (EINVAL).
//! * **Deterministic numbers.** QPNs and SRQNs come from counters set in [`ModelConfig`]; with
//!   [`QpnReuse::MostRecentFirst`] a freed QPN is handed out again at once, the worst case the
//!   CM's TimeWait quarantine has to survive. No clock, no randomness.
//! * **Provider variants**: [`ModelConfig::rxe`] has no XRC (`IBV_DEVICE_XRC` clear, every XRC
//!   verb fails with [`VerbsError::NoXrc`]); [`ModelConfig::qedr`] has XRC but no `ibv_open_qp`.
//!
//! ```
//! use ibcm_xrc::verbs::model::{ModelConfig, KernelModel};
//! use ibcm_xrc::{DomainSpec, Verbs};
//!
//! let kernel = KernelModel::new(ModelConfig::mlx5());
//! let mut a = kernel.spawn();
//! let mut b = kernel.spawn();
//! let xa = a.open_xrcd(&DomainSpec::file("/tmp/job1")).unwrap();
//! let tgt = a.create_tgt_qp(xa).unwrap();
//! let qpn = a.qp_num(tgt).unwrap();
//! let xb = b.open_xrcd(&DomainSpec::existing("/tmp/job1")).unwrap();
//! let _opened = b.open_tgt_qp(xb, qpn).unwrap();
//! drop(a); // the creator exits: the QP survives because b holds a handle
//! assert!(kernel.tgt_qp_exists(qpn));
//! drop(b); // the last holder exits: the QP is destroyed
//! assert!(!kernel.tgt_qp_exists(qpn));
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::types::{DomainSpec, ProcessId, QpHandle, Qpn, SrqHandle, SrqNum, XrcdHandle};
use crate::verbs::qp::{check_modify, QpAttr, QpState, QpType};
use crate::verbs::{DeviceInfo, IniQpCaps, QpInfo, SrqAttr, Verbs, VerbsError};

/// `IBV_DEVICE_XRC`, bit 20 of `device_cap_flags`.
pub const IBV_DEVICE_XRC: u64 = 1 << 20;

/// How the model hands out QP numbers after a QP is destroyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpnReuse {
    /// Always the next number of a wrapping 24-bit counter (freed numbers come back only
    /// after 2²⁴ allocations).
    Never,
    /// The most recently freed number first (LIFO), then the counter: the worst case for
    /// stale-connection detection.
    MostRecentFirst,
}

/// Configuration of a simulated device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// Device name.
    pub device_name: String,
    /// `IBV_DEVICE_XRC`: whether XRC verbs work at all.
    pub xrc: bool,
    /// Whether `ibv_open_qp` is implemented.
    pub open_qp: bool,
    /// First QPN handed out (QPNs 0 and 1 are never used).
    pub first_qpn: u32,
    /// QPN reuse behaviour.
    pub qpn_reuse: QpnReuse,
    /// First XRC SRQ number handed out.
    pub first_srqn: u32,
    /// Maximum number of live QPs (all types); creating more is
    /// [`VerbsError::NoResources`].
    pub max_qps: usize,
    /// The PID given to the first spawned process.
    pub first_pid: u32,
}

impl ModelConfig {
    /// A ConnectX-like device: XRC and `ibv_open_qp` (mlx5 since rdma-core v26).
    pub fn mlx5() -> Self {
        Self {
            device_name: "sim_mlx5_0".into(),
            xrc: true,
            open_qp: true,
            first_qpn: 0x48,
            qpn_reuse: QpnReuse::Never,
            first_srqn: 0x10,
            max_qps: 1 << 16,
            first_pid: 1000,
        }
    }

    /// Soft-RoCE: no XRC at all (docs/xrc.md §5).
    pub fn rxe() -> Self {
        Self {
            device_name: "sim_rxe0".into(),
            xrc: false,
            open_qp: false,
            ..Self::mlx5()
        }
    }

    /// Marvell qedr: XRC domains, SRQs and TGT QPs, but no `ibv_open_qp`, so no sharing of a
    /// TGT QP across processes.
    pub fn qedr() -> Self {
        Self {
            device_name: "sim_qedr0".into(),
            open_qp: false,
            ..Self::mlx5()
        }
    }

    /// Same device, with [`QpnReuse::MostRecentFirst`].
    #[must_use]
    pub fn with_lifo_qpn_reuse(mut self) -> Self {
        self.qpn_reuse = QpnReuse::MostRecentFirst;
        self
    }
}

#[derive(Debug)]
enum Obj {
    Xrcd { xrcd: u32, users: usize },
    Qp { qpn: u32, via: Option<u32> },
    Srq { srqn: u32, via: u32 },
}

#[derive(Debug, Default)]
struct Proc {
    handles: BTreeMap<u32, Obj>,
    next_handle: u32,
}

#[derive(Debug)]
struct Xrcd {
    path: Option<PathBuf>,
    usecnt: usize,
    tgt_qps: BTreeSet<u32>,
}

#[derive(Debug)]
struct RealQp {
    qp_type: QpType,
    state: QpState,
    dest_qpn: Option<Qpn>,
    xrcd: Option<u32>,
    handles: usize,
}

#[derive(Debug)]
struct Kernel {
    cfg: ModelConfig,
    next_pid: u32,
    procs: BTreeMap<ProcessId, Proc>,
    xrcd_by_path: BTreeMap<PathBuf, u32>,
    xrcds: BTreeMap<u32, Xrcd>,
    next_xrcd: u32,
    qps: BTreeMap<u32, RealQp>,
    srqs: BTreeMap<u32, u32>,
    next_qpn: u32,
    freed_qpns: Vec<u32>,
    next_srqn: u32,
}

/// A snapshot of the model's object counts (for tests and timelines).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ModelSnapshot {
    /// Live processes.
    pub processes: usize,
    /// Live XRC domains.
    pub domains: usize,
    /// Live TGT QPs with the processes holding a handle on each, by QPN.
    pub tgt_qps: BTreeMap<Qpn, Vec<ProcessId>>,
    /// Live INI QPs.
    pub ini_qps: usize,
    /// Live XRC SRQs.
    pub srqs: usize,
}

/// One simulated device (kernel side), shared by its processes. Cloning shares it.
#[derive(Clone, Debug)]
pub struct KernelModel {
    inner: Arc<Mutex<Kernel>>,
}

impl KernelModel {
    /// A new device.
    pub fn new(cfg: ModelConfig) -> Self {
        let first_qpn = cfg.first_qpn.clamp(2, Qpn::MAX);
        let first_srqn = cfg.first_srqn.min(SrqNum::MAX);
        Self {
            inner: Arc::new(Mutex::new(Kernel {
                next_pid: cfg.first_pid,
                cfg,
                procs: BTreeMap::new(),
                xrcd_by_path: BTreeMap::new(),
                xrcds: BTreeMap::new(),
                next_xrcd: 1,
                qps: BTreeMap::new(),
                srqs: BTreeMap::new(),
                next_qpn: first_qpn,
                freed_qpns: Vec::new(),
                next_srqn: first_srqn,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Kernel> {
        // No code path panics while holding the lock; recover the data if one ever did.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a new process and returns its verbs context. Dropping the context ends the
    /// process (all its handles are destroyed).
    pub fn spawn(&self) -> ModelVerbs {
        let pid = {
            let mut k = self.lock();
            let pid = ProcessId(k.next_pid);
            k.next_pid = k.next_pid.wrapping_add(1);
            k.procs.insert(pid, Proc::default());
            pid
        };
        ModelVerbs {
            kernel: self.clone(),
            pid,
        }
    }

    /// Ends process `pid` as an exit or SIGKILL would: every QP, SRQ and XRCD handle it holds
    /// is destroyed, in that order. Returns `false` if it was not running.
    pub fn kill(&self, pid: ProcessId) -> bool {
        self.lock().exit(pid)
    }

    /// Whether `pid` is running.
    pub fn is_alive(&self, pid: ProcessId) -> bool {
        self.lock().procs.contains_key(&pid)
    }

    /// Whether a TGT QP with this number exists.
    pub fn tgt_qp_exists(&self, qpn: Qpn) -> bool {
        self.lock()
            .qps
            .get(&qpn.get())
            .is_some_and(|q| q.qp_type == QpType::XrcTgt)
    }

    /// The state of any live QP.
    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.lock().qps.get(&qpn.get()).map(|q| q.state)
    }

    /// The processes holding a handle on a QP (one entry per handle).
    pub fn qp_holders(&self, qpn: Qpn) -> Vec<ProcessId> {
        self.lock().holders(qpn.get())
    }

    /// The reference count of the shared domain on `path` (handles + TGT QPs + SRQs), or
    /// `None` if no such domain exists.
    pub fn domain_usecnt(&self, path: &str) -> Option<usize> {
        let k = self.lock();
        let id = k.xrcd_by_path.get(&PathBuf::from(path))?;
        k.xrcds.get(id).map(|x| x.usecnt)
    }

    /// Object counts.
    pub fn snapshot(&self) -> ModelSnapshot {
        let k = self.lock();
        let mut tgt_qps = BTreeMap::new();
        let mut ini_qps = 0;
        for (&qpn, qp) in &k.qps {
            match qp.qp_type {
                QpType::XrcTgt => {
                    tgt_qps.insert(Qpn::masked(qpn), k.holders(qpn));
                }
                _ => ini_qps += 1,
            }
        }
        ModelSnapshot {
            processes: k.procs.len(),
            domains: k.xrcds.len(),
            tgt_qps,
            ini_qps,
            srqs: k.srqs.len(),
        }
    }
}

impl Kernel {
    fn device(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.cfg.device_name.clone(),
            xrc: self.cfg.xrc,
            open_qp: self.cfg.open_qp,
            cap_flags: if self.cfg.xrc { IBV_DEVICE_XRC } else { 0 },
        }
    }

    fn need_xrc(&self) -> Result<(), VerbsError> {
        if self.cfg.xrc {
            Ok(())
        } else {
            Err(VerbsError::NoXrc {
                device: self.cfg.device_name.clone(),
                cap_flags: 0,
            })
        }
    }

    fn holders(&self, qpn: u32) -> Vec<ProcessId> {
        let mut out = Vec::new();
        for (pid, p) in &self.procs {
            for obj in p.handles.values() {
                if matches!(obj, Obj::Qp { qpn: q, .. } if *q == qpn) {
                    out.push(*pid);
                }
            }
        }
        out
    }

    fn proc_mut(&mut self, pid: ProcessId) -> Result<&mut Proc, VerbsError> {
        self.procs
            .get_mut(&pid)
            .ok_or(VerbsError::ProcessExited { pid })
    }

    fn proc_ref(&self, pid: ProcessId) -> Result<&Proc, VerbsError> {
        self.procs
            .get(&pid)
            .ok_or(VerbsError::ProcessExited { pid })
    }

    fn add_handle(&mut self, pid: ProcessId, obj: Obj) -> Result<u32, VerbsError> {
        let p = self.proc_mut(pid)?;
        let h = p.next_handle;
        p.next_handle = p.next_handle.wrapping_add(1);
        p.handles.insert(h, obj);
        Ok(h)
    }

    /// The XRCD behind a process's XRCD handle.
    fn xrcd_of(&self, pid: ProcessId, h: XrcdHandle) -> Result<u32, VerbsError> {
        match self.proc_ref(pid)?.handles.get(&h.0) {
            Some(Obj::Xrcd { xrcd, .. }) => Ok(*xrcd),
            _ => Err(VerbsError::BadHandle {
                what: "xrcd",
                raw: h.0,
            }),
        }
    }

    fn bump_users(&mut self, pid: ProcessId, h: u32, up: bool) {
        if let Some(Obj::Xrcd { users, .. }) =
            self.procs.get_mut(&pid).and_then(|p| p.handles.get_mut(&h))
        {
            *users = if up {
                users.saturating_add(1)
            } else {
                users.saturating_sub(1)
            };
        }
    }

    fn qp_of(&self, pid: ProcessId, h: QpHandle) -> Result<u32, VerbsError> {
        match self.proc_ref(pid)?.handles.get(&h.0) {
            Some(Obj::Qp { qpn, .. }) => Ok(*qpn),
            _ => Err(VerbsError::BadHandle {
                what: "qp",
                raw: h.0,
            }),
        }
    }

    fn alloc_qpn(&mut self) -> Result<u32, VerbsError> {
        if self.qps.len() >= self.cfg.max_qps {
            return Err(VerbsError::NoResources { what: "QP" });
        }
        if self.cfg.qpn_reuse == QpnReuse::MostRecentFirst {
            while let Some(q) = self.freed_qpns.pop() {
                if !self.qps.contains_key(&q) {
                    return Ok(q);
                }
            }
        }
        // At most 2^24 probes; `max_qps` keeps the table far from full in practice.
        for _ in 0..=Qpn::MAX {
            let q = self.next_qpn;
            self.next_qpn = if q >= Qpn::MAX { 2 } else { q + 1 };
            if q >= 2 && !self.qps.contains_key(&q) {
                return Ok(q);
            }
        }
        Err(VerbsError::NoResources { what: "QP" })
    }

    fn alloc_srqn(&mut self) -> Result<u32, VerbsError> {
        for _ in 0..=SrqNum::MAX {
            let s = self.next_srqn;
            self.next_srqn = if s >= SrqNum::MAX { 0 } else { s + 1 };
            if !self.srqs.contains_key(&s) {
                return Ok(s);
            }
        }
        Err(VerbsError::NoResources { what: "SRQ" })
    }

    fn xrcd_unref(&mut self, id: u32) {
        let gone = match self.xrcds.get_mut(&id) {
            Some(x) => {
                x.usecnt = x.usecnt.saturating_sub(1);
                x.usecnt == 0
            }
            None => false,
        };
        if gone {
            if let Some(x) = self.xrcds.remove(&id) {
                if let Some(p) = x.path {
                    self.xrcd_by_path.remove(&p);
                }
            }
        }
    }

    fn open_xrcd(&mut self, pid: ProcessId, spec: &DomainSpec) -> Result<XrcdHandle, VerbsError> {
        self.need_xrc()?;
        self.proc_ref(pid)?;
        let id = match spec {
            DomainSpec::Private => self.new_xrcd(None),
            DomainSpec::File {
                path,
                create,
                exclusive,
            } => match self.xrcd_by_path.get(path).copied() {
                Some(id) => {
                    if *create && *exclusive {
                        return Err(VerbsError::DomainExists {
                            path: path.display().to_string(),
                        });
                    }
                    if let Some(x) = self.xrcds.get_mut(&id) {
                        x.usecnt = x.usecnt.saturating_add(1);
                    }
                    id
                }
                None if *create => {
                    let id = self.new_xrcd(Some(path.clone()));
                    self.xrcd_by_path.insert(path.clone(), id);
                    id
                }
                None => {
                    return Err(VerbsError::DomainNotFound {
                        path: path.display().to_string(),
                    })
                }
            },
        };
        let h = self.add_handle(pid, Obj::Xrcd { xrcd: id, users: 0 })?;
        Ok(XrcdHandle(h))
    }

    fn new_xrcd(&mut self, path: Option<PathBuf>) -> u32 {
        let id = self.next_xrcd;
        self.next_xrcd = self.next_xrcd.wrapping_add(1);
        self.xrcds.insert(
            id,
            Xrcd {
                path,
                usecnt: 1,
                tgt_qps: BTreeSet::new(),
            },
        );
        id
    }

    fn close_xrcd(&mut self, pid: ProcessId, h: XrcdHandle) -> Result<(), VerbsError> {
        let p = self.proc_mut(pid)?;
        let (id, users) = match p.handles.get(&h.0) {
            Some(Obj::Xrcd { xrcd, users }) => (*xrcd, *users),
            _ => {
                return Err(VerbsError::BadHandle {
                    what: "xrcd",
                    raw: h.0,
                })
            }
        };
        if users > 0 {
            return Err(VerbsError::Busy {
                what: "XRCD",
                users,
            });
        }
        p.handles.remove(&h.0);
        self.xrcd_unref(id);
        Ok(())
    }

    fn create_tgt_qp(&mut self, pid: ProcessId, h: XrcdHandle) -> Result<QpHandle, VerbsError> {
        self.need_xrc()?;
        let id = self.xrcd_of(pid, h)?;
        let qpn = self.alloc_qpn()?;
        self.qps.insert(
            qpn,
            RealQp {
                qp_type: QpType::XrcTgt,
                state: QpState::Reset,
                dest_qpn: None,
                xrcd: Some(id),
                handles: 1,
            },
        );
        if let Some(x) = self.xrcds.get_mut(&id) {
            x.usecnt = x.usecnt.saturating_add(1);
            x.tgt_qps.insert(qpn);
        }
        self.bump_users(pid, h.0, true);
        let qh = self.add_handle(
            pid,
            Obj::Qp {
                qpn,
                via: Some(h.0),
            },
        )?;
        Ok(QpHandle(qh))
    }

    fn open_tgt_qp(
        &mut self,
        pid: ProcessId,
        h: XrcdHandle,
        qpn: Qpn,
    ) -> Result<QpHandle, VerbsError> {
        self.need_xrc()?;
        if !self.cfg.open_qp {
            return Err(VerbsError::NotSupported {
                op: "ibv_open_qp",
                device: self.cfg.device_name.clone(),
            });
        }
        let id = self.xrcd_of(pid, h)?;
        let known = self
            .xrcds
            .get(&id)
            .is_some_and(|x| x.tgt_qps.contains(&qpn.get()));
        if !known {
            return Err(VerbsError::UnknownQpn { qpn });
        }
        if let Some(q) = self.qps.get_mut(&qpn.get()) {
            q.handles = q.handles.saturating_add(1);
        }
        self.bump_users(pid, h.0, true);
        let qh = self.add_handle(
            pid,
            Obj::Qp {
                qpn: qpn.get(),
                via: Some(h.0),
            },
        )?;
        Ok(QpHandle(qh))
    }

    fn create_ini_qp(&mut self, pid: ProcessId) -> Result<QpHandle, VerbsError> {
        self.need_xrc()?;
        self.proc_ref(pid)?;
        let qpn = self.alloc_qpn()?;
        self.qps.insert(
            qpn,
            RealQp {
                qp_type: QpType::XrcIni,
                state: QpState::Reset,
                dest_qpn: None,
                xrcd: None,
                handles: 1,
            },
        );
        let qh = self.add_handle(pid, Obj::Qp { qpn, via: None })?;
        Ok(QpHandle(qh))
    }

    fn create_srq(&mut self, pid: ProcessId, h: XrcdHandle) -> Result<SrqHandle, VerbsError> {
        self.need_xrc()?;
        let id = self.xrcd_of(pid, h)?;
        let srqn = self.alloc_srqn()?;
        self.srqs.insert(srqn, id);
        if let Some(x) = self.xrcds.get_mut(&id) {
            x.usecnt = x.usecnt.saturating_add(1);
        }
        self.bump_users(pid, h.0, true);
        let sh = self.add_handle(pid, Obj::Srq { srqn, via: h.0 })?;
        Ok(SrqHandle(sh))
    }

    fn srq_num(&self, pid: ProcessId, h: SrqHandle) -> Result<SrqNum, VerbsError> {
        match self.proc_ref(pid)?.handles.get(&h.0) {
            Some(Obj::Srq { srqn, .. }) => SrqNum::new(*srqn).ok_or(VerbsError::BadHandle {
                what: "srq",
                raw: h.0,
            }),
            _ => Err(VerbsError::BadHandle {
                what: "srq",
                raw: h.0,
            }),
        }
    }

    fn destroy_srq(&mut self, pid: ProcessId, h: SrqHandle) -> Result<(), VerbsError> {
        let p = self.proc_mut(pid)?;
        let (srqn, via) = match p.handles.get(&h.0) {
            Some(Obj::Srq { srqn, via }) => (*srqn, *via),
            _ => {
                return Err(VerbsError::BadHandle {
                    what: "srq",
                    raw: h.0,
                })
            }
        };
        p.handles.remove(&h.0);
        self.bump_users(pid, via, false);
        if let Some(id) = self.srqs.remove(&srqn) {
            self.xrcd_unref(id);
        }
        Ok(())
    }

    fn destroy_qp(&mut self, pid: ProcessId, h: QpHandle) -> Result<(), VerbsError> {
        let p = self.proc_mut(pid)?;
        let (qpn, via) = match p.handles.get(&h.0) {
            Some(Obj::Qp { qpn, via }) => (*qpn, *via),
            _ => {
                return Err(VerbsError::BadHandle {
                    what: "qp",
                    raw: h.0,
                })
            }
        };
        p.handles.remove(&h.0);
        if let Some(v) = via {
            self.bump_users(pid, v, false);
        }
        let last = match self.qps.get_mut(&qpn) {
            Some(q) => {
                q.handles = q.handles.saturating_sub(1);
                q.handles == 0
            }
            None => false,
        };
        if last {
            if let Some(q) = self.qps.remove(&qpn) {
                if let Some(id) = q.xrcd {
                    if let Some(x) = self.xrcds.get_mut(&id) {
                        x.tgt_qps.remove(&qpn);
                    }
                    self.xrcd_unref(id);
                }
            }
            self.freed_qpns.push(qpn);
        }
        Ok(())
    }

    fn modify_qp(&mut self, pid: ProcessId, h: QpHandle, attr: &QpAttr) -> Result<(), VerbsError> {
        let qpn = self.qp_of(pid, h)?;
        let q = self.qps.get_mut(&qpn).ok_or(VerbsError::BadHandle {
            what: "qp",
            raw: h.0,
        })?;
        let next = check_modify(q.qp_type, q.state, attr)?;
        q.state = next;
        if let Some(d) = attr.dest_qpn {
            q.dest_qpn = Some(d);
        }
        if next == QpState::Reset {
            q.dest_qpn = None;
        }
        Ok(())
    }

    fn query_qp(&self, pid: ProcessId, h: QpHandle) -> Result<QpInfo, VerbsError> {
        let qpn = self.qp_of(pid, h)?;
        let q = self.qps.get(&qpn).ok_or(VerbsError::BadHandle {
            what: "qp",
            raw: h.0,
        })?;
        Ok(QpInfo {
            qpn: Qpn::masked(qpn),
            qp_type: q.qp_type,
            state: q.state,
            dest_qpn: q.dest_qpn,
        })
    }

    fn exit(&mut self, pid: ProcessId) -> bool {
        let Some(p) = self.procs.get(&pid) else {
            return false;
        };
        let mut qps = Vec::new();
        let mut srqs = Vec::new();
        let mut xrcds = Vec::new();
        for (h, obj) in &p.handles {
            match obj {
                Obj::Qp { .. } => qps.push(*h),
                Obj::Srq { .. } => srqs.push(*h),
                Obj::Xrcd { .. } => xrcds.push(*h),
            }
        }
        // Same order as uverbs cleanup: QPs, then SRQs, then XRCDs. None of these can fail
        // for a handle that exists.
        for h in qps {
            let _ = self.destroy_qp(pid, QpHandle(h));
        }
        for h in srqs {
            let _ = self.destroy_srq(pid, SrqHandle(h));
        }
        for h in xrcds {
            let _ = self.close_xrcd(pid, XrcdHandle(h));
        }
        self.procs.remove(&pid);
        true
    }
}

/// One simulated process's verbs context. Dropping it ends the process.
#[derive(Debug)]
pub struct ModelVerbs {
    kernel: KernelModel,
    pid: ProcessId,
}

impl ModelVerbs {
    /// The device this process runs on.
    pub fn kernel(&self) -> &KernelModel {
        &self.kernel
    }
}

impl Drop for ModelVerbs {
    fn drop(&mut self) {
        self.kernel.kill(self.pid);
    }
}

impl Verbs for ModelVerbs {
    fn device(&self) -> DeviceInfo {
        self.kernel.lock().device()
    }

    fn process(&self) -> ProcessId {
        self.pid
    }

    fn open_xrcd(&mut self, spec: &DomainSpec) -> Result<XrcdHandle, VerbsError> {
        self.kernel.lock().open_xrcd(self.pid, spec)
    }

    fn close_xrcd(&mut self, xrcd: XrcdHandle) -> Result<(), VerbsError> {
        self.kernel.lock().close_xrcd(self.pid, xrcd)
    }

    fn create_tgt_qp(&mut self, xrcd: XrcdHandle) -> Result<QpHandle, VerbsError> {
        self.kernel.lock().create_tgt_qp(self.pid, xrcd)
    }

    fn open_tgt_qp(&mut self, xrcd: XrcdHandle, qpn: Qpn) -> Result<QpHandle, VerbsError> {
        self.kernel.lock().open_tgt_qp(self.pid, xrcd, qpn)
    }

    fn create_ini_qp(&mut self, _caps: &IniQpCaps) -> Result<QpHandle, VerbsError> {
        self.kernel.lock().create_ini_qp(self.pid)
    }

    fn create_xrc_srq(
        &mut self,
        xrcd: XrcdHandle,
        _attr: &SrqAttr,
    ) -> Result<SrqHandle, VerbsError> {
        self.kernel.lock().create_srq(self.pid, xrcd)
    }

    fn srq_num(&self, srq: SrqHandle) -> Result<SrqNum, VerbsError> {
        self.kernel.lock().srq_num(self.pid, srq)
    }

    fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), VerbsError> {
        self.kernel.lock().destroy_srq(self.pid, srq)
    }

    fn qp_num(&self, qp: QpHandle) -> Result<Qpn, VerbsError> {
        self.kernel.lock().qp_of(self.pid, qp).map(Qpn::masked)
    }

    fn modify_qp(&mut self, qp: QpHandle, attr: &QpAttr) -> Result<(), VerbsError> {
        self.kernel.lock().modify_qp(self.pid, qp, attr)
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpInfo, VerbsError> {
        self.kernel.lock().query_qp(self.pid, qp)
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), VerbsError> {
        self.kernel.lock().destroy_qp(self.pid, qp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::qp::AccessFlags;

    fn mlx5() -> KernelModel {
        KernelModel::new(ModelConfig::mlx5())
    }

    #[test]
    fn private_domains_are_not_shared() {
        let k = mlx5();
        let mut a = k.spawn();
        a.open_xrcd(&DomainSpec::Private).unwrap();
        a.open_xrcd(&DomainSpec::Private).unwrap();
        assert_eq!(k.snapshot().domains, 2);
    }

    #[test]
    fn o_creat_o_excl_semantics() {
        let k = mlx5();
        let mut a = k.spawn();
        let mut b = k.spawn();
        assert!(matches!(
            a.open_xrcd(&DomainSpec::existing("/d")),
            Err(VerbsError::DomainNotFound { .. })
        ));
        a.open_xrcd(&DomainSpec::exclusive("/d")).unwrap();
        assert!(matches!(
            b.open_xrcd(&DomainSpec::exclusive("/d")),
            Err(VerbsError::DomainExists { .. })
        ));
        b.open_xrcd(&DomainSpec::existing("/d")).unwrap();
        b.open_xrcd(&DomainSpec::file("/d")).unwrap();
        assert_eq!(k.domain_usecnt("/d"), Some(3));
        assert_eq!(k.snapshot().domains, 1);
    }

    #[test]
    fn creator_has_no_special_power() {
        let k = mlx5();
        let mut a = k.spawn();
        let mut b = k.spawn();
        let xa = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let xb = b.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let t = a.create_tgt_qp(xa).unwrap();
        let qpn = a.qp_num(t).unwrap();
        let tb = b.open_tgt_qp(xb, qpn).unwrap();
        a.destroy_qp(t).unwrap();
        assert!(k.tgt_qp_exists(qpn), "b's handle keeps it");
        b.destroy_qp(tb).unwrap();
        assert!(!k.tgt_qp_exists(qpn));
    }

    #[test]
    fn creator_exit_destroys_unshared_qp() {
        let k = mlx5();
        let mut a = k.spawn();
        let xa = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let t = a.create_tgt_qp(xa).unwrap();
        let qpn = a.qp_num(t).unwrap();
        let pid = a.process();
        assert!(k.kill(pid));
        assert!(!k.tgt_qp_exists(qpn));
        assert_eq!(
            k.domain_usecnt("/d"),
            None,
            "the domain went with its last user"
        );
        assert!(matches!(a.qp_num(t), Err(VerbsError::ProcessExited { .. })));
        assert!(!k.kill(pid));
    }

    #[test]
    fn holding_only_the_domain_does_not_keep_a_qp() {
        // docs/xrc.md §0.1: a keeper needs an ibv_open_qp handle, not just the XRCD.
        let k = mlx5();
        let mut keeper = k.spawn();
        keeper.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let mut a = k.spawn();
        let xa = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let qpn = {
            let t = a.create_tgt_qp(xa).unwrap();
            a.qp_num(t).unwrap()
        };
        drop(a);
        assert!(!k.tgt_qp_exists(qpn));
        assert_eq!(k.domain_usecnt("/d"), Some(1));
    }

    #[test]
    fn close_xrcd_busy_while_qps_or_srqs() {
        let k = mlx5();
        let mut a = k.spawn();
        let x = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let t = a.create_tgt_qp(x).unwrap();
        let s = a.create_xrc_srq(x, &SrqAttr::default()).unwrap();
        assert_eq!(
            a.close_xrcd(x),
            Err(VerbsError::Busy {
                what: "XRCD",
                users: 2
            })
        );
        a.destroy_qp(t).unwrap();
        a.destroy_srq(s).unwrap();
        a.close_xrcd(x).unwrap();
        assert_eq!(k.snapshot().domains, 0);
    }

    #[test]
    fn tgt_qps_and_srqs_pin_the_domain_usecnt() {
        let k = mlx5();
        let mut a = k.spawn();
        let x = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let _t = a.create_tgt_qp(x).unwrap();
        let _s = a.create_xrc_srq(x, &SrqAttr::default()).unwrap();
        assert_eq!(k.domain_usecnt("/d"), Some(3));
    }

    #[test]
    fn open_by_number_needs_the_same_domain() {
        let k = mlx5();
        let mut a = k.spawn();
        let mut b = k.spawn();
        let xa = a.open_xrcd(&DomainSpec::file("/d1")).unwrap();
        let xb = b.open_xrcd(&DomainSpec::file("/d2")).unwrap();
        let t = a.create_tgt_qp(xa).unwrap();
        let qpn = a.qp_num(t).unwrap();
        assert_eq!(b.open_tgt_qp(xb, qpn), Err(VerbsError::UnknownQpn { qpn }));
        let xb1 = b.open_xrcd(&DomainSpec::existing("/d1")).unwrap();
        assert!(b.open_tgt_qp(xb1, qpn).is_ok());
        assert_eq!(k.qp_holders(qpn), vec![a.process(), b.process()]);
    }

    #[test]
    fn handles_are_per_process() {
        let k = mlx5();
        let mut a = k.spawn();
        let mut b = k.spawn();
        let xa = a.open_xrcd(&DomainSpec::Private).unwrap();
        let t = a.create_tgt_qp(xa).unwrap();
        // b has no handles at all: any number is invalid there.
        assert!(matches!(b.destroy_qp(t), Err(VerbsError::BadHandle { .. })));
        assert!(matches!(
            b.create_tgt_qp(xa),
            Err(VerbsError::BadHandle { .. })
        ));
    }

    #[test]
    fn rxe_has_no_xrc() {
        let k = KernelModel::new(ModelConfig::rxe());
        let mut a = k.spawn();
        let e = a.open_xrcd(&DomainSpec::Private).unwrap_err();
        assert!(matches!(e, VerbsError::NoXrc { .. }));
        assert!(e.to_string().contains("has no XRC"));
        assert!(!a.device().xrc);
    }

    #[test]
    fn qedr_has_no_open_qp() {
        let k = KernelModel::new(ModelConfig::qedr());
        let mut a = k.spawn();
        let x = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let t = a.create_tgt_qp(x).unwrap();
        let qpn = a.qp_num(t).unwrap();
        assert!(matches!(
            a.open_tgt_qp(x, qpn),
            Err(VerbsError::NotSupported {
                op: "ibv_open_qp",
                ..
            })
        ));
    }

    #[test]
    fn qpn_allocation_is_deterministic_and_lifo_reuse_works() {
        let k = KernelModel::new(ModelConfig::mlx5().with_lifo_qpn_reuse());
        let mut a = k.spawn();
        let x = a.open_xrcd(&DomainSpec::Private).unwrap();
        let t1 = a.create_tgt_qp(x).unwrap();
        let t2 = a.create_tgt_qp(x).unwrap();
        let q1 = a.qp_num(t1).unwrap();
        assert_eq!(q1.get(), 0x48);
        assert_eq!(a.qp_num(t2).unwrap().get(), 0x49);
        a.destroy_qp(t1).unwrap();
        let t3 = a.create_tgt_qp(x).unwrap();
        assert_eq!(
            a.qp_num(t3).unwrap(),
            q1,
            "LIFO reuse hands the freed QPN out again"
        );

        let k2 = mlx5();
        let mut b = k2.spawn();
        let x = b.open_xrcd(&DomainSpec::Private).unwrap();
        let t = b.create_tgt_qp(x).unwrap();
        let q = b.qp_num(t).unwrap();
        b.destroy_qp(t).unwrap();
        let t = b.create_tgt_qp(x).unwrap();
        assert_ne!(b.qp_num(t).unwrap(), q);
    }

    #[test]
    fn max_qps_limit() {
        let mut cfg = ModelConfig::mlx5();
        cfg.max_qps = 1;
        let k = KernelModel::new(cfg);
        let mut a = k.spawn();
        let x = a.open_xrcd(&DomainSpec::Private).unwrap();
        a.create_tgt_qp(x).unwrap();
        assert_eq!(
            a.create_tgt_qp(x),
            Err(VerbsError::NoResources { what: "QP" })
        );
    }

    #[test]
    fn modify_follows_the_rules_and_every_holder_may_modify() {
        let k = mlx5();
        let mut a = k.spawn();
        let mut b = k.spawn();
        let xa = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let xb = b.open_xrcd(&DomainSpec::file("/d")).unwrap();
        let t = a.create_tgt_qp(xa).unwrap();
        let qpn = a.qp_num(t).unwrap();
        let tb = b.open_tgt_qp(xb, qpn).unwrap();
        assert!(matches!(
            a.modify_qp(t, &QpAttr::to_state(QpState::Rtr)),
            Err(VerbsError::Modify(_))
        ));
        b.modify_qp(tb, &QpAttr::to_init(0, 1, AccessFlags::default()))
            .unwrap();
        assert_eq!(a.query_qp(t).unwrap().state, QpState::Init);
        a.modify_qp(t, &QpAttr::to_state(QpState::Err)).unwrap();
        assert_eq!(k.qp_state(qpn), Some(QpState::Err));
    }

    #[test]
    fn ini_qp_and_srq_numbers() {
        let k = mlx5();
        let mut a = k.spawn();
        let x = a.open_xrcd(&DomainSpec::Private).unwrap();
        let i = a.create_ini_qp(&IniQpCaps::default()).unwrap();
        assert_eq!(a.query_qp(i).unwrap().qp_type, QpType::XrcIni);
        let s1 = a.create_xrc_srq(x, &SrqAttr::default()).unwrap();
        let s2 = a.create_xrc_srq(x, &SrqAttr::default()).unwrap();
        assert_eq!(a.srq_num(s1).unwrap().get(), 0x10);
        assert_eq!(a.srq_num(s2).unwrap().get(), 0x11);
        let snap = k.snapshot();
        assert_eq!((snap.ini_qps, snap.srqs), (1, 2));
        drop(a);
        assert_eq!(k.snapshot(), ModelSnapshot::default());
    }
}
