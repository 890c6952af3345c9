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
mod tests {
    use ibcm_mad::{Gid, Lid, Rate, TimeoutExp, U4};

    use super::*;

    fn path() -> PathInfo {
        PathInfo {
            local_lid: Lid(3),
            remote_lid: Lid(7),
            local_gid: Gid([1; 16]),
            remote_gid: Gid([2; 16]),
            flow_label: ibcm_mad::FlowLabel::masked(0x12345),
            packet_rate: Rate::G10,
            traffic_class: 0x20,
            hop_limit: 1,
            sl: U4::masked(5),
            subnet_local: true,
            local_ack_timeout: TimeoutExp::masked(19),
        }
    }

    /// A LAP body carries every field of the path and the private data, both ways; what it
    /// cannot carry is refused with the endpoint's error, and a malformed body is an error,
    /// not a panic.
    #[test]
    fn lap_bodies_round_trip() {
        let b = lap_body(&path(), b"go").unwrap();
        assert_eq!(b.len(), MAD_DATA_LEN);
        assert_eq!(parse_lap_body(&b), Ok((path(), b"go".to_vec())));
        let e = lap_body(&path(), &[1; 169]).unwrap_err();
        assert_eq!(
            e,
            CallError::TooLong {
                what: "LAP private data",
                len: 169,
                max: 168
            }
        );
        assert!(lap_body(&path(), &[1; 168]).is_ok());
        for bad in [&b[..231], &[][..], &[0; 233][..]] {
            assert!(parse_lap_body(bad).is_err(), "{}", bad.len());
        }
    }

    /// The APR's fields and the results of a LAP sent, as the handle's caller gets them.
    #[test]
    fn aprs_and_their_results() {
        let a = AprAnswer {
            status: AprStatus::InvalidLid,
            additional_info: vec![1, 2],
            private_data: b"no".to_vec(),
        };
        let w = WireApr::from_answer(&a);
        assert_eq!(
            serde_json::to_string(&w).unwrap(),
            r#"{"status":7,"additional_info":[1,2],"private_data":[110,111]}"#
        );
        assert_eq!(w.to_answer(), a);
        assert!(matches!(
            apr_result(WireResult::Apr(w)),
            Err(CmError::LapRejected(x)) if x == a
        ));
        let ok = WireApr::bare(AprStatus::Success);
        assert!(matches!(apr_result(WireResult::Apr(ok)), Ok(x) if x.status == AprStatus::Success));
        assert!(matches!(
            apr_result(WireResult::LapTimedOut),
            Err(CmError::LapTimedOut)
        ));
        let e = apr_result(WireResult::CallError(WireCallError::UnknownConnection {
            conn: 7,
        }));
        assert!(matches!(
            e,
            Err(CmError::Call(CallError::UnknownConnection(c))) if c.0 == 7
        ));
        assert!(matches!(
            apr_result(WireResult::Ok),
            Err(CmError::Refused(w)) if w.contains("unexpected")
        ));
        assert_eq!(apr_too_long(&[0; 72], &[0; 148]), None);
        assert!(matches!(
            apr_too_long(&[0; 73], &[]),
            Some(CallError::TooLong {
                what: "APR additional info",
                len: 73,
                max: 72
            })
        ));
        assert!(matches!(
            apr_too_long(&[], &[0; 149]),
            Some(CallError::TooLong {
                what: "APR private data",
                len: 149,
                max: 148
            })
        ));
    }
}

/// Path migration through in-process daemons on Unix sockets of a scratch directory, their
/// endpoints and the peers on a [`MemNetwork`](crate::rt::MemNetwork).
#[cfg(test)]
mod daemon_tests {
    use std::net::SocketAddr;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use ibcm_mad::{AprStatus, Guid, Lid, PathInfo, Qpn, ServiceId, TimeoutExp, U4};
    use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

    use super::super::hooks::{EventSink, HookFuture, NodeHooks, SessionInfo, XrcListenReq};
    use super::super::proto::{
        encode_frame, read_frame, write_frame, ClientMsg, DaemonMsg, Op, WireAccept, WireResult,
        VERSION,
    };
    use super::super::{NodeServer, ServerConfig};
    use super::parse_lap_body;
    use crate::proto::{AcceptParams, CallError, ConnectParams, EndpointConfig, ListenOptions};
    use crate::rt::{Cm, CmError, Connection, LapPolicy, MemNetwork};

