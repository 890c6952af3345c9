//! The verbs backend trait: the handful of XRC verbs this crate needs, per process.
//!
//! A [`Verbs`] value is one process's view of one device, like an `ibv_context`: every handle
//! it returns belongs to that process, and only that process can use it. Two backends exist:
//!
//! * [`ModelVerbs`](model::ModelVerbs) in [`model`]: a deterministic software model of the
//!   modern kernel (docs/xrc.md §1.2–1.3) with any number of simulated processes;
//! * `RdmaVerbs` (feature `rdma`): libibverbs through a small C shim (`csrc/shim.c`).
//!
//! `rc` (features `rdma` and `cm`) is the data path next to it: RC QPs brought up from
//! `ibcm::qp_attr`'s attributes, memory regions, posting and polling (`csrc/rc.c`).
//!
//! The trait is object safe (`Box<dyn Verbs>`), so the registry and the keeper do not care
//! which one they drive. On top of a backend: [`qp`] (QP states, attributes and the per-type
//! modify rules, docs/xrc.md §1.6) and the [`XrcSrq`] / [`IniQp`] helpers.

#[cfg(feature = "rdma")]
#[allow(unsafe_code)]
mod ffi;
pub mod model;
mod objects;
pub mod qp;
#[cfg(all(feature = "rdma", feature = "cm"))]
pub mod rc;

#[cfg(feature = "rdma")]
pub use ffi::RdmaVerbs;
pub use objects::{IniQp, XrcSrq};

use crate::types::{DomainSpec, ProcessId, QpHandle, Qpn, SrqHandle, SrqNum, XrcdHandle};
use crate::verbs::qp::{ModifyError, QpAttr, QpState, QpType};

/// What a backend reports about its device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name (`mlx5_0`, `rxe0`, `sim0`).
    pub name: String,
    /// Whether `IBV_DEVICE_XRC` is set in the device capability flags.
    pub xrc: bool,
    /// Whether the provider implements `ibv_open_qp` (qedr does not; docs/xrc.md §5).
    pub open_qp: bool,
    /// The raw `device_cap_flags` (0 for the software model).
    pub cap_flags: u64,
}

/// Capacities of an XRC INI QP (`ibv_qp_cap`; it has no receive queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IniQpCaps {
    /// `max_send_wr`.
    pub max_send_wr: u32,
    /// `max_send_sge`.
    pub max_send_sge: u32,
    /// `max_inline_data`.
    pub max_inline_data: u32,
}

