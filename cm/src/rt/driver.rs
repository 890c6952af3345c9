//! The task that owns the [`proto::Endpoint`](crate::proto::Endpoint), its transport and
//! its [`App`](crate::App), if any.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::time::{Duration, Instant};

use bytes::Bytes;

use ibcm_mad::ServiceId;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::command::{Command, Reply};
use super::now;
use super::slot::Registry;

use super::types::{CmError, ConnStatus, IncomingKind, SidrAnswer};
use super::DatagramTransport;
use crate::app::{earliest, fire_timers, DynApp};
use crate::log_limit::LogLimit;
use crate::proto::{
    ConnId, Endpoint, EndpointConfig, PeerAddr, SidrRepParams, State, StatelessInfo, Transmit,
};

mod commands;
mod events;
mod lap;

/// How long a stopping endpoint waits for the DREPs of the DREQs it sends
/// ([`Cm::shutdown`](super::Cm::shutdown), or the last handle dropped).
pub const SHUTDOWN_LINGER: Duration = Duration::from_secs(2);

/// The application a driver runs (sent to its task: `Send`).
pub(crate) type BoxApp = Box<dyn DynApp + Send>;

/// A SIDR_REP without a QP: a refusal with `status`.
fn sidr_status(status: ibcm_mad::SidrStatus) -> SidrRepParams {
    SidrRepParams {
        status,
        ..SidrRepParams::success(ibcm_mad::Qpn::default(), ibcm_mad::Qkey(0))
    }
}

/// The channel of a stateless listener's established connections.
type StatelessTx = mpsc::UnboundedSender<(ConnId, Box<StatelessInfo>)>;

/// The driver: one task, one endpoint, one timer.
pub(crate) struct Driver<T> {
    ep: Endpoint,
    transport: T,
    rx: mpsc::UnboundedReceiver<Command>,
    registry: Registry,
    /// Each listener with the token its `Listener` handle holds.
    listeners: BTreeMap<ServiceId, (u64, mpsc::UnboundedSender<(ConnId, IncomingKind)>)>,
    /// Where the connections a listener's stateless template established go
    /// ([`Cm::listen_stateless`](super::Cm::listen_stateless)), by service ID.
    stateless: BTreeMap<ServiceId, StatelessTx>,
    next_listener: u64,
    sidr: BTreeMap<ConnId, Reply<Result<SidrAnswer, CmError>>>,
    /// The LAP exchanges the handles take part in ([`lap::Laps`]).
    laps: lap::Laps,
    app: Option<BoxApp>,
    /// Connections closed (for [`CmStats::closed`](super::CmStats::closed)).
    closed: u64,
    /// Rate limit of the lines logged about what peers make the driver do.
    log: LogLimit,
    /// Datagrams received in this turn, not yet handled.
    inbox: Vec<(PeerAddr, Bytes)>,
    /// REQs and SIDR_REQs received and not yet handled, oldest first (at most
    /// [`REQ_BACKLOG`]; the newest [`TURN_REQS`] are handled per receive, after its other
    /// MADs).
    reqs: VecDeque<(PeerAddr, Bytes)>,
    /// Requests dropped because the backlog was full (the oldest goes).
    reqs_shed: u64,
    /// MADs the transport could not send (its send call failed: `send_error`).
    send_errors: u64,
    /// MADs to send at the end of this turn.
    outbox: Vec<Transmit>,
}

/// Most commands taken without waiting in one turn (after the one that woke the driver).
const TURN_COMMANDS: usize = 256;

/// Requests (REQ, SIDR_REQ: the MADs that make the endpoint create state and answer) handled
/// per receive, after its other MADs. Under a flood the driver reads the socket faster than
/// it handles requests: every other MAD (the RTU that completes a connection, a DREQ) is
/// handled as soon as it is read instead of waiting behind the socket's queue of requests,
/// and the excess requests are dropped here, oldest first ([`REQ_BACKLOG`]), rather than in
/// the kernel's socket buffer, blind to what they are.
///
/// The *newest* `TURN_REQS` of the backlog are handled (in the order they came), not the
/// oldest: when requests come faster than the endpoint handles them, first come first served
/// makes every request wait the whole backlog (2,048 requests are seconds on a slow host),
/// beyond its peer's patience, so that none completes; newest first answers a request
/// within a turn or two of its arrival while the old ones wait and are the ones dropped.
/// A backlog of at most `TURN_REQS` (no overload) is handled whole, in arrival order.
const TURN_REQS: usize = 128;

/// Requests waiting to be handled at most; beyond it the oldest is dropped (counted as
/// `req_backlog_full`). A peer whose REQ is dropped retransmits it.
const REQ_BACKLOG: usize = 2048;

/// Extra receive calls per turn while the socket has more: the driver reads up to
/// `(2 + READS_AHEAD) × 64` datagrams per turn (one batch woke it), so that the socket's
/// queue drains even when requests come faster than they are handled.
const READS_AHEAD: usize = 7;

