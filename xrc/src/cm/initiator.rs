//! The initiator side: [`xrc_connect_params`], [`IniOutcome`], [`XrcInitiator`] (module docs
//! of [`crate::cm`]).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Instant;

use ibcm::proto::{
    ConnId, ConnectError, ConnectParams, ConnectionError, Endpoint, Event, EventKind, PeerAddr,
    RepInfo,
};
use ibcm_mad::{Qpn, RejReason, ServiceId};

use crate::types::SrqNum;
use ibcm_mad::xrc::{GoneCause, RejectKind, TargetGone, XrcDataError, XrcRepData, XrcReqData};

/// Parameters for an XRC REQ from INI QP `ini_qpn`: transport XRC, [`XrcReqData`] followed by
/// `app` as private data, the INI QP shareable by several connections
/// (`allow_shared_qpn`), responder resources 0 and `auto_rtu` off (handle
/// `EventKind::RepReceived` — [`IniRep::from_rep_info`] — then `Endpoint::establish`).
///
/// # Errors
/// [`XrcDataError::TooLong`] when `app` does not fit.
pub fn xrc_connect_params(
    peer: impl Into<PeerAddr>,
    service_id: ServiceId,
    ini_qpn: Qpn,
    data: &XrcReqData,
    app: &[u8],
) -> Result<ConnectParams, XrcDataError> {
    let mut p = ConnectParams::new(peer, service_id, ini_qpn).xrc();
    p.private_data = data.emit(app, p.max_private_data())?;
    p.allow_shared_qpn = true;
    p.responder_resources = 0;
    p.auto_rtu = false;
    Ok(p)
}

/// What an initiator reads from an XRC REP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IniRep {
    /// The TGT QPN (the REP's Local EECN).
    pub tgt_qpn: Qpn,
    /// The ibcm XRC private data, if the target sent it.
    pub data: Option<XrcRepData>,
    /// The SRQN `rdma_xserver` style (the first 4 bytes), when `data` is absent.
    pub compat_srqn: Option<SrqNum>,
}

impl IniRep {
    /// Reads a REP as delivered with `EventKind::RepReceived`.
    pub fn from_rep_info(rep: &RepInfo) -> Self {
        let pd = rep.rep.private_data.as_bytes();
        Self {
            tgt_qpn: rep.remote_qpn,
            data: XrcRepData::parse(pd).ok().map(|(d, _)| d),
            compat_srqn: XrcRepData::first_srqn_compat(pd),
        }
    }

    /// The SRQNs to send to.
    pub fn srqns(&self) -> Vec<SrqNum> {
        match &self.data {
            Some(d) => d.srqns.clone(),
            None => self.compat_srqn.into_iter().collect(),
        }
    }
}

/// How the initiator learned that its TGT QP is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoneSignal {
    /// A REJ reason 1 with the block (a REQ named a gone QP, or the QP went during setup).
    Rej,
    /// A DREQ from the target with the block in its private data.
    Dreq,
}

/// How an XRC connection ended, as the initiator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IniOutcome {
    /// The TGT QP is gone: drop the cached TGT QPN and connect anew (mode any/create).
    TargetGone {
        /// Why it went.
        cause: GoneCause,
        /// The QP named.
        qpn: Option<Qpn>,
        /// REJ or DREQ.
        by: GoneSignal,
    },
    /// Any other REJ: the target refused.
    Refused {
        /// The REJ reason.
        reason: RejReason,
        /// The XRC block, if the REJ carried one (attach refused, no resources).
        info: Option<TargetGone>,
    },
    /// Disconnected without target-gone information.
    Disconnected {
        /// Whether the target sent the DREQ.
        by_peer: bool,
    },
    /// Anything else (timeouts, stale, local aborts).
    Failed(ConnectionError),
}

impl IniOutcome {
    /// Sorts a REJ: reason 1 whose ARI (or, for rdma_cm peers, private data) is a
    /// [`TargetGone`] block of kind 01 is "target gone"; everything else is "refused".
    pub fn from_rej(reason: RejReason, ari: &[u8], private_data: &[u8]) -> Self {
        let info = TargetGone::parse(ari).or_else(|| TargetGone::parse(private_data));
        match info {
            Some(TargetGone {
                kind: RejectKind::Gone(cause),
                qpn,
            }) if reason == RejReason::NoQp => Self::TargetGone {
                cause,
                qpn,
                by: GoneSignal::Rej,
            },
            info => Self::Refused { reason, info },
        }
    }

