//! The node service's socket protocol: [`ClientMsg`] (client → daemon) and [`DaemonMsg`]
//! (daemon → client), each a JSON value in a frame of a 4-byte big-endian length and at most
//! [`MAX_FRAME`] bytes.
//!
//! Parameters and messages that the CM puts on the wire travel as what they become there: the
//! parameters of a connect as the 232-byte body of a REQ carrying them, those of an accept as
//! a REP body, a received REQ or REP as its body. So the protocol has no second copy of
//! every field; only what a MAD does not carry (the peer's address, the rdma_cm header,
//! flags of the runtime) has fields of its own.

use ibcm_mad::{ServiceId, TimeoutExp};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use super::errors::{WireCallError, WireConnError, WireConnectError, WireStatus};
pub use super::fields::{
    MAX_DOMAIN_NAME, MAX_KEEPER_REQUEST, MAX_POLICY_NAME, MAX_SIDR_ADDITIONAL_INFO, MAX_SRQNS,
    MAX_TRANSPORTS,
};
pub use super::lap::{
    lap_body, parse_lap_body, WireApr, MAX_APR_ADDITIONAL_INFO, MAX_APR_PRIVATE_DATA,
};
pub use super::paths::{WirePathError, WirePathTarget};
pub use super::sidr::{
    WireSidrIn, WireSidrRep, WireSidrReq, WireStats, SIDR_BUDGET_ADDRESSES, SIDR_BUDGET_ALLOWANCE,
    SIDR_BUDGET_PER_REQUEST, SIDR_MAX_RETRIES, SIDR_TIMEOUT_MAX_MS, SIDR_TIMEOUT_MIN_MS,
};
pub use super::wire::{
    WireAccept, WireConnect, WirePeer, WireRep, WireReq, WireStateless, WireStatelessInfo,
};

/// The largest frame either side accepts (a bigger length prefix ends the session).
pub const MAX_FRAME: usize = 64 * 1024;

/// Protocol version; the daemon refuses a client of another one (and says which it speaks).
///
/// 2: a connection's end may be `refused` (the daemon could not journal it), a request
/// before hello is refused, and the ops of the stateless mode, the XRC orphans and the keeper
/// were added. A client of version 1 could not decode all of that, so it is refused at its
/// hello instead of failing later.
///
/// Added within version 2, so that either side may be older: optional fields, left out when
/// empty (a decoder that predates one ignores it), and ops that a daemon advertises in its
/// [`WireResult::Hello`] answer and a client sends only to a daemon that did
/// ([`Op::ResolvePath`], advertised by `paths`: how many a session may have in flight; path
/// migration's [`Op::LoadAltPath`], [`Op::LapPolicy`], [`Op::Apr`], [`Op::PathMigrated`] and
/// `ResolvePath`'s `alternate`, advertised by `apm`: how many LAP exchanges a session may
/// have at once).
pub const VERSION: u32 = 2;

/// A request of a client, with the number its answer ([`DaemonMsg::Reply`]) carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientMsg {
    /// Chosen by the client; echoed in the reply.
    pub seq: u64,
    /// What to do.
    pub op: Op,
}

