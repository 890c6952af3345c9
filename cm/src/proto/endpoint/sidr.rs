//! SIDR (service ID resolution): the `sidr_request` and `sidr_reply` commands, the SIDR_REQ
//! and SIDR_REP handlers and the SIDR_REQ retransmission timer. SIDR keeps no connection:
//! outgoing requests live in `Endpoint::sidr_out` (by [`SidrReqId`]), incoming ones in
//! `Endpoint::sidr_in` until the application answers, at most
//! `EndpointConfig::sidr_in_lifetime` and at most `EndpointConfig::max_sidr_in` of them. (Their
//! records, `SidrOut` and `SidrIn`, are in `proto/conn.rs`.)

use std::time::Instant;

use ibcm_mad::{CmMessage, PrivateData, SidrRep, SidrReq, SidrStatus, Tid, VendorId};

use super::Endpoint;
use crate::proto::conn::{Pending, SidrIn, SidrOut};
use crate::proto::ids::{form_tid, SidrReqId};
use crate::proto::util::check_len;
use crate::proto::{
    CallError, ConnId, ConnectError, DropReason, EventKind, PeerAddr, SidrRepParams, SidrReqInfo,
    SidrReqParams,
};

impl Endpoint {
    /// Sends a SIDR_REQ; the answer comes as [`EventKind::SidrReply`] or
    /// [`EventKind::SidrTimedOut`] with the returned ID as `conn`.
    ///
    /// # Errors
    /// [`ConnectError::PrivateDataTooLong`] over 216 bytes.
    pub fn sidr_request(&mut self, now: Instant, p: SidrReqParams) -> Result<ConnId, ConnectError> {
        if p.private_data.len() > SidrReq::PRIVATE_DATA_LEN {
            return Err(ConnectError::PrivateDataTooLong {
                len: p.private_data.len(),
                max: SidrReq::PRIVATE_DATA_LEN,
            });
        }
        let handle = self.alloc_id();
        let id = SidrReqId::allocated(handle);
        let req = SidrReq {
            request_id: id.wire(),
            partition_key: p.pkey,
            service_id: p.service_id,
            private_data: PrivateData::from_slice(&p.private_data).unwrap_or_default(),
        };
        let mad = self.io.send(
            p.peer,
            form_tid(self.cfg.hi_tid, handle),
            CmMessage::SidrReq(req),
        );
        let at = now + p.timeout;
        self.io.timers.insert_sidr(at, id);
        self.sidr_out.insert(
            id,
            SidrOut {
                pending: Pending {
                    mad,
                    retries_left: p.max_retries,
                    timeout: p.timeout,
                    deadline: None,
                },
                timer: Some(at),
            },
        );
        self.sidr_out_peer.insert(id, p.peer);
        Ok(id.handle())
    }

    /// Forgets outgoing SIDR_REQ `id` (its requester is gone): no retransmission, no event.
    /// Whether it was still waiting for its SIDR_REP.
    pub fn sidr_cancel(&mut self, id: ConnId) -> bool {
        self.forget_sidr_out(SidrReqId::allocated(id))
    }

    /// Forgets outgoing request `id` with its timer and peer; whether there was one.
    fn forget_sidr_out(&mut self, id: SidrReqId) -> bool {
        let Some(s) = self.sidr_out.remove(&id) else {
            return false;
        };
        if let Some(t) = s.timer {
            self.io.timers.remove_sidr(t, id);
        }
        self.sidr_out_peer.remove(&id);
        true
    }

    /// Answers a SIDR_REQ reported by [`EventKind::SidrReqReceived`].
    ///
    /// # Errors
    /// [`CallError`] for an unknown request or fields that do not fit.
    pub fn sidr_reply(
        &mut self,
        _now: Instant,
        id: ConnId,
        p: SidrRepParams,
    ) -> Result<(), CallError> {
        check_len(
            "SIDR_REP private data",
            &p.private_data,
            SidrRep::PRIVATE_DATA_LEN,
        )?;
        check_len("SIDR_REP additional info", &p.additional_info, 72)?;
        let s = self
            .take_sidr_in(id)
            .ok_or(CallError::UnknownConnection(id))?;
        let mut add = [0u8; 72];
        if let Some(dst) = add.get_mut(..p.additional_info.len()) {
            dst.copy_from_slice(&p.additional_info);
        }
        let rep = SidrRep {
            request_id: s.request_id,
            status: p.status,
            additional_info_length: p.additional_info.len() as u8,
            ece_vendor_id: VendorId::default(),
            qpn: p.qpn,
            service_id: s.service_id,
            qkey: p.qkey,
            additional_info: add,
            private_data: PrivateData::from_slice(&p.private_data).unwrap_or_default(),
        };
        self.io.send(s.peer, s.tid, CmMessage::SidrRep(rep));
        Ok(())
    }

