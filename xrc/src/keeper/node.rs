//! The keeper served by a node's CM service (`ibcmd`): [`NodeKeeper`], the keeper's
//! operations and rules acting on the **same** [`TgtRegistry`] the node's XRC target
//! ([`XrcTarget`](crate::cm::XrcTarget)) answers REQs from.
//!
//! The service carries the keeper's requests ([`Request`]) and replies ([`Reply`]) in its
//! own protocol and owns the registry; it lends it for each call ([`NodeKeeper::handle`]).
//! What the keeper decides on the CM side (DREQs for the connections on a released QP) is
//! left in the registry's action queue for the target to execute, as for its own decisions.
//! Differences from the standalone keeper (docs/xrc.md §8.5):
//!
//! * a client's keeper session acts in the registry as the process the service knows the
//!   client by ([`NodeKeeper::open_session`]), so its exit is one process exit for its XRC
//!   services and its keeper holdings;
//! * `accept-req` and `conn-event` are refused (`bad-request`): the node's CM answers the
//!   REQs itself; a client serves a domain's QPs through the CM instead
//!   ([`NodeKeeper::serve_check`]);
//! * `leaks` counts every connection the registry binds as live (the service's own leak
//!   report asks the endpoint).

use std::time::Instant;

use ibcm::proto::ConnId;

use super::core::{Cred, KeeperCore, Target};
use super::proto::{ErrorBody, ErrorKind, KeeperEvent, Reply, Request};
use super::server::KeeperLimits;
use crate::registry::{DomainId, QpLife, RegistryConfig, TgtRegistry};
use crate::types::{ProcessId, Qpn};
use crate::verbs::model::{KernelModel, ModelConfig};

/// A keeper session's number.
pub type KeeperSession = u32;

/// Who an event of [`NodeKeeper`] is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventFor {
    /// One session.
    Session(KeeperSession),
    /// Every session.
    All,
}

/// The keeper's state (sessions, owners, `create-or-register` keys, quotas) over a
/// registry lent for each call (module docs).
#[derive(Debug)]
pub struct NodeKeeper {
    core: KeeperCore<ConnId>,
}

fn events(v: Vec<(Target, KeeperEvent)>) -> Vec<(EventFor, KeeperEvent)> {
    v.into_iter()
        .map(|(t, e)| {
            let t = match t {
                Target::Session(s) => EventFor::Session(s),
                Target::All => EventFor::All,
            };
            (t, e)
        })
        .collect()
}

impl NodeKeeper {
    /// A keeper whose registry is held by process `keeper_pid` (the service's), on
    /// `backend` (`sim` or `verbs`, for `hello` and `status`), within `limits`.
    pub fn new(keeper_pid: u32, backend: &str, limits: KeeperLimits, now: Instant) -> Self {
        // Stands in for the lent registry between calls; never acted on.
        let placeholder = TgtRegistry::new(
            Box::new(KernelModel::new(ModelConfig::mlx5()).spawn()),
            RegistryConfig::default(),
        );
        let mut core = KeeperCore::lent(
            placeholder,
            keeper_pid,
            super::server::new_epoch(),
            backend,
            now,
        );
        core.set_limits(limits);
        Self { core }
    }

    /// This instance's epoch (every reply carries it).
    pub fn epoch(&self) -> &str {
        self.core.epoch()
    }

    /// A client with `SO_PEERCRED` `pid`, `uid`, `gid`, acting in the registry as `process`.
    pub fn open_session(
        &mut self,
        pid: Option<u32>,
        uid: u32,
        gid: u32,
        process: ProcessId,
    ) -> KeeperSession {
        self.core
            .open_session_in(pid, Cred { uid, gid }, Some(process))
    }

    /// Handles one request of `session` on `reg`: the reply, and events for sessions.
    pub fn handle(
        &mut self,
        reg: &mut TgtRegistry<ConnId>,
        now: Instant,
        session: KeeperSession,
        id: Option<u64>,
        req: Request,
    ) -> (Reply, Vec<(EventFor, KeeperEvent)>) {
        let (reply, ev) = self
            .core
            .with_registry(reg, |k| k.handle(now, session, id, req));
        (reply, events(ev))
    }

