//! Unit tests of the modify-QP rules and attributes.

use ibcm_mad::{Psn, Qpn, U3};

use super::*;

fn psn(v: u32) -> Psn {
    Psn::new(v).unwrap()
}
fn qpn(v: u32) -> Qpn {
    Qpn::new(v).unwrap()
}
fn u3(v: u8) -> U3 {
    U3::new(v).unwrap()
}

fn walk(ty: QpType, steps: &[QpAttr]) -> Result<QpState, ModifyError> {
    let mut sm = QpStateMachine::new(ty);
    for s in steps {
        sm.apply(s)?;
    }
    Ok(sm.state())
}

#[test]
fn tgt_reset_init_rtr_rts() {
    let st = walk(
        QpType::XrcTgt,
        &[
            QpAttr::to_init(0, 1, AccessFlags::default()),
            QpAttr::tgt_to_rtr(
                AddressVector::default(),
                PathMtu::Mtu1024,
                qpn(0x11),
                psn(1),
                1,
                12,
            ),
            QpAttr::tgt_to_rts(14, psn(7)),
        ],
    );
    assert_eq!(st, Ok(QpState::Rts));
}

#[test]
fn ini_reset_init_rtr_rts() {
    let st = walk(
        QpType::XrcIni,
        &[
            QpAttr::to_init(0, 1, AccessFlags::default()),
            QpAttr::ini_to_rtr(
                AddressVector::default(),
                PathMtu::Mtu4096,
                qpn(0x22),
                psn(1),
            ),
            QpAttr::ini_to_rts(14, u3(7), u3(7), psn(9), 1),
        ],
    );
    assert_eq!(st, Ok(QpState::Rts));
}

#[test]
fn ini_rtr_rejects_max_dest_rd_atomic_open_mpi_1839() {
    let mut a = QpAttr::ini_to_rtr(AddressVector::default(), PathMtu::Mtu1024, qpn(1), psn(1));
    a.max_dest_rd_atomic = Some(4);
    assert_eq!(
        check_modify(QpType::XrcIni, QpState::Init, &a),
        Err(ModifyError::UnexpectedAttributes {
            qp_type: QpType::XrcIni,
            from: QpState::Init,
            to: QpState::Rtr,
            extra: AttrMask::MAX_DEST_RD_ATOMIC,
        })
    );
    // The same attributes are *required* on an RC or TGT QP.
    let b = QpAttr::ini_to_rtr(AddressVector::default(), PathMtu::Mtu1024, qpn(1), psn(1));
    assert!(matches!(
        check_modify(QpType::XrcTgt, QpState::Init, &b),
        Err(ModifyError::MissingAttributes { missing, .. })
            if missing == AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER
    ));
}

#[test]
fn tgt_rts_needs_only_timeout_and_sq_psn() {
    let rc_style = QpAttr::ini_to_rts(14, u3(7), u3(7), psn(1), 1);
    let e = check_modify(QpType::XrcTgt, QpState::Rtr, &rc_style).unwrap_err();
    assert_eq!(
        e,
        ModifyError::UnexpectedAttributes {
            qp_type: QpType::XrcTgt,
            from: QpState::Rtr,
            to: QpState::Rts,
            extra: AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC,
        }
    );
    let mut only_timeout = QpAttr::to_state(QpState::Rts);
    only_timeout.timeout = Some(14);
    assert!(matches!(
        check_modify(QpType::XrcTgt, QpState::Rtr, &only_timeout),
        Err(ModifyError::MissingAttributes { missing, .. }) if missing == AttrMask::SQ_PSN
    ));
}

#[test]
fn invalid_transitions() {
    for (from, to) in [
        (QpState::Reset, QpState::Rtr),
        (QpState::Reset, QpState::Err),
        (QpState::Init, QpState::Rts),
        (QpState::Err, QpState::Init),
        (QpState::Rtr, QpState::Sqd),
        (QpState::Sqe, QpState::Rts),
    ] {
        let mut a = QpAttr::to_state(to);
        if to == QpState::Rts {
            a.timeout = Some(1);
            a.sq_psn = Some(psn(0));
        }
        assert!(
            matches!(
                check_modify(QpType::XrcTgt, from, &a),
                Err(ModifyError::InvalidTransition { .. })
            ),
            "{from}->{to}"
        );
    }
}

