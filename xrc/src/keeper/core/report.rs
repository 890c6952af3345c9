//! How the keeper shows its state: QP views for `query` and `status`, session numbers
//! turned back into real PIDs, verdicts and times in log lines.

use std::time::Instant;

use super::{KeeperConn, KeeperCore, SessionId};
use crate::keeper::proto::{DomainView, HolderView, QpView, SessionView, StatusReport};
use crate::policy::Verdict;
use crate::registry::{DomainId, DomainState, QpLife, Registrant, TgtQp};
use crate::types::ProcessId;

impl<K: KeeperConn> KeeperCore<K> {
    /// The session acting as registry process `p` (live or recently closed).
    pub(super) fn session_of(&self, p: ProcessId) -> Option<SessionId> {
        self.procs.get(&p).copied()
    }

    pub(super) fn pid_of(&self, p: ProcessId) -> Option<u32> {
        let s = self.session_of(p)?;
        self.session_pid(s)
    }

    fn session_pid(&self, s: SessionId) -> Option<u32> {
        match self.sessions.get(&s) {
            Some(x) => x.pid,
            None => self.closed.get(&s).copied().flatten(),
        }
    }

    /// Rewrites the registry's "pid N" (N = a session's process) as "pid P (session S)".
    pub(super) fn humanize(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 16);
        let mut rest = text;
        while let Some(i) = rest.find("pid ") {
            let (head, tail) = rest.split_at(i + 4);
            out.push_str(head);
            let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
            let (num, after) = tail.split_at(digits);
            // Standalone, a process number is a session number even when the session is
            // forgotten; lent, an unknown process is another client of the service.
            let session = |n: u32| self.session_of(ProcessId(n)).or((!self.lent).then_some(n));
            match num
                .parse::<u32>()
                .ok()
                .and_then(session)
                .map(|s| (s, self.session_pid(s)))
            {
                Some((s, Some(pid))) => out.push_str(&format!("{pid} (session {s})")),
                Some((s, None)) => out.push_str(&format!("? (session {s})")),
                None => out.push_str(num),
            }
            rest = after;
        }
        out.push_str(rest);
        out
    }

    pub(super) fn domain_name(&self, id: DomainId) -> String {
        self.reg
            .domain(id)
            .map_or_else(|| id.to_string(), |d| d.name)
    }

    pub(super) fn qp_view(&self, q: &TgtQp<K>) -> QpView {
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
                        pid: c.session().and_then(|s| self.session_pid(s)),
                        conn: Some(c.label()),
                        count: *count,
                    },
                })
                .collect(),
            conns: q.conns.iter().map(KeeperConn::label).collect(),
        }
    }

    /// The `status` report.
    pub(in crate::keeper) fn status(&self) -> StatusReport {
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

    pub(super) fn elapsed(&self, at: Instant) -> String {
        let d = at.saturating_duration_since(self.started);
        format!("+{}.{:03}s", d.as_secs(), d.subsec_millis())
    }
}

pub(super) fn verdict_text(v: Verdict) -> String {
    match v {
        Verdict::Kept => "kept".into(),
        Verdict::Released(c) => format!("released ({c})"),
        Verdict::AlreadyGone(c) => format!("already gone ({c})"),
    }
}
