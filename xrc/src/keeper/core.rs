//! The keeper's state machine, without sockets: sessions in, replies and events out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ibcm_mad::Guid;
use serde_json::{json, Value};

use super::proto::{
    AvAttr, DomainView, ErrorBody, ErrorKind, HolderView, KeeperEvent, LeakView, ModifyAttr,
    QpView, Reply, Request, SessionView, StatusReport,
};
use crate::policy::{OwnershipPolicy, PolicyAction, Verdict};
use crate::registry::{
    ConnEvent, DomainId, DomainState, IniPeer, QpLife, Registrant, RegistryConfig, RegistryError,
    TgtQp, TgtRegistry, TgtRequest,
};
use crate::types::{DomainSpec, ProcessId, Qpn, SrqNum};
use crate::verbs::qp::{AccessFlags, AddressVector, GlobalRoute, PathMtu, QpAttr, QpState};
use crate::verbs::{Verbs, VerbsError};
use ibcm_mad::xrc::{ReqMode, XrcReqData};

/// A connection as the keeper knows it: the session that reported it and its name there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ConnKey {
    /// The session.
    pub session: u32,
    /// The session's name for it.
    pub name: String,
}

const MAX_CLOSED: usize = 4096;

/// A session number. It doubles as the registry's [`ProcessId`] for everything the session
/// creates or registers, so closing one socket releases exactly that socket's references.
pub(super) type SessionId = u32;

#[derive(Clone, Debug)]
struct Session {
    pid: Option<u32>,
    name: String,
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
#[derive(Debug)]
pub(super) struct KeeperCore {
    reg: TgtRegistry<ConnKey>,
    epoch: String,
    backend: String,
    keeper_pid: u32,
    sessions: BTreeMap<SessionId, Session>,
    /// PIDs of recently closed sessions, for logs and status after they are gone.
    closed: BTreeMap<SessionId, Option<u32>>,
    next_session: SessionId,
    slots: BTreeMap<(DomainId, String), Qpn>,
    log: Vec<String>,
    started: Instant,
}

fn err(kind: ErrorKind, message: impl Into<String>) -> ErrorBody {
    ErrorBody {
        kind,
        message: message.into(),
    }
}

fn registry_err(e: &RegistryError) -> ErrorBody {
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
        RegistryError::Verbs(VerbsError::Modify(_)) => ErrorKind::BadModify,
        RegistryError::Verbs(_) => ErrorKind::Verbs,
        RegistryError::Wire(_) => ErrorKind::BadRequest,
    };
    err(kind, e.to_string())
}

fn qpn_arg(v: u32) -> Result<Qpn, ErrorBody> {
    Qpn::new(v).ok_or_else(|| {
        err(
            ErrorKind::BadRequest,
            format!("QPN {v:#x} needs more than 24 bits"),
        )
    })
}

fn policy_arg(s: &str) -> Result<OwnershipPolicy, ErrorBody> {
    OwnershipPolicy::from_name(s).ok_or_else(|| {
        err(
            ErrorKind::BadRequest,
            format!("unknown policy {s:?} (explicit, domain-bound, process-bound, shared)"),
        )
    })
}

fn state_arg(s: &str) -> Result<QpState, ErrorBody> {
    QpState::from_name(s)
        .ok_or_else(|| err(ErrorKind::BadRequest, format!("unknown QP state {s:?}")))
}

fn psn_arg(v: u32) -> Result<ibcm_mad::Psn, ErrorBody> {
    ibcm_mad::Psn::new(v).ok_or_else(|| {
        err(
            ErrorKind::BadRequest,
            format!("PSN {v:#x} needs more than 24 bits"),
        )
    })
}

