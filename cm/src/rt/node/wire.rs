//! The node protocol's parameters and messages: [`ConnectParams`] and [`AcceptParams`] as
//! the REQ and REP bodies that carry them, a received REQ or REP as its body, a [`PeerAddr`].

use std::net::SocketAddr;

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{AttrId, CmMessage, Gid, Lid, Qkey, Qpn, Rep, Req, MAD_DATA_LEN};
use serde::{Deserialize, Serialize};

use crate::proto::{
    AcceptParams, ConnectParams, IbAddr, PeerAddr, RepInfo, ReqInfo, StatelessAccept, StatelessInfo,
};

/// A [`PeerAddr`] on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WirePeer {
    /// `PeerAddr::Udp`.
    Udp(SocketAddr),
    /// `PeerAddr::Ib`.
    Ib {
        /// LID.
        lid: u16,
        /// GID, if any.
        gid: Option<[u8; 16]>,
        /// QPN (1).
        qpn: u32,
        /// Q_Key.
        qkey: u32,
        /// SL.
        sl: u8,
        /// P_Key index.
        pkey_index: u16,
    },
}

impl WirePeer {
    /// From an address.
    pub fn from_peer(p: &PeerAddr) -> Self {
        match p {
            PeerAddr::Udp(a) => Self::Udp(*a),
            PeerAddr::Ib(a) => Self::Ib {
                lid: a.lid.0,
                gid: a.gid.map(|g| g.0),
                qpn: a.qpn.get(),
                qkey: a.qkey.0,
                sl: a.sl,
                pkey_index: a.pkey_index,
            },
        }
    }

    /// Back to an address.
    pub fn to_peer(self) -> PeerAddr {
        match self {
            Self::Udp(a) => PeerAddr::Udp(a),
            Self::Ib {
                lid,
                gid,
                qpn,
                qkey,
                sl,
                pkey_index,
            } => PeerAddr::Ib(IbAddr {
                lid: Lid(lid),
                gid: gid.map(Gid),
                qpn: Qpn::masked(qpn),
                qkey: Qkey(qkey),
                sl,
                pkey_index,
            }),
        }
    }
}

pub(crate) fn body(msg: &CmMessage) -> Vec<u8> {
    let mut v = Vec::with_capacity(MAD_DATA_LEN);
    msg.emit_body(&mut v);
    v
}

pub(crate) fn parse_req(b: &[u8]) -> Result<Req, String> {
    match b.first_chunk::<MAD_DATA_LEN>() {
        Some(d) => match CmMessage::parse_fixed(AttrId::Req, d) {
            CmMessage::Req(r) => Ok(r),
            _ => Err("not a REQ body".into()),
        },
        None => Err(format!("a REQ body of {} bytes", b.len())),
    }
}

fn parse_rep(b: &[u8]) -> Result<Rep, String> {
    match b.first_chunk::<MAD_DATA_LEN>() {
        Some(d) => match CmMessage::parse_fixed(AttrId::Rep, d) {
            CmMessage::Rep(r) => Ok(r),
            _ => Err("not a REP body".into()),
        },
        None => Err(format!("a REP body of {} bytes", b.len())),
    }
}

fn cma(h: Option<&CmaHeader>) -> Result<Option<Vec<u8>>, String> {
    h.map(|h| {
        let mut b = vec![0u8; CmaHeader::LEN];
        h.emit(&mut b).map(|()| b).map_err(|e| e.to_string())
    })
    .transpose()
}

fn parse_cma(b: Option<&Vec<u8>>) -> Result<Option<CmaHeader>, String> {
    b.map(|b| CmaHeader::parse(b).map_err(|e| e.to_string()))
        .transpose()
}

