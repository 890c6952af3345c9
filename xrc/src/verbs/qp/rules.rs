//! The modify-QP rules of the [module table](super) as code: [`transition_rule`],
//! [`check_modify`] and the state machine kept next to a handle.

use super::{AttrMask, QpAttr, QpState, QpType};

/// Why [`check_modify`] refused a modify-QP call. The kernel answers all of these with
/// `EINVAL`; this type says which rule was broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyError {
    /// The transition does not exist for this QP type (e.g. RESET→RTR, INIT→RTS).
    #[error("{qp_type} QP cannot go from {from} to {to}")]
    InvalidTransition {
        /// QP type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute is missing.
    #[error("{qp_type} {from}->{to} requires {missing}")]
    MissingAttributes {
        /// QP type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The required attributes that were not given.
        missing: AttrMask,
    },
    /// An attribute is neither required nor optional for this transition.
    #[error("{qp_type} {from}->{to} does not accept {extra}")]
    UnexpectedAttributes {
        /// QP type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The attributes that are not allowed.
        extra: AttrMask,
    },
    /// `cur_state` was given and does not match the QP's state.
    #[error("cur_state {given} does not match the QP's state {actual}")]
    CurStateMismatch {
        /// What the caller said.
        given: QpState,
        /// What the QP is in.
        actual: QpState,
    },
    /// A value is out of range for its field.
    #[error("attribute {field} = {value} is out of range")]
    OutOfRange {
        /// Field name.
        field: &'static str,
        /// Offending value.
        value: u32,
    },
}

/// Required and optional attributes for a transition, or `None` if it is not allowed.
pub(crate) fn transition_rule(
    qp_type: QpType,
    from: QpState,
    to: QpState,
) -> Option<(AttrMask, AttrMask)> {
    use AttrMask as M;
    use QpState as S;
    let ini = qp_type == QpType::XrcIni;
    let tgt = qp_type == QpType::XrcTgt;
    let none = M::EMPTY;
    let rule = match (from, to) {
        (S::Reset, S::Reset) => (none, none),
        (S::Reset, S::Init) => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        (S::Init | S::Rtr | S::Rts | S::Sqd | S::Sqe | S::Err, S::Reset | S::Err) => (none, none),
        (S::Init, S::Init) => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        (S::Init, S::Rtr) => {
            let mut req = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
            if !ini {
                req |= M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
            }
            (req, M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX)
        }
        (S::Rtr, S::Rts) => {
            let req = if tgt {
                M::TIMEOUT | M::SQ_PSN
            } else {
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
            };
            let mut opt = M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE;
            if !ini {
                opt |= M::MIN_RNR_TIMER;
            }
            (req, opt)
        }
        (S::Rts | S::Sqd, S::Rts) => {
            let mut opt = M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE;
            if !ini {
                opt |= M::MIN_RNR_TIMER;
            }
            (none, opt)
        }
        (S::Rts, S::Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (S::Sqd, S::Sqd) => {
            let common = M::PORT
                | M::AV
                | M::TIMEOUT
                | M::ALT_PATH
                | M::ACCESS_FLAGS
                | M::PKEY_INDEX
                | M::PATH_MIG_STATE;
            let opt = match qp_type {
                QpType::Rc => {
                    common
                        | M::RETRY_CNT
                        | M::RNR_RETRY
                        | M::MAX_QP_RD_ATOMIC
                        | M::MAX_DEST_RD_ATOMIC
                        | M::MIN_RNR_TIMER
                }
                QpType::XrcIni => common | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                QpType::XrcTgt => common | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
            };
            (none, opt)
        }
        _ => return None,
    };
    Some(rule)
}

/// Checks one modify-QP call against the rules above and returns the state the QP ends up
/// in. Without `state` in `attr` the QP stays in its current state (an attribute-only
/// modify, checked as the `cur → cur` transition).
///
/// # Errors
/// [`ModifyError`] naming the broken rule.
pub fn check_modify(qp_type: QpType, cur: QpState, attr: &QpAttr) -> Result<QpState, ModifyError> {
    let next = attr.state.unwrap_or(cur);
    let mask = attr.mask();
    if let Some(given) = attr.cur_state {
        if given != cur {
            return Err(ModifyError::CurStateMismatch { given, actual: cur });
        }
        if !matches!(
            cur,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            return Err(ModifyError::UnexpectedAttributes {
                qp_type,
                from: cur,
                to: next,
                extra: AttrMask::CUR_STATE,
            });
        }
    }
    let (req, opt) = transition_rule(qp_type, cur, next).ok_or(ModifyError::InvalidTransition {
        qp_type,
        from: cur,
        to: next,
    })?;
    let missing = req & !mask;
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes {
            qp_type,
            from: cur,
            to: next,
            missing,
        });
    }
    let extra = mask & !(req | opt | AttrMask::STATE);
    if !extra.is_empty() {
        return Err(ModifyError::UnexpectedAttributes {
            qp_type,
            from: cur,
            to: next,
            extra,
        });
    }
    check_ranges(attr)?;
    Ok(next)
}

fn check_ranges(attr: &QpAttr) -> Result<(), ModifyError> {
    let bad = |field: &'static str, value: u32| Err(ModifyError::OutOfRange { field, value });
    if let Some(t) = attr.timeout {
        if t > 31 {
            return bad("timeout", t.into());
        }
    }
    if let Some(t) = attr.min_rnr_timer {
        if t > 31 {
            return bad("min_rnr_timer", t.into());
        }
    }
    if attr.port == Some(0) {
        return bad("port", 0);
    }
    if let Some(av) = &attr.av {
        if av.sl > 15 {
            return bad("av.sl", av.sl.into());
        }
        if let Some(grh) = &av.grh {
            if grh.flow_label > 0xf_ffff {
                return bad("av.grh.flow_label", grh.flow_label);
            }
        }
    }
    if let Some(alt) = &attr.alt_path {
        if alt.timeout > 31 {
            return bad("alt_path.timeout", alt.timeout.into());
        }
    }
    Ok(())
}

/// A QP's state as tracked next to a handle: applies [`check_modify`] and remembers the
/// result, so a caller can refuse a bad transition before any verb is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpStateMachine {
    qp_type: QpType,
    state: QpState,
}

impl QpStateMachine {
    /// A new QP of `qp_type`, in RESET.
    pub(crate) const fn new(qp_type: QpType) -> Self {
        Self {
            qp_type,
            state: QpState::Reset,
        }
    }

    /// The current state.
    pub(crate) const fn state(&self) -> QpState {
        self.state
    }

    /// Validates `attr` and, if valid, moves to the resulting state.
    ///
    /// # Errors
    /// [`ModifyError`]; the state is unchanged then.
    pub(crate) fn apply(&mut self, attr: &QpAttr) -> Result<QpState, ModifyError> {
        let next = check_modify(self.qp_type, self.state, attr)?;
        self.state = next;
        Ok(next)
    }
}