/// What a client asks for. Every connection it names must be its own (one it connected, or
/// one whose REQ reached its listener); anything else is answered "no connection".
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// First message: the protocol version.
    Hello {
        /// [`VERSION`].
        version: u32,
        /// Asks for the daemon's CM address in the reply ([`WireResult::Hello`]; without it,
        /// [`WireResult::Ok`]). Left out when false; a daemon that predates it ignores it and
        /// answers [`WireResult::Ok`].
        #[serde(default, skip_serializing_if = "is_false")]
        addr: bool,
    },
    /// `Cm::connect`, `Cm::start_connect`, `Cm::connect_manual`.
    Connect {
        /// The parameters.
        params: WireConnect,
    },
    /// `Cm::listen`. A service ID another client listens on is refused.
    Listen {
        /// Service ID.
        service_id: u64,
        /// Accepted transports (raw `ReqTransport` numbers: 0 RC, 1 UC, 2 XRC); empty: any.
        transports: Vec<u8>,
    },
    /// A `Listener` dropped.
    Unlisten {
        /// Service ID.
        service_id: u64,
    },
    /// `Incoming::accept`.
    Accept {
        /// Connection.
        conn: u32,
        /// The parameters.
        params: WireAccept,
    },
    /// `Incoming::reject`, `PendingConnection::reject`.
    Reject {
        /// Connection.
        conn: u32,
        /// REJ reason.
        reason: u16,
        /// ARI.
        ari: Vec<u8>,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// `PendingConnection::establish` (the RTU).
    Establish {
        /// Connection.
        conn: u32,
        /// RTU private data.
        private_data: Vec<u8>,
    },
    /// `Incoming::mra`.
    Mra {
        /// Connection.
        conn: u32,
        /// Service timeout exponent.
        service_timeout: u8,
    },
    /// `Connection::disconnect`.
    Disconnect {
        /// Connection.
        conn: u32,
        /// DREQ private data.
        private_data: Vec<u8>,
    },
    /// An `Incoming` dropped unanswered (REJ 28).
    Unanswered {
        /// Connection.
        conn: u32,
    },
    /// A `PendingConnection` dropped (REJ of the REP).
    PendingDropped {
        /// Connection.
        conn: u32,
    },
    /// `Cm::random_psn`.
    RandomPsn,
    /// `Cm::connection_count`: this client's connections.
    Len,
    /// `Cm::listen_stateless`: [`Op::Listen`], and under pressure the daemon's endpoint
    /// answers this listener's REQs from `template` without keeping state
    /// (docs/protocol.md §5.12); a connection established that way reaches the client as
    /// [`DaemonMsg::Stateless`].
    ListenStateless {
        /// Service ID.
        service_id: u64,
        /// Accepted transports (as [`Op::Listen`]).
        transports: Vec<u8>,
        /// The REP template and its QPN range.
        template: WireStateless,
    },
    /// Serve XRC REQs for `service_id` as an XRC target of this client: the daemon creates or
    /// attaches the TGT QPs, with `policy` for the ones it creates.
    XrcListen {
        /// Service ID.
        service_id: u64,
        /// `explicit`, `domain`, `process` or `shared`.
        policy: String,
        /// The SRQ numbers announced in the REP (1..=47).
        srqns: Vec<u32>,
        /// A domain the client opened through [`Op::Keeper`] (or was admitted to, by the
        /// keeper's rules): the service's TGT QPs are that domain's. Absent: a domain the
        /// daemon chooses for the policy.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        domain: Option<String>,
        /// With `domain`: the TGT QP (of that domain, one the client may register on) that
        /// answers the REQs in mode `any`; its connections do not register on it (the
        /// processes holding it decide its life).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tgt_qpn: Option<u32>,
    },
    /// One request of the XRC keeper's protocol (`ibcm_xrc::keeper::proto::Request`: open or
    /// close a domain by name, create a TGT QP, register, unregister, modify, query, destroy,
    /// adopt, status, leaks), served by the daemon on the registry its XRC target answers
    /// REQs from, with the keeper's authorization rules. Answer [`WireResult::Keeper`].
    Keeper {
        /// The request (the keeper's JSON object, `op` and its fields).
        req: serde_json::Value,
    },
    /// Stop serving XRC REQs for `service_id`.
    XrcUnlisten {
        /// Service ID.
        service_id: u64,
    },
    /// Destroy every TGT QP this client owns (the owner's destroy: its connections get the
    /// "target gone (owner destroyed it)" DREQ; for `Shared` QPs the client's registration
    /// is dropped instead). The answer's value is the number of QPs.
    XrcDestroy,
    /// List the TGT QPs without a living owner (Explicit and DomainBound orphans) and the
    /// leaks (live TGT QPs nobody uses): read only, for everyone. Answer
    /// [`WireResult::XrcQps`].
    XrcOrphans,
    /// Destroy orphaned TGT QPs (owner gone, not `Shared`) of this client's user (root: of
    /// any user): every one, or the one named. The answer's value is the number destroyed;
    /// a named QP that is not such an orphan is refused.
    XrcReclaim {
        /// The QP, or `None` for all of them.
        #[serde(default)]
        qpn: Option<u32>,
    },
    /// `Cm::sidr`: the daemon's endpoint sends the SIDR_REQ; the reply ([`WireResult::Sidr`],
    /// [`WireResult::SidrTimedOut`]) comes when the SIDR_REP (or the timeout) does, after
    /// the replies of requests sent meanwhile.
    Sidr {
        /// The parameters.
        req: WireSidrReq,
    },
    /// `Incoming::sidr_reply` for a [`DaemonMsg::IncomingSidr`].
    SidrReply {
        /// The request ([`DaemonMsg::IncomingSidr::conn`]).
        conn: u32,
        /// The answer.
        rep: WireSidrRep,
    },
    /// `Cm::stats`: the daemon endpoint's counters (node-wide).
    Stats,
    /// `Cm::resolve_path`: the path from the daemon's InfiniBand port to `target`, asked of
    /// its SA; the reply ([`WireResult::Path`], [`WireResult::PathError`]) comes when the
    /// SA's answer does, after the replies of requests sent meanwhile. Sent only to a daemon
    /// whose hello answer said `paths`.
    ResolvePath {
        /// `lid:N` or `gid:G`.
        target: WirePathTarget,
        /// Also an alternate path ([`WireResult::Path::alternate`]): among the paths a
        /// GetTable by SGID/DGID (NumbPath 4) returns, the first with another SLID and
        /// another DLID than the primary's. Left out when false; sent only to a daemon whose
        /// hello answer said `apm`.
        #[serde(default, skip_serializing_if = "is_false")]
        alternate: bool,
    },
    /// `Connection::load_alt_path`: the daemon's endpoint sends a LAP proposing a path as the
    /// connection's alternate one; the reply ([`WireResult::Apr`] whatever its status,
    /// [`WireResult::LapTimedOut`]) comes when the APR (or the LAP's last timeout) does, so
    /// after the replies of requests sent meanwhile; refused at once with a
    /// [`WireResult::CallError`] (not established, a LAP exchange under way) or
    /// [`WireResult::Refused`] (quota). Sent only to a daemon whose hello answer said `apm`.
    LoadAltPath {
        /// Connection.
        conn: u32,
        /// A LAP body (232 bytes, [`lap_body`]) carrying the path, written from this side's
        /// view (`local_*` is this side's port), and the private data; the daemon's endpoint
        /// fills in the rest.
        lap: Vec<u8>,
    },
    /// `Cm::set_lap_policy`: with `application`, the LAPs that arrive on this client's
    /// connections (those it has and those it will have) come to it as [`DaemonMsg::Lap`],
    /// to be answered with [`Op::Apr`] (or [`Op::Mra`] first); without, the daemon's endpoint
    /// answers them "unsupported" (the default), and the LAPs delivered and not answered
    /// yet are answered "unsupported" at once. Sent only to a daemon whose hello answer said
    /// `apm`.
    LapPolicy {
        /// Whether this client answers its LAPs.
        application: bool,
    },
    /// `LapRequest::accept`, `LapRequest::reject` (or one dropped): the APR for the LAP of
    /// `conn` that a [`DaemonMsg::Lap`] delivered. Sent only to a daemon whose hello answer
    /// said `apm`.
    Apr {
        /// Connection.
        conn: u32,
        /// The APR's status, additional information and private data.
        apr: WireApr,
    },
    /// `Connection::notify_path_migrated`: the connection's QP has migrated to its alternate
    /// path. Sent only to a daemon whose hello answer said `apm`.
    PathMigrated {
        /// Connection.
        conn: u32,
    },
}

