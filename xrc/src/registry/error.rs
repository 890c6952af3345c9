//! [`RegistryError`].

use super::DomainId;
use crate::types::{ProcessId, Qpn};
use crate::verbs::VerbsError;
use ibcm_mad::xrc::{GoneCause, XrcDataError};

/// Registry errors.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No such domain in this registry.
    #[error("unknown domain {0}")]
    UnknownDomain(DomainId),
    /// The domain is closing and takes no new QPs.
    #[error("domain {0} is closing")]
    DomainClosing(DomainId),
    /// A domain with this name is already open here and `O_EXCL` was asked.
    #[error("domain {0} is already open")]
    DomainExists(String),
    /// No such TGT QP.
    #[error("no TGT QP {0}")]
    UnknownQpn(Qpn),
    /// The TGT QP is gone.
    #[error("TGT QP {qpn} is gone: {cause}")]
    Gone {
        /// The QP.
        qpn: Qpn,
        /// Why.
        cause: GoneCause,
    },
    /// Only the owner may do this.
    #[error("TGT QP {qpn} is owned by {owner:?}")]
    NotOwner {
        /// The QP.
        qpn: Qpn,
        /// Its owner.
        owner: Option<ProcessId>,
    },
    /// The registrant holds no registration on the QP.
    #[error("{who} is not registered on TGT QP {qpn}")]
    NotRegistered {
        /// The QP.
        qpn: Qpn,
        /// Who asked (display form).
        who: String,
    },
    /// Every new QP got a quarantined number.
    #[error("only quarantined QPNs available after {attempts} attempts")]
    QpnsExhausted {
        /// How many QPs were tried.
        attempts: usize,
    },
    /// Building the REP private data failed (e.g. more than 47 SRQNs).
    #[error("REP private data: {0}")]
    Wire(#[from] XrcDataError),
    /// The verbs backend failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}
