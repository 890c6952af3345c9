//! The keeper's wire protocol: one JSON object per line, both ways.
//!
//! Requests carry an `op` and an optional `id`; every reply echoes the `id` and carries the
//! keeper's `epoch`. Unsolicited events carry an `event` field instead of `id`.
//!
//! ```text
//! → {"id":1,"op":"hello","pid":4242,"name":"hold"}
//! ← {"id":1,"epoch":"9c1e…","ok":true,"result":{"session":3,"keeper_pid":77,"backend":"sim","device":"sim_mlx5_0"}}
//! → {"id":2,"op":"open-domain","domain":"job7","path":"/tmp/job7.xrcd"}
//! ← {"id":2,"epoch":"9c1e…","ok":true,"result":{"domain":"job7"}}
//! → {"id":3,"op":"create-or-register","domain":"job7"}
//! ← {"id":3,"epoch":"9c1e…","ok":true,"result":{"qpn":72,"created":true}}
//! ← {"epoch":"9c1e…","event":"qp-gone","qpn":72,"cause":"last registration dropped"}
//! → {"id":4,"op":"register","qpn":72}
//! ← {"id":4,"epoch":"9c1e…","ok":false,"error":{"kind":"gone","message":"TGT QP 0x000048 is gone: …"}}
//! ```

use serde::{Deserialize, Serialize};

/// A request line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Echoed in the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// The operation.
    #[serde(flatten)]
    pub req: Request,
}

fn default_true() -> bool {
    true
}

fn default_key() -> String {
    "default".to_owned()
}

/// The operations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Introduce the client; the reply carries the epoch and the session number.
    Hello {
        /// The client's PID (used only when the keeper cannot read `SO_PEERCRED`).
        #[serde(default)]
        pid: Option<u32>,
        /// A name for logs.
        #[serde(default)]
        name: Option<String>,
    },
    /// Liveness check.
    Ping,
    /// Open (or create) a domain under a name.
    OpenDomain {
        /// The name.
        domain: String,
        /// The file naming a shared domain; absent: a private domain.
        #[serde(default)]
        path: Option<String>,
        /// `O_CREAT` (default true).
        #[serde(default = "default_true")]
        create: bool,
        /// `O_EXCL` (default false).
        #[serde(default)]
        exclusive: bool,
    },
    /// Close a domain (DomainClose for every QP in it).
    CloseDomain {
        /// The name.
        domain: String,
    },
    /// Create a TGT QP with a policy; the session becomes creator (and owner / registrant).
    Create {
        /// Domain name.
        domain: String,
        /// `explicit`, `domain-bound`, `process-bound` or `shared`.
        policy: String,
    },
    /// Register on the `Shared` TGT QP kept under `key` in the domain, creating it first if
    /// there is none (what `xrcd-keeper hold --shared-qp` does).
    CreateOrRegister {
        /// Domain name.
        domain: String,
        /// Slot name (default `"default"`).
        #[serde(default = "default_key")]
        key: String,
    },
    /// Add a registration (OFED `ibv_reg_xrc_rcv_qp`).
    Register {
        /// The QP.
        qpn: u32,
    },
    /// Drop a registration (OFED `ibv_unreg_xrc_rcv_qp`).
    Unregister {
        /// The QP.
        qpn: u32,
    },
    /// Owner destroy.
    Destroy {
        /// The QP.
        qpn: u32,
    },
    /// Take ownership of an orphan.
    Adopt {
        /// The QP.
        qpn: u32,
    },
    /// Modify by number (OFED `ibv_modify_xrc_rcv_qp`).
    Modify {
        /// The QP.
        qpn: u32,
        /// The attributes.
        attr: ModifyAttr,
    },
    /// Query by number (OFED `ibv_query_xrc_rcv_qp`).
    Query {
        /// The QP.
        qpn: u32,
    },
    /// An XRC REQ received by the client's CM: accept onto a TGT QP per policy, or reject.
    AcceptReq {
        /// The client's name for the connection.
        conn: String,
        /// Domain name.
        domain: String,
        /// Initiator CA GUID.
        ini_ca_guid: u64,
        /// Initiator QPN.
        ini_qpn: u32,
        /// `any`, `create` or `attach`.
        #[serde(default)]
        mode: Option<String>,
        /// TGT QPN for `attach`.
        #[serde(default)]
        tgt_qpn: Option<u32>,
        /// Requested policy.
        #[serde(default)]
        policy: Option<String>,
        /// The accepting process's SRQ numbers.
        #[serde(default)]
        srqns: Vec<u32>,
        /// The connection's TimeWait in milliseconds.
        #[serde(default)]
        timewait_ms: Option<u64>,
    },
    /// A CM event on a connection the keeper accepted.
    ConnEvent {
        /// The client's name for the connection.
        conn: String,
        /// `established`, `peer-dreq`, `peer-timeout` or `closed`.
        event: String,
    },
    /// Everything: domains, QPs, holders.
    Status,
    /// Live TGT QPs with no connection, owner or registration.
    Leaks,
}

