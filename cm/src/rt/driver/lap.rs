//! The driver's side of path migration: the LAPs the handles send
//! ([`Command::LoadAltPath`]) and the APRs that answer them; the LAPs that arrive, answered
//! "unsupported" ([`LapPolicy::Unsupported`]) or held for
//! [`Connection::next_lap`](crate::rt::Connection::next_lap) ([`LapPolicy::Application`]);
//! and the handles' answers to those; the connections the node service's daemon delegated
//! ([`Command::DelegateLaps`]), whose LAPs go to its sessions whatever the policy.

use std::collections::BTreeMap;
use std::time::Instant;

use ibcm_mad::AprStatus;
use tracing::{debug, warn};

use super::Driver;
use crate::proto::{CallError, ConnId, ConnectionError, EventKind, LapState, State};
use crate::rt::command::{Command, LapSink, Reply};
use crate::rt::now;
use crate::rt::types::{AprAnswer, CmError, ConnStatus, LapArrived, LapPolicy};
use crate::rt::DatagramTransport;

/// A `next_lap` waiting for a LAP.
type LapWaiter = Reply<Result<LapArrived, CmError>>;

/// The LAP exchanges the handles take part in. Each map is empty unless a LAP exchange is
/// under way (a connection has one at a time), so a connection costs them nothing.
#[derive(Debug, Default)]
pub(super) struct Laps {
    /// Who answers the LAPs that arrive.
    policy: LapPolicy,
    /// Our LAPs waiting for their APR: the `load_alt_path` callers, by connection.
    sent: BTreeMap<ConnId, Reply<Result<AprAnswer, CmError>>>,
    /// LAPs received under [`LapPolicy::Application`] that no `next_lap` has taken yet.
    held: BTreeMap<ConnId, LapArrived>,
    /// The `next_lap` calls waiting for a LAP, by connection, oldest first.
    waiting: BTreeMap<ConnId, Vec<LapWaiter>>,
    /// Connections whose LAPs go to a sink whatever the policy (the node service's sessions
    /// that answer their LAPs themselves), until they close or are given back.
    delegated: BTreeMap<ConnId, LapSink>,
}

/// Offers `lap` to `w`: `None` when it took it, else the LAP back (its `next_lap` is gone).
fn offer(w: LapWaiter, lap: LapArrived) -> Option<LapArrived> {
    w.send(Ok(lap)).err().and_then(Result::ok)
}

impl<T: DatagramTransport> Driver<T> {
    /// The handles' LAP commands: a LAP to send, a LAP to take, an answer to one, a path
    /// migration, the policy.
    pub(super) fn on_lap_command(&mut self, t: Instant, cmd: Command) {
        match cmd {
            Command::LoadAltPath {
                conn,
                path,
                private_data,
                reply,
            } => match self.ep.load_alternate_path(t, conn, path, &private_data) {
                Ok(()) => {
                    self.laps.sent.insert(conn, reply);
                }
                Err(e) => {
                    let _ = reply.send(Err(CmError::Call(e)));
                }
            },
            Command::NextLap { conn, reply } => self.next_lap(conn, reply),
            // Held again while it waits for its answer (not once answered, or ended).
            Command::LapRequeue { conn, lap } if self.awaits_apr(conn) => match self.laps.policy {
                LapPolicy::Application => self.deliver_lap(conn, lap),
                LapPolicy::Unsupported => self.answer_lap(t, conn, AprStatus::Unsupported),
            },
            Command::Apr {
                conn,
                status,
                additional_info,
                private_data,
                reply,
            } => {
                let r = self
                    .ep
                    .apr(t, conn, status, &additional_info, &private_data);
                if r.is_err() {
                    // Data that does not fit: the peer still gets an answer, "rejected".
                    self.answer_lap(t, conn, AprStatus::Rejected);
                }
                let _ = reply.send(r);
            }
            // Answered "rejected" while it waits for its answer (not once answered, or ended).
            Command::LapUnanswered { conn } if self.awaits_apr(conn) => {
                if self.log.ok(t) {
                    warn!(conn = %conn, "LAP request dropped unanswered: APR \"rejected\"");
                }
                self.answer_lap(t, conn, AprStatus::Rejected);
            }
            Command::PathMigrated { conn, reply } => {
                let _ = reply.send(self.ep.notify_path_migrated(t, conn));
            }
            Command::SetLapPolicy { policy, reply } => {
                self.set_lap_policy(t, policy);
                let _ = reply.send(());
            }
            // Only a connection that has not closed (its `lap_closed` forgets it).
            Command::DelegateLaps {
                conn,
                sink: Some(sink),
            } if matches!(self.ep.state(conn), Some(s) if s != State::Timewait && s != State::Idle) =>
            {
                self.laps.delegated.insert(conn, sink);
            }
            Command::DelegateLaps { conn, .. } => {
                self.laps.delegated.remove(&conn);
            }
            // A requeued or dropped LAP that needs no answer any more, or not a LAP command
            // (`on_command` routes none here).
            _ => {}
        }
    }

    /// Whether the LAP of `conn` waits for this side's APR.
    fn awaits_apr(&self, conn: ConnId) -> bool {
        matches!(
            self.ep.lap_state(conn),
            Some(LapState::LapRcvd | LapState::MraLapSent)
        )
    }

