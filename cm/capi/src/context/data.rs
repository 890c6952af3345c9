//! The `sim` backend's XRC data path from C: the runtime's own XRC SRQs in a shared domain
//! (made in the daemon's software model, as the runtime's process there) and SENDs on its
//! XRC INI connections, which leave this process as RoCEv2 XRC SEND Only packets — what its
//! INI QP would send — for the target's TGT QP to receive into the SRQ they name.
//!
//! With `--backend verbs` a runtime does all of this with rdma-core; these calls then fail
//! with `IBCM_EUNSUPPORTED` (the daemon's refusal, for the SRQ calls; for a SEND, the
//! daemon's `hello` says which backend it runs).

use std::net::SocketAddr;
use std::sync::Arc;

use ibcm::qp_attr::Side;
use ibcm::rt::UdpTransport;
use ibcm_mad::frame::{RoceV2XrcSendRepr, ROCEV2_UDP_PORT};
use ibcm_mad::xrc::SrqNum;
use ibcm_mad::{Psn, Qpn, ReqTransport};
use serde_json::json;

use super::{lock, Context, Entry};
use crate::error::{Error, Result};
use crate::ffi::types::ibcm_status::*;
use crate::ffi::types::IBCM_XRC_MESSAGE_MAX;

/// The most data-path counters taken from the daemon.
const DATA_COUNTERS_MAX: usize = 16;

/// The longest message of an XRC SEND (`IBCM_XRC_MESSAGE_MAX`).
const MESSAGE_MAX: usize = IBCM_XRC_MESSAGE_MAX as usize;

fn srqn_arg(srqn: u32) -> Result<SrqNum> {
    SrqNum::new(srqn)
        .ok_or_else(|| Error::new(IBCM_EINVAL, format!("SRQ number {srqn:#x} is over 24 bits")))
}