/// Modify-QP attributes, all optional (the mask is the set of fields present).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModifyAttr {
    /// Target state (`INIT`, `RTR`, …).
    #[serde(default)]
    pub state: Option<String>,
    /// Current state.
    #[serde(default)]
    pub cur_state: Option<String>,
    /// P_Key index.
    #[serde(default)]
    pub pkey_index: Option<u16>,
    /// Port.
    #[serde(default)]
    pub port: Option<u8>,
    /// Access flags.
    #[serde(default)]
    pub access_flags: Option<u32>,
    /// Path MTU code 1..=5.
    #[serde(default)]
    pub path_mtu: Option<u32>,
    /// Destination (INI) QPN.
    #[serde(default)]
    pub dest_qpn: Option<u32>,
    /// RQ PSN.
    #[serde(default)]
    pub rq_psn: Option<u32>,
    /// SQ PSN.
    #[serde(default)]
    pub sq_psn: Option<u32>,
    /// Local ACK timeout exponent.
    #[serde(default)]
    pub timeout: Option<u8>,
    /// Min RNR timer code.
    #[serde(default)]
    pub min_rnr_timer: Option<u8>,
    /// Max destination RDMA reads/atomics.
    #[serde(default)]
    pub max_dest_rd_atomic: Option<u8>,
    /// Address vector.
    #[serde(default)]
    pub av: Option<AvAttr>,
}

/// An address vector in [`ModifyAttr`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AvAttr {
    /// Destination LID.
    #[serde(default)]
    pub dlid: u16,
    /// Service level.
    #[serde(default)]
    pub sl: u8,
    /// Port.
    #[serde(default)]
    pub port: u8,
    /// Static rate.
    #[serde(default)]
    pub static_rate: u8,
    /// Destination GID as 32 hex digits (RoCE); absent: no GRH.
    #[serde(default)]
    pub dgid: Option<String>,
    /// Source GID index.
    #[serde(default)]
    pub sgid_index: u8,
    /// Hop limit.
    #[serde(default)]
    pub hop_limit: u8,
    /// Traffic class.
    #[serde(default)]
    pub traffic_class: u8,
    /// Flow label.
    #[serde(default)]
    pub flow_label: u32,
}

/// A reply line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The request's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// The keeper instance's epoch (changes at every start).
    pub epoch: String,
    /// Success.
    pub ok: bool,
    /// The result on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// The error otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// An error in a reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Machine-readable kind; a kebab-case string on the wire ([`ErrorKind::as_str`]).
    pub kind: ErrorKind,
    /// Text.
    pub message: String,
}