/// [`ConnectParams`] on the wire: the REQ body that carries them, and the rest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireConnect {
    /// The peer's CM.
    pub peer: WirePeer,
    /// A REQ with the parameters' fields (232 bytes; its private data unused).
    pub req: Vec<u8>,
    /// Private data.
    pub private_data: Vec<u8>,
    /// The rdma_cm header (36 bytes), if any.
    pub cma: Option<Vec<u8>>,
    /// Whether the REQ's primary path was given.
    pub primary_path: bool,
    /// Whether the REQ's alternate path was given.
    pub alternate_path: bool,
    /// `auto_rtu`.
    pub auto_rtu: bool,
    /// `allow_shared_qpn`.
    pub allow_shared_qpn: bool,
    /// Whether the REQ's starting PSN was chosen by the application (otherwise the daemon's
    /// endpoint draws a random one).
    #[serde(default)]
    pub psn_given: bool,
    /// `connect_timeout` in milliseconds (`None`: no bound but the REQ schedule's).
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
}

impl WireConnect {
    /// From the parameters.
    ///
    /// # Errors
    /// An rdma_cm header that cannot be emitted.
    pub fn from_params(p: &ConnectParams) -> Result<Self, String> {
        let mut req = Req {
            starting_psn: p.starting_psn.unwrap_or_default(),
            primary_path: p.primary_path.unwrap_or_default(),
            ..p.req_fields()
        };
        // The packet life time travels in the primary path's ACK timeout slot when no path
        // is given (the REQ has no field of its own for it).
        if p.primary_path.is_none() {
            req.primary_path.local_ack_timeout = p.packet_life_time;
        }
        Ok(WireConnect {
            peer: WirePeer::from_peer(&p.peer),
            req: body(&CmMessage::Req(req)),
            private_data: p.private_data.clone(),
            cma: cma(p.cma_header.as_ref())?,
            primary_path: p.primary_path.is_some(),
            alternate_path: p.alternate_path.is_some(),
            auto_rtu: p.auto_rtu,
            allow_shared_qpn: p.allow_shared_qpn,
            psn_given: p.starting_psn.is_some(),
            connect_timeout_ms: p
                .connect_timeout
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        })
    }

    /// Back to the parameters.
    ///
    /// # Errors
    /// A malformed REQ body or rdma_cm header.
    pub fn to_params(&self) -> Result<ConnectParams, String> {
        let r = parse_req(&self.req)?;
        let mut p = ConnectParams::new(self.peer.to_peer(), r.service_id, r.local_qpn);
        p.transport = r.transport();
        p.starting_psn = self.psn_given.then_some(r.starting_psn);
        p.connect_timeout = self
            .connect_timeout_ms
            .map(std::time::Duration::from_millis);
        p.cma_header = parse_cma(self.cma.as_ref())?;
        p.private_data = self.private_data.clone();
        p.primary_path = self.primary_path.then_some(r.primary_path);
        p.alternate_path = self.alternate_path.then_some(r.alternate_path);
        if !self.primary_path {
            p.packet_life_time = r.primary_path.local_ack_timeout;
        }
        p.pkey = r.partition_key;
        p.path_mtu = r.path_mtu;
        p.responder_resources = r.responder_resources;
        p.initiator_depth = r.initiator_depth;
        p.remote_cm_response_timeout = r.remote_cm_response_timeout;
        p.local_cm_response_timeout = r.local_cm_response_timeout;
        p.max_cm_retries = r.max_cm_retries;
        p.retry_count = r.retry_count;
        p.rnr_retry_count = r.rnr_retry_count;
        p.flow_control = r.end_to_end_flow_control;
        p.srq = r.srq;
        p.auto_rtu = self.auto_rtu;
        p.allow_shared_qpn = self.allow_shared_qpn;
        Ok(p)
    }
}

/// [`AcceptParams`] on the wire: the REP body that carries them, and the rest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireAccept {
    /// A REP with the parameters' fields (232 bytes; its private data unused).
    pub rep: Vec<u8>,
    /// Private data.
    pub private_data: Vec<u8>,
    /// `xrc_tgt_qpn`.
    pub xrc_tgt_qpn: Option<u32>,
    /// `xrc_tgt_live`.
    pub xrc_tgt_live: bool,
}

impl WireAccept {
    /// From the parameters.
    pub fn from_params(p: &AcceptParams) -> Self {
        let rep = p.rep_fields();
        WireAccept {
            rep: body(&CmMessage::Rep(rep)),
            private_data: p.private_data.clone(),
            xrc_tgt_qpn: p.xrc_tgt_qpn.map(Qpn::get),
            xrc_tgt_live: p.xrc_tgt_live,
        }
    }

