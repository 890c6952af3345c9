//! A REQ's path from a PathRecord, field by field as the kernel's `cm_format_req`
//! (`drivers/infiniband/core/cm.c`) fills a primary or alternate path from its
//! `struct sa_path_rec`.

use ibcm_mad::sa::PathRecord;
use ibcm_mad::{Lid, Mtu, PathInfo, Qkey, Qpn, ServiceId, TimeoutExp};

use crate::proto::{ConnectParams, IbAddr, PeerAddr};
use crate::qp_attr::ack_timeout;

/// The CA ACK delay to compute a REQ's Local ACK Timeout with ([`req_path`]) when the local
/// device's own (`ack_delay`, which the kernel reads from the device) is not known: 15, rxe's
/// and a common HCA value. cm-ping and libibcm, which open no verbs device on this path, use it.
pub const DEFAULT_CA_ACK_DELAY: u8 = 15;

/// The REQ path for `p`, sent by a port whose CA ACK delay is `ca_ack_delay` (IBTA
/// `CA_ACK_DELAY`, the device's `ack_delay`):
///
/// * LIDs: SLID and DLID when the path stays in the subnet (HopLimit ≤ 1); across routers the
///   kernel sends the permissive LID (0xFFFF) in both, and so does this;
/// * GIDs: SGID (local) and DGID (remote); flow label, rate, traffic class, hop limit and SL
///   as given;
/// * Subnet Local: HopLimit ≤ 1;
/// * Local ACK Timeout: `cm_ack_timeout(ca_ack_delay, PacketLifeTime)`
///   ([`crate::qp_attr::ack_timeout`]).
///
/// The REQ's Path MTU is not part of a path: it is [`req_mtu`] of the primary path.
pub fn req_path(p: &PathRecord, ca_ack_delay: u8) -> PathInfo {
    let local = p.hop_limit <= 1;
    PathInfo {
        local_lid: if local { p.slid } else { Lid::PERMISSIVE },
        remote_lid: if local { p.dlid } else { Lid::PERMISSIVE },
        local_gid: p.sgid,
        remote_gid: p.dgid,
        flow_label: p.flow_label,
        packet_rate: p.rate,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        sl: p.sl,
        subnet_local: local,
        local_ack_timeout: TimeoutExp::masked(ack_timeout(ca_ack_delay, p.packet_life_time)),
    }
}

/// The REQ's Path MTU for a primary path: the PathRecord's MTU (`cm_format_req` copies
/// `pri_path->mtu`).
pub fn req_mtu(p: &PathRecord) -> Mtu {
    p.mtu
}

/// The alternate path for `primary` among `candidates` (the records of a GetTable with
/// NumbPath > 1 between the same ports): the first with another SLID and another DLID than
/// `primary`. On a fabric whose SM gives the ports more than one LID (LMC > 0), the switches
/// forward each DLID on a route of its own, and OpenSM's LMC-aware routing spreads a port's
/// LIDs over different links where the fabric has them: such a path is the one Automatic Path
/// Migration wants. `None` when every candidate shares a LID with `primary`.
pub fn alternate_path(primary: &PathRecord, candidates: &[PathRecord]) -> Option<PathRecord> {
    candidates
        .iter()
        .find(|c| c.slid != primary.slid && c.dlid != primary.dlid)
        .copied()
}

/// The peer CM's address for path `p`: QP1 at the path's DLID and SL, P_Key index
/// `pkey_index` (of the path's P_Key in the local port's table), and the DGID (a GRH) only
/// when the path leaves the subnet (HopLimit > 1), as the kernel's address vector from a
/// path record (`ib_init_ah_attr_from_path` in `drivers/infiniband/core/sa_query.c`).
pub fn cm_peer(p: &PathRecord, pkey_index: u16) -> IbAddr {
    IbAddr {
        lid: p.dlid,
        gid: (p.hop_limit > 1).then_some(p.dgid),
        qpn: Qpn::masked(1),
        qkey: Qkey::GSI,
        sl: p.sl.get(),
        pkey_index,
    }
}