impl Context {
    /// Creates an XRC SRQ of this process in keeper domain `domain` (one this context may
    /// use, named by a file) with room for `max_wr` unpolled messages; its number.
    pub(crate) fn xrc_srq_create(&self, domain: &str, max_wr: u32) -> Result<u32> {
        let r = self.keeper(json!({ "op": "srq-create", "domain": domain, "max_wr": max_wr }))?;
        r.get("srqn")
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| Error::new(IBCM_EIO, format!("the daemon's reply names no SRQ: {r}")))
    }

    /// The `sim` data path's counters, `xrc_data.OUTCOME` (`received`, and each reason a
    /// SEND was not: `srq_of_another_domain`, `psn_out_of_sequence`, …); none with the
    /// verbs backend. At most [`DATA_COUNTERS_MAX`] names of up to 40 characters are taken
    /// from the daemon (the names live as long as the library).
    pub(crate) fn xrc_data_counters(&self) -> Result<Vec<(String, u64)>> {
        let v = match self.keeper(json!({ "op": "data-counters" })) {
            Ok(v) => v,
            Err(e) if e.code == IBCM_EUNSUPPORTED => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let Some(m) = v.as_object() else {
            return Ok(Vec::new());
        };
        Ok(m.iter()
            .filter(|(k, _)| {
                k.len() <= 40 && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            })
            .filter_map(|(k, n)| Some((format!("xrc_data.{k}"), n.as_u64()?)))
            .take(DATA_COUNTERS_MAX)
            .collect())
    }

    /// Destroys this process's XRC SRQ `srqn` (messages not taken go with it).
    pub(crate) fn xrc_srq_destroy(&self, srqn: u32) -> Result<()> {
        self.keeper(json!({ "op": "srq-destroy", "srqn": srqn }))
            .map(drop)
    }

    /// The oldest message received into this process's SRQ `srqn`, if any.
    pub(crate) fn xrc_srq_recv(&self, srqn: u32) -> Result<Option<Vec<u8>>> {
        let r = self.keeper(json!({ "op": "srq-recv", "srqn": srqn }))?;
        match r.get("data") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => serde_json::from_value::<Vec<u8>>(v.clone())
                .map(Some)
                .map_err(|e| Error::new(IBCM_EIO, format!("the daemon's message: {e}"))),
        }
    }

    /// Sends `data` on XRC connection `h` (established, this side its initiator) to the SRQ
    /// `srqn` of the target: an XRC SEND Only to the TGT QP, with the next PSN of the INI
    /// QP (its RTS `sq_psn`, then one more per SEND), from the daemon's address.
    pub(crate) fn xrc_send(&self, h: u64, srqn: u32, data: &[u8]) -> Result<()> {
        self.live()?;
        let srqn = srqn_arg(srqn)?;
        // The INI QP's attributes as for a real QP: RTR names the TGT QP, RTS the PSN.
        let (rtr, _) = self.qp_attr(h, 2, None, None)?;
        let (rts, _) = self.qp_attr(h, 3, None, None)?;
        let local = self.node.daemon_addr().ok_or_else(|| {
            Error::new(
                IBCM_EUNSUPPORTED,
                "the daemon's address is unknown (an ibcmd on UDP has one)",
            )
        })?;
        // One SEND at a time per context: PSNs leave in order.
        let mut sock = lock(&self.data_sock);
        let (peer, psn) = {
            let mut conns = lock(&self.shared.conns);
            let o = match conns.get_mut(&h) {
                Some(Entry::Open(o)) => o,
                Some(_) => {
                    return Err(Error::new(
                        IBCM_ESTATE,
                        format!("connection {h} is not established"),
                    ))
                }
                None => return Err(Self::unknown(h)),
            };
            let (Side::Active, Some(a), ReqTransport::Xrc) = (o.side, o.active, o.req.transport())
            else {
                return Err(Error::new(
                    IBCM_EINVAL,
                    format!("connection {h} is not an XRC connection this side initiated"),
                ));
            };
            // One SEND Only: at most the path MTU (and IBCM_XRC_MESSAGE_MAX).
            let mtu = o.req.path_mtu.bytes().and_then(|m| usize::try_from(m).ok());
            let max = mtu.map_or(MESSAGE_MAX, |m| m.min(MESSAGE_MAX));
            if data.is_empty() || data.len() > max {
                return Err(Error::new(
                    IBCM_EINVAL,
                    format!(
                        "{} bytes: a SEND on connection {h} carries 1..={max} (one SEND Only \
                         of its path MTU)",
                        data.len()
                    ),
                ));
            }
            let psn = rts.sq_psn.wrapping_add(o.sent) & 0x00ff_ffff;
            o.sent = o.sent.wrapping_add(1);
            (a.peer, psn)
        };
        let ibcm::proto::PeerAddr::Udp(peer) = peer else {
            self.unsend(h);
            return Err(Error::new(
                IBCM_EUNSUPPORTED,
                "the connection's peer is not a RoCEv2/UDP address",
            ));
        };
        let r = self.send_xrc(&mut sock, local, peer, rtr.dest_qp_num, psn, srqn, data);
        if r.is_err() {
            self.unsend(h);
        }
        r
    }

    /// A SEND that did not leave gives its PSN back.
    fn unsend(&self, h: u64) {
        if let Some(Entry::Open(o)) = lock(&self.shared.conns).get_mut(&h) {
            o.sent = o.sent.wrapping_sub(1);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn send_xrc(
        &self,
        sock: &mut Option<Arc<UdpTransport>>,
        local: std::net::IpAddr,
        peer: SocketAddr,
        tgt_qpn: u32,
        psn: u32,
        srqn: SrqNum,
        data: &[u8],
    ) -> Result<()> {
        let io = |e: std::io::Error| Error::new(IBCM_EIO, format!("XRC SEND: {e}"));
        let s = match sock {
            Some(s) => s.clone(),
            None => {
                let t = self
                    .block_on(UdpTransport::bind_port(SocketAddr::new(local, 0)))?
                    .map_err(io)?;
                sock.insert(Arc::new(t)).clone()
            }
        };
        let to = SocketAddr::new(peer.ip(), ROCEV2_UDP_PORT);
        let from = s.socket_addr();
        let repr = RoceV2XrcSendRepr::send_only(
            from.ip(),
            to.ip(),
            from.port(),
            Qpn::masked(tgt_qpn),
            Psn::masked(psn),
            srqn,
        )
        .map_err(|e| Error::new(IBCM_EINVAL, format!("XRC SEND to {to}: {e}")))?;
        let mut buf = vec![0u8; repr.udp_payload_len(data.len())];
        let n = repr
            .emit_udp_payload(data, &mut buf)
            .map_err(|e| Error::new(IBCM_EINVAL, format!("XRC SEND: {e}")))?;
        self.block_on(s.send_datagram(to, buf.get(..n).unwrap_or(&[])))?
            .map_err(io)
    }
}