/// Whether a received MAD is a REQ or a SIDR_REQ: the requests that make the endpoint create
/// state ([`TURN_REQS`]).
fn is_request(mad: &[u8]) -> bool {
    matches!(
        ibcm_mad::MadHeader::peek_attr_id(mad),
        Some(ibcm_mad::AttrId::Req | ibcm_mad::AttrId::SidrReq)
    )
}

impl<T: DatagramTransport> Driver<T> {
    pub(crate) fn new(
        transport: T,
        mut config: EndpointConfig,
        rx: mpsc::UnboundedReceiver<Command>,
        registry: Registry,
        app: Option<BoxApp>,
    ) -> Self {
        if config.local_gid == ibcm_mad::Gid::ZERO {
            if let Some(g) = transport.local_addr().gid() {
                config.local_gid = g;
            }
        }
        Driver {
            ep: Endpoint::new(config),
            transport,
            rx,
            registry,
            listeners: BTreeMap::new(),
            stateless: BTreeMap::new(),
            next_listener: 1,
            sidr: BTreeMap::new(),
            laps: lap::Laps::default(),
            app,
            closed: 0,
            log: LogLimit::default(),
            inbox: Vec::new(),
            reqs: VecDeque::new(),
            reqs_shed: 0,
            send_errors: 0,
            outbox: Vec::new(),
        }
    }

    /// The loop, one *turn* at a time: wait for an input (a command, the timer, datagrams),
    /// take what else is ready without waiting (commands, then one receive's datagrams), each
    /// input followed by its events ([`crate::App`]: call order, steps 1–4), then send
    /// everything the turn queued together ([`DatagramTransport::send_batch`]: one system
    /// call per 64 MADs over UDP) and re-arm the timer.
    pub(crate) async fn run(mut self) -> io::Result<()> {
        let sleep = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(sleep);
        let mut armed: Option<Instant> = None;
        loop {
            self.transmit().await;
            let app_deadline = self.app.as_ref().and_then(|a| a.poll_timeout());
            let deadline = earliest(self.ep.poll_timeout(), app_deadline);
            if deadline != armed {
                if let Some(d) = deadline {
                    sleep.as_mut().reset(tokio::time::Instant::from_std(d));
                }
                armed = deadline;
            }
            // Local work first: the application's commands (accepts, rejects, …) come at the
            // rate the application chooses, datagrams at the rate peers choose. Under a flood
            // the excess waits (and is dropped) in the socket buffer, not the accepts.
            tokio::select! {
                biased;
                cmd = self.rx.recv() => match cmd {
                    None => return self.close_all(SHUTDOWN_LINGER).await,
                    Some(Command::Shutdown { linger }) => return self.close_all(linger).await,
                    Some(cmd) => self.on_command(cmd),
                },
                () = &mut sleep, if armed.is_some() => {
                    armed = None;
                    self.on_timeout(now());
                }
                r = self.transport.recv_batch(&mut self.inbox) => {
                    if let Err(e) = r {
                        warn!(error = %e, "transport receive failed; stopping");
                        return Err(e);
                    }
                }
                // Requests are waiting: no sleep, but the runtime's other tasks (the
                // application's) get their turn first.
                () = tokio::task::yield_now(), if !self.reqs.is_empty() => {}
            }
            self.dispatch();
            self.handle_inbox();
            if let Some(linger) = self.take_ready()? {
                // What the turn's earlier inputs queued still goes out (a DREQ before a
                // shutdown, say) first; then every connection is ended as on any shutdown.
                self.transmit().await;
                return self.close_all(linger).await;
            }
        }
    }

