//! Path queries through the node service: a client's
//! [`Cm::resolve_path`](crate::rt::Cm::resolve_path) ([`Op::ResolvePath`]), answered from the
//! daemon endpoint's SA client ([`WireResult::Path`], [`WireResult::PathError`]) when the
//! answer comes (with `alternate`, [`Cm::resolve_path_with_alternate`](crate::rt::Cm::resolve_path_with_alternate):
//! the alternate path too, one more SA query in the same place), so after the replies of requests sent meanwhile; at most
//! [`ServerConfig::max_path_queries`] in flight per session and
//! [`ServerConfig::max_path_queries_per_user`] per user.
//!
//! Within protocol version 2: a daemon that serves them says so in its `hello` answer
//! ([`WireResult::Hello::paths`]: how many of a session at once); a client does not send one
//! to a daemon that did not, and keeps its own below that many in flight (its callers wait).

use std::net::Ipv6Addr;
use std::sync::Arc;

use ibcm_mad::sa::{PathRecord, SaStatus};
use ibcm_mad::{Gid, Lid};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::proto::{Op, WireResult};
use super::server::{lock, NodeServer, Session};
#[cfg(doc)]
use super::ServerConfig;
use crate::rt::sa::PathError;
use crate::rt::CmError;
use crate::sa::{PathTarget, SaError};

/// A [`PathTarget`] on the wire: `{"lid":N}` or `{"gid":"G"}` (IPv6 notation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WirePathTarget {
    /// A LID (served when unicast, 1..=0xBFFF).
    Lid(u16),
    /// A GID (served when not zero and not multicast).
    Gid(Ipv6Addr),
}

impl WirePathTarget {
    /// From a target.
    pub fn from_target(t: PathTarget) -> Self {
        match t {
            PathTarget::Lid(l) => Self::Lid(l.0),
            PathTarget::Gid(g) => Self::Gid(Ipv6Addr::from(g.0)),
        }
    }

    /// Back to a target.
    ///
    /// # Errors
    /// A LID that is not unicast, a zero or multicast GID.
    pub fn to_target(self) -> Result<PathTarget, String> {
        match self {
            Self::Lid(l) => PathTarget::lid(Lid(l))
                .ok_or_else(|| format!("lid {l:#x} is not a unicast LID (1..0xbfff)")),
            Self::Gid(g) => PathTarget::gid(Gid(g.octets()))
                .ok_or_else(|| format!("gid {g}: the zero GID or a multicast GID names no port")),
        }
    }
}

/// [`PathError`] on the wire, by `kind`. A kind this build does not know decodes as
/// [`WirePathError::Unknown`] (a newer daemon's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum WirePathError {
    /// [`PathError::NoSa`].
    NoSa,
    /// [`PathError::NoSm`].
    NoSm {
        /// The port's LID.
        lid: u16,
        /// The SM's LID.
        sm_lid: u16,
    },
    /// [`PathError::Sa`] of [`SaError::Status`].
    SaStatus {
        /// The MAD status word.
        mad_status: u16,
    },
    /// [`PathError::Sa`] of [`SaError::Timeout`].
    SaTimeout {
        /// Requests sent.
        attempts: u32,
    },
    /// [`PathError::Sa`] of [`SaError::RmppAborted`].
    SaRmppAborted {
        /// RMPPType.
        rmpp_type: u8,
        /// RMPPStatus.
        status: u8,
    },
    /// [`PathError::Sa`] of [`SaError::TooManyQueries`].
    SaTooManyQueries,
    /// [`PathError::Sa`] of [`SaError::Cancelled`] (the daemon's SA task ended).
    SaCancelled,
    /// [`PathError::NoRecord`].
    NoRecord,
    /// [`PathError::PkeyMismatch`].
    PkeyMismatch {
        /// The path's P_Key.
        pkey: u16,
        /// The daemon port's P_Key 0.
        pkey0: u16,
    },
    /// [`PathError::NotServed`] and [`PathError::AlternateNotServed`] (never sent by a
    /// daemon), or a kind this build does not know.
    #[serde(other)]
    Unknown,
}

impl WirePathError {
    /// From the error.
    pub fn from_error(e: &PathError) -> Self {
        match e {
            PathError::NoSa => Self::NoSa,
            PathError::NoSm { lid, sm_lid } => Self::NoSm {
                lid: *lid,
                sm_lid: *sm_lid,
            },
            PathError::Sa(SaError::Status { mad_status, .. }) => Self::SaStatus {
                mad_status: *mad_status,
            },
            PathError::Sa(SaError::Timeout { attempts }) => Self::SaTimeout {
                attempts: *attempts,
            },
            PathError::Sa(SaError::RmppAborted { rmpp_type, status }) => Self::SaRmppAborted {
                rmpp_type: *rmpp_type,
                status: *status,
            },
            PathError::Sa(SaError::TooManyQueries) => Self::SaTooManyQueries,
            PathError::Sa(SaError::Cancelled) => Self::SaCancelled,
            PathError::NoRecord => Self::NoRecord,
            PathError::PkeyMismatch { pkey, pkey0 } => Self::PkeyMismatch {
                pkey: *pkey,
                pkey0: *pkey0,
            },
            PathError::NotServed | PathError::AlternateNotServed => Self::Unknown,
        }
    }