    /// Sorts any close.
    pub fn from_close(error: &ConnectionError) -> Self {
        match error {
            ConnectionError::Rejected {
                reason,
                ari,
                private_data,
            } => Self::from_rej(*reason, ari, private_data),
            ConnectionError::Disconnected {
                by_peer,
                private_data,
            } => match TargetGone::parse(private_data) {
                Some(TargetGone {
                    kind: RejectKind::Gone(cause),
                    qpn,
                }) if *by_peer => Self::TargetGone {
                    cause,
                    qpn,
                    by: GoneSignal::Dreq,
                },
                _ => Self::Disconnected { by_peer: *by_peer },
            },
            other => Self::Failed(other.clone()),
        }
    }

    /// Whether the TGT QP is gone.
    pub fn is_target_gone(&self) -> bool {
        matches!(self, Self::TargetGone { .. })
    }
}

impl fmt::Display for IniOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TargetGone { cause, qpn, by } => {
                let by = match by {
                    GoneSignal::Rej => "REJ",
                    GoneSignal::Dreq => "DREQ",
                };
                write!(f, "target gone ({cause})")?;
                if let Some(q) = qpn {
                    write!(f, " qpn {q}")?;
                }
                write!(f, " [{by}]")
            }
            Self::Refused { reason, info } => {
                write!(f, "refused: REJ {} ({reason})", reason.raw())?;
                if let Some(i) = info {
                    write!(f, ", {i}")?;
                }
                Ok(())
            }
            Self::Disconnected { by_peer: true } => f.write_str("disconnected by the target"),
            Self::Disconnected { by_peer: false } => f.write_str("disconnected"),
            Self::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

/// Called with each [`IniEvent`] as it happens.
pub type IniObserver = Box<dyn FnMut(Instant, IniEvent) + Send>;

/// The state of one initiator connection in an [`XrcInitiator`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IniState {
    /// REQ sent.
    Connecting,
    /// Established on this TGT QP.
    Established(IniRep),
    /// Closed.
    Closed {
        /// The REP, if one arrived.
        rep: Option<IniRep>,
        /// How it ended.
        outcome: IniOutcome,
    },
}

/// Something an [`XrcInitiator`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IniEvent {
    /// The REP arrived (the RTU went out unless held).
    Rep {
        /// The connection.
        conn: ConnId,
        /// What it said.
        rep: IniRep,
    },
    /// Established.
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// Closed.
    Closed {
        /// The connection.
        conn: ConnId,
        /// How.
        outcome: IniOutcome,
    },
}

/// The initiator side of XRC over ibcm: XRC REQs with [`XrcReqData`], REPs read for the TGT
/// QPN and SRQNs, closes sorted into [`IniOutcome`]. Sans-IO; an application of one
/// endpoint (feed it every event with [`XrcInitiator::handle_event`]), also as an
/// [`ibcm::App`].
#[derive(Default)]
pub struct XrcInitiator {
    conns: BTreeMap<ConnId, IniState>,
    hold_rtu: BTreeMap<ConnId, bool>,
    events: VecDeque<IniEvent>,
    observer: Option<IniObserver>,
}

impl fmt::Debug for XrcInitiator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcInitiator")
            .field("conns", &self.conns)
            .field("hold_rtu", &self.hold_rtu)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// The initiator as the endpoint's application ([`XrcInitiator::handle_event`]; events go to
/// the observer, if set, as they happen).
impl ibcm::App for XrcInitiator {
    fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, event: &Event) -> bool {
        let mine = XrcInitiator::handle_event(self, ep, now, event);
        if let Some(f) = self.observer.as_mut() {
            while let Some(e) = self.events.pop_front() {
                f(now, e);
            }
        }
        mine
    }
}