    /// The client of `session` went: its registrations go, the QPs it owned hear "creator
    /// exit" (the registry's process exit of its process).
    pub fn close_session(
        &mut self,
        reg: &mut TgtRegistry<ConnId>,
        now: Instant,
        session: KeeperSession,
    ) -> Vec<(EventFor, KeeperEvent)> {
        events(
            self.core
                .with_registry(reg, |k| k.close_session(now, session)),
        )
    }

    /// Whether `session` may serve REQs through the node's CM from domain `domain` — the
    /// keeper's rule for accepting REQs into a domain (its owner and the uids admitted to
    /// it, docs/xrc.md §8.4) — and, with `qpn`, answer them with that TGT QP: a live QP of
    /// the domain that the session's uid may register on (its owner uid; any admitted uid
    /// if it is `Shared`).
    ///
    /// # Errors
    /// The keeper's error body (`unknown-domain`, `permission-denied`, `unknown-qpn`,
    /// `gone`, `bad-request`).
    pub fn serve_check(
        &mut self,
        reg: &mut TgtRegistry<ConnId>,
        session: KeeperSession,
        domain: &str,
        qpn: Option<u32>,
    ) -> Result<(DomainId, Option<Qpn>), ErrorBody> {
        self.core.with_registry(reg, |k| {
            let id = k.usable_domain(session, domain)?;
            let Some(n) = qpn else {
                return Ok((id, None));
            };
            let q = Qpn::new(n).ok_or_else(|| ErrorBody {
                kind: ErrorKind::BadRequest,
                message: format!("QPN {n:#x} needs more than 24 bits"),
            })?;
            k.check_qp(session, q, "serve", true)?;
            let t = k.registry().query(q).map_err(|e| ErrorBody {
                kind: ErrorKind::UnknownQpn,
                message: e.to_string(),
            })?;
            if t.life != QpLife::Live {
                return Err(ErrorBody {
                    kind: ErrorKind::Gone,
                    message: format!("TGT QP {q} is gone"),
                });
            }
            if t.domain != id {
                return Err(ErrorBody {
                    kind: ErrorKind::BadRequest,
                    message: format!("TGT QP {q} is not in domain {domain:?}"),
                });
            }
            Ok((id, Some(q)))
        })
    }

    /// The file of domain `domain` if `session` may use it (the keeper's rule, as for
    /// [`NodeKeeper::serve_check`]): what another process opens to hold the same domain
    /// (`ibv_open_xrcd` on that file), e.g. to create its XRC SRQs there.
    ///
    /// # Errors
    /// The keeper's error body (`unknown-domain`, `permission-denied`), or `bad-request` for
    /// a private domain (no file names it, so no other process can open it).
    pub fn domain_file(
        &mut self,
        reg: &mut TgtRegistry<ConnId>,
        session: KeeperSession,
        domain: &str,
    ) -> Result<std::path::PathBuf, ErrorBody> {
        self.core.with_registry(reg, |k| {
            let id = k.usable_domain(session, domain)?;
            k.registry()
                .domain(id)
                .and_then(|d| d.spec.path().map(std::path::Path::to_owned))
                .ok_or_else(|| ErrorBody {
                    kind: ErrorKind::BadRequest,
                    message: format!(
                        "domain {domain:?} is private: no file names it, so no other process                          can open it (open it with a path)"
                    ),
                })
        })
    }

    /// A `quota-exceeded` reply if `uid` has as many keeper sessions as its limit.
    pub fn session_quota(&self, uid: u32, gid: u32) -> Option<Reply> {
        self.core.session_quota(Cred { uid, gid })
    }

    /// The reply to a request that could not be parsed.
    pub fn bad_request(&self, message: String) -> Reply {
        self.core.bad_line(message)
    }

    /// Lines to log since the last call (what the registry did, with sessions' PIDs).
    pub fn take_log(&mut self) -> Vec<String> {
        self.core.take_log()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]
mod tests {
    use std::time::Duration;

    use ibcm_mad::xrc::{GoneCause, XrcReqData};
    use ibcm_mad::Guid;

    use super::*;
    use crate::policy::PolicyAction;
    use crate::registry::{IniPeer, TgtRequest};
    use crate::types::SrqNum;
    use crate::verbs::Verbs as _;