    /// Back to the parameters.
    ///
    /// # Errors
    /// A malformed REP body.
    pub fn to_params(&self) -> Result<AcceptParams, String> {
        let r = parse_rep(&self.rep)?;
        let mut p = AcceptParams::new(r.local_qpn);
        p.starting_psn = r.starting_psn;
        p.responder_resources = r.responder_resources;
        p.initiator_depth = r.initiator_depth;
        p.target_ack_delay = r.target_ack_delay;
        p.failover_accepted = r.failover_accepted;
        p.flow_control = r.end_to_end_flow_control;
        p.rnr_retry_count = r.rnr_retry_count;
        p.srq = r.srq;
        p.private_data = self.private_data.clone();
        p.xrc_tgt_qpn = self.xrc_tgt_qpn.map(Qpn::masked);
        p.xrc_tgt_live = self.xrc_tgt_live;
        Ok(p)
    }
}

/// A [`StatelessAccept`] template on the wire (`listen-stateless`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireStateless {
    /// The REP's parameters.
    pub accept: WireAccept,
    /// First local QPN of the range the stateless REPs hand out.
    pub qpn_base: u32,
    /// How many QPNs the range has.
    pub qpn_count: u32,
}

impl WireStateless {
    /// From the template.
    pub fn from_template(t: &StatelessAccept) -> Self {
        WireStateless {
            accept: WireAccept::from_params(&t.rep),
            qpn_base: t.qpn_base.get(),
            qpn_count: t.qpn_count,
        }
    }

    /// Back to the template.
    ///
    /// # Errors
    /// A malformed REP body.
    pub fn to_template(&self) -> Result<StatelessAccept, String> {
        Ok(StatelessAccept::new(
            self.accept.to_params()?,
            Qpn::masked(self.qpn_base),
            self.qpn_count,
        ))
    }
}

/// A connection established statelessly ([`StatelessInfo`]) on the wire: the REQ, the REP
/// the endpoint sent (its body) and the RTU's private data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireStatelessInfo {
    /// The REQ.
    pub req: WireReq,
    /// The REP's body (232 bytes).
    pub rep: Vec<u8>,
    /// The RTU's private data.
    pub rtu_private_data: Vec<u8>,
}

impl WireStatelessInfo {
    /// From the endpoint's report.
    ///
    /// # Errors
    /// A REQ the wire cannot carry.
    pub fn from_info(i: &StatelessInfo) -> Result<Self, String> {
        Ok(WireStatelessInfo {
            req: WireReq::from_info(&i.req)?,
            rep: body(&CmMessage::Rep(i.rep)),
            rtu_private_data: i.rtu_private_data.clone(),
        })
    }

    /// Back to the report.
    ///
    /// # Errors
    /// A malformed REQ or REP body.
    pub fn to_info(&self) -> Result<StatelessInfo, String> {
        Ok(StatelessInfo {
            req: self.req.to_info()?,
            rep: parse_rep(&self.rep)?,
            rtu_private_data: self.rtu_private_data.clone(),
        })
    }
}

/// A received REQ ([`ReqInfo`]) on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireReq {
    /// Where it came from.
    pub peer: WirePeer,
    /// Its body (232 bytes).
    pub req: Vec<u8>,
    /// The rdma_cm header, if any.
    pub cma: Option<Vec<u8>>,
}

impl WireReq {
    /// From the REQ.
    ///
    /// # Errors
    /// An rdma_cm header that cannot be emitted.
    pub fn from_info(i: &ReqInfo) -> Result<Self, String> {
        Ok(WireReq {
            peer: WirePeer::from_peer(&i.peer),
            req: body(&CmMessage::Req(i.req)),
            cma: cma(i.cma_header.as_ref())?,
        })
    }

    /// Back to the REQ.
    ///
    /// # Errors
    /// A malformed body or header.
    pub fn to_info(&self) -> Result<ReqInfo, String> {
        Ok(ReqInfo {
            peer: self.peer.to_peer(),
            req: parse_req(&self.req)?,
            cma_header: parse_cma(self.cma.as_ref())?,
        })
    }
}

