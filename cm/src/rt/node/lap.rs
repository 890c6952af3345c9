//! Path migration through the node service: a client's
//! [`Connection::load_alt_path`](crate::rt::Connection::load_alt_path) ([`Op::LoadAltPath`],
//! answered when the APR or the LAP's last timeout comes),
//! [`Cm::set_lap_policy`](crate::rt::Cm::set_lap_policy) ([`Op::LapPolicy`]: the LAPs of the
//! session's connections come to it as [`DaemonMsg::Lap`], answered with [`Op::Apr`]),
//! [`Connection::notify_path_migrated`](crate::rt::Connection::notify_path_migrated)
//! ([`Op::PathMigrated`]).
//!
//! The daemon's endpoint keeps its default [`LapPolicy::Unsupported`](crate::rt::LapPolicy):
//! the connections of a session that answers its LAPs are *delegated* to it one by one
//! ([`Command::DelegateLaps`]), so every other connection's LAPs are answered "unsupported"
//! as before. A delegated connection's LAP is held for its session (at most one per
//! connection: the next comes once it is answered) until the client answers it, the
//! connection ends, the client goes back to "unsupported" (then the daemon answers it
//! "unsupported") or the session ends (then the daemon answers it "rejected", before the
//! connection's DREQ). A session's LAP exchanges (its LAPs waiting for their APR and the
//! LAPs held for it) are at most [`ServerConfig::max_laps`] and its user's
//! [`ServerConfig::max_laps_per_user`]: beyond, a LAP to send is refused and a LAP that
//! arrives is answered "rejected" by the daemon.
//!
//! Within protocol version 2: a daemon that serves path migration says so in its `hello`
//! answer ([`WireResult::Hello::apm`]); a client does not send these ops to one that did not
//! (the calls fail at once with [`CmError::Refused`]).

use std::collections::HashMap;
use std::sync::Arc;

use ibcm_mad::{AprStatus, AttrId, CmMessage, Lap, PathInfo, PrivateData, MAD_DATA_LEN};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::errors::{WireCallError, WireConnError};
use super::proto::{DaemonMsg, Op, WireResult};
use super::server::{NodeServer, Session};
#[cfg(doc)]
use super::ServerConfig;
use crate::proto::{CallError, ConnId};
use crate::rt::command::{Command, LapSink, Reply};
use crate::rt::types::{AprAnswer, CmError, ConnStatus, LapArrived};

/// The most additional information of an APR ([`WireApr`]).
pub const MAX_APR_ADDITIONAL_INFO: usize = 72;

/// The most private data of an APR ([`WireApr`]).
pub const MAX_APR_PRIVATE_DATA: usize = ibcm_mad::Apr::PRIVATE_DATA_LEN;

/// An APR's content on the wire: the answer to a client's LAP ([`WireResult::Apr`]) and a
/// client's answer to a LAP ([`Op::Apr`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireApr {
    /// AP status (IBTA table 121: 0 "path loaded", 2 "unsupported", 3 "rejected", …).
    pub status: u8,
    /// Additional information (at most 72 bytes).
    pub additional_info: Vec<u8>,
    /// Private data (at most 148 bytes; a received APR's with trailing zeros trimmed).
    pub private_data: Vec<u8>,
}

impl WireApr {
    /// From an APR's answer.
    pub fn from_answer(a: &AprAnswer) -> Self {
        WireApr {
            status: a.status.raw(),
            additional_info: a.additional_info.clone(),
            private_data: a.private_data.clone(),
        }
    }

    /// Back to the answer.
    pub fn to_answer(&self) -> AprAnswer {
        AprAnswer {
            status: AprStatus::from_raw(self.status),
            additional_info: self.additional_info.clone(),
            private_data: self.private_data.clone(),
        }
    }

    /// An answer of `status` without data (what the daemon and the client send on a
    /// client's behalf).
    pub fn bare(status: AprStatus) -> Self {
        WireApr {
            status: status.raw(),
            additional_info: Vec::new(),
            private_data: Vec::new(),
        }
    }
}

/// The LAP body (232 bytes) carrying `path` and `private_data`, its other fields 0: what
/// [`Op::LoadAltPath`] and [`DaemonMsg::Lap`] carry.
///
/// # Errors
/// Private data over a LAP's 168 bytes ([`CallError::TooLong`], as the endpoint says it).
pub fn lap_body(path: &PathInfo, private_data: &[u8]) -> Result<Vec<u8>, CallError> {
    let pd = PrivateData::from_slice(private_data).map_err(|e| CallError::TooLong {
        what: "LAP private data",
        len: e.len,
        max: e.max,
    })?;
    let lap = Lap {
        alternate_path: *path,
        private_data: pd,
        ..Lap::default()
    };
    Ok(super::wire::body(&CmMessage::Lap(lap)))
}

