//! XRC SRQs and INI QPs: thin owners of a backend handle with their state tracked.
//!
//! These live in one process (the one whose [`Verbs`] created them) and are not subject to
//! ownership policies: an XRC SRQ belongs to the process that receives on it, an INI QP to the
//! process that sends on it. Neither implements `Drop` (the backend is borrowed per call);
//! call `destroy` — or let the process exit, which the kernel treats the same way.

use crate::types::{QpHandle, Qpn, SrqHandle, SrqNum, XrcdHandle};
use crate::verbs::qp::{ModifyError, QpAttr, QpState, QpStateMachine, QpType};
use crate::verbs::{IniQpCaps, SrqAttr, Verbs, VerbsError};

/// An XRC SRQ: the receive queue (and, through its CQ, the completions) of one process in a
/// domain. Its number travels to initiators in the REP private data
/// ([`XrcRepData`](ibcm_mad::xrc::XrcRepData)); every XRC send names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XrcSrq {
    handle: SrqHandle,
    srqn: SrqNum,
}

impl XrcSrq {
    /// Creates an XRC SRQ in the domain behind `xrcd` (`ibv_create_srq_ex` +
    /// `ibv_get_srq_num`).
    ///
    /// # Errors
    /// [`VerbsError`].
    pub fn create(
        verbs: &mut dyn Verbs,
        xrcd: XrcdHandle,
        attr: &SrqAttr,
    ) -> Result<Self, VerbsError> {
        let handle = verbs.create_xrc_srq(xrcd, attr)?;
        match verbs.srq_num(handle) {
            Ok(srqn) => Ok(Self { handle, srqn }),
            Err(e) => {
                let _ = verbs.destroy_srq(handle);
                Err(e)
            }
        }
    }

    /// The SRQ number senders must use.
    pub const fn srqn(&self) -> SrqNum {
        self.srqn
    }

    /// The backend handle.
    pub const fn handle(&self) -> SrqHandle {
        self.handle
    }

    /// Destroys it.
    ///
    /// # Errors
    /// [`VerbsError`].
    pub fn destroy(self, verbs: &mut dyn Verbs) -> Result<(), VerbsError> {
        verbs.destroy_srq(self.handle)
    }
}

/// An XRC INI (send-only) QP with its state tracked, so a wrong modify is refused before the
/// verb is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IniQp {
    handle: QpHandle,
    qpn: Qpn,
    sm: QpStateMachine,
}

impl IniQp {
    /// Creates an INI QP (`ibv_create_qp_ex(IBV_QPT_XRC_SEND)`).
    ///
    /// # Errors
    /// [`VerbsError`].
    pub fn create(verbs: &mut dyn Verbs, caps: &IniQpCaps) -> Result<Self, VerbsError> {
        let handle = verbs.create_ini_qp(caps)?;
        match verbs.qp_num(handle) {
            Ok(qpn) => Ok(Self {
                handle,
                qpn,
                sm: QpStateMachine::new(QpType::XrcIni),
            }),
            Err(e) => {
                let _ = verbs.destroy_qp(handle);
                Err(e)
            }
        }
    }

    /// Its QP number: the REQ's Local QPN.
    pub const fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// The backend handle.
    pub const fn handle(&self) -> QpHandle {
        self.handle
    }

    /// Its state as last set.
    pub const fn state(&self) -> QpState {
        self.sm.state()
    }

    /// Checks `attr` against the XRC INI rules, then modifies the QP.
    ///
    /// # Errors
    /// [`VerbsError::Modify`] without calling the backend for a bad transition or mask.
    pub fn modify(&mut self, verbs: &mut dyn Verbs, attr: &QpAttr) -> Result<QpState, VerbsError> {
        let mut next = self.sm;
        next.apply(attr).map_err(VerbsError::Modify)?;
        verbs.modify_qp(self.handle, attr)?;
        self.sm = next;
        Ok(self.sm.state())
    }

    /// Validates `attr` without calling anything.
    ///
    /// # Errors
    /// [`ModifyError`].
    pub fn check(&self, attr: &QpAttr) -> Result<QpState, ModifyError> {
        crate::verbs::qp::check_modify(QpType::XrcIni, self.sm.state(), attr)
    }

    /// Destroys it.
    ///
    /// # Errors
    /// [`VerbsError`].
    pub fn destroy(self, verbs: &mut dyn Verbs) -> Result<(), VerbsError> {
        verbs.destroy_qp(self.handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DomainSpec;
    use crate::verbs::model::{KernelModel, ModelConfig};
    use crate::verbs::qp::{AccessFlags, AddressVector, PathMtu};
    use ibcm_mad::{Psn, U3};

    #[test]
    fn ini_qp_walks_to_rts_and_refuses_bad_masks_before_the_verb() {
        let k = KernelModel::new(ModelConfig::mlx5());
        let mut p = k.spawn();
        let mut ini = IniQp::create(&mut p, &IniQpCaps::default()).unwrap();
        ini.modify(&mut p, &QpAttr::to_init(0, 1, AccessFlags::default()))
            .unwrap();
        let mut bad = QpAttr::ini_to_rtr(
            AddressVector::default(),
            PathMtu::Mtu1024,
            Qpn::new(9).unwrap(),
            Psn::new(0).unwrap(),
        );
        bad.min_rnr_timer = Some(12);
        assert!(matches!(
            ini.modify(&mut p, &bad),
            Err(VerbsError::Modify(_))
        ));
        assert_eq!(ini.state(), QpState::Init);
        bad.min_rnr_timer = None;
        ini.modify(&mut p, &bad).unwrap();
        let rts = QpAttr::ini_to_rts(
            14,
            U3::new(7).unwrap(),
            U3::new(7).unwrap(),
            Psn::new(5).unwrap(),
            1,
        );
        assert_eq!(ini.check(&rts), Ok(QpState::Rts));
        ini.modify(&mut p, &rts).unwrap();
        assert_eq!(k.qp_state(ini.qpn()), Some(QpState::Rts));
        ini.destroy(&mut p).unwrap();
        assert_eq!(k.snapshot().ini_qps, 0);
    }

    #[test]
    fn srq_number() {
        let k = KernelModel::new(ModelConfig::mlx5());
        let mut p = k.spawn();
        let x = p.open_xrcd(&DomainSpec::Private).unwrap();
        let s = XrcSrq::create(&mut p, x, &SrqAttr::default()).unwrap();
        assert_eq!(s.srqn().get(), 0x10);
        s.destroy(&mut p).unwrap();
        p.close_xrcd(x).unwrap();
    }
}