    /// Back to the error ([`WirePathError::Unknown`]: [`PathError::NotServed`], which says
    /// this client does not understand the daemon's answer).
    pub fn to_error(&self) -> PathError {
        match *self {
            Self::NoSa => PathError::NoSa,
            Self::NoSm { lid, sm_lid } => PathError::NoSm { lid, sm_lid },
            Self::SaStatus { mad_status } => PathError::Sa(SaError::Status {
                sa: SaStatus::from_mad_status(mad_status),
                mad_status,
            }),
            Self::SaTimeout { attempts } => PathError::Sa(SaError::Timeout { attempts }),
            Self::SaRmppAborted { rmpp_type, status } => {
                PathError::Sa(SaError::RmppAborted { rmpp_type, status })
            }
            Self::SaTooManyQueries => PathError::Sa(SaError::TooManyQueries),
            Self::SaCancelled => PathError::Sa(SaError::Cancelled),
            Self::NoRecord => PathError::NoRecord,
            Self::PkeyMismatch { pkey, pkey0 } => PathError::PkeyMismatch { pkey, pkey0 },
            Self::Unknown => PathError::NotServed,
        }
    }
}

/// The attached [`Cm`](crate::rt::Cm)'s way to the daemon's path queries: the node
/// operations' channel of its client task, and as many permits as the daemon serves queries
/// of a session at once (its hello's `paths`; `None`: it serves none), so that the handle's
/// callers wait for a place rather than meet the daemon's quota.
#[derive(Debug, Clone)]
pub(crate) struct NodePaths {
    tx: mpsc::UnboundedSender<(Op, oneshot::Sender<WireResult>)>,
    permits: Option<Arc<tokio::sync::Semaphore>>,
    /// The daemon serves path migration (its hello's `apm`): alternate paths, LAPs.
    apm: bool,
}

impl NodePaths {
    /// Over the node operations' channel `tx`, for a daemon that serves `served` path
    /// queries of a session at once (0: none) and path migration if `apm` (its hello's
    /// `apm` was not 0).
    pub(super) fn new(
        tx: mpsc::UnboundedSender<(Op, oneshot::Sender<WireResult>)>,
        served: u32,
        apm: bool,
    ) -> Self {
        let n = usize::try_from(served)
            .unwrap_or(usize::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        NodePaths {
            tx,
            permits: (n > 0).then(|| Arc::new(tokio::sync::Semaphore::new(n))),
            apm,
        }
    }

    /// Paths of a daemon that does not serve them, nor path migration (tests of other
    /// calls).
    #[cfg(test)]
    pub(crate) fn not_served() -> Self {
        NodePaths::new(mpsc::unbounded_channel().0, 0, false)
    }

    /// Whether the daemon serves path migration (LAPs, alternate paths).
    pub(crate) fn apm(&self) -> bool {
        self.apm
    }

    /// [`Op::ResolvePath`] (with `alternate`, also the alternate path), once this handle has
    /// fewer than the daemon's limit in flight.
    pub(crate) async fn resolve(
        &self,
        to: PathTarget,
        alternate: bool,
    ) -> Result<(PathRecord, Option<PathRecord>), CmError> {
        let Some(permits) = &self.permits else {
            return Err(PathError::NotServed.into());
        };
        if alternate && !self.apm {
            return Err(PathError::AlternateNotServed.into());
        }
        let _permit = permits.acquire().await.map_err(|_| CmError::DriverGone)?;
        let (tx, rx) = oneshot::channel();
        let op = Op::ResolvePath {
            target: WirePathTarget::from_target(to),
            alternate,
        };
        self.tx.send((op, tx)).map_err(|_| CmError::DriverGone)?;
        let parse = |b: &[u8]| {
            PathRecord::parse(b)
                .map_err(|e| CmError::Refused(format!("a malformed PathRecord: {e}")))
        };
        match rx.await.map_err(|_| CmError::DriverGone)? {
            WireResult::Path {
                record,
                alternate: alt,
            } => {
                let alt = match (alternate, alt) {
                    (true, Some(a)) => Some(parse(&a)?),
                    _ => None,
                };
                Ok((parse(&record)?, alt))
            }
            WireResult::PathError(e) => Err(CmError::Path(e.to_error())),
            WireResult::Refused { why } => Err(CmError::Refused(why)),
            other => Err(CmError::Refused(format!("unexpected answer {other:?}"))),
        }
    }
}

/// A path query in flight: counted against its session's and its user's limits until
/// dropped.
struct InFlight {
    server: Arc<NodeServer>,
    session: Arc<Session>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut st = self.session.lock();
            st.path_queries = st.path_queries.saturating_sub(1);
        }
        let uid = self.session.info.uid;
        let mut users = lock(&self.server.path_queries);
        if let Some(n) = users.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                users.remove(&uid);
            }
        }
    }
}