    /// Removes an incoming SIDR_REQ with its key and expiry timer.
    fn take_sidr_in(&mut self, id: ConnId) -> Option<SidrIn> {
        let s = self.sidr_in.remove(&id)?;
        self.sidr_in_keys.remove(&(s.request_id, s.peer));
        self.sidr_in_order.remove(&(s.expires, id));
        self.io.timers.remove_sidr_in(s.expires, id);
        Some(s)
    }

    /// Forgets an unanswered incoming SIDR_REQ (expired or evicted).
    fn expire_sidr_in(&mut self, id: ConnId) {
        if self.take_sidr_in(id).is_some() {
            self.io.stats.sidr_in_expired += 1;
            self.io.event(id, EventKind::SidrReqExpired);
        }
    }

    /// The expiry timer of incoming SIDR_REQ `id`, armed for `at`, fired.
    pub(super) fn on_sidr_in_timer(&mut self, id: ConnId, at: Instant) {
        if self.sidr_in.get(&id).is_some_and(|s| s.expires == at) {
            self.expire_sidr_in(id);
        }
    }

    pub(super) fn on_sidr_req(&mut self, now: Instant, from: PeerAddr, tid: Tid, m: SidrReq) {
        if self.sidr_in_keys.contains(&(m.request_id, from)) {
            self.io.stats.drop(DropReason::Duplicate);
            return;
        }
        if !self.listeners.contains_key(&m.service_id) {
            let rep = SidrRep {
                request_id: m.request_id,
                status: SidrStatus::UnsupportedServiceId,
                service_id: m.service_id,
                ..SidrRep::default()
            };
            self.io.send(from, tid, CmMessage::SidrRep(rep));
            return;
        }
        // Bounded: the oldest waiting request makes room.
        while self.sidr_in.len() >= self.cfg.max_sidr_in.max(1) {
            let Some(&(_, oldest)) = self.sidr_in_order.first() else {
                break;
            };
            self.expire_sidr_in(oldest);
        }
        let id = self.alloc_id();
        let expires = now + self.cfg.sidr_in_lifetime;
        self.sidr_in.insert(
            id,
            SidrIn {
                peer: from,
                request_id: m.request_id,
                service_id: m.service_id,
                tid,
                expires,
            },
        );
        self.sidr_in_keys.insert((m.request_id, from));
        self.sidr_in_order.insert((expires, id));
        self.io.timers.insert_sidr_in(expires, id);
        self.io.event(
            id,
            EventKind::SidrReqReceived(Box::new(SidrReqInfo {
                peer: from,
                request_id: m.request_id,
                service_id: m.service_id,
                private_data: m.private_data.as_bytes().to_vec(),
            })),
        );
    }

    pub(super) fn on_sidr_rep(&mut self, m: SidrRep) {
        let id = SidrReqId::from_wire(m.request_id);
        if !self.forget_sidr_out(id) {
            self.io.stats.drop(DropReason::UnknownSidr);
            return;
        }
        self.io.event(
            id.handle(),
            EventKind::SidrReply {
                status: m.status,
                qpn: m.qpn,
                qkey: m.qkey,
                private_data: m.private_data.trimmed().to_vec(),
            },
        );
    }

    /// The timer armed for deadline `t` of request `id` fired: retransmit, or give up.
    pub(super) fn on_sidr_timer(&mut self, now: Instant, id: SidrReqId, t: Instant) {
        let Some(s) = self.sidr_out.get_mut(&id) else {
            return;
        };
        if s.timer != Some(t) {
            return;
        }
        let Some(&peer) = self.sidr_out_peer.get(&id) else {
            return;
        };
        if s.pending.retries_left > 0 {
            s.pending.retries_left -= 1;
            let at = now + s.pending.timeout;
            s.timer = Some(at);
            let mad = s.pending.mad.clone();
            self.io.stats.retransmits += 1;
            self.io.resend(peer, mad);
            self.io.timers.insert_sidr(at, id);
        } else {
            self.sidr_out.remove(&id);
            self.sidr_out_peer.remove(&id);
            self.io.stats.timeouts += 1;
            self.io.event(id.handle(), EventKind::SidrTimedOut);
        }
    }
}