/// The path and the private data (trailing zeros trimmed) of a LAP body ([`lap_body`]).
///
/// # Errors
/// A body that is not 232 bytes.
pub fn parse_lap_body(b: &[u8]) -> Result<(PathInfo, Vec<u8>), String> {
    let Some(d) = b
        .first_chunk::<MAD_DATA_LEN>()
        .filter(|_| b.len() == MAD_DATA_LEN)
    else {
        return Err(format!("a LAP body of {} bytes", b.len()));
    };
    match CmMessage::parse_fixed(AttrId::Lap, d) {
        CmMessage::Lap(l) => Ok((l.alternate_path, l.private_data.trimmed().to_vec())),
        _ => Err("not a LAP body".into()),
    }
}

/// Where a connection's LAP is in its session ([`super::server::ConnEntry::lap`]).
#[derive(Debug, Default)]
pub(super) enum HeldLap {
    /// None held for the client.
    #[default]
    None,
    /// Arrived before the client was told the connection is established: delivered right
    /// after that status.
    Stashed(Box<LapArrived>),
    /// Delivered to the client, not answered yet.
    Delivered,
}

impl HeldLap {
    pub(super) fn is_held(&self) -> bool {
        !matches!(self, HeldLap::None)
    }
}

/// A LAP a client sent, waiting for its APR: counted against its session's and its user's
/// LAP exchanges until dropped.
struct SentLap {
    session: Arc<Session>,
}

impl Drop for SentLap {
    fn drop(&mut self) {
        let mut st = self.session.lock();
        st.laps_sent = st.laps_sent.saturating_sub(1);
    }
}

/// The APR that answers the LAP of `conn` with `status` and no data (for a client that
/// cannot, or will not).
fn apr_command(conn: ConnId, status: AprStatus) -> Command {
    let (reply, _) = oneshot::channel();
    Command::Apr {
        conn,
        status,
        additional_info: Vec::new(),
        private_data: Vec::new(),
        reply,
    }
}

impl NodeServer {
    /// The LAP exchanges of all `uid`'s sessions.
    fn laps_of_user(&self, uid: u32) -> usize {
        self.sessions_of(uid)
            .iter()
            .map(|x| x.lock().laps())
            .fold(0, usize::saturating_add)
    }

    /// Why `s`'s user may not start or hold another LAP exchange, if it may not (counted
    /// over its sessions before the one of `s` is taken: the session's own quota is checked
    /// under its lock, [`Self::session_lap_quota`]).
    fn user_lap_quota(&self, s: &Session) -> Option<String> {
        (self.laps_of_user(s.info.uid) >= self.cfg.max_laps_per_user).then(|| {
            format!(
                "quota: {} LAP exchanges of uid {}",
                self.cfg.max_laps_per_user, s.info.uid
            )
        })
    }

    /// Why a session with these LAP exchanges may not have another, if it may not.
    fn session_lap_quota(&self, st: &super::server::SessionState) -> Option<String> {
        (st.laps() >= self.cfg.max_laps)
            .then(|| format!("quota: {} LAP exchanges", self.cfg.max_laps))
    }

    /// Delegates the LAPs of `conn` to the session whose sink `sink` is, if it answers its
    /// LAPs (called when a connection joins a session).
    pub(super) fn delegate_laps(&self, sink: Option<LapSink>, conn: u32) {
        if let Some(sink) = sink {
            self.cm.send(Command::DelegateLaps {
                conn: ibcm_mad::CommId(conn),
                sink: Some(sink),
            });
        }
    }