impl NodeServer {
    /// [`Op::ResolvePath`]: asked of the daemon endpoint's SA client
    /// ([`Cm::resolve_path`](crate::rt::Cm::resolve_path)); the reply to `seq` is sent when
    /// the answer comes.
    pub(super) fn resolve_path(
        self: &Arc<Self>,
        s: &Arc<Session>,
        seq: u64,
        target: WirePathTarget,
        alternate: bool,
    ) {
        let to = match target.to_target() {
            Ok(t) => t,
            Err(why) => return Self::reply(s, seq, WireResult::Refused { why }),
        };
        let slot = match self.path_slot(s) {
            Ok(slot) => slot,
            Err(why) => return Self::reply(s, seq, WireResult::Refused { why }),
        };
        let cm = self.cm.clone();
        tokio::spawn(async move {
            let r = if alternate {
                cm.resolve_path_with_alternate(to).await
            } else {
                cm.resolve_path(to).await.map(|rec| (rec, None))
            };
            let r = match r {
                Ok((rec, alt)) => WireResult::Path {
                    record: rec.to_bytes().to_vec(),
                    alternate: alt.map(|a| a.to_bytes().to_vec()),
                },
                Err(CmError::Path(e)) => WireResult::PathError(WirePathError::from_error(&e)),
                Err(e) => WireResult::Refused { why: e.to_string() },
            };
            let s = slot.session.clone();
            // Given back before the reply: a client that asks again at once finds room.
            drop(slot);
            Self::reply(&s, seq, r);
        });
    }

