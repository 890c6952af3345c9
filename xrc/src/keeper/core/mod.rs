//! The keeper's state machine, without sockets: sessions in, replies and events out.
//!
//! * this file: [`KeeperCore`], its sessions and the flow of one request (reply plus events)
//!   and of the registry's outputs (log lines, events);
//! * `dispatch.rs`: what each request does;
//! * `args.rs`: request arguments checked and converted, registry errors as protocol errors;
//! * `report.rs`: how the keeper shows QPs, domains and processes (`status`, `query`,
//!   log lines with real PIDs).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use super::proto::{ErrorKind, KeeperEvent, Reply, Request};
use crate::policy::{PolicyAction, Verdict};
use crate::registry::{ConnEvent, DomainId, RegistryConfig, TgtRegistry};
use crate::types::{ProcessId, Qpn};
use crate::verbs::Verbs;

mod access;
#[cfg(test)]
mod access_tests;
mod args;
mod dispatch;
mod report;
#[cfg(test)]
mod tests;

pub(in crate::keeper) use access::Cred;
pub use access::KeeperLimits;
use access::Owners;
use args::err;
use report::verdict_text;

/// A connection as the keeper knows it: the session that reported it and its name there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ConnKey {
    /// The session.
    pub session: u32,
    /// The session's name for it.
    pub name: String,
}

/// The registry's connection key as the keeper serves it: the key of connections its
/// clients report (`accept-req`, `conn-event`: [`ConnKey`]), or the key of a CM the keeper
/// is part of (ibcm's `ConnId` inside `ibcmd`, whose CM answers the REQs itself: there
/// clients report no connections).
pub(in crate::keeper) trait KeeperConn: Clone + Ord + fmt::Debug {
    /// The key of a connection session `session` reports under `name`; `None` where clients
    /// do not report connections.
    fn reported(session: SessionId, name: String) -> Option<Self>;
    /// The session that reported it, if a session did.
    fn session(&self) -> Option<SessionId>;
    /// Its name in views and logs.
    fn label(&self) -> String;
}

impl KeeperConn for ConnKey {
    fn reported(session: SessionId, name: String) -> Option<Self> {
        Some(Self { session, name })
    }

    fn session(&self) -> Option<SessionId> {
        Some(self.session)
    }

    fn label(&self) -> String {
        self.name.clone()
    }
}

#[cfg(feature = "cm")]
impl KeeperConn for ibcm::proto::ConnId {
    fn reported(_: SessionId, _: String) -> Option<Self> {
        None
    }

    fn session(&self) -> Option<SessionId> {
        None
    }

    fn label(&self) -> String {
        self.to_string()
    }
}

const MAX_CLOSED: usize = 4096;

/// A session number. In the standalone keeper it doubles as the registry's [`ProcessId`]
/// for everything the session creates or registers, so closing one socket releases exactly
/// that socket's references; a keeper inside another service (`ibcmd`) gives each session
/// the process number that service knows its client by ([`KeeperCore::open_session_in`]).
pub(super) type SessionId = u32;

#[derive(Clone, Debug)]
struct Session {
    pid: Option<u32>,
    cred: Cred,
    name: String,
    /// The registry's identity of the session.
    process: ProcessId,
}

/// Where an event goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// One session.
    Session(SessionId),
    /// Every session.
    All,
}

/// The keeper: a [`TgtRegistry`] acting for many client sessions.
///
/// Standalone (`xrcd-keeper`), it owns its registry. Inside `ibcmd` ([`KeeperCore::lent`])
/// the registry is the XRC target's, lent for each call ([`KeeperCore::with_registry`]):
/// the keeper's rules and state (sessions, owners, slots, quotas) act on the one registry
/// the node's CM answers REQs from, and the registry's CM actions are left to the target.
#[derive(Debug)]
pub(super) struct KeeperCore<K = ConnKey> {
    reg: TgtRegistry<K>,
    /// The registry is lent by a CM that executes its actions: [`KeeperCore::drain`] leaves
    /// them to it.
    lent: bool,
    epoch: String,
    backend: String,
    keeper_pid: u32,
    sessions: BTreeMap<SessionId, Session>,
    /// PIDs of recently closed sessions, for logs and status after they are gone.
    closed: BTreeMap<SessionId, Option<u32>>,
    /// The session of each registry process (live and recently closed sessions).
    procs: BTreeMap<ProcessId, SessionId>,
    next_session: SessionId,
    /// `create-or-register` keys: kept while their Shared QP lives, pruned after every
    /// request, tick and session close ([`KeeperCore::prune`]).
    slots: BTreeMap<(DomainId, String), Qpn>,
    /// Owner uids of domains and TGT QPs (module `access`).
    owners: Owners,
    /// Something was released or closed since the last [`KeeperCore::prune`].
    dirty: bool,
    /// What one user may hold.
    limits: KeeperLimits,
    log: Vec<String>,
    started: Instant,
}

