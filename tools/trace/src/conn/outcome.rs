//! How a connection ended: the timeouts its requests waited under (from the REQ's timeout
//! fields), the phase it is still waiting in, and the [`Outcome`] settled when it is finished.

use std::time::Duration;

use ibcm_mad::TimeoutExp;

use super::record::{Conn, ConnKind, Outcome, Phase, Side};

impl Conn {
    /// Milliseconds the active side waits for an answer to one REQ (Linux: 2 × packet life
    /// time + Remote CM Response Timeout; the packet life time is taken as the REQ's Local ACK
    /// Timeout − 1, docs/wire.md §4.2, docs/protocol.md §4.3).
    fn req_try_ms(&self) -> u64 {
        match self.req_timeouts {
            Some((remote, _, ack, _)) => {
                let plt = TimeoutExp::masked(ack.get().saturating_sub(1));
                remote.linux_ms() + 2 * plt.linux_ms()
            }
            None => 4096 + 2 * 1024,
        }
    }

    /// Milliseconds the passive side waits for an RTU (Linux: the REQ's Local CM Response
    /// Timeout).
    fn rep_try_ms(&self) -> u64 {
        match self.req_timeouts {
            Some((_, local, _, _)) => local.linux_ms(),
            None => 4096,
        }
    }

    /// How many times a request is sent at most (1 + the REQ's Max CM Retries).
    pub fn max_sends(&self) -> u32 {
        match self.req_timeouts {
            Some((_, _, _, retries)) => 1 + u32::from(retries),
            None => 16,
        }
    }

    /// The deadline of a pending request, after which it counts as timed out.
    fn deadline(&self, phase: Phase) -> Option<Duration> {
        let (last, try_ms) = match phase {
            Phase::Req => (self.req_last?, self.req_try_ms()),
            Phase::Rep => (self.rep_last?, self.rep_try_ms()),
            Phase::Dreq => {
                let ms = match self.dreq.map(|d| d.1) {
                    Some(Side::Passive) => self.rep_try_ms(),
                    _ => self.req_try_ms(),
                };
                (self.dreq_last?, ms)
            }
            // rdma_cm: 4096 ms per try.
            Phase::SidrReq => (self.req_last?, 4096),
        };
        let mut deadline = last + Duration::from_millis(try_ms);
        // An MRA after the last send extends the wait by its service timeout.
        if let Some((t, st)) = self.mra_last {
            if t >= last && matches!(phase, Phase::Req | Phase::Rep) {
                deadline = deadline.max(t + Duration::from_millis(st.linux_ms() + try_ms));
            }
        }
        Some(deadline)
    }

    /// The phase the connection is waiting in, if any.
    fn pending(&self) -> Option<Phase> {
        if self.kind == ConnKind::Sidr {
            return (self.sidr_rep.is_none() && self.req.is_some()).then_some(Phase::SidrReq);
        }
        if self.rej.is_some() {
            return None;
        }
        if self.dreq.is_some() {
            return self.drep.is_none().then_some(Phase::Dreq);
        }
        if self.drep.is_some() || self.rtu.is_some() {
            return None;
        }
        if self.rep.is_some() {
            return Some(Phase::Rep);
        }
        if self.req.is_some() {
            return Some(Phase::Req);
        }
        None
    }

    fn sends(&self, phase: Phase) -> u32 {
        match phase {
            Phase::Req | Phase::SidrReq => self.req_sends,
            Phase::Rep => self.rep_sends,
            Phase::Dreq => self.dreq_sends,
        }
    }

    /// Computes the outcome as of capture time `now`.
    pub(super) fn settle(&mut self, now: Duration) {
        self.outcome = if let Some((_, status)) = self.sidr_rep {
            Outcome::Resolved { status }
        } else if let Some((_, by, reason)) = self.rej.filter(|_| !self.established()) {
            Outcome::Rejected { reason, by }
        } else if let Some(phase) = self.pending() {
            let sends = self.sends(phase);
            let expired = self.deadline(phase).is_some_and(|d| now > d);
            if expired {
                Outcome::TimedOut { phase, sends }
            } else {
                Outcome::Waiting { phase }
            }
        } else if self.drep.is_some() || self.dreq.is_some() {
            Outcome::Closed {
                by: self.dreq.map(|d| d.1),
            }
        } else if self.established() {
            Outcome::Established
        } else if self.rej.is_some() {
            // Rejected after establishment: closed by the REJ.
            Outcome::Closed {
                by: self.rej.map(|r| r.1),
            }
        } else {
            Outcome::Partial
        };
    }
}