    /// Takes a place among `s`'s and its user's path queries in flight, or says why not.
    fn path_slot(self: &Arc<Self>, s: &Arc<Session>) -> Result<InFlight, String> {
        let mut st = s.lock();
        if st.path_queries >= self.cfg.max_path_queries {
            return Err(format!(
                "quota: {} path queries in flight",
                self.cfg.max_path_queries
            ));
        }
        let mut users = lock(&self.path_queries);
        let n = users.entry(s.info.uid).or_insert(0);
        if *n >= self.cfg.max_path_queries_per_user {
            let max = self.cfg.max_path_queries_per_user;
            if *n == 0 {
                users.remove(&s.info.uid);
            }
            return Err(format!(
                "quota: {max} path queries in flight of uid {}",
                s.info.uid
            ));
        }
        *n += 1;
        st.path_queries += 1;
        Ok(InFlight {
            server: self.clone(),
            session: s.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_errors_survive_the_wire() {
        let g: PathTarget = "gid:fe80::2:c903:0:3".parse().unwrap();
        for t in [PathTarget::Lid(Lid(5)), g] {
            let w = WirePathTarget::from_target(t);
            let json = serde_json::to_string(&w).unwrap();
            let back: WirePathTarget = serde_json::from_str(&json).unwrap();
            assert_eq!(back.to_target(), Ok(t), "{json}");
        }
        assert_eq!(
            serde_json::to_string(&WirePathTarget::Lid(5)).unwrap(),
            r#"{"lid":5}"#
        );
        assert_eq!(
            serde_json::to_string(&WirePathTarget::from_target(g)).unwrap(),
            r#"{"gid":"fe80::2:c903:0:3"}"#
        );
        for bad in [
            WirePathTarget::Lid(0),
            WirePathTarget::Lid(0xc000),
            WirePathTarget::Lid(0xffff),
            WirePathTarget::Gid(Ipv6Addr::UNSPECIFIED),
            WirePathTarget::Gid("ff02::1".parse().unwrap()),
        ] {
            assert!(bad.to_target().is_err(), "{bad:?}");
        }
        let errors = [
            PathError::NoSa,
            PathError::NoSm { lid: 0, sm_lid: 0 },
            PathError::Sa(SaError::Status {
                sa: SaStatus::NoRecords,
                mad_status: 0x0300,
            }),
            PathError::Sa(SaError::Timeout { attempts: 4 }),
            PathError::Sa(SaError::RmppAborted {
                rmpp_type: 4,
                status: 118,
            }),
            PathError::Sa(SaError::TooManyQueries),
            PathError::Sa(SaError::Cancelled),
            PathError::NoRecord,
            PathError::PkeyMismatch {
                pkey: 0x8001,
                pkey0: 0xffff,
            },
        ];
        for e in errors {
            let json = serde_json::to_string(&WirePathError::from_error(&e)).unwrap();
            let back: WirePathError = serde_json::from_str(&json).unwrap();
            assert_eq!(back.to_error(), e, "{json}");
        }
        // A newer daemon's kind is not the end of the session.
        let w: WirePathError = serde_json::from_str(r#"{"kind":"sm-moved","to":7}"#).unwrap();
        assert_eq!(w, WirePathError::Unknown);
        assert_eq!(w.to_error(), PathError::NotServed);
    }
}

/// The daemon answering path queries from its SA client: in-process daemons on Unix sockets
/// of a scratch directory, their endpoints on a [`MemNetwork`](crate::rt::MemNetwork) with
/// LID-routed addresses, the SA a fake one ([`crate::rt::sa::test_sa`]).
#[cfg(test)]
mod daemon_tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use ibcm_mad::sa::SaStatus;
    use ibcm_mad::{Guid, Lid, Qkey, Qpn, ServiceId};

    use super::super::hooks::{EventSink, HookFuture, NodeHooks, SessionInfo, XrcListenReq};
    use super::super::proto::WireResult;
    use super::super::{NodeServer, ServerConfig};
    use super::{WirePathError, WirePathTarget};
    use crate::proto::{AcceptParams, EndpointConfig, IbAddr, ListenOptions, PeerAddr};
    use crate::rt::sa::test_sa::{self, FakeSa};
    use crate::rt::sa::{test_port, PathError, PathResolver};
    use crate::rt::{Cm, CmError, MemNetwork};
    use crate::sa::{connect_params, PathTarget, SaError};

    struct NoXrc;

    impl NodeHooks for NoXrc {
        fn xrc_listen<'a>(
            &'a self,
            _: SessionInfo,
            _: ServiceId,
            _: XrcListenReq<'a>,
            _: EventSink,
        ) -> HookFuture<'a, Result<(), String>> {
            Box::pin(async { Err("no XRC here".to_owned()) })
        }
        fn xrc_destroy(&self, _: SessionInfo) -> HookFuture<'_, Result<u64, String>> {
            Box::pin(async { Ok(0) })
        }
        fn xrc_unlisten(&self, _: SessionInfo, _: ServiceId) -> HookFuture<'_, ()> {
            Box::pin(async {})
        }
        fn session_ended(&self, _: SessionInfo) -> HookFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    /// A scratch directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let d =
                std::env::temp_dir().join(format!("ibcm-node-paths-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The CM address of the port at `lid`, as `cm_peer` of a path to it gives (SL 0, P_Key
    /// index 0, no GRH).
    fn lid_addr(lid: u16) -> PeerAddr {
        PeerAddr::Ib(IbAddr {
            lid: Lid(lid),
            gid: None,
            qpn: Qpn::masked(1),
            qkey: Qkey::GSI,
            sl: 0,
            pkey_index: 0,
        })
    }

    /// A daemon serving `dir/name.sock` whose endpoint is at LID 2 of `net`, with the SA
    /// `sa` (`None`: no SA client, as on RoCE or UDP) and `cfg`.
    fn daemon(
        dir: &Scratch,
        name: &str,
        net: &MemNetwork,
        sa: Option<FakeSa>,
        cfg: ServerConfig,
    ) -> PathBuf {
        let (cm, _) = Cm::bind(net.transport(lid_addr(2)), EndpointConfig::default());
        if let Some(f) = sa {
            let (sa, _seen) = test_sa::spawn(f, Duration::from_millis(100));
            assert!(cm
                .set_path_resolver(PathResolver::new(sa, test_port(2)))
                .is_ok());
        }
        let sock = dir.0.join(format!("{name}.sock"));
        let l = tokio::net::UnixListener::bind(&sock).unwrap();
        let server = NodeServer::new(cm, std::sync::Arc::new(NoXrc), cfg, None);
        tokio::spawn(server.serve(l));
        sock
    }

    #[tokio::test]
    async fn a_client_resolves_lids_and_gids_through_the_daemon() {
        let dir = Scratch::new("resolve");
        let net = MemNetwork::new();
        let sock = daemon(
            &dir,
            "a",
            &net,
            Some(FakeSa::default()),
            ServerConfig::default(),
        );
        let (cm, _task) = Cm::attach(&sock).await.unwrap();
        let rec = cm.resolve_path(PathTarget::Lid(Lid(5))).await.unwrap();
        assert_eq!(
            (rec.slid, rec.dlid, rec.packet_life_time),
            (Lid(2), Lid(5), 18)
        );
        let rec = cm
            .resolve_path(PathTarget::Gid(test_sa::gid(7)))
            .await
            .unwrap();
        assert_eq!((rec.sgid, rec.dgid), (test_sa::gid(2), test_sa::gid(7)));
        // The SA's own answer: no path to that LID.
        let e = cm
            .resolve_path(PathTarget::Lid(Lid(0x200)))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                CmError::Path(PathError::Sa(SaError::Status {
                    sa: SaStatus::NoRecords,
                    mad_status: 0x0300
                }))
            ),
            "{e:?}"
        );
        // An attached handle takes no resolver of its own.
        let (sa, _) = test_sa::spawn(FakeSa::default(), Duration::from_millis(100));
        assert!(cm
            .set_path_resolver(PathResolver::new(sa, test_port(2)))
            .is_err());
    }

