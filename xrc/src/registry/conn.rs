//! The CM side (the contract on [`TgtRegistry`], steps 1 and 2): an XRC REQ in, an
//! [`XrcAccept`] or a [`TargetGone`] block out; connection events; rekeying a connection
//! bound under a provisional key.

use std::fmt;
use std::time::{Duration, Instant};

use super::quarantine::QpnStatus;
use super::{DomainId, IniPeer, QpLife, Registrant, TgtRegistry};
use crate::policy::{decide, OwnershipPolicy, PolicyAction, PolicyEvent, Verdict};
use crate::types::{ProcessId, Qpn, SrqNum};
use ibcm_mad::xrc::{
    GoneCause, RejectKind, ReqMode, ServiceFault, TargetGone, XrcDataError, XrcRepData, XrcReqData,
    MAX_REP_SRQNS,
};

/// A REQ for an XRC TGT, as the CM hands it to [`TgtRegistry::handle_req`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TgtRequest<K> {
    /// The CM's key for the new connection.
    pub conn: K,
    /// The domain the listener serves.
    pub domain: DomainId,
    /// The accepting process (the creator of a new TGT QP).
    pub process: ProcessId,
    /// The initiator.
    pub peer: IniPeer,
    /// The XRC part of the REQ's private data.
    pub data: XrcReqData,
    /// The connection's CM TimeWait.
    pub timewait: Duration,
    /// The accepting process's XRC SRQ numbers, for the REP.
    pub srqns: Vec<SrqNum>,
}

/// How to answer an accepted XRC REQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XrcAccept {
    /// The TGT QPN: the REP's Local EECN.
    pub tgt_qpn: Qpn,
    /// Whether the QP was created for this REQ (it is in RESET: bring it to RTR).
    pub created: bool,
    /// Its policy.
    pub policy: OwnershipPolicy,
    /// The REP's XRC private data (the application's bytes may follow).
    pub rep: XrcRepData,
}

impl XrcAccept {
    /// The REP private data: [`XrcRepData`] followed by `app`.
    ///
    /// # Errors
    /// [`XrcDataError::TooLong`] when it does not fit 196 bytes.
    pub fn rep_private_data(&self, app: &[u8]) -> Result<Vec<u8>, XrcDataError> {
        self.rep.emit(app)
    }
}

/// Connection events the CM reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnEvent {
    /// RTU received (or COMM_EST): the connection is up.
    Established,
    /// DREQ received from the initiator.
    PeerDreq,
    /// The connection failed without a DREQ (retries exhausted, REJ received).
    PeerTimeout,
    /// The CM closed it for another reason (local disconnect).
    LocalClosed,
}

impl<K: Clone + Ord + fmt::Debug> TgtRegistry<K> {
    /// Decides on an XRC REQ (type docs, step 1).
    ///
    /// The request's service is checked first ([`RejectKind::Misconfigured`]: a domain this
    /// registry never opened, no SRQ number or more than 47): nothing is created or bound
    /// for it. On every `Err` the connection is left unbound — a REJ never leaves a binding
    /// behind that a later REQ with a reused key could land on.
    ///
    /// # Errors
    /// A [`TargetGone`] block to send in a REJ.
    pub fn handle_req(
        &mut self,
        now: Instant,
        req: &TgtRequest<K>,
    ) -> Result<XrcAccept, TargetGone> {
        let regs = self.cfg.connection_registrations;
        self.handle_req_with(now, req, regs, &|_| None)
    }

