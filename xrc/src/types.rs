//! Small identifier newtypes shared by every module.
//!
//! QP numbers come from `ibcm-mad` ([`Qpn`], 24 bits). The XRC SRQ number is also 24 bits on
//! the wire (the XRCETH field of an XRC send), so it gets the same treatment here.

use core::fmt;
use std::path::{Path, PathBuf};

pub use ibcm_mad::Qpn;

pub use ibcm_mad::xrc::SrqNum;

/// A process identifier: an OS PID for the rdma-core backend and the keeper, a simulated
/// PID for [`ModelVerbs`](crate::verbs::model::ModelVerbs).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId(pub u32);

impl fmt::Debug for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {}", self.0)
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

macro_rules! handle_newtype {
    ($(#[$m:meta])* $name:ident, $label:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub(crate) u32);

        impl $name {
            /// The backend's raw handle number (meaningful only to the backend that issued it).
            pub const fn raw(self) -> u32 {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($label, "#{}"), self.0)
            }
        }
    };
}

handle_newtype!(
    /// A process-local handle on an XRC domain, as returned by
    /// [`Verbs::open_xrcd`](crate::Verbs::open_xrcd) (the `ibv_xrcd *` of rdma-core).
    XrcdHandle,
    "xrcd"
);
handle_newtype!(
    /// A process-local handle on a QP (`ibv_qp *`). For an XRC TGT QP it is one of possibly
    /// many handles on the same kernel QP: the QP lives while any handle does (docs/xrc.md §1.2).
    QpHandle,
    "qp"
);
handle_newtype!(
    /// A process-local handle on an XRC SRQ (`ibv_srq *`).
    SrqHandle,
    "srq"
);

/// How to open an XRC domain (`ibv_open_xrcd`; docs/xrc.md §1.4).
///
/// A domain opened through a file is shared with every process that opens the same file
/// (the kernel keys it by inode); a private domain is visible to this process only.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DomainSpec {
    /// `fd = -1`, `O_CREAT`: a new domain nobody else can open.
    Private,
    /// A domain shared through a file.
    File {
        /// The file whose inode names the domain.
        path: PathBuf,
        /// `O_CREAT`: create the domain if no process has it open.
        create: bool,
        /// `O_EXCL` (with `create`): fail if the domain already exists.
        exclusive: bool,
    },
}

impl DomainSpec {
    /// A shared domain: open it, creating it if needed (`O_CREAT`).
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::File {
            path: path.into(),
            create: true,
            exclusive: false,
        }
    }

    /// A shared domain that must already exist (no `O_CREAT`).
    pub fn existing(path: impl Into<PathBuf>) -> Self {
        Self::File {
            path: path.into(),
            create: false,
            exclusive: false,
        }
    }

    /// A shared domain that must not exist yet (`O_CREAT | O_EXCL`).
    pub fn exclusive(path: impl Into<PathBuf>) -> Self {
        Self::File {
            path: path.into(),
            create: true,
            exclusive: true,
        }
    }

    /// The file naming the domain, if it is shared.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::Private => None,
            Self::File { path, .. } => Some(path),
        }
    }
}

impl fmt::Display for DomainSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Private => f.write_str("private"),
            Self::File {
                path,
                create,
                exclusive,
            } => {
                write!(f, "{}", path.display())?;
                match (create, exclusive) {
                    (true, true) => f.write_str(" (O_CREAT|O_EXCL)"),
                    (true, false) => f.write_str(" (O_CREAT)"),
                    (false, _) => Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_spec_display() {
        assert_eq!(DomainSpec::Private.to_string(), "private");
        assert_eq!(
            DomainSpec::exclusive("/tmp/x").to_string(),
            "/tmp/x (O_CREAT|O_EXCL)"
        );
        assert_eq!(DomainSpec::existing("/tmp/x").to_string(), "/tmp/x");
        assert_eq!(DomainSpec::file("/tmp/x").path(), Some(Path::new("/tmp/x")));
    }
}