impl<K: KeeperConn> KeeperCore<K> {
    /// A keeper acting through `verbs`. `epoch` must differ between keeper instances.
    pub(super) fn new(
        verbs: Box<dyn Verbs>,
        cfg: RegistryConfig,
        epoch: String,
        backend: &str,
        now: Instant,
    ) -> Self {
        let keeper_pid = verbs.process().0;
        Self::over(
            TgtRegistry::new(verbs, cfg),
            false,
            keeper_pid,
            epoch,
            backend,
            now,
        )
    }

    /// A keeper with no session yet over `reg` (`lent`: see [`KeeperCore::lent`]).
    fn over(
        reg: TgtRegistry<K>,
        lent: bool,
        keeper_pid: u32,
        epoch: String,
        backend: &str,
        now: Instant,
    ) -> Self {
        Self {
            reg,
            lent,
            epoch,
            backend: backend.to_owned(),
            keeper_pid,
            sessions: BTreeMap::new(),
            closed: BTreeMap::new(),
            procs: BTreeMap::new(),
            next_session: 1,
            slots: BTreeMap::new(),
            owners: Owners::default(),
            dirty: false,
            limits: KeeperLimits::default(),
            log: Vec::new(),
            started: now,
        }
    }

    /// A keeper acting on a registry lent for each call ([`KeeperCore::with_registry`]) by
    /// the CM that owns it; `placeholder` (an empty registry, never acted on) stands in for
    /// it between calls. `keeper_pid` is the process holding the real registry's handles.
    #[cfg(feature = "cm")]
    pub(super) fn lent(
        placeholder: TgtRegistry<K>,
        keeper_pid: u32,
        epoch: String,
        backend: &str,
        now: Instant,
    ) -> Self {
        Self::over(placeholder, true, keeper_pid, epoch, backend, now)
    }

    /// Runs `f` with `reg` as this keeper's registry (and the placeholder back afterwards).
    #[cfg(feature = "cm")]
    pub(super) fn with_registry<R>(
        &mut self,
        reg: &mut TgtRegistry<K>,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        std::mem::swap(&mut self.reg, reg);
        // What the CM released meanwhile (which this keeper does not see) is forgotten before
        // anything is checked; a reused number must not keep an old owner.
        self.dirty = true;
        self.prune();
        let r = f(self);
        std::mem::swap(&mut self.reg, reg);
        r
    }

    /// The registry.
    #[cfg(feature = "cm")]
    pub(super) fn registry(&self) -> &TgtRegistry<K> {
        &self.reg
    }

    /// This instance's epoch.
    pub(super) fn epoch(&self) -> &str {
        &self.epoch
    }

    /// Lines to log since the last call (everything the registry did).
    pub(super) fn take_log(&mut self) -> Vec<String> {
        std::mem::take(&mut self.log)
    }

    /// A client connected with the keeper's own credentials (in-process use and tests);
    /// `pid` from `SO_PEERCRED` when available. A socket server uses
    /// [`KeeperCore::open_session_as`].
    #[allow(dead_code)] // the unit tests' and an in-process embedder's entry
    pub(super) fn open_session(&mut self, pid: Option<u32>) -> SessionId {
        self.open_session_as(pid, Cred::own())
    }

    /// A client connected with credentials `cred` (its `SO_PEERCRED` uid and gid): it owns
    /// what it creates and acts only on what that uid owns or may share (module `access`).
    pub(super) fn open_session_as(&mut self, pid: Option<u32>, cred: Cred) -> SessionId {
        self.open_session_in(pid, cred, None)
    }

    /// [`KeeperCore::open_session_as`], the session acting in the registry as `process`
    /// (`None`: the session number, as the standalone keeper does). A keeper inside another
    /// service passes the process that service already knows the client by, so the client's
    /// exit is one process exit for both.
    pub(super) fn open_session_in(
        &mut self,
        pid: Option<u32>,
        cred: Cred,
        process: Option<ProcessId>,
    ) -> SessionId {
        let mut id = self.next_session;
        // Skip numbers still in use (after a wrap): a session number is a registry identity.
        while self.sessions.contains_key(&id) {
            id = id.wrapping_add(1).max(1);
        }
        self.next_session = id.wrapping_add(1).max(1);
        let process = process.unwrap_or(ProcessId(id));
        self.procs.insert(process, id);
        self.sessions.insert(
            id,
            Session {
                pid,
                cred,
                name: String::new(),
                process,
            },
        );
        id
    }

    /// The registry's identity of session `s` (an unknown session: its number, which holds
    /// nothing).
    fn process_of(&self, s: SessionId) -> ProcessId {
        self.sessions.get(&s).map_or(ProcessId(s), |x| x.process)
    }

    /// The credentials of session `s` (unknown sessions: none, which owns nothing).
    fn cred(&self, s: SessionId) -> Option<Cred> {
        self.sessions.get(&s).map(|x| x.cred)
    }