macro_rules! error_kinds {
    ($($(#[$m:meta])* $v:ident => $s:literal,)*) => {
        /// The `kind` of an [`ErrorBody`]. On the wire it is the kebab-case string shown for
        /// each variant; a string this version does not know parses to [`ErrorKind::Other`]
        /// and is written back unchanged.
        #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(from = "String", into = "String")]
        #[non_exhaustive]
        pub enum ErrorKind {
            $($(#[$m])* $v,)*
            /// A kind this version does not know (from a newer keeper).
            Other(String),
        }

        impl ErrorKind {
            /// Every known kind.
            pub const KNOWN: &'static [ErrorKind] = &[$(ErrorKind::$v,)*];

            /// The wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $(ErrorKind::$v => $s,)*
                    ErrorKind::Other(s) => s,
                }
            }
        }

        impl From<String> for ErrorKind {
            fn from(s: String) -> Self {
                match s.as_str() {
                    $($s => ErrorKind::$v,)*
                    _ => ErrorKind::Other(s),
                }
            }
        }
    };
}

error_kinds! {
    /// `unknown-domain`: no domain of that name.
    UnknownDomain => "unknown-domain",
    /// `domain-closing`: the domain is being closed.
    DomainClosing => "domain-closing",
    /// `domain-exists`: a domain of that name is already open.
    DomainExists => "domain-exists",
    /// `unknown-qpn`: no TGT QP of that number.
    UnknownQpn => "unknown-qpn",
    /// `gone`: the TGT QP is gone.
    Gone => "gone",
    /// `not-owner`: only the owner may do that.
    NotOwner => "not-owner",
    /// `not-registered`: the session holds no registration on the QP.
    NotRegistered => "not-registered",
    /// `no-resources`: no usable QPN could be found.
    NoResources => "no-resources",
    /// `no-xrc`: the device has no XRC.
    NoXrc => "no-xrc",
    /// `bad-modify`: the QP transition or its attributes are invalid.
    BadModify => "bad-modify",
    /// `verbs`: another verbs failure.
    Verbs => "verbs",
    /// `bad-request`: the request line or one of its values is malformed.
    BadRequest => "bad-request",
    /// `error`: the keeper failed to build its answer.
    Internal => "error",
    /// `permission-denied`: the object belongs to another uid and its sharing rule does not
    /// admit this client (a domain name held by another uid, another uid's private domain or
    /// non-Shared QP, a domain file the client could not open itself).
    PermissionDenied => "permission-denied",
    /// `quota-exceeded`: the client's user holds as many sessions, domains or TGT QPs as the
    /// keeper allows one user ([`KeeperLimits`](crate::keeper::server::KeeperLimits)).
    QuotaExceeded => "quota-exceeded",
}

impl From<ErrorKind> for String {
    fn from(k: ErrorKind) -> Self {
        match k {
            ErrorKind::Other(s) => s,
            known => known.as_str().to_owned(),
        }
    }
}

impl core::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for ErrorKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ErrorKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// An unsolicited event line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLine {
    /// The keeper's epoch.
    pub epoch: String,
    /// The event.
    #[serde(flatten)]
    pub event: KeeperEvent,
}

/// Unsolicited events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum KeeperEvent {
    /// A TGT QP went away (sent to every session).
    QpGone {
        /// The QP.
        qpn: u32,
        /// Why (text of [`GoneCause`](ibcm_mad::xrc::GoneCause)).
        cause: String,
    },
    /// A TGT QP lost its owner and is kept as an orphan.
    QpOrphaned {
        /// The QP.
        qpn: u32,
    },
    /// End this connection (DREQ if established, REJ reason 1 while still being set up): its
    /// TGT QP went. `send-dreq` on the wire.
    #[serde(rename = "send-dreq")]
    EndConnection {
        /// The connection (the name the session gave it).
        conn: String,
        /// The TGT QP.
        qpn: u32,
        /// Why.
        cause: String,
    },
}

/// One session in [`StatusReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    /// Session number.
    pub session: u32,
    /// The client's PID.
    pub pid: Option<u32>,
    /// Its name.
    pub name: String,
}

/// One domain in [`StatusReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainView {
    /// Name.
    pub name: String,
    /// File, or `private`.
    pub path: String,
    /// `open` or `closing`.
    pub state: String,
}

/// One registration in [`QpView`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderView {
    /// The holder's PID (process registrations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The connection (connection registrations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conn: Option<String>,
    /// Registration count.
    pub count: u32,
}

/// One TGT QP in [`StatusReport`] and the reply of `query`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpView {
    /// QP number.
    pub qpn: u32,
    /// Domain name.
    pub domain: String,
    /// Policy name.
    pub policy: String,
    /// `live`, or `gone: <cause>` while quarantined.
    pub life: String,
    /// QP state.
    pub state: String,
    /// Creator PID.
    pub creator_pid: Option<u32>,
    /// Owner PID (`None` for Shared and orphans).
    pub owner_pid: Option<u32>,
    /// Registrations.
    pub holders: Vec<HolderView>,
    /// Connections (names).
    pub conns: Vec<String>,
}