    /// [`Op::LapPolicy`]: the session answers its connections' LAPs (they are delegated to
    /// it, and a task delivers them), or no longer (given back to the endpoint's
    /// "unsupported"; the LAPs delivered and unanswered are answered "unsupported").
    pub(super) fn lap_policy(self: &Arc<Self>, s: &Arc<Session>, application: bool) -> WireResult {
        if application {
            let (rx, sink, conns) = {
                let mut st = s.lock();
                if st.closed || st.lap_sink.is_some() {
                    return WireResult::Ok;
                }
                let (tx, rx) = mpsc::unbounded_channel();
                st.lap_sink = Some(tx.clone());
                (rx, tx, st.conns.keys().copied().collect::<Vec<_>>())
            };
            for conn in conns {
                self.delegate_laps(Some(sink.clone()), conn);
            }
            drop(sink);
            let (me, s) = (self.clone(), s.clone());
            tokio::spawn(async move {
                let mut rx = rx;
                // Until every sender is gone: the session's (dropped when it stops answering
                // or ends) and the driver's (dropped as its connections close or are given
                // back).
                while let Some((id, lap)) = rx.recv().await {
                    me.lap_arrived(&s, id, lap);
                }
            });
        } else {
            let (conns, held) = {
                let mut st = s.lock();
                if st.lap_sink.take().is_none() {
                    return WireResult::Ok;
                }
                let conns: Vec<u32> = st.conns.keys().copied().collect();
                let mut held = Vec::new();
                for (id, c) in &mut st.conns {
                    if std::mem::take(&mut c.lap).is_held() {
                        held.push(*id);
                    }
                }
                st.laps_held = 0;
                (conns, held)
            };
            for conn in conns {
                self.cm.send(Command::DelegateLaps {
                    conn: ibcm_mad::CommId(conn),
                    sink: None,
                });
            }
            for conn in held {
                self.cm
                    .send(apr_command(ibcm_mad::CommId(conn), AprStatus::Unsupported));
            }
        }
        WireResult::Ok
    }

    /// A LAP on a connection delegated to `s`: held for the client and delivered (once the
    /// client knows the connection established), or answered on its behalf: "unsupported"
    /// when it no longer answers LAPs or the connection is not its, "rejected" when the
    /// session has ended or is over its LAP quota.
    fn lap_arrived(&self, s: &Arc<Session>, id: ConnId, lap: LapArrived) {
        let conn = id.0;
        // Counted before the session's lock is taken (it counts every session of the user).
        let user_quota = self.user_lap_quota(s);
        let (answer, deliver, quota) = {
            let mut st = s.lock();
            let quota = user_quota.or_else(|| self.session_lap_quota(&st));
            let over = quota.is_some();
            let answering = st.lap_sink.is_some();
            let closed = st.closed;
            match st.conns.get_mut(&conn) {
                _ if closed => (Some(AprStatus::Rejected), None, quota),
                Some(c) if answering && !over && !c.lap.is_held() => {
                    let deliver = if c.established {
                        c.lap = HeldLap::Delivered;
                        Some(lap)
                    } else {
                        c.lap = HeldLap::Stashed(Box::new(lap));
                        None
                    };
                    st.laps_held += 1;
                    (None, deliver, quota)
                }
                Some(_) if answering => (Some(AprStatus::Rejected), None, quota),
                _ => (Some(AprStatus::Unsupported), None, quota),
            }
        };
        if let (Some(why), Some(AprStatus::Rejected)) = (&quota, answer) {
            if let Some(suppressed) = super::server::lock(&self.log).ok() {
                warn!(session = s.info.id, conn, why = %why, suppressed,
                    "LAP answered \"rejected\" for a client over its quota");
            }
        }
        if let Some(status) = answer {
            self.cm.send(apr_command(id, status));
        }
        if let Some(lap) = deliver {
            Self::deliver_lap(s, conn, &lap);
        }
    }

    /// Sends the client the LAP held for `conn`.
    pub(super) fn deliver_lap(s: &Session, conn: u32, lap: &LapArrived) {
        match lap_body(&lap.path, &lap.private_data) {
            Ok(lap) => s.out.push(&DaemonMsg::Lap { conn, lap }),
            // A received LAP's data fits its body: not reached.
            Err(e) => warn!(conn, error = %e, "a LAP that its body cannot carry"),
        }
    }