    /// Forgets slots and owners of objects that are gone, when something went since the last
    /// time (a lent registry is marked so at each loan, in `with_registry`).
    fn prune(&mut self) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        let reg = &self.reg;
        let live = |q: &Qpn| {
            reg.query(*q)
                .is_ok_and(|t| t.life == crate::registry::QpLife::Live)
        };
        self.slots.retain(|_, q| live(q));
        self.owners.qps.retain(|q, _| reg.query(*q).is_ok());
        self.owners.domains.retain(|d, _| reg.domain(*d).is_some());
    }

    /// A client's socket closed (exit, SIGKILL, or a clean close): exactly its references go.
    pub(super) fn close_session(
        &mut self,
        now: Instant,
        s: SessionId,
    ) -> Vec<(Target, KeeperEvent)> {
        let name = self
            .sessions
            .get(&s)
            .map(|x| {
                format!(
                    "session {s} (pid {})",
                    x.pid.map_or("?".into(), |p| p.to_string())
                )
            })
            .unwrap_or_default();
        self.log.push(format!("{name} closed"));
        self.dirty = true;
        let process = self.process_of(s);
        self.reg.process_exit(now, process);
        // Its connections died with its CM: nobody can DREQ them any more.
        let conns: Vec<K> = self
            .reg
            .tgt_qps()
            .into_iter()
            .flat_map(|q| q.conns)
            .filter(|c| c.session() == Some(s))
            .collect();
        for c in conns {
            self.reg.handle_conn_event(now, &c, ConnEvent::LocalClosed);
        }
        if let Some(x) = self.sessions.remove(&s) {
            self.closed.insert(s, x.pid);
            while self.closed.len() > MAX_CLOSED {
                if let Some((old, _)) = self.closed.pop_first() {
                    self.procs.retain(|_, v| *v != old);
                }
            }
        }
        let out = self.drain();
        self.prune();
        out
    }

    /// Runs due quarantines.
    pub(super) fn tick(&mut self, now: Instant) -> Vec<(Target, KeeperEvent)> {
        if self.reg.poll_timeout().is_some_and(|t| t <= now) {
            self.reg.handle_timeout(now);
            self.dirty = true;
        }
        let out = self.drain();
        self.prune();
        out
    }

    /// When [`KeeperCore::tick`] has work.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.reg.poll_timeout()
    }

    /// Handles one request of session `s`.
    pub(super) fn handle(
        &mut self,
        now: Instant,
        s: SessionId,
        id: Option<u64>,
        req: Request,
    ) -> (Reply, Vec<(Target, KeeperEvent)>) {
        let res = self.dispatch(now, s, req);
        let events = self.drain();
        self.prune();
        let reply = match res {
            Ok(v) => Reply {
                id,
                epoch: self.epoch.clone(),
                ok: true,
                result: Some(v),
                error: None,
            },
            Err(e) => Reply {
                id,
                epoch: self.epoch.clone(),
                ok: false,
                result: None,
                error: Some(e),
            },
        };
        (reply, events)
    }

    /// A reply for a line that could not be parsed.
    pub(super) fn bad_line(&self, message: String) -> Reply {
        Reply {
            id: None,
            epoch: self.epoch.clone(),
            ok: false,
            result: None,
            error: Some(err(ErrorKind::BadRequest, message)),
        }
    }

    /// Moves the registry's outputs into events and log lines.
    fn drain(&mut self) -> Vec<(Target, KeeperEvent)> {
        let mut out = Vec::new();
        while let Some(t) = self.reg.poll_trace() {
            let mut line = format!(
                "{} qp {} {}",
                self.elapsed(t.at),
                t.qpn,
                self.humanize(&t.what)
            );
            if let Some(v) = t.verdict {
                line.push_str(&format!(" -> {}", verdict_text(v)));
            }
            self.log.push(line);
            if let Some(Verdict::Released(cause)) = t.verdict {
                self.dirty = true;
                out.push((
                    Target::All,
                    KeeperEvent::QpGone {
                        qpn: t.qpn.get(),
                        cause: cause.text().into(),
                    },
                ));
            }
        }
        // A lent registry's actions are its CM's (DREQs, REJs, its reports).
        if self.lent {
            return out;
        }
        while let Some(a) = self.reg.poll_action() {
            match a {
                PolicyAction::EndConnection { conn, qpn, cause } => {
                    match conn.session().filter(|s| self.sessions.contains_key(s)) {
                        Some(s) => out.push((
                            Target::Session(s),
                            KeeperEvent::EndConnection {
                                conn: conn.label(),
                                qpn: qpn.get(),
                                cause: cause.text().into(),
                            },
                        )),
                        None => self.log.push(format!(
                            "conn {} of closed session {:?} on qp {qpn} cannot be disconnected: its CM is gone",
                            conn.label(),
                            conn.session()
                        )),
                    }
                }
                PolicyAction::ReportOrphan { qpn } => {
                    out.push((Target::All, KeeperEvent::QpOrphaned { qpn: qpn.get() }));
                }
                // Covered by the QpGone broadcast above.
                _ => {}
            }
        }
        out
    }
}
