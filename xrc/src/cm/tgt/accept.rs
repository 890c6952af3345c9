//! An XRC REQ in, a REP or a REJ out: [`XrcTarget::on_request`] asks the registry, brings a
//! new TGT QP to RTR and builds the answer; [`XrcTarget::answer`] sends it.

use std::time::{Duration, Instant};

use ibcm::proto::{AcceptParams, CallError, ConnId, Endpoint, ReqInfo};
use ibcm_mad::{Psn, Qpn, RejReason, ReqTransport, ServiceId};

use super::{TargetEvent, XrcTarget};
use crate::policy::OwnershipPolicy;
#[cfg(doc)]
use crate::registry::TgtRegistry;
use crate::registry::{ConnEvent, IniPeer, TgtRequest};
use crate::verbs::qp::{AddressVector, GlobalRoute, PathMtu, QpAttr, QpState};
use ibcm_mad::xrc::{RejectKind, ReqMode, TargetGone, XrcReqData};

/// How [`XrcTarget::on_request`] answers an XRC REQ.
#[derive(Clone, Debug)]
pub enum TgtAnswer {
    /// Send a REP with these parameters.
    Accept {
        /// `AcceptParams::xrc_tgt(qpn)` with the REP private data and the starting PSN.
        params: AcceptParams,
        /// The TGT QPN (the REP's Local EECN).
        qpn: Qpn,
        /// Whether the QP was created for this REQ.
        created: bool,
        /// Its policy.
        policy: OwnershipPolicy,
    },
    /// Send a REJ: `reason`, with `info` as ARI and private data.
    Reject {
        /// The REJ reason ([`TargetGone::reason`]).
        reason: RejReason,
        /// The 12-byte block.
        info: TargetGone,
    },
}

impl XrcTarget {
    /// Decides on a REQ. `None` if it is not XRC or asks for a service this target does not
    /// serve (the application answers it); else the answer to send — also recorded as a
    /// [`TargetEvent`]. `timewait` is the connection's CM TimeWait
    /// ([`passive_timewait`](super::passive_timewait)).
    ///
    /// It does not see the endpoint's own QPN quarantine (the TimeWaits of the endpoint's
    /// other connections): [`XrcTarget::handle_event`], which asks the endpoint, never offers
    /// a new TGT QP whose number the endpoint would refuse.
    pub fn on_request(
        &mut self,
        now: Instant,
        conn: ConnId,
        req: &ReqInfo,
        timewait: Duration,
    ) -> Option<TgtAnswer> {
        self.on_request_with(now, conn, req, timewait, &|_| None)
    }

    /// [`XrcTarget::on_request`], with `cm_quarantined` telling until when the endpoint keeps
    /// a QPN out of use ([`TgtRegistry::handle_req_with`]).
    pub(super) fn on_request_with(
        &mut self,
        now: Instant,
        conn: ConnId,
        req: &ReqInfo,
        timewait: Duration,
        cm_quarantined: &dyn Fn(Qpn) -> Option<Instant>,
    ) -> Option<TgtAnswer> {
        if req.transport() != ReqTransport::Xrc {
            return None;
        }
        let service = req.service_id();
        let svc = self.services.get(&service)?.clone();
        let mut data = XrcReqData::parse(req.user_private_data())
            .map(|(d, _)| d)
            .unwrap_or(XrcReqData {
                mode: ReqMode::Any,
                policy: None,
            });
        if svc.policy.is_some() {
            data.policy = svc.policy;
        }
        if let (Some(q), ReqMode::Any) = (svc.tgt_qpn, data.mode) {
            data.mode = ReqMode::Attach(q);
        }
        let peer = IniPeer {
            ca_guid: req.remote_ca_guid(),
            ini_qpn: req.remote_qpn(),
        };
        let ireq = TgtRequest {
            conn,
            domain: svc.domain,
            process: svc.process,
            peer,
            data,
            timewait,
            srqns: svc.srqns.clone(),
        };
        if let Some(admit) = self.admission.as_mut() {
            let q = super::AdmissionQuery {
                service_id: service,
                service: &svc,
                creates: self.reg.would_create(&ireq),
                registry: &self.reg,
            };
            if admit(&q).is_err() {
                let info = TargetGone {
                    kind: RejectKind::NoResources,
                    qpn: None,
                };
                return Some(self.rejected(conn, service, peer, info));
            }
        }
        let regs = svc
            .conn_registrations
            .unwrap_or(self.reg.config().connection_registrations);
        let acc = match self.reg.handle_req_with(now, &ireq, regs, cm_quarantined) {
            Ok(acc) => acc,
            Err(info) => return Some(self.rejected(conn, service, peer, info)),
        };
        let qpn = acc.tgt_qpn;
        let psn = self.bring_up(qpn, conn, req);
        let psn = match psn {
            Ok(psn) => psn,
            Err(()) => {
                // The QP could not be brought up: unbind the connection, refuse the REQ.
                self.reg
                    .handle_conn_event(now, &conn, ConnEvent::LocalClosed);
                let info = TargetGone {
                    kind: RejectKind::NoResources,
                    qpn: Some(qpn),
                };
                return Some(self.rejected(conn, service, peer, info));
            }
        };
        let private_data = acc
            .rep_private_data(&svc.rep_app_data)
            .or_else(|_| acc.rep_private_data(&[]))
            .unwrap_or_default();
        let params = AcceptParams {
            private_data,
            starting_psn: psn,
            initiator_depth: 0,
            flow_control: false,
            xrc_tgt_live: !acc.created,
            ..AcceptParams::xrc_tgt(qpn)
        };
        self.tgt_qpns.insert(conn, qpn);
        if acc.created {
            self.stats.created = self.stats.created.saturating_add(1);
        } else {
            self.stats.attached = self.stats.attached.saturating_add(1);
        }
        self.events.push_back(TargetEvent::Accepted {
            conn,
            service,
            peer,
            qpn,
            created: acc.created,
            policy: acc.policy,
        });
        Some(TgtAnswer::Accept {
            params,
            qpn,
            created: acc.created,
            policy: acc.policy,
        })
    }

