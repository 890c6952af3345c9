//! What each request does: one arm per [`Request`], each a registry call.

use std::time::{Duration, Instant};

use ibcm_mad::Guid;
use serde_json::{json, Value};

use super::args::{err, modify_attr, policy_arg, qpn_arg, registry_err};
use super::{KeeperConn, KeeperCore, SessionId};
use crate::keeper::proto::{ErrorBody, ErrorKind, LeakView, Request};
use crate::policy::{OwnershipPolicy, Verdict};
use crate::registry::{ConnEvent, DomainState, IniPeer, QpLife, Registrant, TgtRequest};
use crate::types::SrqNum;
use ibcm_mad::xrc::{ReqMode, XrcReqData};

/// The longest CM TimeWait an `accept-req` may ask for (`timewait_ms`): a TGT QP number is
/// quarantined that long after its connection ends, so an unbounded value would park QPs for
/// ever. 60 s, the ibcm endpoint's own ceiling for peer-derived TimeWaits
/// (`EndpointConfig::max_timewait`).
pub(in crate::keeper) const MAX_TIMEWAIT_MS: u64 = 60_000;

impl<K: KeeperConn> KeeperCore<K> {
    pub(super) fn dispatch(
        &mut self,
        now: Instant,
        s: SessionId,
        req: Request,
    ) -> Result<Value, ErrorBody> {
        let me = self.process_of(s);
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
                    "uid": self.cred(s).map(|c| c.uid),
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
                self.open_domain_for(s, &domain, path.as_deref(), create, exclusive)?;
                self.log.push(format!("domain {domain} open"));
                Ok(json!({ "domain": domain }))
            }
            Request::CloseDomain { domain } => {
                let id = self.owned_domain(s, &domain)?;
                self.dirty = true;
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
                let id = self.usable_domain(s, &domain)?;
                let policy = policy_arg(&policy)?;
                self.qp_quota(s)?;
                let qpn = self
                    .reg
                    .create_tgt_qp(now, id, policy, me)
                    .map_err(|e| registry_err(&e))?;
                self.own_qp(s, qpn);
                Ok(json!({ "qpn": qpn.get(), "policy": policy.name() }))
            }
            Request::CreateOrRegister { domain, key } => {
                let id = self.usable_domain(s, &domain)?;
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
                        self.qp_quota(s)?;
                        let qpn = self
                            .reg
                            .create_tgt_qp(now, id, OwnershipPolicy::Shared, me)
                            .map_err(|e| registry_err(&e))?;
                        self.own_qp(s, qpn);
                        self.slots.insert((id, key), qpn);
                        Ok(json!({ "qpn": qpn.get(), "created": true }))
                    }
                }
            }
            Request::Register { qpn } => {
                let qpn = qpn_arg(qpn)?;
                self.check_qp(s, qpn, "register on", true)?;
                let n = self
                    .reg
                    .register(now, qpn, Registrant::Process(me))
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
                let qpn = qpn_arg(qpn)?;
                // An orphan may be destroyed by any session (registry rule), but only of its
                // owner's uid.
                self.check_qp(s, qpn, "destroy", false)?;
                let v = self
                    .reg
                    .destroy(now, qpn, me)
                    .map_err(|e| registry_err(&e))?;
                Ok(verdict_json(v))
            }
            Request::Adopt { qpn } => {
                let qpn = qpn_arg(qpn)?;
                self.check_qp(s, qpn, "adopt", false)?;
                self.reg.adopt(now, qpn, me).map_err(|e| registry_err(&e))?;
                Ok(json!({}))
            }
            Request::Modify { qpn, attr } => {
                let a = modify_attr(&attr)?;
                let qpn = qpn_arg(qpn)?;
                self.check_qp(s, qpn, "modify", true)?;
                let st = self.reg.modify(qpn, &a).map_err(|e| registry_err(&e))?;
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
                let conn = K::reported(s, conn).ok_or_else(|| {
                    err(
                        ErrorKind::BadRequest,
                        "this keeper's CM answers the XRC REQs itself: serve the domain's QPs \
                         through it (xrc-listen) instead of reporting REQs",
                    )
                })?;
                let id = self.usable_domain(s, &domain)?;
                let timewait = match timewait_ms {
                    None => self.reg.config().policy.default_timewait,
                    Some(ms) if ms <= MAX_TIMEWAIT_MS => Duration::from_millis(ms),
                    Some(ms) => {
                        return Err(err(
                            ErrorKind::BadRequest,
                            format!("timewait_ms {ms} is over the limit of {MAX_TIMEWAIT_MS} ms"),
                        ))
                    }
                };
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
                if !matches!(mode, ReqMode::Attach(_)) {
                    // It may create a TGT QP (`any` too, when none fits): within the quota.
                    self.qp_quota(s)?;
                }
                let srqns = srqns
                    .into_iter()
                    .map(|v| {
                        SrqNum::new(v)
                            .ok_or_else(|| err(ErrorKind::BadRequest, format!("SRQN {v:#x}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let req = TgtRequest {
                    conn,
                    domain: id,
                    process: me,
                    peer: IniPeer {
                        ca_guid: Guid(ini_ca_guid),
                        ini_qpn: qpn_arg(ini_qpn)?,
                    },
                    data: XrcReqData { mode, policy },
                    timewait,
                    srqns,
                };
                match self.reg.handle_req(now, &req) {
                    Ok(acc) => {
                        if acc.created {
                            self.own_qp(s, acc.tgt_qpn);
                        }
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
                let key = K::reported(s, conn).ok_or_else(|| {
                    err(
                        ErrorKind::BadRequest,
                        "this keeper's CM sees the connections' events itself",
                    )
                })?;
                let v = self.reg.handle_conn_event(now, &key, ev);
                Ok(v.map_or(json!({}), verdict_json))
            }
            Request::Status => serde_json::to_value(self.status())
                .map_err(|e| err(ErrorKind::Internal, e.to_string())),
            Request::Leaks => {
                // A connection of a session that is gone holds nothing (its CM went with it).
                let leaks: Vec<LeakView> = self
                    .reg
                    .leaks_with(|c| c.session().is_none_or(|s| self.sessions.contains_key(&s)))
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