/// What the daemon sends: replies, and events about the client's own objects.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum DaemonMsg {
    /// The answer to request `seq`.
    Reply {
        /// The request's number.
        seq: u64,
        /// The answer.
        result: WireResult,
    },
    /// A REQ for a service the client listens on: a new connection of the client.
    Incoming {
        /// The listener's service ID.
        service_id: u64,
        /// The new connection.
        conn: u32,
        /// The REQ.
        req: WireReq,
    },
    /// The REP of an active connection of the client arrived.
    Rep {
        /// Connection.
        conn: u32,
        /// The REP.
        rep: WireRep,
    },
    /// A connection of the client changed status.
    Status {
        /// Connection.
        conn: u32,
        /// The new status.
        status: WireStatus,
        /// With [`WireStatus::Established`] on the passive side: the private data of the RTU
        /// that established it (trailing zeros trimmed; `Connection::rtu_private_data`).
        /// Left out when empty; a decoder that predates it ignores it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rtu_private_data: Vec<u8>,
    },
    /// A SIDR_REQ for a service the client listens on.
    IncomingSidr {
        /// The listener's service ID.
        service_id: u64,
        /// The request's number (for [`Op::SidrReply`] / [`Op::Unanswered`]).
        conn: u32,
        /// The request.
        req: WireSidrIn,
    },
    /// A connection established statelessly for one of the client's stateless listeners
    /// ([`Op::ListenStateless`]): a new established connection of the client.
    Stateless {
        /// The listener's service ID.
        service_id: u64,
        /// The connection.
        conn: u32,
        /// Its REQ, REP and RTU.
        info: WireStatelessInfo,
    },
    /// Something the daemon's XRC target did on one of the client's XRC services.
    XrcEvent {
        /// Service ID.
        service_id: u64,
        /// One line, for logs.
        text: String,
    },
    /// An event of the keeper's protocol (`ibcm_xrc::keeper::proto::KeeperEvent`: a TGT QP
    /// gone, orphaned), for a client that used [`Op::Keeper`].
    KeeperEvent {
        /// The event (the keeper's JSON object).
        event: serde_json::Value,
    },
    /// A LAP arrived on one of the client's connections, and the client answers its LAPs
    /// ([`Op::LapPolicy`]): answer it with [`Op::Apr`] ([`Op::Mra`] asks the peer for more
    /// time). One at a time per connection: the next comes once this one is answered.
    Lap {
        /// Connection.
        conn: u32,
        /// A LAP body (232 bytes, [`parse_lap_body`]) carrying the proposed path, as the LAP
        /// did (the sender's view: `local_*` is the peer's port), and its private data
        /// (trailing zeros trimmed); its other fields 0.
        lap: Vec<u8>,
    },
}