fn gid_arg(s: &str) -> Result<[u8; 16], ErrorBody> {
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

fn av_arg(a: &AvAttr) -> Result<AddressVector, ErrorBody> {
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
pub(super) fn modify_attr(m: &ModifyAttr) -> Result<QpAttr, ErrorBody> {
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

impl KeeperCore {
    /// A keeper acting through `verbs`. `epoch` must differ between keeper instances.
    pub(super) fn new(
        verbs: Box<dyn Verbs>,
        cfg: RegistryConfig,
        epoch: String,
        backend: &str,
        now: Instant,
    ) -> Self {
        let keeper_pid = verbs.process().0;
        Self {
            reg: TgtRegistry::new(verbs, cfg),
            epoch,
            backend: backend.to_owned(),
            keeper_pid,
            sessions: BTreeMap::new(),
            closed: BTreeMap::new(),
            next_session: 1,
            slots: BTreeMap::new(),
            log: Vec::new(),
            started: now,
        }
    }

    /// This instance's epoch.
    pub(super) fn epoch(&self) -> &str {
        &self.epoch
    }

    /// Lines to log since the last call (everything the registry did).
    pub(super) fn take_log(&mut self) -> Vec<String> {
        std::mem::take(&mut self.log)
    }

    /// A client connected; `pid` from `SO_PEERCRED` when available.
    pub(super) fn open_session(&mut self, pid: Option<u32>) -> SessionId {
        let id = self.next_session;
        self.next_session = self.next_session.wrapping_add(1).max(1);
        self.sessions.insert(
            id,
            Session {
                pid,
                name: String::new(),
            },
        );
        id
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
        self.reg.process_exit(now, ProcessId(s));
        // Its connections died with its CM: nobody can DREQ them any more.
        let conns: Vec<ConnKey> = self
            .reg
            .tgt_qps()
            .into_iter()
            .flat_map(|q| q.conns)
            .filter(|c| c.session == s)
            .collect();
        for c in conns {
            self.reg.handle_conn_event(now, &c, ConnEvent::LocalClosed);
        }
        if let Some(x) = self.sessions.remove(&s) {
            self.closed.insert(s, x.pid);
            while self.closed.len() > MAX_CLOSED {
                self.closed.pop_first();
            }
        }
        self.drain()
    }

    /// Runs due quarantines.
    pub(super) fn tick(&mut self, now: Instant) -> Vec<(Target, KeeperEvent)> {
        if self.reg.poll_timeout().is_some_and(|t| t <= now) {
            self.reg.handle_timeout(now);
        }
        self.drain()
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

    fn domain_arg(&self, name: &str) -> Result<DomainId, ErrorBody> {
        self.reg.domain_by_name(name).ok_or_else(|| {
            err(
                ErrorKind::UnknownDomain,
                format!("no domain named {name:?}"),
            )
        })
    }

    fn dispatch(&mut self, now: Instant, s: SessionId, req: Request) -> Result<Value, ErrorBody> {
        let me = ProcessId(s);
        match req {
            Request::Hello { pid, name } => {
                if let Some(sess) = self.sessions.get_mut(&s) {
                    if sess.pid.is_none() {
                        sess.pid = pid;
                    }
                    sess.name = name.unwrap_or_default();
                }
                let dev = self.reg.verbs().device();
                Ok(json!({
                    "session": s,
                    "keeper_pid": self.keeper_pid,
                    "backend": self.backend,
                    "device": dev.name,
                    "xrc": dev.xrc,
                }))
            }
            Request::Ping => Ok(json!({})),
            Request::OpenDomain {
                domain,
                path,
                create,
                exclusive,
            } => {
                let spec = match path {
                    None => DomainSpec::Private,
                    Some(p) => DomainSpec::File {
                        path: p.into(),
                        create,
                        exclusive,
                    },
                };
                self.reg
                    .open_domain(&domain, spec)
                    .map_err(|e| registry_err(&e))?;
                self.log.push(format!("domain {domain} open"));
                Ok(json!({ "domain": domain }))
            }
            Request::CloseDomain { domain } => {
                let id = self.domain_arg(&domain)?;
                let st = self
                    .reg
                    .close_domain(now, id)
                    .map_err(|e| registry_err(&e))?;
                self.slots.retain(|(d, _), _| *d != id);
                Ok(match st {
                    DomainState::Open => json!({ "state": "open" }),
                    DomainState::Closing { pinned_by } => json!({
                        "state": if pinned_by.is_empty() { "closed" } else { "closing" },
                        "pinned_by": pinned_by.iter().map(|q| q.get()).collect::<Vec<_>>(),
                    }),
                })
            }
            Request::Create { domain, policy } => {
                let id = self.domain_arg(&domain)?;
                let policy = policy_arg(&policy)?;
                let qpn = self
                    .reg
                    .create_tgt_qp(now, id, policy, me)
                    .map_err(|e| registry_err(&e))?;
                Ok(json!({ "qpn": qpn.get(), "policy": policy.name() }))
            }
            Request::CreateOrRegister { domain, key } => {
                let id = self.domain_arg(&domain)?;
                let existing = self
                    .slots
                    .get(&(id, key.clone()))
                    .copied()
                    .filter(|q| self.reg.query(*q).is_ok_and(|t| t.life == QpLife::Live));
                match existing {
                    Some(qpn) => {
                        self.reg
                            .register(now, qpn, Registrant::Process(me))
                            .map_err(|e| registry_err(&e))?;
                        Ok(json!({ "qpn": qpn.get(), "created": false }))
                    }
                    None => {
                        let qpn = self
                            .reg
                            .create_tgt_qp(now, id, OwnershipPolicy::Shared, me)
                            .map_err(|e| registry_err(&e))?;
                        self.slots.insert((id, key), qpn);
                        Ok(json!({ "qpn": qpn.get(), "created": true }))
                    }
                }
            }
            Request::Register { qpn } => {
                let n = self
                    .reg
                    .register(now, qpn_arg(qpn)?, Registrant::Process(me))
                    .map_err(|e| registry_err(&e))?;
                Ok(json!({ "count": n }))
            }
            Request::Unregister { qpn } => {
                let v = self
                    .reg
                    .unregister(now, qpn_arg(qpn)?, &Registrant::Process(me))
                    .map_err(|e| registry_err(&e))?;
                Ok(verdict_json(v))
            }
            Request::Destroy { qpn } => {
                let v = self
                    .reg
                    .destroy(now, qpn_arg(qpn)?, me)
                    .map_err(|e| registry_err(&e))?;
                Ok(verdict_json(v))
            }
            Request::Adopt { qpn } => {
                self.reg
                    .adopt(now, qpn_arg(qpn)?, me)
                    .map_err(|e| registry_err(&e))?;
                Ok(json!({}))
            }
            Request::Modify { qpn, attr } => {
                let a = modify_attr(&attr)?;
                let st = self
                    .reg
                    .modify(qpn_arg(qpn)?, &a)
                    .map_err(|e| registry_err(&e))?;
                Ok(json!({ "state": st.name() }))
            }
            Request::Query { qpn } => {
                let q = self
                    .reg
                    .query(qpn_arg(qpn)?)
                    .map_err(|e| registry_err(&e))?;
                serde_json::to_value(self.qp_view(&q))
                    .map_err(|e| err(ErrorKind::Internal, e.to_string()))
            }
            Request::AcceptReq {
                conn,
                domain,
                ini_ca_guid,
                ini_qpn,
                mode,
                tgt_qpn,
                policy,
                srqns,
                timewait_ms,
            } => {
                let id = self.domain_arg(&domain)?;
                let mode = match (mode.as_deref().unwrap_or("any"), tgt_qpn) {
                    ("any", _) => ReqMode::Any,
                    ("create", _) => ReqMode::Create,
                    ("attach", Some(q)) => ReqMode::Attach(qpn_arg(q)?),
                    (m, _) => {
                        return Err(err(
                            ErrorKind::BadRequest,
                            format!("bad mode {m:?} (attach needs tgt_qpn)"),
                        ))
                    }
                };
                let policy = policy.as_deref().map(policy_arg).transpose()?;
                let srqns = srqns
                    .into_iter()
                    .map(|v| {
                        SrqNum::new(v)
                            .ok_or_else(|| err(ErrorKind::BadRequest, format!("SRQN {v:#x}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let req = TgtRequest {
                    conn: ConnKey {
                        session: s,
                        name: conn,
                    },
                    domain: id,
                    process: me,
                    peer: IniPeer {
                        ca_guid: Guid(ini_ca_guid),
                        ini_qpn: qpn_arg(ini_qpn)?,
                    },
                    data: XrcReqData { mode, policy },
                    timewait: timewait_ms.map_or(
                        self.reg.config().policy.default_timewait,
                        Duration::from_millis,
                    ),
                    srqns,
                };
                match self.reg.handle_req(now, &req) {
                    Ok(acc) => {
                        let pd = acc.rep_private_data(&[]).unwrap_or_default();
                        Ok(json!({
                            "accept": true,
                            "tgt_qpn": acc.tgt_qpn.get(),
                            "created": acc.created,
                            "policy": acc.policy.name(),
                            "rep_private_data": hex(&pd),
                        }))
                    }
                    Err(gone) => Ok(json!({
                        "accept": false,
                        "rej_reason": gone.reason().raw(),
                        "ari": hex(&gone.to_bytes()),
                        "text": gone.to_string(),
                    })),
                }
            }
            Request::ConnEvent { conn, event } => {
                let ev = match event.as_str() {
                    "established" => ConnEvent::Established,
                    "peer-dreq" => ConnEvent::PeerDreq,
                    "peer-timeout" => ConnEvent::PeerTimeout,
                    "closed" => ConnEvent::LocalClosed,
                    other => {
                        return Err(err(
                            ErrorKind::BadRequest,
                            format!("unknown connection event {other:?}"),
                        ))
                    }
                };
                let key = ConnKey {
                    session: s,
                    name: conn,
                };
                let v = self.reg.handle_conn_event(now, &key, ev);
                Ok(v.map_or(json!({}), verdict_json))
            }
            Request::Status => serde_json::to_value(self.status())
                .map_err(|e| err(ErrorKind::Internal, e.to_string())),
            Request::Leaks => {
                let leaks: Vec<LeakView> = self
                    .reg
                    .leaks()
                    .into_iter()
                    .map(|l| LeakView {
                        qpn: l.qpn.get(),
                        domain: self.domain_name(l.domain),
                        policy: l.policy.name().into(),
                        creator_pid: self.pid_of(l.creator),
                    })
                    .collect();
                serde_json::to_value(leaks).map_err(|e| err(ErrorKind::Internal, e.to_string()))
            }
        }
    }

    fn pid_of(&self, p: ProcessId) -> Option<u32> {
        match self.sessions.get(&p.0) {
            Some(s) => s.pid,
            None => self.closed.get(&p.0).copied().flatten(),
        }
    }

    /// Rewrites the registry's "pid N" (N = session number) as "pid P (session N)".
    fn humanize(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 16);
        let mut rest = text;
        while let Some(i) = rest.find("pid ") {
            let (head, tail) = rest.split_at(i + 4);
            out.push_str(head);
            let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
            let (num, after) = tail.split_at(digits);
            match num
                .parse::<u32>()
                .ok()
                .map(|n| (n, self.pid_of(ProcessId(n))))
            {
                Some((n, Some(pid))) => out.push_str(&format!("{pid} (session {n})")),
                Some((n, None)) => out.push_str(&format!("? (session {n})")),
                None => out.push_str(num),
            }
            rest = after;
        }
        out.push_str(rest);
        out
    }

    fn domain_name(&self, id: DomainId) -> String {
        self.reg
            .domain(id)
            .map_or_else(|| id.to_string(), |d| d.name)
    }

    fn qp_view(&self, q: &TgtQp<ConnKey>) -> QpView {
        QpView {
            qpn: q.qpn.get(),
            domain: self.domain_name(q.domain),
            policy: q.policy.name().into(),
            life: match q.life {
                QpLife::Live => "live".into(),
                QpLife::Gone { cause, .. } => format!("gone: {cause}"),
            },
            state: q.state.name().into(),
            creator_pid: self.pid_of(q.creator),
            owner_pid: q.owner.and_then(|o| self.pid_of(o)),
            holders: q
                .registrations
                .iter()
                .map(|(r, count)| match r {
                    Registrant::Process(p) => HolderView {
                        pid: self.pid_of(*p),
                        conn: None,
                        count: *count,
                    },
                    Registrant::Conn(c) => HolderView {
                        pid: self.pid_of(ProcessId(c.session)),
                        conn: Some(c.name.clone()),
                        count: *count,
                    },
                })
                .collect(),
            conns: q.conns.iter().map(|c| c.name.clone()).collect(),
        }
    }

    /// The `status` report.
    pub(super) fn status(&self) -> StatusReport {
        let dev = self.reg.verbs().device();
        StatusReport {
            epoch: self.epoch.clone(),
            keeper_pid: self.keeper_pid,
            backend: self.backend.clone(),
            device: dev.name,
            sessions: self
                .sessions
                .iter()
                .map(|(&session, x)| SessionView {
                    session,
                    pid: x.pid,
                    name: x.name.clone(),
                })
                .collect(),
            domains: self
                .reg
                .domains()
                .into_iter()
                .map(|d| DomainView {
                    name: d.name,
                    path: d
                        .spec
                        .path()
                        .map_or_else(|| "private".into(), |p| p.display().to_string()),
                    state: match d.state {
                        DomainState::Open => "open".into(),
                        DomainState::Closing { .. } => "closing".into(),
                    },
                })
                .collect(),
            qps: self.reg.tgt_qps().iter().map(|q| self.qp_view(q)).collect(),
        }
    }

    fn elapsed(&self, at: Instant) -> String {
        let d = at.saturating_duration_since(self.started);
        format!("+{}.{:03}s", d.as_secs(), d.subsec_millis())
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
                out.push((
                    Target::All,
                    KeeperEvent::QpGone {
                        qpn: t.qpn.get(),
                        cause: cause.text().into(),
                    },
                ));
            }
        }
        while let Some(a) = self.reg.poll_action() {
            match a {
                PolicyAction::EndConnection { conn, qpn, cause } => {
                    if self.sessions.contains_key(&conn.session) {
                        out.push((
                            Target::Session(conn.session),
                            KeeperEvent::EndConnection {
                                conn: conn.name,
                                qpn: qpn.get(),
                                cause: cause.text().into(),
                            },
                        ));
                    } else {
                        self.log.push(format!(
                            "conn {} of closed session {} on qp {qpn} cannot be disconnected: its CM is gone",
                            conn.name, conn.session
                        ));
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

fn verdict_text(v: Verdict) -> String {
    match v {
        Verdict::Kept => "kept".into(),
        Verdict::Released(c) => format!("released ({c})"),
        Verdict::AlreadyGone(c) => format!("already gone ({c})"),
    }
}

fn verdict_json(v: Verdict) -> Value {
    match v {
        Verdict::Kept => json!({ "verdict": "kept" }),
        Verdict::Released(c) => json!({ "verdict": "released", "cause": c.text() }),
        Verdict::AlreadyGone(c) => json!({ "verdict": "already-gone", "cause": c.text() }),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::model::{KernelModel, ModelConfig};

    fn keeper() -> (KeeperCore, Instant) {
        let k = KernelModel::new(ModelConfig::mlx5());
        let now = Instant::now();
        (
            KeeperCore::new(
                Box::new(k.spawn()),
                RegistryConfig::default(),
                "e1".into(),
                "sim",
                now,
            ),
            now,
        )
    }

    fn ok(k: &mut KeeperCore, now: Instant, s: SessionId, req: Request) -> Value {
        let (r, _) = k.handle(now, s, Some(1), req);
        assert!(r.ok, "{:?}", r.error);
        assert_eq!(r.epoch, "e1");
        r.result.unwrap()
    }

    fn fail(k: &mut KeeperCore, now: Instant, s: SessionId, req: Request) -> ErrorKind {
        let (r, _) = k.handle(now, s, Some(1), req);
        assert!(!r.ok);
        r.error.unwrap().kind
    }

    #[test]
    fn shared_hold_counts_follow_session_deaths() {
        let (mut k, now) = keeper();
        let a = k.open_session(Some(100));
        let b = k.open_session(Some(200));
        ok(
            &mut k,
            now,
            a,
            Request::OpenDomain {
                domain: "d".into(),
                path: Some("/x".into()),
                create: true,
                exclusive: false,
            },
        );
        let r1 = ok(
            &mut k,
            now,
            a,
            Request::CreateOrRegister {
                domain: "d".into(),
                key: "default".into(),
            },
        );
        let r2 = ok(
            &mut k,
            now,
            b,
            Request::CreateOrRegister {
                domain: "d".into(),
                key: "default".into(),
            },
        );
        assert_eq!(r1["qpn"], r2["qpn"]);
        assert_eq!(
            (r1["created"].as_bool(), r2["created"].as_bool()),
            (Some(true), Some(false))
        );
        let st = k.status();
        assert_eq!(st.qps.len(), 1);
        assert_eq!(st.qps[0].holders.len(), 2);
        let ev = k.close_session(now, a);
        assert!(ev.is_empty());
        assert_eq!(k.status().qps[0].holders.len(), 1);
        let ev = k.close_session(now, b);
        assert_eq!(
            ev,
            vec![(
                Target::All,
                KeeperEvent::QpGone {
                    qpn: r1["qpn"].as_u64().unwrap() as u32,
                    cause: "last registration dropped".into()
                }
            )]
        );
        assert_eq!(k.status().qps[0].life, "gone: last registration dropped");
        k.tick(now + Duration::from_secs(10));
        assert!(k.status().qps.is_empty());
    }

    #[test]
    fn process_bound_dies_with_its_session_and_dreqs_other_sessions_conns() {
        let (mut k, now) = keeper();
        let a = k.open_session(Some(100));
        let b = k.open_session(Some(200));
        ok(
            &mut k,
            now,
            a,
            Request::OpenDomain {
                domain: "d".into(),
                path: None,
                create: true,
                exclusive: false,
            },
        );
        let r = ok(
            &mut k,
            now,
            a,
            Request::Create {
                domain: "d".into(),
                policy: "process-bound".into(),
            },
        );
        let qpn = r["qpn"].as_u64().unwrap() as u32;
        let acc = ok(
            &mut k,
            now,
            b,
            Request::AcceptReq {
                conn: "c1".into(),
                domain: "d".into(),
                ini_ca_guid: 7,
                ini_qpn: 0x99,
                mode: Some("attach".into()),
                tgt_qpn: Some(qpn),
                policy: None,
                srqns: vec![0x10],
                timewait_ms: Some(100),
            },
        );
        assert_eq!(acc["accept"], true);
        assert_eq!(acc["tgt_qpn"], qpn);
        let ev = k.close_session(now, a);
        assert!(ev.contains(&(
            Target::Session(b),
            KeeperEvent::EndConnection {
                conn: "c1".into(),
                qpn,
                cause: "creator exited".into()
            }
        )));
        // A reconnect to the gone QP is rejected with reason 1 and the cause.
        let rej = ok(
            &mut k,
            now,
            b,
            Request::AcceptReq {
                conn: "c2".into(),
                domain: "d".into(),
                ini_ca_guid: 7,
                ini_qpn: 0x99,
                mode: Some("attach".into()),
                tgt_qpn: Some(qpn),
                policy: None,
                srqns: vec![0x10],
                timewait_ms: None,
            },
        );
        assert_eq!(rej["accept"], false);
        assert_eq!(rej["rej_reason"], 1);
        assert!(rej["ari"].as_str().unwrap().starts_with("585243010103"));
    }

    #[test]
    fn errors_have_kinds() {
        let (mut k, now) = keeper();
        let a = k.open_session(None);
        assert_eq!(
            fail(
                &mut k,
                now,
                a,
                Request::Create {
                    domain: "nope".into(),
                    policy: "shared".into()
                }
            ),
            "unknown-domain"
        );
        ok(
            &mut k,
            now,
            a,
            Request::OpenDomain {
                domain: "d".into(),
                path: None,
                create: true,
                exclusive: false,
            },
        );
        assert_eq!(
            fail(
                &mut k,
                now,
                a,
                Request::Create {
                    domain: "d".into(),
                    policy: "forever".into()
                }
            ),
            "bad-request"
        );
        assert_eq!(
            fail(&mut k, now, a, Request::Register { qpn: 5 }),
            "unknown-qpn"
        );
        assert_eq!(
            fail(&mut k, now, a, Request::Register { qpn: 1 << 24 }),
            "bad-request"
        );
        let b = k.open_session(None);
        let r = ok(
            &mut k,
            now,
            a,
            Request::Create {
                domain: "d".into(),
                policy: "explicit".into(),
            },
        );
        let qpn = r["qpn"].as_u64().unwrap() as u32;
        assert_eq!(fail(&mut k, now, b, Request::Destroy { qpn }), "not-owner");
        assert_eq!(
            fail(
                &mut k,
                now,
                a,
                Request::Modify {
                    qpn,
                    attr: ModifyAttr {
                        state: Some("RTR".into()),
                        ..ModifyAttr::default()
                    }
                }
            ),
            "bad-modify"
        );
        let m = ok(
            &mut k,
            now,
            b,
            Request::Modify {
                qpn,
                attr: ModifyAttr {
                    state: Some("INIT".into()),
                    pkey_index: Some(0),
                    port: Some(1),
                    access_flags: Some(0),
                    ..ModifyAttr::default()
                },
            },
        );
        assert_eq!(m["state"], "INIT");
        let q = ok(&mut k, now, b, Request::Query { qpn });
        assert_eq!(q["state"], "INIT");
    }

    #[test]
    fn explicit_orphan_is_a_leak_until_adopted() {
        let (mut k, now) = keeper();
        let a = k.open_session(Some(1));
        let b = k.open_session(Some(2));
        ok(
            &mut k,
            now,
            a,
            Request::OpenDomain {
                domain: "d".into(),
                path: None,
                create: true,
                exclusive: false,
            },
        );
        let r = ok(
            &mut k,
            now,
            a,
            Request::Create {
                domain: "d".into(),
                policy: "explicit".into(),
            },
        );
        let qpn = r["qpn"].as_u64().unwrap() as u32;
        let ev = k.close_session(now, a);
        assert_eq!(ev, vec![(Target::All, KeeperEvent::QpOrphaned { qpn })]);
        let leaks = ok(&mut k, now, b, Request::Leaks);
        assert_eq!(leaks.as_array().unwrap().len(), 1);
        ok(&mut k, now, b, Request::Adopt { qpn });
        assert_eq!(
            ok(&mut k, now, b, Request::Leaks).as_array().unwrap().len(),
            0
        );
        let d = ok(&mut k, now, b, Request::Destroy { qpn });
        assert_eq!(d["verdict"], "released");
    }

    #[test]
    fn log_lines_name_real_pids() {
        let (mut k, now) = keeper();
        let a = k.open_session(Some(4242));
        ok(
            &mut k,
            now,
            a,
            Request::OpenDomain {
                domain: "d".into(),
                path: None,
                create: true,
                exclusive: false,
            },
        );
        ok(
            &mut k,
            now,
            a,
            Request::Create {
                domain: "d".into(),
                policy: "shared".into(),
            },
        );
        let log = k.take_log().join("\n");
        assert!(
            log.contains("create shared by pid 4242 (session 1)"),
            "{log}"
        );
        assert_eq!(
            k.humanize("pid 99 and pid x"),
            "pid ? (session 99) and pid x"
        );
        k.close_session(now, a);
        assert!(k
            .take_log()
            .iter()
            .any(|l| l.contains("session 1 (pid 4242) closed")));
    }

    #[test]
    fn gid_parsing() {
        assert_eq!(
            gid_arg("fe80:0000:0000:0000:0000:0000:0000:0001").unwrap()[15],
            1
        );
        assert!(gid_arg("xyz").is_err());
        assert!(gid_arg(&"é".repeat(16)).is_err());
    }
}