impl Default for IniQpCaps {
    fn default() -> Self {
        Self {
            max_send_wr: 64,
            max_send_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// Attributes of an XRC SRQ (`ibv_srq_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqAttr {
    /// `max_wr`.
    pub max_wr: u32,
    /// `max_sge`.
    pub max_sge: u32,
    /// `srq_limit`.
    pub srq_limit: u32,
}

impl Default for SrqAttr {
    fn default() -> Self {
        Self {
            max_wr: 128,
            max_sge: 1,
            srq_limit: 0,
        }
    }
}

/// What [`Verbs::query_qp`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qpn: Qpn,
    /// QP type.
    pub qp_type: QpType,
    /// Current state.
    pub state: QpState,
    /// Destination QPN, once set (RTR).
    pub dest_qpn: Option<Qpn>,
}

/// Errors from a verbs backend.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// No RDMA device at all (`ibv_get_device_list` returned none).
    #[error("no RDMA device found")]
    NoDevice,
    /// The named device does not exist.
    #[error("RDMA device {name} not found")]
    DeviceNotFound {
        /// The name asked for.
        name: String,
    },
    /// The device has no XRC support (`IBV_DEVICE_XRC` absent). This is what rxe (Soft-RoCE)
    /// gives: docs/xrc.md §5.
    /// When the provider was asked anyway (`ibv_open_xrcd` called), `provider_errno` is its
    /// answer, shown in the text: "… and ibv_open_xrcd fails: Operation not supported (errno
    /// 95)".
    #[error("{}", no_xrc_text(device, *cap_flags, *provider_errno))]
    NoXrc {
        /// Device name.
        device: String,
        /// The raw `device_cap_flags`.
        cap_flags: u64,
        /// The errno of the provider's own `ibv_open_xrcd`, when it was called.
        provider_errno: Option<i32>,
    },
    /// The provider does not implement this verb (EOPNOTSUPP or ENOSYS), e.g. `ibv_open_qp`
    /// on qedr.
    #[error("{op} is not supported by device {device}: {} (errno {errno})", strerror(*errno))]
    NotSupported {
        /// The verb.
        op: &'static str,
        /// Device name.
        device: String,
        /// The provider's errno.
        errno: i32,
    },
    /// Opening a shared domain without `O_CREAT` found no such domain (EINVAL).
    #[error("no XRC domain is open on {path}")]
    DomainNotFound {
        /// The file.
        path: String,
    },
    /// Opening with `O_CREAT|O_EXCL` found the domain already open (EINVAL).
    #[error("an XRC domain already exists on {path}")]
    DomainExists {
        /// The file.
        path: String,
    },
    /// The object still has dependants (EBUSY), e.g. closing an XRCD handle through which this
    /// process still holds TGT QPs or XRC SRQs.
    #[error("{what} is busy ({users} dependent objects)")]
    Busy {
        /// What could not be released.
        what: &'static str,
        /// How many dependants remain.
        users: usize,
    },
    /// `ibv_open_qp` named a QPN that is not a TGT QP of this domain (EINVAL).
    #[error("no XRC TGT QP {qpn} in this domain")]
    UnknownQpn {
        /// The QPN.
        qpn: Qpn,
    },
    /// The handle is not (or no longer) valid in this process.
    #[error("invalid {what} handle {raw}")]
    BadHandle {
        /// Object kind.
        what: &'static str,
        /// The handle number.
        raw: u32,
    },
    /// The operation needs another QP type.
    #[error("operation needs a {expected} QP, this is {found}")]
    WrongQpType {
        /// Needed type.
        expected: QpType,
        /// Actual type.
        found: QpType,
    },
    /// The modify-QP attributes break the transition rules (EINVAL).
    #[error("modify QP: {0}")]
    Modify(#[from] ModifyError),
    /// The (simulated) process has exited; its handles are gone.
    #[error("process {pid} has exited")]
    ProcessExited {
        /// The process.
        pid: ProcessId,
    },
    /// Out of QPs, SRQs or memory (ENOMEM / a configured limit).
    #[error("out of resources creating {what}")]
    NoResources {
        /// What could not be created.
        what: &'static str,
    },
    /// The backend was built without this capability (e.g. `--backend verbs` without the
    /// `rdma` feature).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// Any other OS error from a verb.
    #[error("{op} failed: {message} (errno {errno})")]
    Os {
        /// The verb.
        op: &'static str,
        /// The errno value.
        errno: i32,
        /// `strerror` text.
        message: String,
    },
}

/// `EOPNOTSUPP` on Linux: what a provider answers for a verb it does not implement.
pub const EOPNOTSUPP: i32 = 95;

fn strerror(errno: i32) -> String {
    let s = std::io::Error::from_raw_os_error(errno).to_string();
    // "Operation not supported (os error 95)": the number is shown once, by the caller
    match s.rfind(" (os error") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

fn no_xrc_text(device: &str, cap_flags: u64, provider_errno: Option<i32>) -> String {
    let mut s = format!(
        "device {device} has no XRC (IBV_DEVICE_XRC not set in device_cap_flags {cap_flags:#x})"
    );
    if let Some(e) = provider_errno {
        s.push_str(&format!(
            ", and ibv_open_xrcd fails: {} (errno {e})",
            strerror(e)
        ));
    }
    s
}

/// One process's access to one RDMA device: the XRC verbs this crate uses.
///
/// All methods act only on this process's handles; a handle from another `Verbs` value is a
/// [`VerbsError::BadHandle`]. Object safe.
pub trait Verbs: Send {
    /// The device.
    fn device(&self) -> DeviceInfo;

    /// The process this context belongs to.
    fn process(&self) -> ProcessId;

    /// `ibv_open_xrcd`: opens (or creates) an XRC domain.
    ///
    /// # Errors
    /// [`VerbsError::NoXrc`], [`VerbsError::DomainNotFound`], [`VerbsError::DomainExists`], …
    fn open_xrcd(&mut self, spec: &DomainSpec) -> Result<XrcdHandle, VerbsError>;

    /// `ibv_close_xrcd`: drops this handle's reference; the domain is destroyed with its last
    /// reference (TGT QPs and XRC SRQs count as references).
    ///
    /// # Errors
    /// [`VerbsError::Busy`] while this process holds TGT QPs or SRQs through the handle.
    fn close_xrcd(&mut self, xrcd: XrcdHandle) -> Result<(), VerbsError>;

    /// `ibv_create_qp_ex(IBV_QPT_XRC_RECV)`: a new TGT QP in the domain (no PD, no CQs); the
    /// returned handle is this process's reference on it.
    ///
    /// # Errors
    /// [`VerbsError`].
    fn create_tgt_qp(&mut self, xrcd: XrcdHandle) -> Result<QpHandle, VerbsError>;

    /// `ibv_open_qp`: another handle on an existing TGT QP of the same domain.
    ///
    /// # Errors
    /// [`VerbsError::UnknownQpn`], [`VerbsError::NotSupported`].
    fn open_tgt_qp(&mut self, xrcd: XrcdHandle, qpn: Qpn) -> Result<QpHandle, VerbsError>;

    /// `ibv_create_qp_ex(IBV_QPT_XRC_SEND)`: an INI QP (send only).
    ///
    /// # Errors
    /// [`VerbsError`].
    fn create_ini_qp(&mut self, caps: &IniQpCaps) -> Result<QpHandle, VerbsError>;

    /// `ibv_create_srq_ex(IBV_SRQT_XRC)`: an XRC SRQ in the domain.
    ///
    /// # Errors
    /// [`VerbsError`].
    fn create_xrc_srq(&mut self, xrcd: XrcdHandle, attr: &SrqAttr)
        -> Result<SrqHandle, VerbsError>;

    /// `ibv_get_srq_num`.
    ///
    /// # Errors
    /// [`VerbsError::BadHandle`].
    fn srq_num(&self, srq: SrqHandle) -> Result<SrqNum, VerbsError>;

    /// `ibv_destroy_srq`.
    ///
    /// # Errors
    /// [`VerbsError`].
    fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), VerbsError>;

    /// The QP number behind a handle.
    ///
    /// # Errors
    /// [`VerbsError::BadHandle`].
    fn qp_num(&self, qp: QpHandle) -> Result<Qpn, VerbsError>;

    /// `ibv_modify_qp`. Backends check [`check_modify`](crate::verbs::qp::check_modify) first.
    ///
    /// # Errors
    /// [`VerbsError::Modify`] for a bad transition or mask.
    fn modify_qp(&mut self, qp: QpHandle, attr: &QpAttr) -> Result<(), VerbsError>;

    /// `ibv_query_qp`.
    ///
    /// # Errors
    /// [`VerbsError::BadHandle`].
    fn query_qp(&self, qp: QpHandle) -> Result<QpInfo, VerbsError>;

    /// `ibv_destroy_qp`: for a TGT QP, closes this handle and destroys the QP only if no other
    /// handle remains (in any process).
    ///
    /// # Errors
    /// [`VerbsError::BadHandle`].
    fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), VerbsError>;
}