    /// [`Op::LoadAltPath`]: the LAP goes out now (queued in order with the session's other
    /// requests); the reply to `seq` is sent when its APR or last timeout comes.
    pub(super) fn load_alt_path(
        self: &Arc<Self>,
        s: &Arc<Session>,
        seq: u64,
        conn: u32,
        lap: &[u8],
    ) {
        if !s.lock().conns.contains_key(&conn) {
            let e = WireCallError::UnknownConnection { conn };
            return Self::reply(s, seq, WireResult::CallError(e));
        }
        let (path, private_data) = match parse_lap_body(lap) {
            Ok(l) => l,
            Err(why) => return Self::reply(s, seq, WireResult::Refused { why }),
        };
        let user_quota = self.user_lap_quota(s);
        {
            let mut st = s.lock();
            if let Some(why) = user_quota.or_else(|| self.session_lap_quota(&st)) {
                drop(st);
                return Self::reply(s, seq, WireResult::Refused { why });
            }
            st.laps_sent += 1;
        }
        let sent = SentLap { session: s.clone() };
        let rx = self.cm.queue(|reply| Command::LoadAltPath {
            conn: ibcm_mad::CommId(conn),
            path,
            private_data,
            reply,
        });
        tokio::spawn(async move {
            let r = match rx {
                Ok(rx) => rx.await.ok(),
                Err(_) => None,
            };
            // Given back before the reply: a client that sends again at once finds room.
            let s = sent.session.clone();
            drop(sent);
            let result = match r {
                Some(Ok(a)) | Some(Err(CmError::LapRejected(a))) => {
                    WireResult::Apr(WireApr::from_answer(&a))
                }
                Some(Err(CmError::LapTimedOut)) => WireResult::LapTimedOut,
                Some(Err(CmError::Call(e))) => WireResult::CallError(WireCallError::from_error(&e)),
                Some(Err(CmError::Connection(e))) => {
                    WireResult::Closed(WireConnError::from_error(&e))
                }
                Some(Err(e)) => WireResult::Refused { why: e.to_string() },
                None => WireResult::Refused {
                    why: "the endpoint has stopped".into(),
                },
            };
            Self::reply(&s, seq, result);
        });
    }

    /// [`Op::Apr`]: the client's answer to the LAP of `conn` (no longer held for it).
    pub(super) async fn apr(&self, s: &Session, conn: u32, apr: WireApr) -> WireResult {
        {
            let mut st = s.lock();
            let Some(c) = st.conns.get_mut(&conn) else {
                return WireResult::CallError(WireCallError::UnknownConnection { conn });
            };
            if std::mem::take(&mut c.lap).is_held() {
                st.laps_held = st.laps_held.saturating_sub(1);
            }
        }
        let r = self
            .cm
            .call(|reply| Command::Apr {
                conn: ibcm_mad::CommId(conn),
                status: AprStatus::from_raw(apr.status),
                additional_info: apr.additional_info,
                private_data: apr.private_data,
                reply,
            })
            .await;
        super::requests::unit(r)
    }

    /// [`Op::PathMigrated`].
    pub(super) async fn path_migrated(&self, s: &Session, conn: u32) -> WireResult {
        if !s.lock().conns.contains_key(&conn) {
            return WireResult::CallError(WireCallError::UnknownConnection { conn });
        }
        let r = self
            .cm
            .call(|reply| Command::PathMigrated {
                conn: ibcm_mad::CommId(conn),
                reply,
            })
            .await;
        super::requests::unit(r)
    }

    /// The APRs that answer, on behalf of a session that has ended, the LAPs held for it
    /// ("rejected"), before its connections' DREQs.
    pub(super) fn answer_held_laps(&self, held: impl IntoIterator<Item = u32>) {
        for conn in held {
            self.cm
                .send(apr_command(ibcm_mad::CommId(conn), AprStatus::Rejected));
        }
    }
}

/// A `next_lap` waiting for a LAP.
type LapWaiter = Reply<Result<LapArrived, CmError>>;

/// The client's side of the LAPs the daemon delivers ([`DaemonMsg::Lap`]): held per
/// connection until a `next_lap` takes one, and the `next_lap` calls waiting; the handles'
/// rules are the driver's (`rt/driver/lap.rs`).
#[derive(Debug, Default)]
pub(super) struct ClientLaps {
    /// This client answers its LAPs ([`Op::LapPolicy`] said so).
    pub(super) application: bool,
    held: HashMap<ConnId, LapArrived>,
    waiting: HashMap<ConnId, Vec<LapWaiter>>,
}

/// Offers `lap` to `w`: `None` when it took it, else the LAP back (its `next_lap` is gone).
fn offer(w: LapWaiter, lap: LapArrived) -> Option<LapArrived> {
    w.send(Ok(lap)).err().and_then(Result::ok)
}

