//! Request arguments, checked and converted to the registry's types; registry errors as
//! protocol error bodies.

use super::KeeperCore;
use crate::keeper::proto::{AvAttr, ErrorBody, ErrorKind, ModifyAttr};
use crate::policy::OwnershipPolicy;
use crate::registry::{DomainId, RegistryError};
use crate::types::Qpn;
use crate::verbs::qp::{AccessFlags, AddressVector, GlobalRoute, PathMtu, QpAttr, QpState};
use crate::verbs::VerbsError;

pub(super) fn err(kind: ErrorKind, message: impl Into<String>) -> ErrorBody {
    ErrorBody {
        kind,
        message: message.into(),
    }
}

pub(super) fn registry_err(e: &RegistryError) -> ErrorBody {
    let kind = match e {
        RegistryError::UnknownDomain(_) => ErrorKind::UnknownDomain,
        RegistryError::DomainClosing(_) => ErrorKind::DomainClosing,
        RegistryError::DomainExists(_) => ErrorKind::DomainExists,
        RegistryError::UnknownQpn(_) => ErrorKind::UnknownQpn,
        RegistryError::Gone { .. } => ErrorKind::Gone,
        RegistryError::NotOwner { .. } => ErrorKind::NotOwner,
        RegistryError::NotRegistered { .. } => ErrorKind::NotRegistered,
        RegistryError::QpnsExhausted { .. } => ErrorKind::NoResources,
        RegistryError::Verbs(VerbsError::NoXrc { .. }) => ErrorKind::NoXrc,
        // The provider does not implement the verb (EOPNOTSUPP: rxe's ibv_open_xrcd).
        RegistryError::Verbs(VerbsError::NotSupported { .. }) => ErrorKind::NoXrc,
        // The file names no domain (no `O_CREAT`), or one already (`O_EXCL`).
        RegistryError::Verbs(VerbsError::DomainNotFound { .. }) => ErrorKind::UnknownDomain,
        RegistryError::Verbs(VerbsError::DomainExists { .. }) => ErrorKind::DomainExists,
        RegistryError::Verbs(VerbsError::Modify(_)) => ErrorKind::BadModify,
        RegistryError::Verbs(_) => ErrorKind::Verbs,
        RegistryError::Wire(_) => ErrorKind::BadRequest,
    };
    err(kind, e.to_string())
}

pub(super) fn qpn_arg(v: u32) -> Result<Qpn, ErrorBody> {
    Qpn::new(v).ok_or_else(|| {
        err(
            ErrorKind::BadRequest,
            format!("QPN {v:#x} needs more than 24 bits"),
        )
    })
}

pub(super) fn policy_arg(s: &str) -> Result<OwnershipPolicy, ErrorBody> {
    OwnershipPolicy::from_name(s).ok_or_else(|| {
        err(
            ErrorKind::BadRequest,
            format!("unknown policy {s:?} (explicit, domain-bound, process-bound, shared)"),
        )
    })
}

pub(super) fn state_arg(s: &str) -> Result<QpState, ErrorBody> {
    QpState::from_name(s)
        .ok_or_else(|| err(ErrorKind::BadRequest, format!("unknown QP state {s:?}")))
}

pub(super) fn psn_arg(v: u32) -> Result<ibcm_mad::Psn, ErrorBody> {
    ibcm_mad::Psn::new(v).ok_or_else(|| {
        err(
            ErrorKind::BadRequest,
            format!("PSN {v:#x} needs more than 24 bits"),
        )
    })
}

pub(super) fn gid_arg(s: &str) -> Result<[u8; 16], ErrorBody> {
    let s: String = s.chars().filter(|c| *c != ':').collect();
    let bad = || {
        err(
            ErrorKind::BadRequest,
            format!("GID {s:?} is not 32 hex digits"),
        )
    };
    if s.len() != 32 || !s.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let pair = s.get(i * 2..i * 2 + 2).ok_or_else(bad)?;
        *o = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

pub(super) fn av_arg(a: &AvAttr) -> Result<AddressVector, ErrorBody> {
    let grh = match &a.dgid {
        None => None,
        Some(g) => Some(GlobalRoute {
            dgid: gid_arg(g)?,
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        }),
    };
    Ok(AddressVector {
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: a.static_rate,
        port: a.port,
        grh,
    })
}

/// Converts the protocol's attributes to a [`QpAttr`].
///
/// # Errors
/// A `bad-request` body for malformed values.
pub(in crate::keeper) fn modify_attr(m: &ModifyAttr) -> Result<QpAttr, ErrorBody> {
    Ok(QpAttr {
        state: m.state.as_deref().map(state_arg).transpose()?,
        cur_state: m.cur_state.as_deref().map(state_arg).transpose()?,
        pkey_index: m.pkey_index,
        port: m.port,
        access_flags: m.access_flags.map(AccessFlags),
        path_mtu: m
            .path_mtu
            .map(|v| {
                PathMtu::from_raw(v)
                    .ok_or_else(|| err(ErrorKind::BadRequest, format!("path MTU code {v}")))
            })
            .transpose()?,
        dest_qpn: m.dest_qpn.map(qpn_arg).transpose()?,
        rq_psn: m.rq_psn.map(psn_arg).transpose()?,
        sq_psn: m.sq_psn.map(psn_arg).transpose()?,
        timeout: m.timeout,
        min_rnr_timer: m.min_rnr_timer,
        max_dest_rd_atomic: m.max_dest_rd_atomic,
        av: m.av.as_ref().map(av_arg).transpose()?,
        ..QpAttr::default()
    })
}

impl<K: super::KeeperConn> KeeperCore<K> {
    pub(super) fn domain_arg(&self, name: &str) -> Result<DomainId, ErrorBody> {
        self.reg.domain_by_name(name).ok_or_else(|| {
            err(
                ErrorKind::UnknownDomain,
                format!("no domain named {name:?}"),
            )
        })
    }
}