    /// [`TgtRegistry::handle_req`] with two choices of the CM's:
    ///
    /// * the connection registers on a `Shared` QP if `conn_registrations` (instead of
    ///   [`RegistryConfig::connection_registrations`](super::RegistryConfig::connection_registrations)):
    ///   a CM serving a QP that processes hold by their registrations (a keeper's, across
    ///   jobs) passes `false`, so that its initiators never keep it alive on their own;
    /// * `cm_quarantined(qpn)` says until when the CM keeps `qpn` out of use: its own QPN
    ///   quarantine may hold numbers this registry never heard of — the TimeWaits of other
    ///   connections of the same CM endpoint (ibcm's `Endpoint::qpn_quarantined`). A new TGT
    ///   QP the device numbers like that is parked until then (as one in this registry's own
    ///   quarantine) and another one is created.
    ///
    /// # Errors
    /// A [`TargetGone`] block to send in a REJ.
    pub fn handle_req_with(
        &mut self,
        now: Instant,
        req: &TgtRequest<K>,
        conn_registrations: bool,
        cm_quarantined: &dyn Fn(Qpn) -> Option<Instant>,
    ) -> Result<XrcAccept, TargetGone> {
        let refuse = |kind, qpn| TargetGone { kind, qpn };
        if let Some(fault) = self.service_fault(req) {
            let named = match req.data.mode {
                ReqMode::Attach(q) => Some(q),
                ReqMode::Any | ReqMode::Create => None,
            };
            self.unbind(now, &req.conn);
            return Err(refuse(RejectKind::Misconfigured(fault), named));
        }
        // A duplicate of a REQ already accepted (same key, same initiator): answer the same
        // way. The same key from another initiator is a new connection (the CM reused the
        // key): the stale binding goes first.
        if let Some(qpn) = self.accepted_dup(req) {
            return self.accept(qpn, false, &req.srqns);
        }
        if self.conns.contains_key(&req.conn) {
            self.unbind(now, &req.conn);
        }
        let domain_open = self.domains.get(&req.domain).is_some_and(|d| !d.closing);
        let closed = refuse(RejectKind::Gone(GoneCause::DomainClosed), None);
        let (qpn, created) = match req.data.mode {
            ReqMode::Attach(qpn) => {
                let decided = self.qps.get(&qpn).map(|q| {
                    let f = q.facts(qpn, true);
                    (q.life, q.domain, q.peer, f)
                });
                match decided {
                    Some((QpLife::Live, _, _, _)) if !domain_open => {
                        return Err(refuse(RejectKind::Gone(GoneCause::DomainClosed), Some(qpn)));
                    }
                    Some((QpLife::Live, dom, peer, _)) => {
                        if dom != req.domain || peer.is_some_and(|p| p != req.peer) {
                            return Err(refuse(RejectKind::AttachRefused, Some(qpn)));
                        }
                        (qpn, false)
                    }
                    Some((QpLife::Gone { .. }, _, _, facts)) => {
                        let ev = PolicyEvent::ReqReceived {
                            conn: req.conn.clone(),
                        };
                        let d = decide(&facts, &ev, now, &self.cfg.policy);
                        self.log(
                            now,
                            qpn,
                            "REQ for a gone QP".into(),
                            Some(d.verdict),
                            d.actions.clone(),
                        );
                        let info = d.actions.iter().find_map(|a| match a {
                            PolicyAction::RejectReq { qpn, cause, .. } => {
                                Some(TargetGone::gone(*cause, *qpn))
                            }
                            _ => None,
                        });
                        return Err(info.unwrap_or(TargetGone::gone(GoneCause::Unknown, qpn)));
                    }
                    None => {
                        let cause = match self.qpn_status(qpn, now) {
                            QpnStatus::Quarantined { cause, .. } => cause,
                            _ => GoneCause::Unknown,
                        };
                        return Err(TargetGone::gone(cause, qpn));
                    }
                }
            }
            ReqMode::Any | ReqMode::Create if !domain_open => return Err(closed),
            ReqMode::Any => match self.live_qp_for(req) {
                Some(qpn) => (qpn, false),
                None => (self.create_for_req(now, req, cm_quarantined)?, true),
            },
            ReqMode::Create => (self.create_for_req(now, req, cm_quarantined)?, true),
        };
        // Bind the connection.
        let conn_regs = conn_registrations;
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.peer.get_or_insert(req.peer);
            q.conns.insert(req.conn.clone(), req.timewait);
            if q.policy == OwnershipPolicy::Shared && conn_regs {
                q.registrations
                    .insert(Registrant::Conn(req.conn.clone()), 1);
            }
        }
        self.conns.insert(req.conn.clone(), qpn);
        self.log(
            now,
            qpn,
            format!(
                "REQ {:?} from INI {} {}",
                req.conn,
                req.peer.ini_qpn,
                if created {
                    "created the QP"
                } else {
                    "attached"
                }
            ),
            None,
            vec![],
        );
        let answer = self.accept(qpn, created, &req.srqns);
        if answer.is_err() {
            self.unbind(now, &req.conn);
        }
        answer
    }

    /// Whether [`TgtRegistry::handle_req`] would create a TGT QP for `req` now (mode Create,
    /// or mode Any without a live QP of the domain bound to the same initiator), so that a
    /// CM can apply a quota on TGT QPs before deciding. `false` when the request would be
    /// refused for its service, or is a duplicate of one already accepted.
    pub fn would_create(&self, req: &TgtRequest<K>) -> bool {
        if self.service_fault(req).is_some() {
            return false;
        }
        if self.accepted_dup(req).is_some() {
            return false;
        }
        match req.data.mode {
            ReqMode::Attach(_) => false,
            ReqMode::Create => true,
            ReqMode::Any => self.live_qp_for(req).is_none(),
        }
    }

    /// The live QP of a REQ already accepted under the same key from the same initiator (a
    /// duplicate: answered the same way).
    fn accepted_dup(&self, req: &TgtRequest<K>) -> Option<Qpn> {
        let &qpn = self.conns.get(&req.conn)?;
        self.qps
            .get(&qpn)
            .is_some_and(|q| q.life == QpLife::Live && q.peer == Some(req.peer))
            .then_some(qpn)
    }

    /// A live QP of the REQ's domain already serving its initiator (mode `any` reuses it).
    fn live_qp_for(&self, req: &TgtRequest<K>) -> Option<Qpn> {
        self.qps
            .iter()
            .find(|(_, q)| {
                q.life == QpLife::Live && q.domain == req.domain && q.peer == Some(req.peer)
            })
            .map(|(&qpn, _)| qpn)
    }

    /// What is wrong with the service `req` was made for, if anything.
    fn service_fault(&self, req: &TgtRequest<K>) -> Option<ServiceFault> {
        let n = req.srqns.len();
        if n == 0 {
            Some(ServiceFault::NoSrqns)
        } else if n > MAX_REP_SRQNS {
            Some(ServiceFault::TooManySrqns)
        } else if !self.domain_ever_opened(req.domain) {
            Some(ServiceFault::UnknownDomain)
        } else {
            None
        }
    }

    /// Removes the binding of `conn`, if any, as a connection that never came up (its
    /// connection-scoped registration goes, and the QP's policy decides on the rest).
    fn unbind(&mut self, now: Instant, conn: &K) {
        if self.conns.contains_key(conn) {
            self.handle_conn_event(now, conn, ConnEvent::PeerTimeout);
        }
    }

    /// The connections bound to a TGT QP (every key [`TgtRegistry::handle_req`] accepted and
    /// no connection event has ended yet), with their QP.
    pub fn bound_conns(&self) -> Vec<(K, Qpn)> {
        self.conns.iter().map(|(k, &q)| (k.clone(), q)).collect()
    }

    fn create_for_req(
        &mut self,
        now: Instant,
        req: &TgtRequest<K>,
        cm_quarantined: &dyn Fn(Qpn) -> Option<Instant>,
    ) -> Result<Qpn, TargetGone> {
        let policy = req.data.policy.unwrap_or(self.cfg.default_policy);
        self.create_inner(
            now,
            req.domain,
            policy,
            req.process,
            Some(req.peer),
            cm_quarantined,
        )
        .map_err(|_| TargetGone {
            kind: RejectKind::NoResources,
            qpn: None,
        })
    }

    fn accept(&self, qpn: Qpn, created: bool, srqns: &[SrqNum]) -> Result<XrcAccept, TargetGone> {
        let policy = self
            .qps
            .get(&qpn)
            .map_or(self.cfg.default_policy, |q| q.policy);
        let rep = XrcRepData {
            tgt_qpn: qpn,
            policy,
            created,
            srqns: srqns.to_vec(),
        };
        // Validate now so the CM never fails to build the REP.
        if rep.emit(&[]).is_err() {
            return Err(TargetGone {
                kind: RejectKind::NoResources,
                qpn: Some(qpn),
            });
        }
        Ok(XrcAccept {
            tgt_qpn: qpn,
            created,
            policy,
            rep,
        })
    }

    /// A connection event from the CM (type docs, step 2). Unknown connections are
    /// ignored (e.g. the DREQ crossing ours after the QP was released).
    pub fn handle_conn_event(&mut self, now: Instant, conn: &K, ev: ConnEvent) -> Option<Verdict> {
        let &qpn = self.conns.get(conn)?;
        if ev == ConnEvent::Established {
            self.log(now, qpn, format!("conn {conn:?} established"), None, vec![]);
            return None;
        }
        self.conns.remove(conn);
        let q = self.qps.get_mut(&qpn)?;
        q.registrations.remove(&Registrant::Conn(conn.clone()));
        let event = match ev {
            ConnEvent::PeerTimeout => PolicyEvent::PeerTimeout { conn: conn.clone() },
            _ => PolicyEvent::PeerDreq { conn: conn.clone() },
        };
        Some(self.apply(now, qpn, event))
    }

    /// Renames a connection key everywhere (the connection map, the QP's connection list, a
    /// connection-scoped registration, queued actions). For a CM that learns its own
    /// connection ID only after the REP went out — ibcm's async `Incoming::accept` — and so
    /// calls [`TgtRegistry::handle_req`] with a provisional key. Returns whether `old` was
    /// known; an existing `new` is overwritten.
    pub fn rekey_conn(&mut self, old: &K, new: K) -> bool {
        let Some(qpn) = self.conns.remove(old) else {
            return false;
        };
        self.conns.insert(new.clone(), qpn);
        if let Some(q) = self.qps.get_mut(&qpn) {
            if let Some(tw) = q.conns.remove(old) {
                q.conns.insert(new.clone(), tw);
            }
            if let Some(c) = q.registrations.remove(&Registrant::Conn(old.clone())) {
                q.registrations.insert(Registrant::Conn(new.clone()), c);
            }
        }
        for a in &mut self.outbox {
            if let PolicyAction::EndConnection { conn, .. } = a {
                if conn == old {
                    *conn = new.clone();
                }
            }
        }
        true
    }
}