    /// Answers the LAP of `conn` with `status` and no data, if it still waits for an answer.
    fn answer_lap(&mut self, t: Instant, conn: ConnId, status: AprStatus) {
        if self.awaits_apr(conn) {
            let _ = self.ep.apr(t, conn, status, &[], &[]);
        }
    }

    /// [`Command::NextLap`]: the LAP held for `conn`, or a place in its queue of waiters.
    fn next_lap(&mut self, conn: ConnId, reply: LapWaiter) {
        if self.laps.policy == LapPolicy::Unsupported {
            let _ = reply.send(Err(CmError::LapsNotDelegated));
            return;
        }
        if let Some(lap) = self.laps.held.remove(&conn) {
            if let Some(lap) = offer(reply, lap) {
                self.laps.held.insert(conn, lap);
            }
            return;
        }
        match self.registry.get(conn).map(|s| s.status()) {
            None => {
                let _ = reply.send(Err(CmError::Call(CallError::UnknownConnection(conn))));
            }
            // An ended connection gets no more LAPs.
            Some(ConnStatus::Closed(e) | ConnStatus::Gone(e)) => {
                let _ = reply.send(Err(CmError::Connection(e)));
            }
            Some(ConnStatus::Connecting | ConnStatus::Established) => {
                let waiting = self.laps.waiting.entry(conn).or_default();
                // The waiters a cancelled `next_lap` left (say, one in a `select!` loop).
                waiting.retain(|w| !w.is_closed());
                waiting.push(reply);
            }
        }
    }

    /// A LAP for the application: to the oldest waiting `next_lap`, else held for the next.
    fn deliver_lap(&mut self, conn: ConnId, lap: LapArrived) {
        let mut waiting = self.laps.waiting.remove(&conn).unwrap_or_default();
        let mut left = Some(lap);
        while let Some(lap) = left.take() {
            if waiting.is_empty() {
                self.laps.held.insert(conn, lap);
                break;
            }
            left = offer(waiting.remove(0), lap);
        }
        waiting.retain(|w| !w.is_closed());
        if !waiting.is_empty() {
            self.laps.waiting.insert(conn, waiting);
        }
    }

    /// [`Command::SetLapPolicy`]. Back to [`LapPolicy::Unsupported`], the LAPs held are
    /// answered "unsupported" and the waiting `next_lap` calls fail; the LAPs the application
    /// has taken already ([`LapRequest`](crate::rt::LapRequest)s) remain its to answer.
    fn set_lap_policy(&mut self, t: Instant, policy: LapPolicy) {
        self.laps.policy = policy;
        if policy == LapPolicy::Unsupported {
            for (conn, _) in std::mem::take(&mut self.laps.held) {
                self.answer_lap(t, conn, AprStatus::Unsupported);
            }
            for (_, waiters) in std::mem::take(&mut self.laps.waiting) {
                for w in waiters {
                    let _ = w.send(Err(CmError::LapsNotDelegated));
                }
            }
        }
    }

    /// The LAP events of a connection: a LAP that arrived, the APR for ours, ours unanswered.
    pub(super) fn on_lap_event(&mut self, id: ConnId, kind: EventKind) {
        match kind {
            EventKind::LapReceived { path, private_data } => {
                let lap = LapArrived { path, private_data };
                // A delegated connection's LAP goes to its sink, whatever the policy.
                let lap = match self.laps.delegated.get(&id) {
                    Some(sink) => match sink.send((id, lap)) {
                        Ok(()) => return,
                        Err(e) => {
                            self.laps.delegated.remove(&id);
                            e.0 .1
                        }
                    },
                    None => lap,
                };
                // Held for the application only on a connection it has a handle for.
                if self.laps.policy == LapPolicy::Application && self.registry.get(id).is_some() {
                    self.deliver_lap(id, lap);
                } else {
                    // `LapPolicy::Unsupported`: alternate paths are not loaded here.
                    self.answer_lap(now(), id, AprStatus::Unsupported);
                }
            }
            EventKind::AprReceived {
                status,
                additional_info,
                private_data,
            } => {
                let Some(reply) = self.laps.sent.remove(&id) else {
                    // Sent by the app, or its caller's connection has no handle.
                    debug!(status = %status, "APR for a LAP no handle waits for");
                    return;
                };
                let answer = AprAnswer {
                    status,
                    additional_info,
                    private_data,
                };
                let r = if status == AprStatus::Success {
                    Ok(answer)
                } else {
                    Err(CmError::LapRejected(answer))
                };
                let _ = reply.send(r);
            }
            EventKind::LapTimedOut => {
                if let Some(reply) = self.laps.sent.remove(&id) {
                    let _ = reply.send(Err(CmError::LapTimedOut));
                }
            }
            _ => {} // `on_event` routes none here
        }
    }

    /// The connection `id` closed with `e`: its LAP exchange ends with it.
    pub(super) fn lap_closed(&mut self, id: ConnId, e: &ConnectionError) {
        self.laps.held.remove(&id);
        self.laps.delegated.remove(&id);
        if let Some(reply) = self.laps.sent.remove(&id) {
            let _ = reply.send(Err(CmError::Connection(e.clone())));
        }
        for w in self.laps.waiting.remove(&id).unwrap_or_default() {
            let _ = w.send(Err(CmError::Connection(e.clone())));
        }
    }
}