impl XrcInitiator {
    /// An initiator with no connections.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends an XRC REQ ([`xrc_connect_params`]).
    ///
    /// # Errors
    /// The endpoint's [`ConnectError`]; private data that does not fit is reported as
    /// [`ConnectError::PrivateDataTooLong`].
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        peer: impl Into<PeerAddr>,
        service_id: ServiceId,
        ini_qpn: Qpn,
        data: &XrcReqData,
        app: &[u8],
    ) -> Result<ConnId, ConnectError> {
        let p = xrc_connect_params(peer, service_id, ini_qpn, data, app).map_err(|_| {
            ConnectError::PrivateDataTooLong {
                len: XrcReqData::LEN.saturating_add(app.len()),
                max: ibcm_mad::Req::PRIVATE_DATA_LEN,
            }
        })?;
        self.connect_with(ep, now, p)
    }

    /// Sends a REQ with parameters made by [`xrc_connect_params`] (and adjusted).
    ///
    /// # Errors
    /// The endpoint's [`ConnectError`].
    pub fn connect_with(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        mut params: ConnectParams,
    ) -> Result<ConnId, ConnectError> {
        params.auto_rtu = false;
        let id = ep.connect(now, params)?;
        self.conns.insert(id, IniState::Connecting);
        Ok(id)
    }

    /// Do not send the RTU for `conn` when its REP arrives (tests: a peer that never
    /// completes the handshake).
    pub fn hold_rtu(&mut self, conn: ConnId) {
        self.hold_rtu.insert(conn, true);
    }

    /// Feeds one event of the endpoint; returns whether it concerned a connection of this
    /// initiator.
    pub fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, ev: &Event) -> bool {
        let conn = ev.conn;
        let Some(state) = self.conns.get_mut(&conn) else {
            return false;
        };
        match &ev.kind {
            EventKind::RepReceived(info) => {
                let rep = IniRep::from_rep_info(info);
                *state = IniState::Established(rep.clone());
                self.events.push_back(IniEvent::Rep { conn, rep });
                if !self.hold_rtu.contains_key(&conn) {
                    let _ = ep.establish(now, conn, &[]);
                }
            }
            EventKind::Established => {
                if let IniState::Connecting = state {
                    let rep = IniRep {
                        tgt_qpn: ep.remote_qpn(conn).unwrap_or_default(),
                        data: None,
                        compat_srqn: None,
                    };
                    *state = IniState::Established(rep);
                }
                self.events.push_back(IniEvent::Established { conn });
            }
            EventKind::Closed(e) => {
                let outcome = IniOutcome::from_close(e);
                let rep = match std::mem::replace(state, IniState::Connecting) {
                    IniState::Established(r) => Some(r),
                    IniState::Closed { rep, .. } => rep,
                    IniState::Connecting => None,
                };
                *state = IniState::Closed {
                    rep,
                    outcome: outcome.clone(),
                };
                self.hold_rtu.remove(&conn);
                self.events.push_back(IniEvent::Closed { conn, outcome });
            }
            _ => {}
        }
        true
    }

    /// A connection's state.
    pub fn state(&self, conn: ConnId) -> Option<&IniState> {
        self.conns.get(&conn)
    }

    /// The REP of a connection (once it arrived; kept after the close).
    pub fn rep(&self, conn: ConnId) -> Option<&IniRep> {
        match self.conns.get(&conn)? {
            IniState::Established(r) => Some(r),
            IniState::Closed { rep, .. } => rep.as_ref(),
            IniState::Connecting => None,
        }
    }

    /// How a connection ended, once it did.
    pub fn outcome(&self, conn: ConnId) -> Option<&IniOutcome> {
        match self.conns.get(&conn)? {
            IniState::Closed { outcome, .. } => Some(outcome),
            _ => None,
        }
    }

    /// Whether `conn` is established.
    pub fn is_established(&self, conn: ConnId) -> bool {
        matches!(self.conns.get(&conn), Some(IniState::Established(_)))
    }

    /// Forgets closed connections: their REPs and outcomes, kept after the close so that the
    /// application can read why a connection ended ([`XrcInitiator::outcome`]). A
    /// long-running initiator calls this once it has read them, or its table grows by one
    /// entry per connection it ever made.
    pub fn forget_closed(&mut self) {
        self.conns
            .retain(|_, s| !matches!(s, IniState::Closed { .. }));
    }

    /// The next event (none when an observer is set and the initiator runs as an app).
    pub fn poll_event(&mut self) -> Option<IniEvent> {
        self.events.pop_front()
    }

    /// Hands every [`IniEvent`] to `f` as it happens when the initiator runs as an
    /// [`ibcm::App`], instead of leaving them for [`XrcInitiator::poll_event`].
    pub fn set_observer(&mut self, f: IniObserver) {
        self.observer = Some(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibcm_mad::xrc::ReqMode;
    use ibcm_mad::ReqTransport;

    fn qpn(n: u32) -> Qpn {
        Qpn::new(n).unwrap()
    }

    #[test]
    fn rej_with_the_block_is_target_gone_even_trimmed() {
        let b = TargetGone::gone(GoneCause::DomainClosed, qpn(0x4800)).to_bytes();
        let want = IniOutcome::TargetGone {
            cause: GoneCause::DomainClosed,
            qpn: Some(qpn(0x4800)),
            by: GoneSignal::Rej,
        };
        assert_eq!(IniOutcome::from_rej(RejReason::NoQp, &b, &b), want);
        // rdma_cm peers see no ARI; the CM trims trailing zeros of the private data.
        let trimmed = b.get(..10).unwrap();
        assert_eq!(IniOutcome::from_rej(RejReason::NoQp, &[], trimmed), want);
    }

    #[test]
    fn other_rejs_are_refusals() {
        let gone = TargetGone::gone(GoneCause::OwnerDestroyed, qpn(0x48)).to_bytes();
        // The block with another reason is not "gone".
        assert!(matches!(
            IniOutcome::from_rej(RejReason::ConsumerReject, &gone, &[]),
            IniOutcome::Refused {
                reason: RejReason::ConsumerReject,
                info: Some(_)
            }
        ));
        let refused = TargetGone {
            kind: RejectKind::AttachRefused,
            qpn: Some(qpn(0x48)),
        };
        assert!(matches!(
            IniOutcome::from_rej(refused.reason(), &refused.to_bytes(), &[]),
            IniOutcome::Refused {
                info: Some(TargetGone {
                    kind: RejectKind::AttachRefused,
                    ..
                }),
                ..
            }
        ));
        // Foreign bytes, empty, garbage: never a panic, always "refused".
        for ari in [
            &[][..],
            &[0x58, 0x52][..],
            &[0xff; 72][..],
            b"XRC\x01\x01\x09",
        ] {
            assert!(!IniOutcome::from_rej(RejReason::NoQp, ari, ari).is_target_gone());
        }
    }

    #[test]
    fn dreq_with_the_block_is_target_gone() {
        let b = TargetGone::gone(GoneCause::KeeperLost, qpn(0x49)).to_bytes();
        let e = ConnectionError::Disconnected {
            by_peer: true,
            private_data: b.get(..11).unwrap().to_vec(),
        };
        assert_eq!(
            IniOutcome::from_close(&e),
            IniOutcome::TargetGone {
                cause: GoneCause::KeeperLost,
                qpn: Some(qpn(0x49)),
                by: GoneSignal::Dreq
            }
        );
        let plain = ConnectionError::Disconnected {
            by_peer: true,
            private_data: vec![],
        };
        assert_eq!(
            IniOutcome::from_close(&plain),
            IniOutcome::Disconnected { by_peer: true }
        );
        assert_eq!(
            IniOutcome::from_close(&ConnectionError::TimedOut),
            IniOutcome::Failed(ConnectionError::TimedOut)
        );
    }

    #[test]
    fn connect_params_are_xrc_ini() {
        let peer: PeerAddr = "127.0.0.2:4791"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into();
        let p = xrc_connect_params(
            peer,
            ServiceId(1),
            qpn(0x99),
            &XrcReqData::attach(qpn(0x48)),
            b"app",
        )
        .unwrap();
        assert_eq!(p.transport, ReqTransport::Xrc);
        assert!(p.allow_shared_qpn && !p.auto_rtu);
        let (d, app) = XrcReqData::parse(&p.private_data).unwrap();
        assert_eq!(d.mode, ReqMode::Attach(qpn(0x48)));
        assert_eq!(app, b"app");
        assert!(xrc_connect_params(
            peer,
            ServiceId(1),
            qpn(0x99),
            &XrcReqData::any(None),
            &[0; 90]
        )
        .is_err());
    }
}