    struct NoXrc;

    impl NodeHooks for NoXrc {
        fn xrc_listen<'a>(
            &'a self,
            _: SessionInfo,
            _: ServiceId,
            _: XrcListenReq<'a>,
            _: EventSink,
        ) -> HookFuture<'a, Result<(), String>> {
            Box::pin(async { Err("no XRC here".to_owned()) })
        }
        fn xrc_destroy(&self, _: SessionInfo) -> HookFuture<'_, Result<u64, String>> {
            Box::pin(async { Ok(0) })
        }
        fn xrc_unlisten(&self, _: SessionInfo, _: ServiceId) -> HookFuture<'_, ()> {
            Box::pin(async {})
        }
        fn session_ended(&self, _: SessionInfo) -> HookFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    /// A scratch directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let d =
                std::env::temp_dir().join(format!("ibcm-node-lap-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const DAEMON: &str = "127.0.0.1:4791";
    const PEER: &str = "127.0.0.2:4791";

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A daemon serving `dir/daemon.sock`, its endpoint at [`DAEMON`] of `net`.
    fn daemon(dir: &Scratch, net: &MemNetwork, cfg: ServerConfig) -> PathBuf {
        let (cm, _) = Cm::bind(
            net.transport(addr(DAEMON).into()),
            EndpointConfig::default(),
        );
        let sock = dir.0.join("daemon.sock");
        let l = tokio::net::UnixListener::bind(&sock).unwrap();
        let server = NodeServer::new(cm, std::sync::Arc::new(NoXrc), cfg, None);
        tokio::spawn(server.serve(l));
        sock
    }

    /// The in-process peer at [`PEER`], answering its LAPs itself.
    async fn peer(net: &MemNetwork) -> Cm {
        let cfg = EndpointConfig {
            local_ca_guid: Guid(2),
            ..EndpointConfig::default()
        };
        let (cm, _) = Cm::bind(net.transport(addr(PEER).into()), cfg);
        cm.set_lap_policy(LapPolicy::Application).await.unwrap();
        cm
    }

    /// A connect to `to` for `sid` from QP `qpn`, its LAPs retransmitted every ~25 ms, 2
    /// retries.
    fn params(to: &str, sid: u64, qpn: u32) -> ConnectParams {
        let mut p = ConnectParams::new(addr(to), ServiceId(sid), Qpn::masked(qpn));
        p.packet_life_time = TimeoutExp::masked(10);
        p.remote_cm_response_timeout = TimeoutExp::masked(12);
        p.max_cm_retries = U4::masked(2);
        p
    }

    /// A path with LIDs `l` → `r`.
    fn path(l: u16, r: u16) -> PathInfo {
        PathInfo {
            local_lid: Lid(l),
            remote_lid: Lid(r),
            sl: U4::masked(1),
            local_ack_timeout: TimeoutExp::masked(18),
            ..PathInfo::default()
        }
    }

    /// Accepts the next REQ of `l` with QP `qpn` and waits for the RTU.
    async fn accept(l: &mut crate::rt::Listener, qpn: u32) -> Connection {
        let inc = l.next().await.unwrap();
        let c = inc
            .accept(AcceptParams::new(Qpn::masked(qpn)))
            .await
            .unwrap();
        c.established().await.unwrap();
        c
    }

    /// A LAP sent by an attached client is answered by the peer's APR, whatever its status;
    /// an MRA makes the client wait; the client reports a migration; what cannot be sent is
    /// refused at once with the endpoint's own error.
    #[tokio::test]
    async fn a_client_loads_alternate_paths_through_the_daemon() {
        let dir = Scratch::new("send");
        let net = MemNetwork::new();
        let sock = daemon(&dir, &net, ServerConfig::default());
        let b = peer(&net).await;
        let mut l = b
            .listen(ServiceId(0x42), ListenOptions::default())
            .await
            .unwrap();
        let server = tokio::spawn(async move {
            let conn = accept(&mut l, 0x22).await;
            let lap = conn.next_lap().await.unwrap();
            assert_eq!((*lap.path(), lap.private_data()), (path(3, 7), &b"try"[..]));
            lap.accept(b"loaded").await.unwrap();
            let lap = conn.next_lap().await.unwrap();
            lap.reject(AprStatus::InvalidLid, b"i", b"no")
                .await
                .unwrap();
            let lap = conn.next_lap().await.unwrap();
            lap.mra(TimeoutExp::masked(16)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            lap.accept(&[]).await.unwrap();
            conn
        });
        let (a, _t) = Cm::attach(&sock).await.unwrap();
        let conn = a.connect(params(PEER, 0x42, 0x11)).await.unwrap();
        let apr = conn.load_alt_path(path(3, 7), b"try").await.unwrap();
        assert_eq!(
            (apr.status, apr.private_data),
            (AprStatus::Success, b"loaded".to_vec())
        );
        let e = conn.load_alt_path(path(4, 8), &[]).await.unwrap_err();
        let CmError::LapRejected(apr) = e else {
            panic!("{e:?}");
        };
        assert_eq!(
            (apr.status, apr.additional_info, apr.private_data),
            (AprStatus::InvalidLid, b"i".to_vec(), b"no".to_vec())
        );
        // Answered after 150 ms, within the MRA's 268 ms: without it the LAP's three tries
        // of ~25 ms would have run out.
        let apr = conn.load_alt_path(path(5, 9), &[]).await.unwrap();
        assert_eq!(apr.status, AprStatus::Success);
        conn.notify_path_migrated().await.unwrap();
        let e = conn.load_alt_path(path(3, 7), &[0; 169]).await.unwrap_err();
        assert!(
            matches!(
                e,
                CmError::Call(CallError::TooLong {
                    what: "LAP private data",
                    len: 169,
                    max: 168
                })
            ),
            "{e:?}"
        );
        let passive = server.await.unwrap();
        conn.disconnect(&[]).await;
        passive.closed().await;
        // A connection that has ended: the endpoint's error, through the daemon.
        let e = conn.load_alt_path(path(3, 7), &[]).await.unwrap_err();
        assert!(matches!(e, CmError::Call(_)), "{e:?}");
    }

    /// A LAP nobody answers times out at the client (the connection stays); while it is
    /// under way, a second LAP and a migration are refused with the endpoint's `WrongState`.
    #[tokio::test]
    async fn a_lap_nobody_answers_times_out() {
        let dir = Scratch::new("timeout");
        let net = MemNetwork::new();
        let sock = daemon(&dir, &net, ServerConfig::default());
        let b = peer(&net).await;
        let mut l = b
            .listen(ServiceId(0x42), ListenOptions::default())
            .await
            .unwrap();
        let server = tokio::spawn(async move { accept(&mut l, 0x22).await });
        let (a, _t) = Cm::attach(&sock).await.unwrap();
        let conn = a.connect(params(PEER, 0x42, 0x11)).await.unwrap();
        let _passive = server.await.unwrap();
        let first = {
            let conn = conn.clone();
            tokio::spawn(async move { conn.load_alt_path(path(3, 7), &[]).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let busy =
            |r: Result<(), CmError>| matches!(r, Err(CmError::Call(CallError::WrongState { .. })));
        assert!(busy(conn.load_alt_path(path(4, 8), &[]).await.map(drop)));
        assert!(busy(conn.notify_path_migrated().await));
        let t0 = tokio::time::Instant::now();
        let r = first.await.unwrap();
        assert!(matches!(r, Err(CmError::LapTimedOut)), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // The exchange is over, the connection stays.
        conn.notify_path_migrated().await.unwrap();
        assert!(matches!(a.connection_count().await, Ok(1)));
    }

    /// A client that asks for its LAPs gets those of its own connections (passive and
    /// active) and answers them: accept, reject, an MRA first, a `LapRequest` dropped
    /// ("rejected"); another client's connections are answered "unsupported" by the
    /// daemon; going back to "unsupported" ends the waiting `next_lap`s.
    #[tokio::test]
    async fn a_client_answers_its_own_laps_when_it_asks() {
        let dir = Scratch::new("answer");
        let net = MemNetwork::new();
        let sock = daemon(&dir, &net, ServerConfig::default());
        let b = peer(&net).await;
        let (c1, _t1) = Cm::attach(&sock).await.unwrap();
        let (c2, _t2) = Cm::attach(&sock).await.unwrap();
        c1.set_lap_policy(LapPolicy::Application).await.unwrap();
        let mut l1 = c1
            .listen(ServiceId(0x51), ListenOptions::default())
            .await
            .unwrap();
        let mut l2 = c2
            .listen(ServiceId(0x52), ListenOptions::default())
            .await
            .unwrap();
        let s1 = tokio::spawn(async move { accept(&mut l1, 0x31).await });
        let s2 = tokio::spawn(async move { accept(&mut l2, 0x32).await });
        let b1 = b.connect(params(DAEMON, 0x51, 0x41)).await.unwrap();
        let b2 = b.connect(params(DAEMON, 0x52, 0x42)).await.unwrap();
        let (p1, p2) = (s1.await.unwrap(), s2.await.unwrap());
        // c2 did not ask: the daemon answers as before.
        let e = b2.load_alt_path(path(3, 7), &[]).await.unwrap_err();
        assert!(
            matches!(&e, CmError::LapRejected(a) if a.status == AprStatus::Unsupported),
            "{e:?}"
        );
        assert!(matches!(
            p2.next_lap().await,
            Err(CmError::LapsNotDelegated)
        ));
        // c1 answers its own.
        let answer = tokio::spawn(async move {
            let lap = p1.next_lap().await.unwrap();
            assert_eq!((*lap.path(), lap.private_data()), (path(3, 7), &b"one"[..]));
            lap.accept(b"ok").await.unwrap();
            let lap = p1.next_lap().await.unwrap();
            lap.reject(AprStatus::InvalidGid, &[], b"no").await.unwrap();
            let lap = p1.next_lap().await.unwrap();
            lap.mra(TimeoutExp::masked(16)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            lap.accept(&[]).await.unwrap();
            // Dropped unanswered: "rejected".
            drop(p1.next_lap().await.unwrap());
            p1
        });
        let apr = b1.load_alt_path(path(3, 7), b"one").await.unwrap();
        assert_eq!(apr.private_data, b"ok");
        let e = b1.load_alt_path(path(3, 7), &[]).await.unwrap_err();
        assert!(
            matches!(&e, CmError::LapRejected(a) if a.status == AprStatus::InvalidGid && a.private_data == b"no"),
            "{e:?}"
        );
        assert!(
            b1.load_alt_path(path(3, 7), &[]).await.is_ok(),
            "after an MRA"
        );
        let e = b1.load_alt_path(path(3, 7), &[]).await.unwrap_err();
        assert!(
            matches!(&e, CmError::LapRejected(a) if a.status == AprStatus::Rejected),
            "{e:?}"
        );
        let p1 = answer.await.unwrap();
        // c1's active connection: delegated from its connect on.
        let mut lb = b
            .listen(ServiceId(0x53), ListenOptions::default())
            .await
            .unwrap();
        let sb = tokio::spawn(async move { accept(&mut lb, 0x33).await });
        let a1 = c1.connect(params(PEER, 0x53, 0x34)).await.unwrap();
        let pb = sb.await.unwrap();
        let answer = tokio::spawn(async move {
            let lap = a1.next_lap().await.unwrap();
            lap.accept(&[]).await.unwrap();
            a1
        });
        assert!(pb.load_alt_path(path(6, 9), &[]).await.is_ok());
        let a1 = answer.await.unwrap();
        // Back to "unsupported": a waiting next_lap ends, the daemon answers again.
        let waiting = tokio::spawn(async move { p1.next_lap().await.map(drop) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        c1.set_lap_policy(LapPolicy::Unsupported).await.unwrap();
        let r = waiting.await.unwrap();
        assert!(matches!(r, Err(CmError::LapsNotDelegated)), "{r:?}");
        let e = pb.load_alt_path(path(6, 9), &[]).await.unwrap_err();
        assert!(
            matches!(&e, CmError::LapRejected(a) if a.status == AprStatus::Unsupported),
            "{e:?}"
        );
        assert!(matches!(
            a1.next_lap().await,
            Err(CmError::LapsNotDelegated)
        ));
        drop(b1);
    }

    /// A raw session: hello said; its reader and writer.
    async fn raw(sock: &Path) -> (OwnedReadHalf, OwnedWriteHalf) {
        let s = tokio::net::UnixStream::connect(sock).await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        send(
            &mut wr,
            0,
            Op::Hello {
                version: VERSION,
                addr: true,
            },
        )
        .await;
        match read_frame::<DaemonMsg, _>(&mut rd).await.unwrap() {
            DaemonMsg::Reply {
                result: WireResult::Hello { apm, .. },
                ..
            } => assert_eq!(apm, 1024, "the hello says how many"),
            other => panic!("{other:?}"),
        }
        (rd, wr)
    }

    /// The next message (10 s at most).
    async fn next(rd: &mut OwnedReadHalf) -> DaemonMsg {
        tokio::time::timeout(Duration::from_secs(10), read_frame::<DaemonMsg, _>(rd))
            .await
            .expect("a message within 10 s")
            .unwrap()
    }

    async fn send(wr: &mut OwnedWriteHalf, seq: u64, op: Op) {
        let f = encode_frame(&ClientMsg { seq, op }).unwrap();
        write_frame(wr, &f).await.unwrap();
    }

    /// A raw client that answers its LAPs gets each after the connection's `established`
    /// status; when it goes with the LAP unanswered, the daemon answers it "rejected" at
    /// once (the peer does not wait for its LAP's timeout, about a minute here), then the
    /// connection's DREQ follows.
    #[tokio::test]
    async fn a_session_that_goes_has_its_held_laps_rejected() {
        let dir = Scratch::new("gone");
        let net = MemNetwork::new();
        let sock = daemon(&dir, &net, ServerConfig::default());
        let b = peer(&net).await;
        let (mut rd, mut wr) = raw(&sock).await;
        send(&mut wr, 1, Op::LapPolicy { application: true }).await;
        let listen = Op::Listen {
            service_id: 0x61,
            transports: Vec::new(),
        };
        send(&mut wr, 2, listen).await;
        for seq in [1, 2] {
            match next(&mut rd).await {
                DaemonMsg::Reply {
                    seq: s,
                    result: WireResult::Ok,
                } if s == seq => {}
                other => panic!("{other:?}"),
            }
        }
        // Default timeouts: the LAP would wait 15 retries of ~4 s.
        let p = ConnectParams::new(addr(DAEMON), ServiceId(0x61), Qpn::masked(0x71));
        let active = tokio::spawn(async move {
            let conn = b.connect(p).await.unwrap();
            let t0 = tokio::time::Instant::now();
            let r = conn.load_alt_path(path(3, 7), b"held").await;
            let why = conn.closed().await;
            (r, t0.elapsed(), why)
        });
        let mut seen = Vec::new();
        let lap = loop {
            match next(&mut rd).await {
                DaemonMsg::Incoming { conn, .. } => {
                    let params = WireAccept::from_params(&AcceptParams::new(Qpn::masked(0x72)));
                    send(&mut wr, 3, Op::Accept { conn, params }).await;
                }
                DaemonMsg::Status { status, .. } => seen.push(format!("{status:?}")),
                DaemonMsg::Lap { lap, .. } => break lap,
                DaemonMsg::Reply { result, .. } => {
                    assert!(matches!(result, WireResult::Ok), "{result:?}")
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(seen, ["Established"], "the LAP comes after the status");
        assert_eq!(parse_lap_body(&lap), Ok((path(3, 7), b"held".to_vec())));
        drop((rd, wr));
        let (r, took, why) = active.await.unwrap();
        assert!(
            matches!(&r, Err(CmError::LapRejected(a)) if a.status == AprStatus::Rejected),
            "{r:?}"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(
            matches!(
                why,
                crate::proto::ConnectionError::Disconnected { by_peer: true, .. }
            ),
            "{why:?}"
        );
    }

    /// At most `max_laps` LAP exchanges per session and `max_laps_per_user` per user: a LAP
    /// over either is answered "rejected" by the daemon, a LAP to send is refused; a place is
    /// given back with the answer.
    #[tokio::test]
    async fn lap_exchanges_are_bounded_per_session_and_user() {
        let dir = Scratch::new("quota");
        let net = MemNetwork::new();
        let cfg = ServerConfig {
            max_laps: 1,
            max_laps_per_user: 2,
            ..ServerConfig::default()
        };
        let sock = daemon(&dir, &net, cfg);
        let b = peer(&net).await;
        let mut clients = Vec::new();
        for (i, sid) in [0x81u64, 0x82, 0x83].into_iter().enumerate() {
            let (c, t) = Cm::attach(&sock).await.unwrap();
            c.set_lap_policy(LapPolicy::Application).await.unwrap();
            let mut l = c
                .listen(ServiceId(sid), ListenOptions::default())
                .await
                .unwrap();
            let n = u32::try_from(i).unwrap();
            let s = tokio::spawn(async move {
                let x = accept(&mut l, 0x90 + 2 * n).await;
                let y = accept(&mut l, 0x91 + 2 * n).await;
                (l, x, y)
            });
            let bx = b.connect(params(DAEMON, sid, 0xa0 + 2 * n)).await.unwrap();
            let by = b.connect(params(DAEMON, sid, 0xa1 + 2 * n)).await.unwrap();
            let (_l, x, y) = s.await.unwrap();
            clients.push((c, t, bx, by, x, y));
        }
        let rejected = |r: Result<crate::rt::AprAnswer, CmError>| matches!(&r, Err(CmError::LapRejected(a)) if a.status == AprStatus::Rejected);
        // Session 0 holds one LAP: its second connection's is over its quota.
        let (_, _, b0x, b0y, x0, y0) = &clients[0];
        let held0 = {
            let b0x = b0x.clone();
            tokio::spawn(async move { b0x.load_alt_path(path(3, 7), &[]).await })
        };
        let lap0 = x0.next_lap().await.unwrap();
        assert!(rejected(b0y.load_alt_path(path(3, 7), &[]).await));
        // ... and it may not send one either.
        let e = y0.load_alt_path(path(4, 8), &[]).await.unwrap_err();
        assert!(
            matches!(&e, CmError::Refused(w) if w == "quota: 1 LAP exchanges"),
            "{e:?}"
        );
        // Session 1 holds one: the user's two. Session 2's is over the user's quota.
        let (_, _, b1x, ..) = &clients[1];
        let held1 = {
            let b1x = b1x.clone();
            tokio::spawn(async move { b1x.load_alt_path(path(3, 7), &[]).await })
        };
        let lap1 = clients[1].4.next_lap().await.unwrap();
        let (_, _, b2x, _, x2, _) = &clients[2];
        assert!(rejected(b2x.load_alt_path(path(3, 7), &[]).await));
        let uid = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata("/proc/self").unwrap().uid()
        };
        let e = x2.load_alt_path(path(4, 8), &[]).await.unwrap_err();
        assert!(
            matches!(&e, CmError::Refused(w) if *w == format!("quota: 2 LAP exchanges of uid {uid}")),
            "{e:?}"
        );
        // Answered: the places are given back.
        lap0.accept(&[]).await.unwrap();
        lap1.accept(&[]).await.unwrap();
        assert!(held0.await.unwrap().is_ok());
        assert!(held1.await.unwrap().is_ok());
        let answer = {
            let x2 = x2.clone();
            tokio::spawn(async move { x2.next_lap().await.unwrap().accept(&[]).await })
        };
        assert!(b2x.load_alt_path(path(3, 7), &[]).await.is_ok());
        answer.await.unwrap().unwrap();
        // A LAP sent counts too, until its APR: the peer answers it.
        let peer_side = {
            let b0y = b0y.clone();
            tokio::spawn(async move { b0y.next_lap().await.unwrap().accept(&[]).await })
        };
        assert!(y0.load_alt_path(path(4, 8), &[]).await.is_ok());
        peer_side.await.unwrap().unwrap();
    }
}