    #[tokio::test]
    async fn the_daemons_errors_reach_the_client() {
        let dir = Scratch::new("errors");
        let net = MemNetwork::new();
        let lid5 = PathTarget::Lid(Lid(5));
        // No SA client: a RoCE or UDP daemon.
        let sock = daemon(&dir, "nosa", &net, None, ServerConfig::default());
        let (cm, _t) = Cm::attach(&sock).await.unwrap();
        let e = cm.resolve_path(lid5).await.unwrap_err();
        assert!(matches!(e, CmError::Path(PathError::NoSa)), "{e:?}");
        assert!(e.to_string().contains("not on an InfiniBand port"), "{e}");
        // An SA that never answers: 4 attempts of 100 ms.
        let net2 = MemNetwork::new();
        let silent = FakeSa {
            drop: usize::MAX,
            ..FakeSa::default()
        };
        let sock = daemon(&dir, "silent", &net2, Some(silent), ServerConfig::default());
        let (cm, _t) = Cm::attach(&sock).await.unwrap();
        let e = cm.resolve_path(lid5).await.unwrap_err();
        assert!(
            matches!(
                e,
                CmError::Path(PathError::Sa(SaError::Timeout { attempts: 4 }))
            ),
            "{e:?}"
        );
        // A path outside the port's P_Key 0.
        let net3 = MemNetwork::new();
        let other = FakeSa {
            pkey: Some(ibcm_mad::Pkey(0x8002)),
            ..FakeSa::default()
        };
        let sock = daemon(&dir, "pkey", &net3, Some(other), ServerConfig::default());
        let (cm, _t) = Cm::attach(&sock).await.unwrap();
        let e = cm.resolve_path(lid5).await.unwrap_err();
        assert!(
            matches!(
                e,
                CmError::Path(PathError::PkeyMismatch {
                    pkey: 0x8002,
                    pkey0: 0xffff
                })
            ),
            "{e:?}"
        );
        // An IP peer through a daemon on an InfiniBand port.
        let net4 = MemNetwork::new();
        let cfg = ServerConfig {
            infiniband: true,
            ..ServerConfig::default()
        };
        let sock = daemon(&dir, "ib", &net4, Some(FakeSa::default()), cfg);
        let (cm, _t) = Cm::attach(&sock).await.unwrap();
        let p = crate::proto::ConnectParams::new(
            "10.0.0.9:4791".parse::<std::net::SocketAddr>().unwrap(),
            ServiceId(1),
            Qpn::masked(0x11),
        );
        let e = cm.connect(p).await.unwrap_err();
        assert!(
            matches!(&e, CmError::Refused(why) if why.contains("lid:N, gid:G")),
            "{e:?}"
        );
    }

    /// A raw session on `sock`: hello said, the daemon's `paths` returned.
    async fn raw(
        sock: &std::path::Path,
    ) -> (
        tokio::net::unix::OwnedReadHalf,
        tokio::net::unix::OwnedWriteHalf,
        u32,
    ) {
        use super::super::proto::{
            encode_frame, read_frame, write_frame, ClientMsg, DaemonMsg, Op, WireResult, VERSION,
        };
        let s = tokio::net::UnixStream::connect(sock).await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        let hello = ClientMsg {
            seq: 0,
            op: Op::Hello {
                version: VERSION,
                addr: true,
            },
        };
        write_frame(&mut wr, &encode_frame(&hello).unwrap())
            .await
            .unwrap();
        let m: DaemonMsg = read_frame(&mut rd).await.unwrap();
        let DaemonMsg::Reply {
            result: WireResult::Hello { paths, .. },
            ..
        } = m
        else {
            panic!("{m:?}");
        };
        (rd, wr, paths)
    }

    /// Sends `resolve-path` for `lid` as `seq`.
    async fn ask(wr: &mut tokio::net::unix::OwnedWriteHalf, seq: u64, lid: u16) {
        use super::super::proto::{encode_frame, write_frame, ClientMsg, Op};
        let m = ClientMsg {
            seq,
            op: Op::ResolvePath {
                target: WirePathTarget::Lid(lid),
                alternate: false,
            },
        };
        write_frame(wr, &encode_frame(&m).unwrap()).await.unwrap();
    }