/// The reply of `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Epoch.
    pub epoch: String,
    /// The keeper's PID.
    pub keeper_pid: u32,
    /// `sim` or `verbs`.
    pub backend: String,
    /// Device name.
    pub device: String,
    /// Connected clients.
    pub sessions: Vec<SessionView>,
    /// Domains.
    pub domains: Vec<DomainView>,
    /// TGT QPs (live and quarantined).
    pub qps: Vec<QpView>,
}

/// One entry of the reply of `leaks`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakView {
    /// QP number.
    pub qpn: u32,
    /// Domain name.
    pub domain: String,
    /// Policy name.
    pub policy: String,
    /// Creator PID.
    pub creator_pid: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds are the strings the keeper has always sent: old clients still parse them.
    #[test]
    fn error_kinds_keep_their_json() {
        let old = [
            "unknown-domain",
            "domain-closing",
            "domain-exists",
            "unknown-qpn",
            "gone",
            "not-owner",
            "not-registered",
            "no-resources",
            "no-xrc",
            "bad-modify",
            "verbs",
            "bad-request",
            "error",
            "permission-denied",
            "quota-exceeded",
        ];
        assert_eq!(ErrorKind::KNOWN.len(), old.len());
        for (k, s) in ErrorKind::KNOWN.iter().zip(old) {
            let body = ErrorBody {
                kind: k.clone(),
                message: "m".into(),
            };
            let json = serde_json::to_string(&body).unwrap();
            assert_eq!(json, format!(r#"{{"kind":"{s}","message":"m"}}"#));
            assert_eq!(serde_json::from_str::<ErrorBody>(&json).unwrap(), body);
            assert_eq!(*k, s);
        }
        let future: ErrorBody =
            serde_json::from_str(r#"{"kind":"from-the-future","message":"m"}"#).unwrap();
        assert_eq!(future.kind, ErrorKind::Other("from-the-future".into()));
        assert_eq!(
            serde_json::to_string(&future).unwrap(),
            r#"{"kind":"from-the-future","message":"m"}"#
        );
    }

    #[test]
    fn request_lines_parse() {
        let e: Envelope =
            serde_json::from_str(r#"{"id":3,"op":"create-or-register","domain":"d"}"#).unwrap();
        assert_eq!(
            e,
            Envelope {
                id: Some(3),
                req: Request::CreateOrRegister {
                    domain: "d".into(),
                    key: "default".into()
                }
            }
        );
        let e: Envelope = serde_json::from_str(r#"{"op":"open-domain","domain":"d"}"#).unwrap();
        assert!(matches!(
            e.req,
            Request::OpenDomain {
                create: true,
                exclusive: false,
                path: None,
                ..
            }
        ));
        let e: Envelope = serde_json::from_str(
            r#"{"op":"modify","qpn":72,"attr":{"state":"INIT","pkey_index":0,"port":1,"access_flags":0}}"#,
        )
        .unwrap();
        assert!(matches!(e.req, Request::Modify { qpn: 72, .. }));
        assert!(serde_json::from_str::<Envelope>(r#"{"op":"nope"}"#).is_err());
        assert!(
            serde_json::from_str::<Envelope>(r#"{"op":"modify","qpn":1,"attr":{"bogus":1}}"#)
                .is_err()
        );
    }

    #[test]
    fn event_lines() {
        let l = EventLine {
            epoch: "e".into(),
            event: KeeperEvent::QpGone {
                qpn: 72,
                cause: "creator exited".into(),
            },
        };
        let s = serde_json::to_string(&l).unwrap();
        assert_eq!(
            s,
            r#"{"epoch":"e","event":"qp-gone","qpn":72,"cause":"creator exited"}"#
        );
        assert_eq!(serde_json::from_str::<EventLine>(&s).unwrap(), l);
    }

    #[test]
    fn end_connection_is_send_dreq_on_the_wire() {
        let l = EventLine {
            epoch: "e".into(),
            event: KeeperEvent::EndConnection {
                conn: "c".into(),
                qpn: 7,
                cause: "keeper lost".into(),
            },
        };
        let s = serde_json::to_string(&l).unwrap();
        assert_eq!(
            s,
            r#"{"epoch":"e","event":"send-dreq","conn":"c","qpn":7,"cause":"keeper lost"}"#
        );
        assert_eq!(serde_json::from_str::<EventLine>(&s).unwrap(), l);
    }
}
