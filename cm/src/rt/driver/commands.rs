//! The driver's side of the [`Command`]s the handles send: [`Driver::on_command`] routes each
//! to its concern — the listeners, the answers to incoming requests, a connection's own calls,
//! the SIDR requests sent, the LAP exchanges (`lap.rs`), the queries.

use std::time::Instant;

use ibcm_mad::{RejReason, ServiceId};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::{sidr_status, Driver, StatelessTx};
use crate::proto::{CallError, ConnId, ListenOptions, State, StatelessAccept};
use crate::rt::command::Command;
use crate::rt::now;
use crate::rt::stats::CmStats;
use crate::rt::types::{CmError, IncomingKind};
use crate::rt::DatagramTransport;

impl<T: DatagramTransport> Driver<T> {
    /// One command from the handles, handed to the method of its concern (each of them
    /// handles only the commands routed to it here).
    pub(super) fn on_command(&mut self, cmd: Command) {
        let t = now();
        match cmd {
            Command::Listen { .. } | Command::ListenStateless { .. } | Command::Unlisten { .. } => {
                self.on_listen(cmd);
            }
            Command::Accept { .. }
            | Command::Reject { .. }
            | Command::SidrReply { .. }
            | Command::Unanswered { .. } => self.on_answer(t, cmd),
            Command::Connect { .. }
            | Command::Establish { .. }
            | Command::Mra { .. }
            | Command::Disconnect { .. }
            | Command::EndStale { .. }
            | Command::PendingDropped { .. } => self.on_conn_call(t, cmd),
            Command::Sidr { .. } | Command::SidrCancel { .. } => self.on_sidr(t, cmd),
            Command::LoadAltPath { .. }
            | Command::NextLap { .. }
            | Command::LapRequeue { .. }
            | Command::Apr { .. }
            | Command::LapUnanswered { .. }
            | Command::PathMigrated { .. }
            | Command::SetLapPolicy { .. }
            | Command::DelegateLaps { .. } => self.on_lap_command(t, cmd),
            Command::Stats { .. }
            | Command::RandomPsn { .. }
            | Command::Len { .. }
            | Command::WithApp(_) => self.on_query(t, cmd),
            // `run` and `take_ready` stop the driver on it before it gets here.
            Command::Shutdown { .. } => {}
        }
    }

    /// The listeners: added ([`Command::Listen`], [`Command::ListenStateless`]) and removed
    /// ([`Command::Unlisten`]).
    fn on_listen(&mut self, cmd: Command) {
        match cmd {
            Command::Listen {
                service_id,
                options,
                tx,
                reply,
            } => {
                let _ = reply.send(self.add_listener(service_id, options, tx, None));
            }
            Command::ListenStateless {
                service_id,
                options,
                template,
                tx,
                stateless,
                reply,
            } => {
                let stateless = Some((template, stateless));
                let _ = reply.send(self.add_listener(service_id, options, tx, stateless));
            }
            Command::Unlisten { service_id, token } => self.unlisten(service_id, token),
            // Not a listener command: `on_command` routes none here.
            _ => {}
        }
    }