    /// The next reply: its `seq` and result.
    async fn answer(rd: &mut tokio::net::unix::OwnedReadHalf) -> (u64, WireResult) {
        use super::super::proto::{read_frame, DaemonMsg};
        match read_frame::<DaemonMsg, _>(rd).await.unwrap() {
            DaemonMsg::Reply { seq, result } => (seq, result),
            other => panic!("{other:?}"),
        }
    }

    /// At most `max_path_queries` in flight per session and `max_path_queries_per_user` per
    /// user, whatever a client sends; a place is given back with its answer.
    #[tokio::test]
    async fn path_queries_in_flight_are_bounded() {
        let dir = Scratch::new("quota");
        let net = MemNetwork::new();
        let silent = FakeSa {
            drop: usize::MAX,
            ..FakeSa::default()
        };
        let cfg = ServerConfig {
            max_path_queries: 2,
            max_path_queries_per_user: 3,
            ..ServerConfig::default()
        };
        let sock = daemon(&dir, "a", &net, Some(silent), cfg);
        let timed_out = |r: &WireResult| {
            matches!(
                r,
                WireResult::PathError(WirePathError::SaTimeout { attempts: 4 })
            )
        };
        let refused =
            |r: &WireResult, what: &str| matches!(r, WireResult::Refused { why } if why == what);
        let (mut ra, mut wa, paths) = raw(&sock).await;
        assert_eq!(paths, 2, "the hello says how many");
        // a: 2 in flight; its third is refused at once, before their answers.
        for (seq, lid) in [(1, 5), (2, 6), (3, 7)] {
            ask(&mut wa, seq, lid).await;
        }
        let (seq, r) = answer(&mut ra).await;
        assert_eq!(seq, 3);
        assert!(refused(&r, "quota: 2 path queries in flight"), "{r:?}");
        for _ in 0..2 {
            let (seq, r) = answer(&mut ra).await;
            assert!((1..=2).contains(&seq) && timed_out(&r), "{seq} {r:?}");
        }
        // Given back. a 2 and b 1 in flight; b's second is over the user's 3.
        let (mut rb, mut wb, _) = raw(&sock).await;
        ask(&mut wa, 4, 5).await;
        ask(&mut wa, 5, 6).await;
        // Its refused third says that a's two are in flight (a session's requests are
        // served in order).
        ask(&mut wa, 6, 7).await;
        let (seq, r) = answer(&mut ra).await;
        assert!(
            seq == 6 && refused(&r, "quota: 2 path queries in flight"),
            "{r:?}"
        );
        ask(&mut wb, 1, 7).await;
        ask(&mut wb, 2, 8).await;
        let (seq, r) = answer(&mut rb).await;
        let uid = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata("/proc/self").unwrap().uid()
        };
        let want = format!("quota: 3 path queries in flight of uid {uid}");
        assert_eq!(seq, 2);
        assert!(refused(&r, &want), "{r:?}");
        let (seq, r) = answer(&mut rb).await;
        assert!(seq == 1 && timed_out(&r), "{r:?}");
        for _ in 0..2 {
            assert!(timed_out(&answer(&mut ra).await.1));
        }
        // A session that ends with queries in flight: they count against its user until
        // they end, then are given back.
        ask(&mut wa, 7, 5).await;
        ask(&mut wa, 8, 6).await;
        ask(&mut wa, 9, 7).await;
        let (seq, r) = answer(&mut ra).await;
        assert!(
            seq == 9 && refused(&r, "quota: 2 path queries in flight"),
            "{r:?}"
        );
        drop((ra, wa));
        ask(&mut wb, 3, 5).await;
        ask(&mut wb, 4, 6).await;
        let (seq, r) = answer(&mut rb).await;
        assert!(seq == 4 && refused(&r, &want), "{r:?}");
        assert!(timed_out(&answer(&mut rb).await.1));
        tokio::time::sleep(Duration::from_millis(100)).await;
        ask(&mut wb, 5, 5).await;
        ask(&mut wb, 6, 6).await;
        for _ in 0..2 {
            assert!(timed_out(&answer(&mut rb).await.1));
        }
    }

    /// An attached handle keeps its queries below the daemon's limit: its callers wait for a
    /// place instead of meeting the quota.
    #[tokio::test]
    async fn an_attached_handle_waits_for_a_place() {
        let dir = Scratch::new("queue");
        let net = MemNetwork::new();
        let silent = FakeSa {
            drop: usize::MAX,
            ..FakeSa::default()
        };
        let cfg = ServerConfig {
            max_path_queries: 2,
            ..ServerConfig::default()
        };
        let sock = daemon(&dir, "a", &net, Some(silent), cfg);
        let (cm, _t) = Cm::attach(&sock).await.unwrap();
        let q = |lid| {
            let cm = cm.clone();
            async move { cm.resolve_path(PathTarget::Lid(Lid(lid))).await }
        };
        let t0 = tokio::time::Instant::now();
        let (r1, r2, r3) = tokio::join!(q(5), q(6), q(7));
        for r in [r1, r2, r3] {
            assert!(
                matches!(
                    r,
                    Err(CmError::Path(PathError::Sa(SaError::Timeout {
                        attempts: 4
                    })))
                ),
                "{r:?}"
            );
        }
        // Two rounds of 4 × 100 ms: the third waited for the first two.
        assert!(
            t0.elapsed() >= Duration::from_millis(800),
            "{:?}",
            t0.elapsed()
        );
    }

    /// A daemon that predates path queries (its hello answer is a bare `ok`): the client does
    /// not send one.
    #[tokio::test]
    async fn an_older_daemon_is_not_asked() {
        use super::super::proto::{
            encode_frame, read_frame, write_frame, ClientMsg, DaemonMsg, WireResult,
        };
        let dir = Scratch::new("old");
        let sock = dir.0.join("old.sock");
        let l = tokio::net::UnixListener::bind(&sock).unwrap();
        let old = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let (mut rd, mut wr) = s.into_split();
            let hello: ClientMsg = read_frame(&mut rd).await.unwrap();
            let ok = DaemonMsg::Reply {
                seq: hello.seq,
                result: WireResult::Ok,
            };
            write_frame(&mut wr, &encode_frame(&ok).unwrap())
                .await
                .unwrap();
            // Every request until the client closes: none may be a path query.
            let mut ops = Vec::new();
            while let Ok(m) = read_frame::<ClientMsg, _>(&mut rd).await {
                ops.push(m.op);
            }
            ops
        });
        let (cm, task) = Cm::attach(&sock).await.unwrap();
        let e = cm.resolve_path(PathTarget::Lid(Lid(5))).await.unwrap_err();
        assert!(matches!(e, CmError::Path(PathError::NotServed)), "{e:?}");
        let e = cm
            .resolve_path_with_alternate(PathTarget::Lid(Lid(5)))
            .await
            .unwrap_err();
        assert!(matches!(e, CmError::Path(PathError::NotServed)), "{e:?}");
        drop(cm);
        let _ = task.await;
        assert!(old.await.unwrap().is_empty());
    }

    /// A daemon that answers path queries but predates path migration (its hello says
    /// `paths`, not `apm`): the client asks it for no alternate path and sends it no LAP
    /// op; the calls fail at once, saying why.
    #[tokio::test]
    async fn a_daemon_without_path_migration_is_not_asked() {
        use super::super::proto::{
            encode_frame, read_frame, write_frame, ClientMsg, DaemonMsg, WireResult,
        };
        let dir = Scratch::new("no-apm");
        let sock = dir.0.join("old.sock");
        let l = tokio::net::UnixListener::bind(&sock).unwrap();
        let old = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let (mut rd, mut wr) = s.into_split();
            let hello: ClientMsg = read_frame(&mut rd).await.unwrap();
            // As an older daemon encodes it: no `apm`.
            let ok = DaemonMsg::Reply {
                seq: hello.seq,
                result: WireResult::Hello {
                    addr: None,
                    paths: 64,
                    apm: 0,
                },
            };
            let f = encode_frame(&ok).unwrap();
            assert!(!String::from_utf8_lossy(&f).contains("apm"));
            write_frame(&mut wr, &f).await.unwrap();
            let mut ops = Vec::new();
            while let Ok(m) = read_frame::<ClientMsg, _>(&mut rd).await {
                ops.push(m.op);
            }
            ops
        });
        let (cm, task) = Cm::attach(&sock).await.unwrap();
        let e = cm
            .resolve_path_with_alternate(PathTarget::Lid(Lid(5)))
            .await
            .unwrap_err();
        assert!(
            matches!(e, CmError::Path(PathError::AlternateNotServed)),
            "{e:?}"
        );
        assert!(e.to_string().contains("predates path migration"), "{e}");
        let e = cm
            .set_lap_policy(crate::rt::LapPolicy::Application)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, CmError::Refused(w) if w.contains("not served by this node service")),
            "{e:?}"
        );
        assert!(cm
            .set_lap_policy(crate::rt::LapPolicy::Unsupported)
            .await
            .is_ok());
        drop(cm);
        let _ = task.await;
        let ops = old.await.unwrap();
        assert!(ops.is_empty(), "{ops:?}");
    }

    /// With LMC 1 the daemon resolves an alternate path too (`resolve-path` with
    /// `alternate`); it goes in the REQ as the alternate path, which the passive side sees as
    /// sent. With LMC 0 there is none.
    #[tokio::test]
    async fn a_connect_carries_the_alternate_path_the_daemon_resolved() {
        let dir = Scratch::new("alternate");
        let net = MemNetwork::new();
        let lmc = FakeSa {
            lmc: true,
            ..FakeSa::default()
        };
        let cfg = ServerConfig {
            infiniband: true,
            ..ServerConfig::default()
        };
        let sock = daemon(&dir, "a", &net, Some(lmc), cfg);
        let cfg_b = EndpointConfig {
            local_ca_guid: Guid(5),
            ..EndpointConfig::default()
        };
        let (b, _) = Cm::bind(net.transport(lid_addr(5)), cfg_b);
        let mut l = b
            .listen(ServiceId(0x78), ListenOptions::default())
            .await
            .unwrap();
        let server = tokio::spawn(async move {
            let inc = l.next().await.unwrap();
            let req = inc.request().map(|r| r.req);
            let conn = inc
                .accept(AcceptParams::new(Qpn::masked(0x22)))
                .await
                .unwrap();
            conn.established().await.unwrap();
            (req, conn)
        });
        let (a, _t) = Cm::attach(&sock).await.unwrap();
        let (rec, alt) = a
            .resolve_path_with_alternate(PathTarget::Gid(test_sa::gid(5)))
            .await
            .unwrap();
        let alt = alt.unwrap();
        assert_eq!((rec.slid, rec.dlid), (Lid(2), Lid(5)));
        assert_eq!((alt.slid, alt.dlid), (Lid(3), Lid(6)));
        let mut p = connect_params(&rec, 15, 0, ServiceId(0x78), Qpn::masked(0x11));
        p.alternate_path = Some(crate::sa::req_path(&alt, 15));
        let conn = a.connect(p).await.unwrap();
        let (req, passive) = server.await.unwrap();
        let req = req.unwrap();
        assert_eq!(
            (req.alternate_path.local_lid, req.alternate_path.remote_lid),
            (Lid(3), Lid(6))
        );
        assert_eq!(req.alternate_path, crate::sa::req_path(&alt, 15));
        conn.disconnect(&[]).await;
        passive.closed().await;
        // LMC 0: no alternate.
        let net0 = MemNetwork::new();
        let sock = daemon(
            &dir,
            "b",
            &net0,
            Some(FakeSa::default()),
            ServerConfig::default(),
        );
        let (a, _t) = Cm::attach(&sock).await.unwrap();
        let (rec, alt) = a
            .resolve_path_with_alternate(PathTarget::Lid(Lid(5)))
            .await
            .unwrap();
        assert_eq!((rec.dlid, alt), (Lid(5), None));
    }

    /// A client connects to `lid:5` with the REQ's fields from the path the daemon resolved;
    /// the REQ reaches the port at LID 5, LID-routed, and the passive side sees it from
    /// LID 2.
    #[tokio::test]
    async fn a_connect_by_lid_reaches_the_port_at_that_lid() {
        let dir = Scratch::new("connect");
        let net = MemNetwork::new();
        let sock = daemon(
            &dir,
            "a",
            &net,
            Some(FakeSa::default()),
            ServerConfig {
                infiniband: true,
                ..ServerConfig::default()
            },
        );
        let cfg_b = EndpointConfig {
            local_ca_guid: Guid(5),
            ..EndpointConfig::default()
        };
        let (b, _) = Cm::bind(net.transport(lid_addr(5)), cfg_b);
        let mut l = b
            .listen(ServiceId(0x77), ListenOptions::default())
            .await
            .unwrap();
        let server = tokio::spawn(async move {
            let inc = l.next().await.unwrap();
            let peer = inc.peer();
            let req = inc.request().map(|r| r.req);
            let conn = inc
                .accept(AcceptParams::new(Qpn::masked(0x22)))
                .await
                .unwrap();
            conn.established().await.unwrap();
            (peer, req, conn)
        });
        let (a, _t) = Cm::attach(&sock).await.unwrap();
        let rec = a.resolve_path(PathTarget::Lid(Lid(5))).await.unwrap();
        let p = connect_params(&rec, 15, 0, ServiceId(0x77), Qpn::masked(0x11));
        let conn = a.connect(p).await.unwrap();
        let (peer, req, passive) = server.await.unwrap();
        assert_eq!(peer, lid_addr(2));
        let req = req.unwrap();
        assert_eq!(
            (req.primary_path.local_lid, req.primary_path.remote_lid),
            (Lid(2), Lid(5))
        );
        assert_eq!(req.partition_key, ibcm_mad::Pkey(0xffff));
        conn.disconnect(&[]).await;
        passive.closed().await;
    }
}