#[test]
fn any_to_err_and_reset_take_no_attributes() {
    for from in [
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Err,
    ] {
        assert_eq!(
            check_modify(QpType::XrcTgt, from, &QpAttr::to_state(QpState::Err)),
            Ok(QpState::Err)
        );
        assert_eq!(
            check_modify(QpType::XrcIni, from, &QpAttr::to_state(QpState::Reset)),
            Ok(QpState::Reset)
        );
        let mut a = QpAttr::to_state(QpState::Err);
        a.pkey_index = Some(0);
        assert!(check_modify(QpType::XrcTgt, from, &a).is_err());
    }
}

#[test]
fn cur_state_only_from_rtr_rts_sqd() {
    let mut a = QpAttr::to_state(QpState::Init);
    a.cur_state = Some(QpState::Init);
    assert!(check_modify(QpType::Rc, QpState::Init, &a).is_err());
    let mut b = QpAttr {
        cur_state: Some(QpState::Rts),
        ..QpAttr::default()
    };
    assert_eq!(
        check_modify(QpType::XrcTgt, QpState::Rts, &b),
        Ok(QpState::Rts)
    );
    b.cur_state = Some(QpState::Rtr);
    assert_eq!(
        check_modify(QpType::XrcTgt, QpState::Rts, &b),
        Err(ModifyError::CurStateMismatch {
            given: QpState::Rtr,
            actual: QpState::Rts
        })
    );
}

#[test]
fn sqd_sqd_differs_per_type() {
    let a = QpAttr {
        retry_cnt: Some(u3(3)),
        ..QpAttr::default()
    };
    assert!(check_modify(QpType::XrcIni, QpState::Sqd, &a).is_ok());
    assert!(check_modify(QpType::XrcTgt, QpState::Sqd, &a).is_err());
    let b = QpAttr {
        min_rnr_timer: Some(3),
        ..QpAttr::default()
    };
    assert!(check_modify(QpType::XrcTgt, QpState::Sqd, &b).is_ok());
    assert!(check_modify(QpType::XrcIni, QpState::Sqd, &b).is_err());
    assert!(check_modify(QpType::Rc, QpState::Sqd, &b).is_ok());
}

#[test]
fn ranges() {
    let mut a = QpAttr::tgt_to_rts(32, psn(0));
    assert_eq!(
        check_modify(QpType::XrcTgt, QpState::Rtr, &a),
        Err(ModifyError::OutOfRange {
            field: "timeout",
            value: 32
        })
    );
    a.timeout = Some(31);
    assert!(check_modify(QpType::XrcTgt, QpState::Rtr, &a).is_ok());
    let z = QpAttr::to_init(0, 0, AccessFlags::default());
    assert!(check_modify(QpType::XrcTgt, QpState::Reset, &z).is_err());
}

#[test]
fn failed_apply_keeps_state() {
    let mut sm = QpStateMachine::new(QpType::XrcTgt);
    assert!(sm.apply(&QpAttr::to_state(QpState::Rtr)).is_err());
    assert_eq!(sm.state(), QpState::Reset);
}

#[test]
fn mask_display_and_names() {
    let m = AttrMask::AV | AttrMask::DEST_QPN;
    assert_eq!(m.to_string(), "AV|DEST_QPN");
    assert_eq!(AttrMask::EMPTY.to_string(), "-");
    assert_eq!(QpState::from_name("rtr"), Some(QpState::Rtr));
    assert_eq!(QpState::from_raw(6), Some(QpState::Err));
    assert_eq!(QpState::from_raw(7), None);
    assert_eq!(PathMtu::Mtu4096.bytes(), 4096);
    assert_eq!(PathMtu::from_raw(3), Some(PathMtu::Mtu1024));
}