impl ClientLaps {
    /// `next_lap` on `conn`, whose status is `status` (`None`: not a connection of this
    /// client): the LAP held for it, a place among its waiters, or why not.
    pub(super) fn next(&mut self, conn: ConnId, reply: LapWaiter, status: Option<ConnStatus>) {
        if !self.application {
            let _ = reply.send(Err(CmError::LapsNotDelegated));
            return;
        }
        if let Some(lap) = self.held.remove(&conn) {
            if let Some(lap) = offer(reply, lap) {
                self.held.insert(conn, lap);
            }
            return;
        }
        match status {
            None => {
                let _ = reply.send(Err(CmError::Call(CallError::UnknownConnection(conn))));
            }
            Some(ConnStatus::Closed(e) | ConnStatus::Gone(e)) => {
                let _ = reply.send(Err(CmError::Connection(e)));
            }
            Some(ConnStatus::Connecting | ConnStatus::Established) => {
                let w = self.waiting.entry(conn).or_default();
                w.retain(|w| !w.is_closed());
                w.push(reply);
            }
        }
    }

    /// A LAP for the application: to the oldest waiting `next_lap`, else held.
    pub(super) fn deliver(&mut self, conn: ConnId, lap: LapArrived) {
        let mut waiting = self.waiting.remove(&conn).unwrap_or_default();
        let mut left = Some(lap);
        while let Some(lap) = left.take() {
            if waiting.is_empty() {
                self.held.insert(conn, lap);
                break;
            }
            left = offer(waiting.remove(0), lap);
        }
        waiting.retain(|w| !w.is_closed());
        if !waiting.is_empty() {
            self.waiting.insert(conn, waiting);
        }
    }

    /// The client stops answering its LAPs: the LAPs held go (the daemon answers them
    /// "unsupported"), the waiting `next_lap` calls fail.
    pub(super) fn stop(&mut self) {
        self.application = false;
        self.held.clear();
        for (_, waiters) in std::mem::take(&mut self.waiting) {
            for w in waiters {
                let _ = w.send(Err(CmError::LapsNotDelegated));
            }
        }
    }

    /// The connection `conn` ended with `status`: its LAP exchange ends with it.
    pub(super) fn closed(&mut self, conn: ConnId, status: &ConnStatus) {
        self.held.remove(&conn);
        let (ConnStatus::Closed(e) | ConnStatus::Gone(e)) = status else {
            return;
        };
        for w in self.waiting.remove(&conn).unwrap_or_default() {
            let _ = w.send(Err(CmError::Connection(e.clone())));
        }
    }
}

/// The answer to a client's [`Op::LoadAltPath`], as `load_alt_path` returns it.
pub(super) fn apr_result(r: WireResult) -> Result<AprAnswer, CmError> {
    match r {
        WireResult::Apr(a) => {
            let a = a.to_answer();
            if a.status == AprStatus::Success {
                Ok(a)
            } else {
                Err(CmError::LapRejected(a))
            }
        }
        WireResult::LapTimedOut => Err(CmError::LapTimedOut),
        WireResult::CallError(e) => Err(CmError::Call(e.to_error())),
        WireResult::Closed(e) => Err(CmError::Connection(e.to_error())),
        WireResult::Refused { why } => Err(CmError::Refused(why)),
        other => Err(CmError::Refused(format!("unexpected answer {other:?}"))),
    }
}

/// Why a client's APR cannot be sent as it is, if it cannot: its fields over an APR's (the
/// endpoint's own [`CallError::TooLong`]).
pub(super) fn apr_too_long(additional_info: &[u8], private_data: &[u8]) -> Option<CallError> {
    let long = |what, len: usize, max| (len > max).then_some(CallError::TooLong { what, len, max });
    long(
        "APR additional info",
        additional_info.len(),
        MAX_APR_ADDITIONAL_INFO,
    )
    .or_else(|| long("APR private data", private_data.len(), MAX_APR_PRIVATE_DATA))
}

/// The `Op::LoadAltPath` of a handle's [`Command::LoadAltPath`], or the error its caller
/// gets at once (private data over a LAP's).
pub(super) fn load_alt_path_op(
    conn: ConnId,
    path: &PathInfo,
    private_data: &[u8],
) -> Result<Op, CmError> {
    let lap = lap_body(path, private_data).map_err(CmError::Call)?;
    Ok(Op::LoadAltPath { conn: conn.0, lap })
}

/// The APR a client sends on its own (a dropped `LapRequest`, a LAP it cannot take).
pub(super) fn bare_apr(conn: ConnId, status: AprStatus) -> Op {
    Op::Apr {
        conn: conn.0,
        apr: WireApr::bare(status),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod daemon_tests;
