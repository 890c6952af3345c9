//! The glue to an ibcm `Endpoint`: its events in ([`XrcTarget::handle_event`]), the target
//! as the endpoint's [`ibcm::App`], and how the endpoint's TimeWait and close reasons read
//! for the registry.

use std::time::{Duration, Instant};

use ibcm::proto::{
    ConnId, ConnectionError, Endpoint, EndpointConfig, Event, EventKind, ReqInfo, State,
};

use super::{TargetEvent, XrcTarget};
use crate::registry::ConnEvent;
#[cfg(doc)]
use crate::registry::TgtRegistry;

/// The passive side's TimeWait for a connection set up by `req`, as `Endpoint` computes it
/// (the REQ's primary local ACK timeout, or the configured override, plus the slack).
pub fn passive_timewait(cfg: &EndpointConfig, req: &ReqInfo) -> Duration {
    cfg.timewait
        .unwrap_or_else(|| req.req.primary_path.local_ack_timeout.to_duration())
        .saturating_add(cfg.timewait_slack)
}

impl XrcTarget {
    /// Feeds one event of `ep` (module docs) and executes what follows on `ep`. Returns
    /// whether the event concerned this target (an XRC REQ for a served service, or a
    /// connection it accepted); other events are the application's.
    pub fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, ev: &Event) -> bool {
        let conn = ev.conn;
        let handled = match &ev.kind {
            EventKind::ReqReceived(req) => {
                let tw = passive_timewait(ep.config(), req);
                // A new TGT QP must not get a number the endpoint still quarantines for a
                // connection the target never saw (another application's, on the same
                // endpoint).
                let cm_quarantined = |qpn| ep.qpn_quarantined(qpn, now);
                match self.on_request_with(now, conn, req, tw, &cm_quarantined) {
                    Some(answer) => {
                        self.answer(ep, now, conn, answer);
                        true
                    }
                    None => false,
                }
            }
            EventKind::Established => {
                let known = self.tgt_qpns.contains_key(&conn);
                self.on_established(now, conn);
                known
            }
            EventKind::Closed(e) => match self.conn_qpn(conn) {
                Some(qpn) => {
                    let until = ep
                        .state(conn)
                        .filter(|s| *s == State::Timewait)
                        .and_then(|_| ep.qpn_quarantined(qpn, now));
                    self.on_closed(now, conn, e, until);
                    true
                }
                None => false,
            },
            _ => false,
        };
        self.flush(ep, now);
        handled
    }

    /// The CM reports `conn` established.
    fn on_established(&mut self, now: Instant, conn: ConnId) {
        if let Some(&qpn) = self.tgt_qpns.get(&conn) {
            self.reg
                .handle_conn_event(now, &conn, ConnEvent::Established);
            self.events
                .push_back(TargetEvent::Established { conn, qpn });
        }
    }

    /// The CM reports `conn` closed with `error`. `timewait_until`: when the CM's TimeWait
    /// quarantine of the TGT QPN ends (`Endpoint::qpn_quarantined`), if the connection
    /// entered TimeWait; it is noted in the registry ([`TgtRegistry::note_timewait`]).
    fn on_closed(
        &mut self,
        now: Instant,
        conn: ConnId,
        error: &ConnectionError,
        timewait_until: Option<Instant>,
    ) {
        let Some(qpn) = self.tgt_qpns.remove(&conn) else {
            return;
        };
        let event = conn_event_of(error);
        let verdict = self.reg.handle_conn_event(now, &conn, event);
        if let Some(until) = timewait_until {
            self.reg.note_timewait(qpn, until);
        }
        self.events.push_back(TargetEvent::Closed {
            conn,
            qpn,
            event,
            verdict,
        });
    }
}

/// The target as the endpoint's application: events through [`XrcTarget::handle_event`],
/// the registry's actions through [`XrcTarget::flush`], its quarantine timers.
impl ibcm::App for XrcTarget {
    fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, event: &Event) -> bool {
        XrcTarget::handle_event(self, ep, now, event)
    }

    fn poll(&mut self, ep: &mut Endpoint, now: Instant) {
        self.flush(ep, now);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        XrcTarget::poll_timeout(self)
    }

    fn handle_timeout(&mut self, ep: &mut Endpoint, now: Instant) {
        XrcTarget::handle_timeout(self, now);
        self.flush(ep, now);
    }
}

/// How a CM close reads for the registry (module docs).
pub fn conn_event_of(error: &ConnectionError) -> ConnEvent {
    match error {
        ConnectionError::Disconnected { by_peer: true, .. } => ConnEvent::PeerDreq,
        ConnectionError::TimedOut | ConnectionError::Rejected { .. } | ConnectionError::Stale => {
            ConnEvent::PeerTimeout
        }
        _ => ConnEvent::LocalClosed,
    }
}