    fn rejected(
        &mut self,
        conn: ConnId,
        service: ServiceId,
        peer: IniPeer,
        info: TargetGone,
    ) -> TgtAnswer {
        self.stats.rejected = self.stats.rejected.saturating_add(1);
        self.events.push_back(TargetEvent::Rejected {
            conn,
            service,
            peer,
            info,
        });
        TgtAnswer::Reject {
            reason: info.reason(),
            info,
        }
    }

    /// Brings a QP in RESET or INIT to RTR; returns the PSN the REP announces (= the QP's RQ
    /// PSN).
    fn bring_up(&mut self, qpn: Qpn, conn: ConnId, req: &ReqInfo) -> Result<Psn, ()> {
        let psn = *self
            .psns
            .entry(qpn)
            .or_insert_with(|| Psn::masked(conn.0.rotate_left(7)));
        if !self.cfg.bring_up {
            return Ok(psn);
        }
        // A QP a holder already moved to INIT (`ibcm_xrc_tgt_modify`) is taken on from there.
        let state = self.reg.query(qpn).map(|q| q.state).map_err(|_| ())?;
        if !matches!(state, QpState::Reset | QpState::Init) {
            return Ok(psn);
        }
        let path = &req.req.primary_path;
        let av = AddressVector {
            dlid: path.local_lid.get(),
            sl: path.sl.get(),
            port: self.cfg.port,
            grh: Some(GlobalRoute {
                dgid: path.local_gid.0,
                flow_label: path.flow_label.get(),
                hop_limit: path.hop_limit,
                traffic_class: path.traffic_class,
                ..GlobalRoute::default()
            }),
            ..AddressVector::default()
        };
        let mtu = PathMtu::from_raw(u32::from(req.req.path_mtu.raw())).unwrap_or(PathMtu::Mtu1024);
        let init = QpAttr::to_init(0, self.cfg.port, self.cfg.access);
        let rtr = QpAttr::tgt_to_rtr(
            av,
            mtu,
            req.remote_qpn(),
            psn,
            req.req.initiator_depth.clamp(1, 16),
            self.cfg.min_rnr_timer,
        );
        if state == QpState::Reset {
            self.reg.modify(qpn, &init).map_err(|_| ())?;
        }
        self.reg.modify(qpn, &rtr).map_err(|_| ())?;
        Ok(psn)
    }

    /// Sends `answer` for `conn` on `ep` (REP or REJ).
    pub fn answer(&mut self, ep: &mut Endpoint, now: Instant, conn: ConnId, answer: TgtAnswer) {
        match answer {
            TgtAnswer::Accept { params, qpn, .. } => {
                if let Err(e) = ep.accept(now, conn, params) {
                    self.accept_failed(now, conn, e);
                    let info = TargetGone {
                        kind: RejectKind::NoResources,
                        qpn: Some(qpn),
                    };
                    let b = info.to_bytes();
                    let _ = ep.reject(now, conn, info.reason(), &b, &b);
                }
            }
            TgtAnswer::Reject { reason, info } => {
                let b = info.to_bytes();
                let _ = ep.reject(now, conn, reason, &b, &b);
            }
        }
    }

    /// The endpoint refused the accept of `conn`: the connection is unbound from its QP.
    fn accept_failed(&mut self, now: Instant, conn: ConnId, error: CallError) {
        if let Some(qpn) = self.tgt_qpns.remove(&conn) {
            self.reg
                .handle_conn_event(now, &conn, ConnEvent::LocalClosed);
            self.events
                .push_back(TargetEvent::AcceptFailed { conn, qpn, error });
        }
    }
}