    /// The endpoint stops (shutdown, or the last handle dropped): every connection is ended
    /// as [`Endpoint::disconnect`] does it — DREQ when established, REJ during setup — and
    /// the driver keeps answering and retransmitting until every DREQ is answered (the
    /// connection is in TimeWait or gone), or for `linger` at most.
    async fn close_all(&mut self, linger: Duration) -> io::Result<()> {
        let t = now();
        for id in self.ep.conn_ids() {
            let _ = self.ep.disconnect(t, id, &[]);
        }
        // The connections whose DREQ waits for its DREP, in the order the DREQs went out. A
        // connection that has left DREQ_SENT does not come back to it (the driver takes no more
        // commands), so a cursor that only moves forward past the answered ones tells when all
        // of them are: O(N) for the whole shutdown. (A count over every connection after each
        // datagram made the shutdown of a million connections quadratic: minutes of CPU.) When
        // the cursor is through, one count over every connection finds the DREQs sent since
        // (by the app, or for a stateless connection whose listener is gone), as before.
        let mut waiting: Vec<ConnId> = Vec::new();
        let mut answered = 0;
        let deadline = tokio::time::Instant::now() + linger;
        loop {
            self.dispatch();
            self.transmit().await;
            while waiting
                .get(answered)
                .is_some_and(|&id| self.ep.state(id) != Some(State::DreqSent))
            {
                answered += 1;
            }
            if answered == waiting.len() {
                waiting = self
                    .ep
                    .conn_ids()
                    .into_iter()
                    .filter(|&id| self.ep.state(id) == Some(State::DreqSent))
                    .collect();
                answered = 0;
                if waiting.is_empty() {
                    return Ok(());
                }
            }
            let timer = self.ep.poll_timeout().map(tokio::time::Instant::from_std);
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    let waiting = waiting
                        .iter()
                        .filter(|&&id| self.ep.state(id) == Some(State::DreqSent))
                        .count();
                    warn!(waiting, "shutdown: DREQs still unanswered after {linger:?}; stopping");
                    return Ok(());
                }
                () = tokio::time::sleep_until(timer.unwrap_or(deadline)), if timer.is_some() => {
                    self.ep.handle_timeout(now());
                }
                r = self.transport.recv() => match r {
                    Ok((from, mad)) => self.ep.handle_datagram(now(), from, &mad),
                    Err(e) => return Err(e),
                },
            }
        }
    }

    /// The rest of a turn: the commands and datagrams ready now, without waiting (bounded,
    /// commands first as in [`Driver::run`]). `Some(linger)` when the driver must stop
    /// (a shutdown, or the last handle dropped).
    fn take_ready(&mut self) -> io::Result<Option<Duration>> {
        for _ in 0..TURN_COMMANDS {
            match self.rx.try_recv() {
                Ok(Command::Shutdown { linger }) => return Ok(Some(linger)),
                Err(mpsc::error::TryRecvError::Disconnected) => return Ok(Some(SHUTDOWN_LINGER)),
                Ok(cmd) => {
                    self.on_command(cmd);
                    self.dispatch();
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
        // Read on while datagrams keep coming (up to `READS_AHEAD` more batches): under a
        // flood the MADs behind the requests in the socket are handled now, and the excess
        // requests dropped in the backlog.
        for _ in 0..=READS_AHEAD {
            let before = self.inbox.len();
            if let Err(e) = self.transport.try_recv_batch(&mut self.inbox) {
                warn!(error = %e, "transport receive failed; stopping");
                return Err(e);
            }
            if self.inbox.len() == before {
                break;
            }
        }
        self.handle_inbox();
        Ok(None)
    }

    /// Each received datagram, followed by its events. One receive's datagrams arrived
    /// together: they are handled at one instant.
    fn handle_inbox(&mut self) {
        if self.inbox.is_empty() && self.reqs.is_empty() {
            return;
        }
        let mut inbox = std::mem::take(&mut self.inbox);
        // Every REQ's and REP's random index line is loaded while the earlier ones are handled.
        for (_, mad) in &inbox {
            self.ep.prefetch(mad);
        }
        let t = now();
        for (from, mad) in inbox.drain(..) {
            if is_request(&mad) {
                if self.reqs.len() >= REQ_BACKLOG {
                    self.reqs.pop_front();
                    self.reqs_shed += 1;
                }
                self.reqs.push_back((from, mad));
                continue;
            }
            self.ep.handle_datagram(t, from, &mad);
            self.dispatch();
        }
        // Keep the allocation for the next turn.
        self.inbox = inbox;
        // The newest requests, in the order they came ([`TURN_REQS`]).
        let mut reqs = std::mem::take(&mut self.reqs);
        let newest = reqs.len().saturating_sub(TURN_REQS);
        for (from, mad) in reqs.drain(newest..) {
            self.ep.handle_datagram(t, from, &mad);
            self.dispatch();
        }
        self.reqs = reqs;
    }

    /// The timer fired: the endpoint's timers, then the app's, each if due.
    fn on_timeout(&mut self, now: Instant) {
        fire_timers(&mut self.ep, self.app.as_deref_mut(), now);
    }

    /// After an input: events (to the app, then the handles) and the app's deferred work,
    /// until neither produces more (the order of [`crate::App`], steps 2–4).
    fn dispatch(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(ev) = self.ep.poll_event() {
                progressed = true;
                self.on_event(ev);
            }
            if let Some(app) = self.app.as_mut() {
                app.poll(&mut self.ep, now());
            }
            if !progressed {
                // The app's deferred work may have produced events.
                match self.ep.poll_event() {
                    Some(ev) => self.on_event(ev),
                    None => return,
                }
            }
        }
    }

    /// What the endpoint queued onto the wire in this turn, in order, in as few system calls
    /// as the transport can.
    async fn transmit(&mut self) {
        while let Some(t) = self.ep.poll_transmit() {
            self.outbox.push(t);
        }
        if self.outbox.is_empty() {
            return;
        }
        let failed = self.transport.send_batch(&self.outbox).await;
        for (i, e) in failed {
            // Like a lost packet (the core retransmits requests), counted.
            self.send_errors += 1;
            if self.log.ok(now()) {
                let to = self.outbox.get(i).map(|t| t.to);
                debug!(to = ?to, error = %e, "send failed");
            }
        }
        self.outbox.clear();
    }

    fn set_status(&self, id: ConnId, st: ConnStatus) {
        if let Some(slot) = self.registry.get(id) {
            slot.set(st);
        }
    }
}
