//! Errors of the C API: an [`ibcm_status`] code with a message for `ibcm_last_error`.

use ibcm::proto::{CallError, ConnectError};
use ibcm::rt::node::NodeError;
use ibcm::rt::sa::PathError;
use ibcm::rt::CmError;

use crate::ffi::types::ibcm_status::{self, *};

/// A failed call: its code and what happened in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Error {
    pub(crate) code: ibcm_status,
    pub(crate) msg: String,
}

impl Error {
    pub(crate) fn new(code: ibcm_status, msg: impl Into<String>) -> Self {
        Error {
            code,
            msg: msg.into(),
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

/// Every code, in declaration order (for `ibcm_strerror` tests and docs).
pub(crate) const ALL: [ibcm_status; 17] = [
    IBCM_OK,
    IBCM_EAGAIN,
    IBCM_EINVAL,
    IBCM_ENOENT,
    IBCM_EBUSY,
    IBCM_ESTATE,
    IBCM_ETOOLONG,
    IBCM_EQPN,
    IBCM_EREFUSED,
    IBCM_EATTACH,
    IBCM_EGONE,
    IBCM_ECLOSED,
    IBCM_EUNSUPPORTED,
    IBCM_EIO,
    IBCM_EINTERNAL,
    IBCM_ENOPATH,
    IBCM_ETIMEDOUT,
];

/// The text of a code, NUL-terminated for C.
pub(crate) const fn text(code: ibcm_status) -> &'static str {
    match code {
        IBCM_OK => "success\0",
        IBCM_EAGAIN => "no event queued\0",
        IBCM_EINVAL => "invalid argument\0",
        IBCM_ENOENT => "no such connection or listener\0",
        IBCM_EBUSY => "another call on this connection is in progress\0",
        IBCM_ESTATE => "not allowed in the connection's state\0",
        IBCM_ETOOLONG => "private data too long\0",
        IBCM_EQPN => "QP number in use or in TimeWait quarantine\0",
        IBCM_EREFUSED => "refused by the node service\0",
        IBCM_EATTACH => "cannot attach to the node service\0",
        IBCM_EGONE => "the node service connection is gone\0",
        IBCM_ECLOSED => "the connection has ended\0",
        IBCM_EUNSUPPORTED => "not supported (by the node service or its device)\0",
        IBCM_EIO => "operating system error\0",
        IBCM_EINTERNAL => "internal error in libibcm\0",
        IBCM_ENOPATH => "no path to the peer\0",
        IBCM_ETIMEDOUT => "no answer in time\0",
    }
}

/// The code of a C `int`, if it is one.
pub(crate) fn status_of(code: i32) -> Option<ibcm_status> {
    ALL.iter().copied().find(|s| *s as i32 == code)
}

impl From<ConnectError> for Error {
    fn from(e: ConnectError) -> Self {
        let code = match &e {
            ConnectError::PrivateDataTooLong { .. } => IBCM_ETOOLONG,
            ConnectError::QpnInQuarantine { .. } | ConnectError::QpnInUse { .. } => IBCM_EQPN,
            ConnectError::NoPath => IBCM_EINVAL,
            _ => IBCM_EINVAL,
        };
        Error::new(code, e.to_string())
    }
}

impl From<CallError> for Error {
    fn from(e: CallError) -> Self {
        let code = match &e {
            CallError::UnknownConnection(_) => IBCM_ENOENT,
            CallError::WrongState { .. } => IBCM_ESTATE,
            CallError::TooLong { .. } => IBCM_ETOOLONG,
            CallError::QpnInQuarantine { .. } | CallError::QpnInUse { .. } => IBCM_EQPN,
            _ => IBCM_EINVAL,
        };
        Error::new(code, e.to_string())
    }
}

impl From<CmError> for Error {
    fn from(e: CmError) -> Self {
        match e {
            CmError::Connect(e) => e.into(),
            CmError::Call(e) => e.into(),
            CmError::Connection(e) => Error::new(IBCM_ECLOSED, e.to_string()),
            CmError::DriverGone => Error::new(IBCM_EGONE, e.to_string()),
            CmError::Refused(_) | CmError::AlreadyListening(_) => {
                Error::new(IBCM_EREFUSED, e.to_string())
            }
            CmError::SidrTimedOut | CmError::NoApp => Error::new(IBCM_EUNSUPPORTED, e.to_string()),
            CmError::LapTimedOut => Error::new(IBCM_ETIMEDOUT, e.to_string()),
            CmError::LapsNotDelegated => Error::new(IBCM_ESTATE, e.to_string()),
            CmError::Path(p) => {
                let code = match p {
                    PathError::NoSa | PathError::NotServed | PathError::AlternateNotServed => {
                        IBCM_EUNSUPPORTED
                    }
                    _ => IBCM_ENOPATH,
                };
                Error::new(code, format!("no path: {p}"))
            }
            other => Error::new(IBCM_EINTERNAL, other.to_string()),
        }
    }
}

impl From<NodeError> for Error {
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::Refused(why) => Error::new(IBCM_EREFUSED, why),
            NodeError::Gone => Error::new(IBCM_EGONE, e.to_string()),
            other => Error::new(IBCM_EINTERNAL, other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_own_text() {
        let mut seen = std::collections::HashSet::new();
        for c in ALL {
            let t = text(c);
            assert!(t.ends_with('\0') && t.len() > 1, "{c:?}");
            assert!(!t[..t.len() - 1].contains('\0'), "{c:?}");
            assert!(seen.insert(t), "{c:?} shares its text");
            assert_eq!(status_of(c as i32), Some(c));
        }
        assert_eq!(status_of(1), None);
        assert_eq!(status_of(-17), None);
    }

    #[test]
    fn errors_map_to_codes() {
        let e: Error = CmError::DriverGone.into();
        assert_eq!(e.code, IBCM_EGONE);
        let e: Error = CmError::Refused("taken".into()).into();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (IBCM_EREFUSED, "the node service refused the request: taken")
        );
        let e: Error = ConnectError::PrivateDataTooLong { len: 93, max: 92 }.into();
        assert_eq!(e.code, IBCM_ETOOLONG);
        let e: Error = CallError::UnknownConnection(ibcm_mad::CommId(7)).into();
        assert_eq!(e.code, IBCM_ENOENT);
        let e: Error = NodeError::Refused("quota".into()).into();
        assert_eq!((e.code, e.msg.as_str()), (IBCM_EREFUSED, "quota"));
        let e: Error = CmError::Path(PathError::NoSa).into();
        assert_eq!(e.code, IBCM_EUNSUPPORTED);
        assert!(e.msg.contains("not on an InfiniBand port"), "{}", e.msg);
        let e: Error = CmError::Path(PathError::NotServed).into();
        assert_eq!(e.code, IBCM_EUNSUPPORTED);
        let timeout = ibcm::sa::SaError::Timeout { attempts: 4 };
        let e: Error = CmError::Path(PathError::Sa(timeout)).into();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (
                IBCM_ENOPATH,
                "no path: PathRecord query to the SA: no answer from the SA after 4 attempts"
            )
        );
        let e: Error = CmError::Path(PathError::PkeyMismatch {
            pkey: 0x8001,
            pkey0: 0xffff,
        })
        .into();
        assert_eq!(e.code, IBCM_ENOPATH);
    }
}