/// A REQ over path `p` to `service_id` from QP `local_qpn`: the peer's CM at [`cm_peer`],
/// the primary path as [`req_path`] builds it (with the port's CA ACK delay
/// `ca_ack_delay`), the path's MTU ([`req_mtu`]), P_Key and packet life time (the REQ's
/// timer is 2 × that plus the remote CM response timeout, as the kernel's `cm_send_req`
/// sets it); the rest as [`ConnectParams::new`].
///
/// ```
/// use ibcm::sa::connect_params;
/// use ibcm_mad::sa::PathRecord;
/// use ibcm_mad::{Lid, Qpn, ServiceId};
/// let rec = PathRecord { slid: Lid(3), dlid: Lid(4), ..PathRecord::default() };
/// let p = connect_params(&rec, 15, 0, ServiceId(0x1000), Qpn::masked(0x44));
/// assert_eq!(p.primary_path.unwrap().remote_lid, Lid(4));
/// ```
pub fn connect_params(
    p: &PathRecord,
    ca_ack_delay: u8,
    pkey_index: u16,
    service_id: ServiceId,
    local_qpn: Qpn,
) -> ConnectParams {
    let mut c = ConnectParams::new(PeerAddr::Ib(cm_peer(p, pkey_index)), service_id, local_qpn);
    c.primary_path = Some(req_path(p, ca_ack_delay));
    c.path_mtu = req_mtu(p);
    c.pkey = p.pkey;
    c.packet_life_time = TimeoutExp::masked(p.packet_life_time);
    c
}

#[cfg(test)]
mod tests {
    use ibcm_mad::{FlowLabel, Gid, Pkey, Rate, U4};

    use super::*;

    fn rec(hop_limit: u8) -> PathRecord {
        let mut s = [0u8; 16];
        s[0] = 0xfe;
        s[1] = 0x80;
        let mut d = s;
        s[15] = 3;
        d[15] = 5;
        PathRecord {
            sgid: Gid(s),
            dgid: Gid(d),
            slid: Lid(3),
            dlid: Lid(4),
            flow_label: FlowLabel::masked(0x12345),
            hop_limit,
            traffic_class: 0x20,
            pkey: Pkey(0xffff),
            sl: U4::masked(2),
            mtu: Mtu::Mtu2048,
            rate: Rate::G10,
            packet_life_time: 18,
            ..PathRecord::default()
        }
    }

    #[test]
    fn a_subnet_local_path_keeps_its_lids() {
        let p = req_path(&rec(0), 15);
        assert_eq!((p.local_lid, p.remote_lid), (Lid(3), Lid(4)));
        assert_eq!((p.local_gid, p.remote_gid), (rec(0).sgid, rec(0).dgid));
        assert!(p.subnet_local);
        assert_eq!(p.flow_label, FlowLabel::masked(0x12345));
        assert_eq!(
            (p.packet_rate, p.traffic_class, p.hop_limit),
            (Rate::G10, 0x20, 0)
        );
        assert_eq!(p.sl, U4::masked(2));
        // cm_ack_timeout(15, 18): 19 >= 15 and 15 < 18, so 19
        assert_eq!(p.local_ack_timeout.get(), 19);
        assert_eq!(req_mtu(&rec(0)), Mtu::Mtu2048);
        assert!(req_path(&rec(1), 15).subnet_local);
    }

    #[test]
    fn a_routed_path_has_permissive_lids() {
        let p = req_path(&rec(64), 18);
        assert_eq!(
            (p.local_lid, p.remote_lid),
            (Lid::PERMISSIVE, Lid::PERMISSIVE)
        );
        assert!(!p.subnet_local);
        assert_eq!(p.hop_limit, 64);
        // cm_ack_timeout(18, 18): 19 >= 18 and 18 >= 18, so 20
        assert_eq!(p.local_ack_timeout.get(), 20);
    }

    #[test]
    fn the_peer_is_lid_routed_inside_the_subnet_only() {
        let a = cm_peer(&rec(0), 3);
        assert_eq!((a.lid, a.gid, a.sl, a.pkey_index), (Lid(4), None, 2, 3));
        assert_eq!(a.qpn, Qpn::masked(1));
        assert_eq!(cm_peer(&rec(2), 0).gid, Some(rec(2).dgid));
        let c = connect_params(&rec(0), 15, 0, ServiceId(7), Qpn::masked(9));
        assert_eq!(c.path_mtu, Mtu::Mtu2048);
        assert_eq!(c.pkey, Pkey(0xffff));
        assert_eq!(c.packet_life_time.get(), 18);
        assert_eq!(c.primary_path, Some(req_path(&rec(0), 15)));
        assert_eq!(c.peer, PeerAddr::Ib(cm_peer(&rec(0), 0)));
    }

    #[test]
    fn the_alternate_path_has_other_lids() {
        let p = rec(0);
        let lids = |s, d| PathRecord {
            slid: Lid(s),
            dlid: Lid(d),
            ..rec(0)
        };
        let c = [lids(3, 4), lids(3, 5), lids(6, 4), lids(6, 5)];
        assert_eq!(alternate_path(&p, &c), Some(lids(6, 5)));
        assert_eq!(alternate_path(&p, &c[..3]), None);
    }
}
