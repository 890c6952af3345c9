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
//! * **The receive side of the data path.** A SEND arriving for a TGT QP
//!   ([`KernelModel::deliver`], its XRCETH naming an SRQ) is received into that SRQ only if the
//!   QP is in RTR or RTS, its PSN the next one the QP expects (from `rq_psn`), and the SRQ
//!   is of the QP's domain, whichever process created it;
//!   its creator takes it with [`ModelVerbs::poll_srq`]. An SRQ holds at most `max_wr`
//!   unpolled messages (then [`Delivery::ReceiverNotReady`], an RNR NAK).
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
//!
//! The simulated kernel objects and what each verb does to them are in `kernel.rs`; this
//! file has the configuration and the handles: [`KernelModel`] (the device, with inspection
//! for tests) and [`ModelVerbs`] (one process's [`Verbs`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::types::{DomainSpec, ProcessId, QpHandle, Qpn, SrqHandle, SrqNum, XrcdHandle};
use crate::verbs::qp::{QpAttr, QpState, QpType};
use crate::verbs::{DeviceInfo, IniQpCaps, QpInfo, SrqAttr, Verbs, VerbsError};
use ibcm_mad::Psn;

mod kernel;
#[cfg(test)]
mod tests;

use kernel::{Kernel, Proc};

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

/// What became of a SEND that arrived for a TGT QP ([`KernelModel::deliver`]): received, or
/// why the responder refused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Received into the SRQ (a receive completion for its owner).
    Received,
    /// No QP has that number (dropped).
    UnknownQp,
    /// The QP is not an XRC TGT QP.
    NotTgt,
    /// The TGT QP is not in RTR or RTS (dropped).
    NotReady(QpState),
    /// The PSN is not the one the responder expects next (the initiator's starting PSN from
    /// the REQ, then one more per message received): NAK, sequence error.
    OutOfSequence {
        /// The PSN it expects.
        expected: u32,
    },
    /// The XRCETH names no SRQ (NAK: invalid request).
    UnknownSrq,
    /// The SRQ belongs to another XRC domain than the TGT QP (NAK: invalid request).
    OtherDomain,
    /// Every receive the SRQ had is taken (RNR NAK).
    ReceiverNotReady,
}

impl Delivery {
    /// The name of the outcome in counters and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::UnknownQp => "unknown_qp",
            Self::NotTgt => "not_tgt_qp",
            Self::NotReady(_) => "qp_not_ready",
            Self::OutOfSequence { .. } => "psn_out_of_sequence",
            Self::UnknownSrq => "unknown_srq",
            Self::OtherDomain => "srq_of_another_domain",
            Self::ReceiverNotReady => "receiver_not_ready",
        }
    }
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
        Self {
            inner: Arc::new(Mutex::new(Kernel::new(cfg))),
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

    /// A SEND with PSN `psn` arriving for TGT QP `qpn`, its XRCETH naming `srqn` (the RoCE
    /// data path of the `sim` backend): received into that SRQ if the QP is ready, the PSN
    /// the one it expects, and the SRQ in the QP's domain with a receive free.
    pub fn deliver(&self, qpn: Qpn, psn: Psn, srqn: SrqNum, payload: &[u8]) -> Delivery {
        self.lock()
            .deliver(qpn.get(), psn.get(), srqn.get(), payload)
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

    /// The oldest message received into this process's XRC SRQ `srq` (its receive
    /// completion, as `ibv_poll_cq` on the SRQ's CQ would give it), or `None`.
    ///
    /// # Errors
    /// [`VerbsError::BadHandle`] for an SRQ this process does not hold.
    pub fn poll_srq(&mut self, srq: SrqHandle) -> Result<Option<Vec<u8>>, VerbsError> {
        self.kernel.lock().poll_srq(self.pid, srq)
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
        attr: &SrqAttr,
    ) -> Result<SrqHandle, VerbsError> {
        self.kernel.lock().create_srq(self.pid, xrcd, attr)
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