/// A received REP ([`RepInfo`]) on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireRep {
    /// Its body (232 bytes).
    pub rep: Vec<u8>,
    /// The QPN to use.
    pub remote_qpn: u32,
}

impl WireRep {
    /// From the REP.
    pub fn from_info(i: &RepInfo) -> Self {
        WireRep {
            rep: body(&CmMessage::Rep(i.rep)),
            remote_qpn: i.remote_qpn.get(),
        }
    }

    /// Back to the REP.
    ///
    /// # Errors
    /// A malformed body.
    pub fn to_info(&self) -> Result<RepInfo, String> {
        Ok(RepInfo {
            rep: parse_rep(&self.rep)?,
            remote_qpn: Qpn::masked(self.remote_qpn),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{CallError, ConnectionError, State};
    use crate::rt::node::errors::{WireCallError, WireConnError};
    use ibcm_mad::{Psn, RejReason, ReqTransport, TimeoutExp};

    #[test]
    fn stateless_template_round_trip() {
        let mut rep = AcceptParams::new(Qpn::new(0x77).unwrap());
        rep.private_data = vec![9, 8, 7];
        rep.starting_psn = Psn::new(0x1234).unwrap();
        let t = StatelessAccept::new(rep, Qpn::new(0x80_0000).unwrap(), 4096);
        let json = serde_json::to_vec(&WireStateless::from_template(&t)).unwrap();
        let back: WireStateless = serde_json::from_slice(&json).unwrap();
        let u = back.to_template().unwrap();
        assert_eq!((u.qpn_base, u.qpn_count), (t.qpn_base, t.qpn_count));
        assert_eq!(u.rep.private_data, t.rep.private_data);
        assert_eq!(u.rep.starting_psn, t.rep.starting_psn);
        let bad = WireStateless {
            accept: WireAccept {
                rep: vec![1, 2],
                ..back.accept
            },
            ..back
        };
        assert!(bad.to_template().is_err());
    }

    #[test]
    fn connect_params_round_trip() {
        let mut p = ConnectParams::rdma_cm(
            "127.0.0.1:49152".parse().unwrap(),
            "127.0.0.2:7471".parse().unwrap(),
            Qpn::new(0x1234).unwrap(),
        )
        .xrc();
        p.starting_psn = Some(Psn::new(0x55aa).unwrap());
        p.private_data = vec![1, 2, 3];
        p.auto_rtu = false;
        p.packet_life_time = TimeoutExp::masked(11);
        let w = WireConnect::from_params(&p).unwrap();
        let json = serde_json::to_vec(&w).unwrap();
        let back: WireConnect = serde_json::from_slice(&json).unwrap();
        let q = back.to_params().unwrap();
        assert_eq!(q.transport, ReqTransport::Xrc);
        assert_eq!(q.service_id, p.service_id);
        assert_eq!(q.local_qpn, p.local_qpn);
        assert_eq!(q.starting_psn, p.starting_psn);
        assert_eq!(q.cma_header, p.cma_header);
        assert_eq!(q.private_data, p.private_data);
        assert_eq!(q.packet_life_time, p.packet_life_time);
        assert_eq!(q.primary_path, None);
        assert!(!q.auto_rtu);
        assert_eq!(q.peer, p.peer);
    }

    #[test]
    fn accept_and_errors_round_trip() {
        let mut a = AcceptParams::xrc_tgt(Qpn::new(0x77).unwrap());
        a.xrc_tgt_live = true;
        a.private_data = vec![9];
        let b = WireAccept::from_params(&a).to_params().unwrap();
        assert_eq!(b.xrc_tgt_qpn, a.xrc_tgt_qpn);
        assert_eq!(b.srq, a.srq);
        assert_eq!(b.local_qpn, a.local_qpn);
        assert_eq!(b.private_data, a.private_data);
        let e = ConnectionError::Rejected {
            reason: RejReason::from_raw(1),
            ari: vec![1, 2],
            private_data: vec![3],
        };
        assert_eq!(WireConnError::from_error(&e).to_error(), e);
        let c = CallError::WrongState {
            op: "accept",
            state: State::RepSent,
        };
        assert_eq!(WireCallError::from_error(&c).to_error(), c);
    }
}