    /// A listener for `service_id` (with `stateless`: its stateless template, and where the
    /// connections it establishes go); its token, for its [`Command::Unlisten`].
    fn add_listener(
        &mut self,
        service_id: ServiceId,
        options: ListenOptions,
        tx: mpsc::UnboundedSender<(ConnId, IncomingKind)>,
        stateless: Option<(StatelessAccept, StatelessTx)>,
    ) -> Result<u64, CmError> {
        // One listener per service ID: a second one would silently take the first
        // one's REQs, and the first one's drop would then end the second.
        if self.ep.is_listening(service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        let stateless = match stateless {
            Some((template, stateless)) => {
                self.ep.set_stateless(service_id, Some(template))?;
                Some(stateless)
            }
            None => None,
        };
        self.ep.listen(service_id, options);
        let token = self.next_listener;
        self.next_listener = self.next_listener.wrapping_add(1);
        self.listeners.insert(service_id, (token, tx));
        if let Some(stateless) = stateless {
            self.stateless.insert(service_id, stateless);
        }
        Ok(token)
    }

    /// Removes the listener of `service_id` if it is still the one of `token` (a dropped
    /// [`Listener`](crate::rt::Listener) removes its own registration only).
    fn unlisten(&mut self, service_id: ServiceId, token: u64) {
        if self
            .listeners
            .get(&service_id)
            .is_some_and(|(t, _)| *t == token)
        {
            self.ep.unlisten(service_id);
            self.listeners.remove(&service_id);
            self.stateless.remove(&service_id);
        }
    }

    /// The answers to an incoming request (REQ or SIDR_REQ). The rule they share: the peer
    /// always gets an answer, a refused one becomes a rejection.
    fn on_answer(&mut self, t: Instant, cmd: Command) {
        match cmd {
            Command::Accept {
                conn,
                params,
                reply,
            } => {
                let r = self.ep.accept(t, conn, params).and_then(|()| {
                    self.registry
                        .get(conn)
                        .ok_or(CallError::UnknownConnection(conn))
                });
                if r.is_err() {
                    // A refused accept still answers the peer (the handle counts the
                    // accept as its answer once queued).
                    self.refuse_unanswered(t, conn);
                }
                let _ = reply.send(r);
            }
            Command::Reject {
                conn,
                reason,
                ari,
                private_data,
                reply,
            } => {
                let r = self.ep.reject(t, conn, reason, &ari, &private_data);
                if r.is_err() {
                    // Data that does not fit: rejected all the same, with reason 28.
                    self.refuse_unanswered(t, conn);
                }
                let _ = reply.send(r);
            }
            Command::SidrReply { id, params, reply } => {
                let r = self.ep.sidr_reply(t, id, params);
                if r.is_err() {
                    // The requester still gets an answer: "rejected".
                    self.refuse_sidr(t, id);
                }
                let _ = reply.send(r);
            }
            Command::Unanswered { id, sidr } => {
                if self.log.ok(t) {
                    warn!(conn = %id, "incoming request dropped unanswered: rejecting it");
                }
                // Gone already (the peer gave up, or it expired) is fine.
                if sidr {
                    self.refuse_sidr(t, id);
                } else {
                    let _ = self.ep.reject(t, id, RejReason::ConsumerReject, &[], &[]);
                }
            }
            // Not an answer: `on_command` routes none here.
            _ => {}
        }
    }

    /// An answer to the REQ of `conn` was refused: reject the REQ (REJ 28) if it is still
    /// waiting for one, so that the peer is not left waiting.
    fn refuse_unanswered(&mut self, t: Instant, conn: ConnId) {
        if matches!(
            self.ep.state(conn),
            Some(State::ReqRcvd | State::MraReqSent)
        ) {
            let _ = self.ep.reject(t, conn, RejReason::ConsumerReject, &[], &[]);
        }
    }

    /// Answers the SIDR_REQ `id` with status "rejected" (gone already is fine).
    fn refuse_sidr(&mut self, t: Instant, id: ConnId) {
        let _ = self
            .ep
            .sidr_reply(t, id, sidr_status(ibcm_mad::SidrStatus::Rejected));
    }

    /// A connection's own calls: the active side's REQ, RTU and abandonment, an MRA, a
    /// disconnect, and the end of a connection of an earlier life.
    fn on_conn_call(&mut self, t: Instant, cmd: Command) {
        match cmd {
            Command::Connect { params, reply } => {
                let r = self.ep.connect_sent(t, params);
                let r = r.map(|(id, req)| (id, self.registry.open(id), req));
                let _ = reply.send(r.map_err(CmError::from));
            }
            Command::Establish {
                conn,
                private_data,
                reply,
            } => {
                let _ = reply.send(self.ep.establish(t, conn, &private_data));
            }
            Command::Mra {
                conn,
                service_timeout,
                reply,
            } => {
                let _ = reply.send(self.ep.mra(t, conn, service_timeout, &[]));
            }
            Command::Disconnect {
                conn,
                private_data,
                reply,
            } => {
                let _ = reply.send(self.ep.disconnect(t, conn, &private_data));
            }
            Command::EndStale { stale, reply } => {
                let r = self.ep.end_stale(t, stale).map(|id| self.registry.open(id));
                let _ = reply.send(r);
            }
            Command::PendingDropped { id } => self.pending_dropped(t, id),
            // Not a connection call: `on_command` routes none here.
            _ => {}
        }
    }

    /// A [`PendingConnection`](crate::rt::PendingConnection) dropped without establish or
    /// reject.
    fn pending_dropped(&mut self, t: Instant, id: ConnId) {
        // Before the REP: REJ 4 (the attempt is given up); after it: REJ 28. Closed
        // already (the peer gave up, or rejected) or established: nothing to do.
        if matches!(
            self.ep.state(id),
            Some(State::ReqSent | State::MraReqRcvd | State::RepRcvd | State::MraRepSent)
        ) {
            if self.log.ok(t) {
                warn!(conn = %id, "pending connection dropped before its RTU: abandoning it");
            }
            let _ = self.ep.disconnect(t, id, &[]);
        }
    }

    /// The SIDR requests this side sends: sent ([`Command::Sidr`]), and forgotten
    /// ([`Command::SidrCancel`]).
    fn on_sidr(&mut self, t: Instant, cmd: Command) {
        match cmd {
            Command::Sidr { params, reply } => {
                let r = self.ep.sidr_request(t, params).map(|id| {
                    let (tx, rx) = oneshot::channel();
                    self.sidr.insert(id, tx);
                    (id, rx)
                });
                let _ = reply.send(r);
            }
            Command::SidrCancel { id } => {
                self.sidr.remove(&id);
                self.ep.sidr_cancel(id);
            }
            // Not a SIDR request: `on_command` routes none here.
            _ => {}
        }
    }

    /// The queries, and the closures run on the app and the endpoint.
    fn on_query(&mut self, t: Instant, cmd: Command) {
        match cmd {
            Command::Stats { reply } => {
                let _ = reply.send(self.stats());
            }
            Command::RandomPsn { reply } => {
                let _ = reply.send(self.ep.random_psn());
            }
            Command::Len { reply } => {
                let _ = reply.send(self.ep.len());
            }
            Command::WithApp(call) => {
                let app = self.app.as_mut().map(|a| a.as_any_mut());
                (call.0)(app, &mut self.ep, t);
            }
            // Not a query: `on_command` routes none here.
            _ => {}
        }
    }

    /// The counters of [`Command::Stats`].
    fn stats(&self) -> CmStats {
        let mut transport = self.transport.stats();
        transport.dropped.push(("req_backlog_full", self.reqs_shed));
        transport.dropped.push(("send_error", self.send_errors));
        CmStats {
            endpoint: self.ep.stats().clone(),
            transport,
            closed: self.closed,
            log_suppressed: self.log.suppressed,
            connections: self.ep.len(),
            half_open: self.ep.half_open(),
            established_now: self.ep.established(),
        }
    }
}