pub(super) fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The answer to a [`ClientMsg`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "r", rename_all = "kebab-case")]
pub enum WireResult {
    /// Done, nothing to return.
    Ok,
    /// The answer to an [`Op::Hello`] that asked for the daemon's address.
    Hello {
        /// The IP address of the daemon's CM (`ibcmd --addr`), when the daemon was told it:
        /// its peers are of that address family.
        #[serde(default)]
        addr: Option<std::net::IpAddr>,
        /// The daemon answers [`Op::ResolvePath`] (whether or not it is on an InfiniBand
        /// port: on another, the answer says so), at most this many of a session in flight
        /// (`ServerConfig::max_path_queries`; a client keeps its own below it). Left out
        /// when 0, and absent from an older daemon's answer: not served.
        #[serde(default, skip_serializing_if = "is_zero")]
        paths: u32,
        /// The daemon serves path migration ([`Op::LoadAltPath`], [`Op::LapPolicy`],
        /// [`Op::Apr`], [`Op::PathMigrated`], [`DaemonMsg::Lap`], `ResolvePath`'s
        /// `alternate`), with at most this many LAP exchanges of a session at once (its LAPs
        /// waiting for their APR and the LAPs delivered to it unanswered;
        /// `ServerConfig::max_laps`). Left out when 0, and absent from an older daemon's
        /// answer: not served.
        #[serde(default, skip_serializing_if = "is_zero")]
        apm: u32,
    },
    /// A new connection (connect).
    Conn {
        /// Its ID.
        conn: u32,
        /// The REQ body as the daemon's endpoint sent it (232 bytes: with the start PSN it
        /// drew), for the client's `qp_attr`.
        #[serde(default)]
        req: Vec<u8>,
    },
    /// A number (random PSN, count).
    Value {
        /// The number.
        value: u64,
    },
    /// `ConnectError`.
    ConnectError(WireConnectError),
    /// `CallError`.
    CallError(WireCallError),
    /// `ConnectionError` (the connection is closed already).
    Closed(WireConnError),
    /// The answer to [`Op::Sidr`] (any status).
    Sidr(WireSidrRep),
    /// [`Op::Sidr`]: no SIDR_REP after every retry.
    SidrTimedOut,
    /// [`Op::Stats`].
    Stats(Box<WireStats>),
    /// [`Op::Keeper`]: the keeper's reply (`ibcm_xrc::keeper::proto::Reply`: `ok`, and
    /// `result` or `error` with its `kind`).
    Keeper {
        /// The reply.
        reply: serde_json::Value,
    },
    /// [`Op::ResolvePath`]: the PathRecord (its 64 bytes, as the SA sent it).
    Path {
        /// `PathRecord::to_bytes`.
        record: Vec<u8>,
        /// With `alternate` asked for: the alternate path's record, when the SA has one
        /// (another SLID and DLID). Left out when there is none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alternate: Option<Vec<u8>>,
    },
    /// [`Op::LoadAltPath`]: the APR arrived (any status: 0 is "path loaded").
    Apr(WireApr),
    /// [`Op::LoadAltPath`]: no APR after the LAP's last retry (the connection stays).
    LapTimedOut,
    /// [`Op::ResolvePath`]: no path, and why.
    PathError(WirePathError),
    /// [`Op::XrcOrphans`].
    XrcQps {
        /// The QPs.
        qps: Vec<WireTgtQp>,
    },
    /// The daemon refused the request (ownership, quota, bad parameters, protocol).
    Refused {
        /// Why.
        why: String,
    },
}

