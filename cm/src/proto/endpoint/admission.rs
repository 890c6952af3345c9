//! Admission and limits: what an off-path peer can make the endpoint keep, and for how long.
//!
//! * **Half-open entries** (passive connections REQ_RCVD … RTU) are indexed by arrival
//!   order, by service ID and by source, so that the cap is fair: a source may hold at most
//!   `max_half_open_per_source` of them (beyond: REJ 3), a service ID at most
//!   `max_half_open_per_service`, the endpoint at most `max_half_open`; when a service or the
//!   endpoint is full, the **oldest** entry (of that service, or overall) is evicted instead of
//!   refusing the newcomer. Each entry also has a deadline (`max_half_open_lifetime` after its
//!   REQ) past which it is given up, whatever the REQ asked for.
//! * **Established connections** are counted per endpoint and per source
//!   (`max_established`, `max_established_per_peer`); a REQ beyond either is answered with
//!   REJ 3 "no resources".
//! * **Anti-amplification**: until a half-open peer has proved that it receives (it echoed our
//!   comm ID from its address: an RTU, an MRA or a REJ for our REP, …), the bytes sent to it for
//!   that connection stay below 3 × the bytes it sent.
//!
//! A "source" is the peer's IP address or GID without the UDP port (`source_of`): one host is
//! one source whatever port it sends from.
//!
//! This file makes the decisions; the bookkeeping they read (`Limits`, `source_of`,
//! `MAD_BYTES`) is in `limits.rs`.

use std::time::{Duration, Instant};

use ibcm_mad::{CommId, RejReason, Req, Tid, TimeoutExp};

use super::io::reject_req;
use super::limits::{source_of, Admit};
use super::Endpoint;
use crate::proto::{PeerAddr, State};

impl Endpoint {
    /// Admission of a REQ that passed the duplicate, stale, listener and transport checks:
    /// evicts the oldest half-open entries the caps call for, or refuses the REQ with REJ 3
    /// "no resources" (returns `false`).
    pub(super) fn admit(&mut self, now: Instant, from: PeerAddr, tid: Tid, req: &Req) -> bool {
        let source = source_of(from);
        loop {
            match self.io.limits.check(&self.cfg, source, req.service_id) {
                Admit::Yes => return true,
                Admit::Evict(victim) => {
                    self.io.stats.half_open_evicted += 1;
                    self.evict(now, victim);
                }
                Admit::SourceFull => {
                    self.io.stats.half_open_limit += 1;
                    reject_req(&mut self.io, from, tid, req, RejReason::NoResources);
                    return false;
                }
                Admit::EstablishedFull => {
                    self.io.stats.established_limit += 1;
                    reject_req(&mut self.io, from, tid, req, RejReason::NoResources);
                    return false;
                }
            }
        }
    }

    /// Gives up a half-open entry to make room: REJ 3 "no resources" to its peer (within the
    /// amplification budget), `Closed(LocallyRejected)` to the application.
    fn evict(&mut self, now: Instant, id: CommId) {
        if self
            .reject(now, id, RejReason::NoResources, &[], &[])
            .is_err()
        {
            self.remove(id);
        }
        // Whatever state it was in, it no longer holds a slot.
        self.io.limits.leave(id);
    }

    /// The REP retransmission interval a REQ asks for, within the configured floor and
    /// ceiling.
    pub(super) fn peer_response_timeout(&self, req: &Req) -> Duration {
        let lo = self.cfg.min_peer_cm_response_timeout.get();
        let hi = self.cfg.max_peer_cm_response_timeout.get();
        let exp = req.local_cm_response_timeout.get().max(lo).min(hi);
        TimeoutExp::masked(exp).to_duration()
    }

    /// Keeps a half-open connection's timer from running past its deadline.
    pub(super) fn cap_timer(&mut self, id: CommId) {
        let Some(deadline) = self.io.limits.half(id).map(|h| h.deadline) else {
            return;
        };
        if let Some((at, kind)) = self.io.timers.conn(id) {
            if at > deadline {
                self.io.arm(id, deadline, kind);
            }
        }
    }

    /// The application left a REQ unanswered for the whole half-open lifetime: give it up as
    /// a timed-out setup (REJ 4, `Closed(TimedOut)`).
    pub(super) fn on_half_open_expired(&mut self, id: CommId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            self.io.stats.half_open_expired += 1;
            self.on_setup_timeout(id);
        }
    }
}