    fn req(qpn: Qpn, conn: u32, dom: DomainId, p: ProcessId) -> TgtRequest<ConnId> {
        TgtRequest {
            conn: ibcm_mad::CommId(conn),
            domain: dom,
            process: p,
            peer: IniPeer {
                ca_guid: Guid(7),
                ini_qpn: Qpn::new(0x99).unwrap(),
            },
            data: XrcReqData::attach(qpn),
            timewait: Duration::from_millis(10),
            srqns: vec![SrqNum::new(1).unwrap()],
        }
    }

    /// The keeper acts on the CM's registry; the CM's actions stay for the CM.
    #[test]
    fn keeper_requests_act_on_the_lent_registry_and_leave_the_dreqs_to_the_cm() {
        let kernel = KernelModel::new(ModelConfig::mlx5());
        let mut reg: TgtRegistry<ConnId> =
            TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
        let now = Instant::now();
        let mut k = NodeKeeper::new(1, "sim", KeeperLimits::default(), now);
        let (pa, pb) = (kernel.spawn().process(), kernel.spawn().process());
        let a = k.open_session(Some(100), 0, 0, pa);
        let b = k.open_session(Some(200), 0, 0, pb);
        let open = Request::OpenDomain {
            domain: "job".into(),
            path: Some("/job".into()),
            create: true,
            exclusive: false,
        };
        assert!(k.handle(&mut reg, now, a, None, open.clone()).0.ok);
        let create = Request::Create {
            domain: "job".into(),
            policy: "shared".into(),
        };
        let (r, _) = k.handle(&mut reg, now, a, None, create);
        let qpn = u32::try_from(r.result.unwrap()["qpn"].as_u64().unwrap()).unwrap();
        let q = Qpn::new(qpn).unwrap();
        // The same registry: the QP is the CM's to attach REQs to.
        let (dom, served) = k.serve_check(&mut reg, a, "job", Some(qpn)).unwrap();
        assert_eq!(served, Some(q));
        assert!(k.handle(&mut reg, now, b, None, open).0.ok);
        assert!(
            k.handle(&mut reg, now, b, None, Request::Register { qpn })
                .0
                .ok
        );
        let acc = reg
            .handle_req_with(now, &req(q, 5, dom, pa), false, &|_| None)
            .unwrap();
        assert_eq!(acc.tgt_qpn, q);
        // A reports no connection itself here.
        let (r, _) = k.handle(
            &mut reg,
            now,
            a,
            None,
            Request::ConnEvent {
                conn: "5".into(),
                event: "closed".into(),
            },
        );
        assert_eq!(r.error.unwrap().kind, ErrorKind::BadRequest);
        // A goes: kept (B's registration; the connection holds none).
        k.close_session(&mut reg, now, a);
        assert_eq!(reg.query(q).unwrap().life, QpLife::Live);
        // B unregisters: released; the DREQ is the CM's to send.
        let (r, ev) = k.handle(&mut reg, now, b, None, Request::Unregister { qpn });
        assert_eq!(r.result.unwrap()["verdict"], "released");
        // Its sessions hear it as from the keeper; no `send-dreq`: the CM's connection.
        assert_eq!(
            ev,
            vec![(
                EventFor::All,
                KeeperEvent::QpGone {
                    qpn,
                    cause: "last registration dropped".into()
                }
            )]
        );
        let mut dreq = None;
        while let Some(a) = reg.poll_action() {
            if let PolicyAction::EndConnection { conn, cause, .. } = a {
                dreq = Some((conn, cause));
            }
        }
        assert_eq!(
            dreq,
            Some((ibcm_mad::CommId(5), GoneCause::LastUnregistered))
        );
    }

    #[test]
    fn another_uid_may_not_serve_a_domain_it_was_not_admitted_to() {
        let kernel = KernelModel::new(ModelConfig::mlx5());
        let mut reg: TgtRegistry<ConnId> =
            TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
        let now = Instant::now();
        let mut k = NodeKeeper::new(1, "sim", KeeperLimits::default(), now);
        let root = k.open_session(None, 0, 0, kernel.spawn().process());
        let other = k.open_session(None, 65534, 65534, kernel.spawn().process());
        let open = Request::OpenDomain {
            domain: "mine".into(),
            path: None,
            create: true,
            exclusive: false,
        };
        assert!(k.handle(&mut reg, now, root, None, open).0.ok);
        let e = k.serve_check(&mut reg, other, "mine", None).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{}", e.message);
        assert!(k.serve_check(&mut reg, root, "mine", None).is_ok());
    }
}