/// A TGT QP in [`WireResult::XrcQps`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireTgtQp {
    /// QP number.
    pub qpn: u32,
    /// Its XRC domain's name.
    pub domain: String,
    /// Its policy (`explicit`, `domain`, `process`, `shared`).
    pub policy: String,
    /// The user of the client that created it, if the daemon knows.
    pub uid: Option<u32>,
    /// Connections on it.
    pub conns: u32,
    /// Its owner is gone (an orphan, kept by its policy).
    pub orphan: bool,
    /// Nobody uses it: no owner, no registration, no connection.
    pub leak: bool,
}

/// A service ID from the wire.
pub(crate) fn sid(v: u64) -> ServiceId {
    ServiceId(v)
}

/// A timeout exponent from the wire (masked to 5 bits).
pub(crate) fn texp(v: u8) -> TimeoutExp {
    TimeoutExp::masked(v)
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The socket failed or closed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The length prefix is above [`MAX_FRAME`].
    #[error("frame of {0} bytes is above the {MAX_FRAME}-byte limit")]
    TooLong(usize),
    /// Not a message of this protocol.
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Reads one frame and decodes it.
///
/// # Errors
/// [`FrameError`]; an end of stream is `Io(UnexpectedEof)`.
pub async fn read_frame<T, R>(r: &mut R) -> Result<T, FrameError>
where
    T: for<'de> Deserialize<'de>,
    R: AsyncRead + Unpin,
{
    let len = r.read_u32().await? as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLong(len));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    Ok(serde_json::from_slice(&buf)?)
}

