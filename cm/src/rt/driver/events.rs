//! The driver's side of the endpoint's [`Event`]s: [`Driver::on_event`] gives each to the
//! application first, then to its concern — a request for a listener, a connection's own news,
//! its LAP exchanges (`lap.rs`), the answer to a SIDR request this endpoint sent.

use ibcm_mad::RejReason;
use tracing::{debug, debug_span};

use super::{sidr_status, Driver};
use crate::proto::{ConnId, Event, EventKind};
use crate::rt::now;
use crate::rt::types::{CmError, ConnStatus, IncomingKind, SidrAnswer};
use crate::rt::DatagramTransport;

impl<T: DatagramTransport> Driver<T> {
    /// One event of the endpoint: the application's if it takes it, else handed to the
    /// method of its concern (each of them handles only the events routed to it here).
    pub(super) fn on_event(&mut self, ev: Event) {
        let span = debug_span!("conn", id = %ev.conn);
        let _g = span.enter();
        if let Some(app) = self.app.as_mut() {
            if app.handle_event(&mut self.ep, now(), &ev) {
                return;
            }
        }
        let id = ev.conn;
        match ev.kind {
            k @ (EventKind::ReqReceived(_)
            | EventKind::SidrReqReceived(_)
            | EventKind::StatelessEstablished(_)) => self.on_request(id, k),
            k @ (EventKind::RepReceived(_)
            | EventKind::RtuReceived { .. }
            | EventKind::Established
            | EventKind::Closed(_)
            | EventKind::TimewaitExit { .. }) => self.on_conn_event(id, k),
            k @ (EventKind::LapReceived { .. }
            | EventKind::AprReceived { .. }
            | EventKind::LapTimedOut) => self.on_lap_event(id, k),
            k @ (EventKind::SidrReply { .. } | EventKind::SidrTimedOut) => {
                self.on_sidr_answer(id, k)
            }
            other => {
                if self.log.ok(now()) {
                    debug!(event = ?other, "event");
                }
            }
        }
    }

    /// A request for a listener: delivered to its stream, or answered at once when no
    /// listener takes it (a REQ: REJ 2 "invalid service ID"; a SIDR_REQ: "service ID not
    /// supported"; a stateless connection: disconnected, as a dropped one would be).
    fn on_request(&mut self, id: ConnId, kind: EventKind) {
        match kind {
            EventKind::ReqReceived(req) => {
                self.registry.open(id);
                let delivered = self
                    .listeners
                    .get(&req.service_id())
                    .is_some_and(|(_, tx)| tx.send((id, IncomingKind::Connect(req))).is_ok());
                if !delivered {
                    let _ = self
                        .ep
                        .reject(now(), id, RejReason::InvalidServiceId, &[], &[]);
                }
            }
            EventKind::SidrReqReceived(s) => {
                let sid = s.service_id;
                let delivered = self
                    .listeners
                    .get(&sid)
                    .is_some_and(|(_, tx)| tx.send((id, IncomingKind::Sidr(s))).is_ok());
                if !delivered {
                    let p = sidr_status(ibcm_mad::SidrStatus::UnsupportedServiceId);
                    let _ = self.ep.sidr_reply(now(), id, p);
                }
            }
            EventKind::StatelessEstablished(info) => {
                self.registry.open_established(id, &info.rtu_private_data);
                let sid = info.req.service_id();
                let delivered = self
                    .stateless
                    .get(&sid)
                    .is_some_and(|tx| tx.send((id, info)).is_ok());
                if !delivered {
                    // Its listener is gone: end it as a dropped connection would be.
                    let _ = self.ep.disconnect(now(), id, &[]);
                }
            }
            _ => {} // `on_event` routes none here
        }
    }

    /// A connection's own news, into its slot: the REP, the RTU's private data, its status
    /// (and the end of its LAP exchange when it closes).
    fn on_conn_event(&mut self, id: ConnId, kind: EventKind) {
        match kind {
            EventKind::RepReceived(rep) => {
                if let Some(slot) = self.registry.get(id) {
                    slot.set_rep(&rep);
                }
            }
            EventKind::RtuReceived { private_data } => {
                if let Some(slot) = self.registry.get(id) {
                    slot.set_rtu_private_data(&private_data);
                }
            }
            EventKind::Established => self.set_status(id, ConnStatus::Established),
            EventKind::Closed(e) => {
                self.closed += 1;
                if self.log.ok(now()) {
                    debug!(error = %e, "closed");
                }
                self.lap_closed(id, &e);
                if self.ep.state(id).is_none() {
                    // Gone without TimeWait.
                    self.registry.close(id, |_| ConnStatus::Gone(e));
                } else {
                    self.set_status(id, ConnStatus::Closed(e));
                }
            }
            EventKind::TimewaitExit { .. } => {
                self.registry.close(id, ConnStatus::gone);
            }
            _ => {} // `on_event` routes none here
        }
    }

    /// The answer to a SIDR request this endpoint sent, to the caller waiting for it.
    fn on_sidr_answer(&mut self, id: ConnId, kind: EventKind) {
        let Some(reply) = self.sidr.remove(&id) else {
            return;
        };
        let answer = match kind {
            EventKind::SidrReply {
                status,
                qpn,
                qkey,
                private_data,
            } => Ok(SidrAnswer {
                status,
                qpn,
                qkey,
                private_data,
            }),
            EventKind::SidrTimedOut => Err(CmError::SidrTimedOut),
            _ => return, // `on_event` routes none here
        };
        let _ = reply.send(answer);
    }
}