/// Encodes a message as one frame.
///
/// # Errors
/// A message above [`MAX_FRAME`] (none of this protocol's are).
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let json = serde_json::to_vec(msg)?;
    if json.len() > MAX_FRAME {
        return Err(FrameError::TooLong(json.len()));
    }
    let len = u32::try_from(json.len()).map_err(|_| FrameError::TooLong(json.len()))?;
    let mut out = Vec::with_capacity(4 + json.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Writes one encoded frame.
///
/// # Errors
/// The socket's error.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> std::io::Result<()> {
    w.write_all(frame).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_refuse_oversized_lengths() {
        let f = encode_frame(&ClientMsg {
            seq: 7,
            op: Op::RandomPsn,
        })
        .unwrap();
        let m: ClientMsg = read_frame(&mut &f[..]).await.unwrap();
        assert_eq!(m.seq, 7);
        let big = (MAX_FRAME as u32 + 1).to_be_bytes();
        let r = read_frame::<ClientMsg, _>(&mut &big[..]).await;
        assert!(matches!(r, Err(FrameError::TooLong(_))));
        let junk = [0, 0, 0, 2, b'{', b'x'];
        let r = read_frame::<ClientMsg, _>(&mut &junk[..]).await;
        assert!(matches!(r, Err(FrameError::Malformed(_))));
    }

    /// A path query and its answers as frames: round trips, and the JSON the docs show.
    #[tokio::test]
    async fn path_queries_round_trip() {
        let op = ClientMsg {
            seq: 9,
            op: Op::ResolvePath {
                target: WirePathTarget::Lid(4),
                alternate: false,
            },
        };
        assert_eq!(
            serde_json::to_string(&op).unwrap(),
            r#"{"seq":9,"op":{"op":"resolve-path","target":{"lid":4}}}"#
        );
        let f = encode_frame(&op).unwrap();
        let back: ClientMsg = read_frame(&mut &f[..]).await.unwrap();
        assert!(matches!(
            back.op,
            Op::ResolvePath {
                target: WirePathTarget::Lid(4),
                alternate: false
            }
        ));
        let rec = ibcm_mad::sa::PathRecord {
            slid: ibcm_mad::Lid(2),
            dlid: ibcm_mad::Lid(4),
            ..Default::default()
        };
        let reply = DaemonMsg::Reply {
            seq: 9,
            result: WireResult::Path {
                record: rec.to_bytes().to_vec(),
                alternate: None,
            },
        };
        let f = encode_frame(&reply).unwrap();
        let back: DaemonMsg = read_frame(&mut &f[..]).await.unwrap();
        let DaemonMsg::Reply {
            result: WireResult::Path { record, alternate },
            ..
        } = back
        else {
            panic!("{back:?}");
        };
        assert_eq!(ibcm_mad::sa::PathRecord::parse(&record).unwrap(), rec);
        assert_eq!(alternate, None);
        let e = WireResult::PathError(WirePathError::SaTimeout { attempts: 4 });
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"r":"path-error","kind":"sa-timeout","attempts":4}"#
        );
        // A target the frame cannot hold is malformed, not a panic.
        let junk = br#"{"seq":1,"op":{"op":"resolve-path","target":{"lid":70000}}}"#;
        let mut f = (junk.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(junk);
        let r = read_frame::<ClientMsg, _>(&mut &f[..]).await;
        assert!(matches!(r, Err(FrameError::Malformed(_))));
    }

    /// The fields added within version 2 are optional both ways: left out when empty or
    /// false, and messages without them (as before) decode.
    #[test]
    fn added_fields_are_optional() {
        let hello = |addr| {
            serde_json::to_string(&Op::Hello {
                version: VERSION,
                addr,
            })
            .unwrap()
        };
        assert_eq!(hello(false), r#"{"op":"hello","version":2}"#);
        assert_eq!(hello(true), r#"{"op":"hello","version":2,"addr":true}"#);
        let op: Op = serde_json::from_str(r#"{"op":"hello","version":2}"#).unwrap();
        assert!(matches!(op, Op::Hello { addr: false, .. }));
        let r: WireResult = serde_json::from_str(r#"{"r":"hello","addr":"fd00::1"}"#).unwrap();
        assert!(matches!(r, WireResult::Hello { addr: Some(a), paths: 0, apm: 0 } if a.is_ipv6()));
        let r: WireResult = serde_json::from_str(r#"{"r":"hello"}"#).unwrap();
        assert!(matches!(r, WireResult::Hello { addr: None, .. }));
        let h = |paths, apm| {
            serde_json::to_string(&WireResult::Hello {
                addr: None,
                paths,
                apm,
            })
            .unwrap()
        };
        assert_eq!(h(0, 0), r#"{"r":"hello","addr":null}"#);
        assert_eq!(h(64, 0), r#"{"r":"hello","addr":null,"paths":64}"#);
        assert_eq!(
            h(64, 1024),
            r#"{"r":"hello","addr":null,"paths":64,"apm":1024}"#
        );
        let r: WireResult = serde_json::from_str(&h(64, 0)).unwrap();
        assert!(matches!(
            r,
            WireResult::Hello {
                paths: 64,
                apm: 0,
                ..
            }
        ));
        let r: WireResult = serde_json::from_str(&h(64, 1024)).unwrap();
        assert!(matches!(
            r,
            WireResult::Hello {
                paths: 64,
                apm: 1024,
                ..
            }
        ));

        let est = |pd: Vec<u8>| DaemonMsg::Status {
            conn: 3,
            status: WireStatus::Established,
            rtu_private_data: pd,
        };
        let plain = serde_json::to_string(&est(Vec::new())).unwrap();
        assert!(!plain.contains("rtu_private_data"), "{plain}");
        let m: DaemonMsg = serde_json::from_str(&plain).unwrap();
        assert!(
            matches!(m, DaemonMsg::Status { rtu_private_data, .. } if rtu_private_data.is_empty())
        );
        let with = serde_json::to_string(&est(b"go".to_vec())).unwrap();
        let m: DaemonMsg = serde_json::from_str(&with).unwrap();
        assert!(
            matches!(m, DaemonMsg::Status { rtu_private_data, .. } if rtu_private_data == b"go")
        );
    }
    /// Path migration's ops, event and answers as frames: round trips, the JSON the docs
    /// show, the fields added to `resolve-path` optional both ways, and what an older peer
    /// sent still decoding.
    #[tokio::test]
    async fn path_migration_round_trips() {
        async fn back<T: Serialize + for<'de> Deserialize<'de>>(m: &T) -> T {
            let f = encode_frame(m).unwrap();
            read_frame(&mut &f[..]).await.unwrap()
        }
        let path = ibcm_mad::PathInfo {
            local_lid: ibcm_mad::Lid(3),
            remote_lid: ibcm_mad::Lid(7),
            sl: ibcm_mad::U4::masked(2),
            local_ack_timeout: ibcm_mad::TimeoutExp::masked(18),
            ..ibcm_mad::PathInfo::default()
        };
        let lap = lap_body(&path, b"pd").unwrap();
        let op = ClientMsg {
            seq: 3,
            op: Op::LoadAltPath {
                conn: 9,
                lap: lap.clone(),
            },
        };
        let json = serde_json::to_string(&op).unwrap();
        assert!(
            json.starts_with(r#"{"seq":3,"op":{"op":"load-alt-path","conn":9,"lap":[0,"#),
            "{json}"
        );
        let Op::LoadAltPath { conn: 9, lap: l } = back(&op).await.op else {
            panic!("{json}");
        };
        assert_eq!(parse_lap_body(&l), Ok((path, b"pd".to_vec())));
        for (op, want) in [
            (
                Op::LapPolicy { application: true },
                r#"{"op":"lap-policy","application":true}"#,
            ),
            (
                Op::PathMigrated { conn: 9 },
                r#"{"op":"path-migrated","conn":9}"#,
            ),
            (
                Op::Apr {
                    conn: 9,
                    apr: WireApr {
                        status: 3,
                        additional_info: vec![1],
                        private_data: vec![2],
                    },
                },
                r#"{"op":"apr","conn":9,"apr":{"status":3,"additional_info":[1],"private_data":[2]}}"#,
            ),
            (
                Op::ResolvePath {
                    target: WirePathTarget::Lid(4),
                    alternate: true,
                },
                r#"{"op":"resolve-path","target":{"lid":4},"alternate":true}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&op).unwrap(), want);
            let m = back(&ClientMsg { seq: 1, op }).await;
            assert_eq!(serde_json::to_string(&m.op).unwrap(), want);
        }
        // `alternate` is left out when false, and a request without it asks for none.
        let op: Op = serde_json::from_str(r#"{"op":"resolve-path","target":{"lid":4}}"#).unwrap();
        assert!(matches!(
            op,
            Op::ResolvePath {
                alternate: false,
                ..
            }
        ));
        // The event and the answers.
        let ev = DaemonMsg::Lap {
            conn: 9,
            lap: lap.clone(),
        };
        let DaemonMsg::Lap { conn: 9, lap: l } = back(&ev).await else {
            panic!("{ev:?}");
        };
        assert_eq!(l, lap);
        let json = serde_json::to_string(&WireResult::LapTimedOut).unwrap();
        assert_eq!(json, r#"{"r":"lap-timed-out"}"#);
        let apr = WireResult::Apr(WireApr::bare(ibcm_mad::AprStatus::Success));
        assert_eq!(
            serde_json::to_string(&apr).unwrap(),
            r#"{"r":"apr","status":0,"additional_info":[],"private_data":[]}"#
        );
        let rec = ibcm_mad::sa::PathRecord {
            slid: ibcm_mad::Lid(2),
            dlid: ibcm_mad::Lid(4),
            ..Default::default()
        };
        let two = WireResult::Path {
            record: rec.to_bytes().to_vec(),
            alternate: Some(rec.to_bytes().to_vec()),
        };
        let WireResult::Path {
            alternate: Some(a), ..
        } = back(&DaemonMsg::Reply {
            seq: 1,
            result: two,
        })
        .await
        .into_result()
        else {
            panic!("no alternate");
        };
        assert_eq!(ibcm_mad::sa::PathRecord::parse(&a).unwrap(), rec);
        // An older daemon's answer has no `alternate`.
        let r: WireResult = serde_json::from_str(r#"{"r":"path","record":[]}"#).unwrap();
        assert!(matches!(
            r,
            WireResult::Path {
                alternate: None,
                ..
            }
        ));
        // A malformed LAP body is refused by its parser, not a panic.
        assert!(parse_lap_body(&[0; 12]).is_err());
    }

    impl DaemonMsg {
        fn into_result(self) -> WireResult {
            match self {
                DaemonMsg::Reply { result, .. } => result,
                other => panic!("{other:?}"),
            }
        }
    }
}
