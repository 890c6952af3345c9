//! The C parameter structs as ibcm's Rust parameters, and ibcm's QP attributes as the C
//! struct. Safe code: the FFI layer has copied everything behind the structs' pointers.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ibcm::proto::{
    AcceptParams, ConnectParams, IbAddr, PeerAddr, SidrRepParams, SidrReqParams,
    DEFAULT_CONNECT_TIMEOUT,
};
use ibcm::qp_attr::{AhAttr, LinkLayer, LocalPort, QpAttr, QpAttrMask, QpType};
use ibcm::sa::{cm_peer, req_mtu, req_path, PathTarget};
use ibcm_mad::sa::PathRecord;
use ibcm_mad::{
    FlowLabel, Gid, Lid, Mtu, PathInfo, Psn, Qkey, Qpn, Rate, ReqTransport, ServiceId, SidrStatus,
    TimeoutExp, U3, U4,
};

use crate::error::{Error, Result};
use crate::ffi::types::ibcm_status::*;
use crate::ffi::types::*;

/// ibcm_conn_param_init's values: ibcm's (rdma_cm's) defaults.
pub(crate) fn conn_param_default() -> ibcm_conn_param {
    let d = ConnectParams::new(
        SocketAddr::from(([127, 0, 0, 1], 4791)),
        ServiceId(0),
        Qpn::masked(1),
    );
    ibcm_conn_param {
        peer: std::ptr::null(),
        service_id: 0,
        qp_num: 0,
        transport: ibcm_transport::IBCM_TRANSPORT_RC as u32,
        flags: 0,
        starting_psn: 0,
        private_data: std::ptr::null(),
        private_data_len: 0,
        timeout_ms: u32::try_from(DEFAULT_CONNECT_TIMEOUT.as_millis()).unwrap_or(u32::MAX),
        responder_resources: d.responder_resources,
        initiator_depth: d.initiator_depth,
        retry_count: d.retry_count.get(),
        rnr_retry_count: d.rnr_retry_count.get(),
        path_mtu: d.path_mtu.raw(),
        srq: u8::from(d.srq),
        context: std::ptr::null_mut(),
    }
}

/// ibcm_sidr_param_init's values: rdma_cm's timing (4096 ms, 15 retries).
pub(crate) fn sidr_param_default() -> ibcm_sidr_param {
    let d = SidrReqParams::new(SocketAddr::from(([127, 0, 0, 1], 4791)), ServiceId(0));
    ibcm_sidr_param {
        peer: std::ptr::null(),
        service_id: 0,
        private_data: std::ptr::null(),
        private_data_len: 0,
        timeout_ms: u32::try_from(d.timeout.as_millis()).unwrap_or(u32::MAX),
        max_retries: d.max_retries,
        context: std::ptr::null_mut(),
    }
}

/// 32 random bits: SipHash, under the keys `RandomState` draws from the OS, of a counter and
/// the clock (for PSNs and rdma_cm source ports; no round trip to the daemon).
pub(crate) fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.write_u128(now.as_nanos());
    // The high half of the 64-bit hash.
    (h.finish() >> 32) as u32
}

/// A random 24-bit PSN (ibcm_accept_param_init).
pub(crate) fn random_psn() -> u32 {
    random_u32() & 0x00ff_ffff
}

/// ibcm_accept_param_init's values (the PSN is drawn by the caller).
pub(crate) fn accept_param_default() -> ibcm_accept_param {
    let d = AcceptParams::new(Qpn::masked(1));
    ibcm_accept_param {
        qp_num: 0,
        starting_psn: 0,
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: d.responder_resources,
        initiator_depth: d.initiator_depth,
        rnr_retry_count: d.rnr_retry_count.get(),
        srq: u8::from(d.srq),
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(IBCM_EINVAL, msg)
}

/// The peer's CM address: "IP" (UDP 4791) or "IP:PORT", a unicast host: the unspecified
/// address, broadcast and multicast are refused (no CM answers there: the connect would
/// only time out).
pub(crate) fn peer_addr(s: &str) -> Result<SocketAddr> {
    let sa = match s.parse::<SocketAddr>() {
        Ok(sa) => sa,
        Err(_) => s
            .parse::<IpAddr>()
            .map(|ip| SocketAddr::new(ip, ibcm_mad::frame::ROCEV2_UDP_PORT))
            .map_err(|_| invalid(format!("peer {s:?} is not an IP address or IP:PORT")))?,
    };
    let ip = sa.ip();
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if ip.is_unspecified() || ip.is_multicast() || broadcast {
        return Err(invalid(format!(
            "peer {s:?} is not a unicast host address (unspecified, broadcast or multicast)"
        )));
    }
    if sa.port() == 0 {
        return Err(invalid(format!("peer {s:?}: port 0")));
    }
    Ok(sa)
}

/// The CA ACK delay the REQ's Local ACK Timeout is computed with on a path from the SA
/// ([`ibcm::sa::DEFAULT_CA_ACK_DELAY`]: libibcm opens no device).
pub(crate) const CA_ACK_DELAY: u8 = ibcm::sa::DEFAULT_CA_ACK_DELAY;

/// Where a connect goes: the peer's CM by IP, or a port on an InfiniBand fabric whose path
/// the node service resolves first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// "IP" or "IP:PORT" ([`peer_addr`]).
    Ip(SocketAddr),
    /// "lid:N" or "gid:G".
    Ib(PathTarget),
}

/// The peer of `ibcm_conn_param`: "lid:N", "gid:G" ([`PathTarget`]), or an IP peer
/// ([`peer_addr`]).
pub(crate) fn peer(s: &str) -> Result<Peer> {
    if PathTarget::is_written_as_one(s) {
        return s
            .parse::<PathTarget>()
            .map(Peer::Ib)
            .map_err(|e| invalid(format!("peer {e}")));
    }
    peer_addr(s).map(Peer::Ip)
}

/// A connect's parameters: the REQ's ([`ConnectParams`]; for a [`Peer::Ib`] its peer and
/// path fields are set by [`apply_path`] once the path is known), whether the RTU waits for
/// ibcm_establish, and the target whose path is needed first.
#[derive(Debug, Clone)]
pub(crate) struct Connect {
    pub(crate) params: ConnectParams,
    pub(crate) manual: bool,
    pub(crate) path: Option<PathTarget>,
    /// `IBCM_CONNECT_ALT_PATH`: an alternate path too (with `path`).
    pub(crate) alternate: bool,
}

/// The REQ's fields from the path `rec` to a "lid:" / "gid:" peer, as
/// `ibcm::sa::connect_params` sets them: the peer's CM at [`cm_peer`] (P_Key index 0: the
/// daemon checked the path is in its port's P_Key 0), the primary path ([`req_path`] with
/// [`CA_ACK_DELAY`]), the path's P_Key and packet life time, and its MTU ([`req_mtu`]),
/// lowered to what the application asked for (`path_mtu`) if that is smaller.
pub(crate) fn apply_path(c: &mut ConnectParams, rec: &PathRecord) {
    c.peer = PeerAddr::Ib(cm_peer(rec, 0));
    c.primary_path = Some(req_path(rec, CA_ACK_DELAY));
    c.pkey = rec.pkey;
    c.packet_life_time = TimeoutExp::masked(rec.packet_life_time);
    let path = req_mtu(rec);
    if !path.is_known() || path.raw() < c.path_mtu.raw() {
        c.path_mtu = path;
    }
}

/// The REQ's alternate path from the record `rec` of the alternate path the daemon found
/// (`IBCM_CONNECT_ALT_PATH`), as its primary path is built ([`req_path`] with
/// [`CA_ACK_DELAY`]).
pub(crate) fn apply_alternate(c: &mut ConnectParams, rec: &PathRecord) {
    c.alternate_path = Some(req_path(rec, CA_ACK_DELAY));
}

/// `p` as the C struct; `turn`: written from the peer's view (a received REQ's or LAP's),
/// so its local and remote ends are swapped to give this side's view.
pub(crate) fn path_c(p: &PathInfo, turn: bool) -> ibcm_path {
    let (local_lid, remote_lid, local_gid, remote_gid) = if turn {
        (p.remote_lid, p.local_lid, p.remote_gid, p.local_gid)
    } else {
        (p.local_lid, p.remote_lid, p.local_gid, p.remote_gid)
    };
    ibcm_path {
        local_gid: local_gid.0,
        remote_gid: remote_gid.0,
        flow_label: p.flow_label.get(),
        local_lid: local_lid.0,
        remote_lid: remote_lid.0,
        rate: p.packet_rate.raw(),
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        sl: p.sl.get(),
        subnet_local: u8::from(p.subnet_local),
        local_ack_timeout: p.local_ack_timeout.get(),
    }
}

/// The C struct (this side's view) as the path a LAP of this side carries; every field
/// checked against its width.
pub(crate) fn path_of(p: &ibcm_path) -> Result<PathInfo> {
    let flow_label = FlowLabel::new(p.flow_label).ok_or_else(|| {
        invalid(format!(
            "path flow_label {:#x} is not 20 bits",
            p.flow_label
        ))
    })?;
    if p.rate > 63 {
        return Err(invalid(format!("path rate {} is not 6 bits", p.rate)));
    }
    let sl = U4::new(p.sl).ok_or_else(|| invalid(format!("path sl {} is above 15", p.sl)))?;
    if p.subnet_local > 1 {
        return Err(invalid(format!(
            "path subnet_local {} (0 or 1)",
            p.subnet_local
        )));
    }
    let local_ack_timeout = TimeoutExp::new(p.local_ack_timeout).ok_or_else(|| {
        invalid(format!(
            "path local_ack_timeout {} is above 31",
            p.local_ack_timeout
        ))
    })?;
    Ok(PathInfo {
        local_lid: Lid(p.local_lid),
        remote_lid: Lid(p.remote_lid),
        local_gid: Gid(p.local_gid),
        remote_gid: Gid(p.remote_gid),
        flow_label,
        packet_rate: Rate::from_raw(p.rate),
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        sl,
        subnet_local: p.subnet_local == 1,
        local_ack_timeout,
    })
}

/// The peer string of an event: "IP:PORT"; a LID-routed InfiniBand peer as "lid:N" and one
/// with a GRH as "gid:G" (what ibcm_connect takes); a RoCE peer through umad by its IP.
pub(crate) fn peer_string(p: &PeerAddr) -> String {
    match p {
        PeerAddr::Udp(sa) => sa.to_string(),
        PeerAddr::Ib(IbAddr { lid, gid, .. }) if *lid != Lid::PERMISSIVE => match gid {
            Some(g) => format!("gid:{}", std::net::Ipv6Addr::from(g.0)),
            None => format!("lid:{}", lid.0),
        },
        PeerAddr::Ib(IbAddr { gid: Some(g), .. }) => {
            SocketAddr::new(Gid::to_ip(*g), ibcm_mad::frame::ROCEV2_UDP_PORT).to_string()
        }
        PeerAddr::Ib(_) => String::new(),
    }
}

fn qpn(n: u32, what: &str) -> Result<Qpn> {
    Qpn::new(n)
        .filter(|q| q.get() != 0)
        .ok_or_else(|| invalid(format!("{what} {n:#x} is not a 24-bit QP number above 0")))
}

fn psn(n: u32) -> Result<Psn> {
    Psn::new(n).ok_or_else(|| invalid(format!("PSN {n:#x} is not 24 bits")))
}

fn u3(n: u8, what: &str) -> Result<U3> {
    U3::new(n).ok_or_else(|| invalid(format!("{what} {n} is above 7")))
}

fn too_long(what: &str, len: usize, max: u32) -> Result<()> {
    if len > max as usize {
        return Err(Error::new(
            IBCM_ETOOLONG,
            format!("{what} of {len} bytes exceeds the {max}-byte limit"),
        ));
    }
    Ok(())
}

/// The connect parameters ([`Connect`]). `local`: the node service's CM address, the source
/// of an rdma_cm CMA header (`IBCM_CONNECT_RDMA_CM`).
pub(crate) fn connect_params(
    p: &ibcm_conn_param,
    peer: &str,
    private_data: Vec<u8>,
    local: Option<IpAddr>,
) -> Result<Connect> {
    let known = IBCM_CONNECT_MANUAL_RTU
        | IBCM_CONNECT_PSN
        | IBCM_CONNECT_SHARED_QPN
        | IBCM_CONNECT_RDMA_CM
        | IBCM_CONNECT_ALT_PATH;
    if p.flags & !known != 0 {
        return Err(invalid(format!("unknown flags {:#x}", p.flags & !known)));
    }
    let alternate = p.flags & IBCM_CONNECT_ALT_PATH != 0;
    if alternate && (p.flags & IBCM_CONNECT_RDMA_CM != 0 || !PathTarget::is_written_as_one(peer)) {
        return Err(invalid(format!(
            "peer {peer:?}: IBCM_CONNECT_ALT_PATH needs a \"lid:N\" or \"gid:G\" peer (the \
             daemon's SA gives the alternate path), without IBCM_CONNECT_RDMA_CM"
        )));
    }
    let local_qpn = qpn(p.qp_num, "qp_num")?;
    let mut path = None;
    let mut c = if p.flags & IBCM_CONNECT_RDMA_CM != 0 {
        too_long(
            "REQ private data (after rdma_cm's CMA header)",
            private_data.len(),
            IBCM_REQ_RDMA_CM_PRIVATE_DATA_MAX,
        )?;
        rdma_cm_params(p, peer, local, local_qpn)?
    } else {
        too_long(
            "REQ private data",
            private_data.len(),
            IBCM_REQ_PRIVATE_DATA_MAX,
        )?;
        let to = match self::peer(peer)? {
            Peer::Ip(sa) => PeerAddr::Udp(sa),
            Peer::Ib(t) => {
                path = Some(t);
                // Until the path is known (apply_path): the target's LID, or none.
                let lid = match t {
                    PathTarget::Lid(l) => l,
                    PathTarget::Gid(_) => Lid::PERMISSIVE,
                };
                PeerAddr::Ib(IbAddr {
                    lid,
                    gid: None,
                    ..IbAddr::roce(Gid::ZERO)
                })
            }
        };
        ConnectParams::new(to, ServiceId(p.service_id), local_qpn)
    };
    c = match p.transport {
        0 => c,
        1 => {
            c.transport = ReqTransport::Uc;
            c
        }
        2 => c.xrc(),
        t => return Err(invalid(format!("transport {t} (0 RC, 1 UC, 2 XRC)"))),
    };
    if p.flags & IBCM_CONNECT_PSN != 0 {
        c.starting_psn = Some(psn(p.starting_psn)?);
    }
    c.allow_shared_qpn = p.flags & IBCM_CONNECT_SHARED_QPN != 0;
    c.private_data = private_data;
    c.connect_timeout = (p.timeout_ms != 0).then(|| Duration::from_millis(u64::from(p.timeout_ms)));
    c.responder_resources = p.responder_resources;
    c.initiator_depth = p.initiator_depth;
    c.retry_count = u3(p.retry_count, "retry_count")?;
    c.rnr_retry_count = u3(p.rnr_retry_count, "rnr_retry_count")?;
    c.path_mtu = match Mtu::from_raw(p.path_mtu) {
        m if m.is_known() => m,
        _ => return Err(invalid(format!("path_mtu {} (1..5)", p.path_mtu))),
    };
    c.srq = p.srq != 0;
    Ok(Connect {
        params: c,
        manual: p.flags & IBCM_CONNECT_MANUAL_RTU != 0,
        path,
        alternate,
    })
}

/// `IBCM_CONNECT_RDMA_CM`: the REQ to the rdma_cm listener at `peer` ("IP:PORT", the port
/// rdma_cm listens on), from `local` and a random ephemeral port (as Linux binds one).
fn rdma_cm_params(
    p: &ibcm_conn_param,
    peer: &str,
    local: Option<IpAddr>,
    local_qpn: Qpn,
) -> Result<ConnectParams> {
    if p.service_id != 0 {
        return Err(invalid(format!(
            "service_id {:#x} with IBCM_CONNECT_RDMA_CM: the service ID is the port's, leave it 0",
            p.service_id
        )));
    }
    if PathTarget::is_written_as_one(peer) {
        return Err(invalid(format!(
            "peer {peer:?}: IBCM_CONNECT_RDMA_CM needs the rdma_cm listener's \"IP:PORT\" \
             (lid: and gid: peers are ibcm's own service IDs)"
        )));
    }
    let dst: SocketAddr = peer.parse().map_err(|_| {
        invalid(format!(
            "peer {peer:?}: IBCM_CONNECT_RDMA_CM needs the listener's \"IP:PORT\""
        ))
    })?;
    peer_addr(&dst.ip().to_string())?;
    if dst.port() == 0 {
        return Err(invalid(format!("peer {peer:?}: rdma_cm port 0")));
    }
    let local = local.ok_or_else(|| {
        invalid("IBCM_CONNECT_RDMA_CM: the node service did not say its address (the CMA header's source)")
    })?;
    // Linux's ephemeral range (net.ipv4.ip_local_port_range): 32768..=60999.
    let port = 32768 + (random_u32() % (60999 - 32768 + 1)) as u16;
    Ok(ConnectParams::rdma_cm(
        SocketAddr::new(local, port),
        dst,
        local_qpn,
    ))
}

/// The SIDR_REQ parameters.
pub(crate) fn sidr_params(
    p: &ibcm_sidr_param,
    peer: &str,
    private_data: Vec<u8>,
) -> Result<SidrReqParams> {
    too_long(
        "SIDR_REQ private data",
        private_data.len(),
        IBCM_SIDR_REQ_PRIVATE_DATA_MAX,
    )?;
    if p.timeout_ms == 0 {
        return Err(invalid(
            "timeout_ms 0: a SIDR_REQ needs time for its answer",
        ));
    }
    if PathTarget::is_written_as_one(peer) {
        return Err(Error::new(
            IBCM_EUNSUPPORTED,
            format!(
                "peer {peer:?}: ibcm_sidr_query takes IP peers (lid: and gid: are ibcm_connect's)"
            ),
        ));
    }
    let mut s = SidrReqParams::new(peer_addr(peer)?, ServiceId(p.service_id));
    s.private_data = private_data;
    s.timeout = Duration::from_millis(u64::from(p.timeout_ms));
    s.max_retries = p.max_retries;
    Ok(s)
}

/// The SIDR_REP parameters.
pub(crate) fn sidr_rep_params(
    p: &ibcm_sidr_rep_param,
    private_data: Vec<u8>,
) -> Result<SidrRepParams> {
    too_long(
        "SIDR_REP private data",
        private_data.len(),
        IBCM_SIDR_REP_PRIVATE_DATA_MAX,
    )?;
    let status = u8::try_from(p.status)
        .ok()
        .filter(|s| *s <= 5)
        .map(SidrStatus::from_raw)
        .ok_or_else(|| invalid(format!("SIDR status {} (0..5)", p.status)))?;
    let qpn = if status == SidrStatus::Success {
        qpn(p.qp_num, "qp_num")?
    } else {
        Qpn::new(p.qp_num)
            .ok_or_else(|| invalid(format!("qp_num {:#x} is not 24 bits", p.qp_num)))?
    };
    let mut r = SidrRepParams::success(qpn, Qkey(p.qkey));
    r.status = status;
    r.private_data = private_data;
    Ok(r)
}

/// The accept parameters.
pub(crate) fn accept_params(p: &ibcm_accept_param, private_data: Vec<u8>) -> Result<AcceptParams> {
    too_long(
        "REP private data",
        private_data.len(),
        IBCM_REP_PRIVATE_DATA_MAX,
    )?;
    let mut a = AcceptParams::new(qpn(p.qp_num, "qp_num")?);
    a.starting_psn = psn(p.starting_psn)?;
    a.private_data = private_data;
    a.responder_resources = p.responder_resources;
    a.initiator_depth = p.initiator_depth;
    a.rnr_retry_count = u3(p.rnr_retry_count, "rnr_retry_count")?;
    a.srq = p.srq != 0;
    Ok(a)
}

/// The local port, NULL = [`LocalPort::default`] on RoCE.
pub(crate) fn local_port(p: Option<&ibcm_port>) -> Result<(LocalPort, LinkLayer)> {
    let Some(p) = p else {
        return Ok((LocalPort::default(), LinkLayer::Ethernet));
    };
    let link = match p.link_layer {
        1 => LinkLayer::InfiniBand,
        2 => LinkLayer::Ethernet,
        l => {
            return Err(invalid(format!(
                "link_layer {l} (1 InfiniBand, 2 Ethernet)"
            )))
        }
    };
    let port = LocalPort {
        port_num: p.port_num,
        pkey_index: p.pkey_index,
        sgid_index: p.sgid_index,
        lmc: p.lmc,
    };
    Ok((port, link))
}

fn ah(a: &AhAttr) -> ibcm_ah_attr {
    let grh = a.grh.unwrap_or_default();
    ibcm_ah_attr {
        grh: ibcm_global_route {
            dgid: grh.dgid.0,
            flow_label: grh.flow_label.get(),
            sgid_index: grh.sgid_index,
            hop_limit: grh.hop_limit,
            traffic_class: grh.traffic_class,
        },
        dlid: a.dlid.get(),
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.grh.is_some()),
        port_num: a.port_num,
    }
}

/// ibcm's attributes as the C struct, and the mask as `int`.
pub(crate) fn qp_attr_c(a: &QpAttr, mask: QpAttrMask, t: QpType) -> (ibcm_qp_attr, i32) {
    let qp_type = match t {
        QpType::Rc => ibcm_qp_type::IBCM_QPT_RC,
        QpType::Uc => ibcm_qp_type::IBCM_QPT_UC,
        QpType::XrcIni => ibcm_qp_type::IBCM_QPT_XRC_SEND,
        QpType::XrcTgt => ibcm_qp_type::IBCM_QPT_XRC_RECV,
    };
    let c = ibcm_qp_attr {
        qp_state: a.qp_state.ibv(),
        qp_access_flags: a.qp_access_flags.bits(),
        pkey_index: a.pkey_index,
        port_num: a.port_num,
        path_mtu: a.path_mtu.raw(),
        ah_attr: ah(&a.ah_attr),
        dest_qp_num: a.dest_qp_num.get(),
        rq_psn: a.rq_psn.get(),
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        alt_pkey_index: a.alt_pkey_index,
        alt_ah_attr: ah(&a.alt_ah_attr),
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        sq_psn: a.sq_psn.get(),
        rnr_retry: a.rnr_retry,
        max_rd_atomic: a.max_rd_atomic,
        path_mig_state: u8::try_from(a.path_mig_state.ibv()).unwrap_or(0),
        qp_type: qp_type as u8,
    };
    // The mask has 21 bits: it fits an int.
    (c, i32::try_from(mask.bits()).unwrap_or(i32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_unicast_hosts() {
        for ok in [
            "10.0.0.2",
            "10.0.0.2:4792",
            "::1",
            "[fe80::1]:4791",
            "127.0.0.1",
        ] {
            assert!(peer_addr(ok).is_ok(), "{ok}");
        }
        for bad in [
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "239.1.2.3:4791",
            "::",
            "ff02::1",
            "10.0.0.2:0",
            "host",
        ] {
            assert_eq!(
                peer_addr(bad).map_err(|e| e.code),
                Err(IBCM_EINVAL),
                "{bad}"
            );
        }
    }

    #[test]
    fn peers_by_lid_and_gid() {
        assert_eq!(peer("lid:4"), Ok(Peer::Ib(PathTarget::Lid(Lid(4)))));
        assert_eq!(peer("lid:0x1F"), Ok(Peer::Ib(PathTarget::Lid(Lid(0x1f)))));
        let g = peer("gid:fe80::2:c903:0:3").unwrap();
        assert!(matches!(g, Peer::Ib(PathTarget::Gid(_))), "{g:?}");
        assert_eq!(
            peer("10.0.0.2"),
            Ok(Peer::Ip("10.0.0.2:4791".parse().unwrap()))
        );
        for bad in [
            "lid:0",
            "lid:0xc000",
            "lid:49152",
            "lid:65535",
            "lid:",
            "lid:-3",
            "lid:+3",
            "lid:4:4791",
            "gid:",
            "gid:::",
            "gid:ff02::1",
            "gid:10.0.0.1",
            "gid:[fe80::1]:4791",
            "LID:4",
        ] {
            let e = peer(bad).unwrap_err();
            assert_eq!(e.code, IBCM_EINVAL, "{bad}");
            assert!(e.msg.contains(&format!("{bad:?}")), "{bad}: {}", e.msg);
        }
        let mut p = conn_param_default();
        p.qp_num = 0x11;
        p.service_id = 0x77;
        p.transport = 2;
        p.flags = IBCM_CONNECT_MANUAL_RTU;
        let c = connect_params(&p, "lid:5", b"pd".to_vec(), None).unwrap();
        assert_eq!(c.path, Some(PathTarget::Lid(Lid(5))));
        assert!(c.manual);
        assert_eq!(
            (
                c.params.service_id,
                c.params.transport,
                c.params.private_data.as_slice()
            ),
            (ServiceId(0x77), ReqTransport::Xrc, &b"pd"[..])
        );
        // rdma_cm listeners are named by IP and port; SIDR by IP.
        p.flags = IBCM_CONNECT_RDMA_CM;
        p.service_id = 0;
        let e = connect_params(&p, "lid:5", Vec::new(), None).unwrap_err();
        assert_eq!(e.code, IBCM_EINVAL);
        assert!(e.msg.contains("IP:PORT"), "{}", e.msg);
        let sp = sidr_param_default();
        let e = sidr_params(&sp, "lid:5", Vec::new()).unwrap_err();
        assert_eq!(e.code, IBCM_EUNSUPPORTED);
    }

    #[test]
    fn a_path_gives_the_reqs_fields() {
        use ibcm_mad::sa::PathRecord;
        use ibcm_mad::{Pkey, U4};
        let rec = PathRecord {
            slid: Lid(2),
            dlid: Lid(5),
            sl: U4::masked(3),
            pkey: Pkey(0xffff),
            mtu: Mtu::Mtu2048,
            packet_life_time: 18,
            ..PathRecord::default()
        };
        let mut p = conn_param_default();
        p.qp_num = 0x11;
        p.service_id = 0x77;
        p.path_mtu = 5;
        let mut c = connect_params(&p, "lid:5", Vec::new(), None)
            .unwrap()
            .params;
        apply_path(&mut c, &rec);
        let want =
            ibcm::sa::connect_params(&rec, CA_ACK_DELAY, 0, ServiceId(0x77), Qpn::masked(0x11));
        assert_eq!(c.peer, want.peer);
        assert_eq!(c.primary_path, want.primary_path);
        assert_eq!(
            (c.pkey, c.packet_life_time),
            (want.pkey, want.packet_life_time)
        );
        assert_eq!(c.path_mtu, Mtu::Mtu2048, "the path's, below the asked 4096");
        // The application's smaller MTU stays.
        p.path_mtu = 3;
        let mut c = connect_params(&p, "lid:5", Vec::new(), None)
            .unwrap()
            .params;
        apply_path(&mut c, &rec);
        assert_eq!(c.path_mtu, Mtu::Mtu1024);
        // The other fields keep their meaning.
        assert_eq!(
            (c.retry_count, c.connect_timeout),
            (want.retry_count, want.connect_timeout)
        );
    }

    #[test]
    fn alternate_paths_need_a_fabric_peer() {
        let mut p = conn_param_default();
        p.qp_num = 0x11;
        p.flags = IBCM_CONNECT_ALT_PATH;
        let c = connect_params(&p, "gid:fe80::5", Vec::new(), None).unwrap();
        assert!(c.alternate && c.path.is_some());
        assert!(
            connect_params(&p, "lid:5", Vec::new(), None)
                .unwrap()
                .alternate
        );
        let e = connect_params(&p, "10.0.0.2", Vec::new(), None).unwrap_err();
        assert_eq!(e.code, IBCM_EINVAL);
        assert!(e.msg.contains("IBCM_CONNECT_ALT_PATH"), "{}", e.msg);
        p.flags = IBCM_CONNECT_ALT_PATH | IBCM_CONNECT_RDMA_CM;
        let e = connect_params(
            &p,
            "10.0.0.2:7174",
            Vec::new(),
            Some("10.0.0.1".parse().unwrap()),
        )
        .unwrap_err();
        assert_eq!(e.code, IBCM_EINVAL);
        p.flags = 0;
        assert!(
            !connect_params(&p, "lid:5", Vec::new(), None)
                .unwrap()
                .alternate
        );
        // The REQ's alternate path is built as its primary path.
        let rec = PathRecord {
            slid: Lid(3),
            dlid: Lid(6),
            packet_life_time: 18,
            ..PathRecord::default()
        };
        let mut c = connect_params(&p, "lid:5", Vec::new(), None)
            .unwrap()
            .params;
        apply_alternate(&mut c, &rec);
        assert_eq!(c.alternate_path, Some(req_path(&rec, CA_ACK_DELAY)));
    }

    #[test]
    fn paths_cross_the_boundary_field_for_field() {
        let p = PathInfo {
            local_lid: Lid(3),
            remote_lid: Lid(7),
            local_gid: Gid([1; 16]),
            remote_gid: Gid([2; 16]),
            flow_label: FlowLabel::masked(0xabcde),
            packet_rate: Rate::G10,
            traffic_class: 0x20,
            hop_limit: 1,
            sl: U4::masked(5),
            subnet_local: true,
            local_ack_timeout: TimeoutExp::masked(19),
        };
        let c = path_c(&p, false);
        assert_eq!((c.local_lid, c.remote_lid, c.sl, c.rate), (3, 7, 5, 3));
        assert_eq!(
            (c.flow_label, c.local_ack_timeout, c.subnet_local),
            (0xabcde, 19, 1)
        );
        assert_eq!(path_of(&c), Ok(p));
        // From the peer's view: the ends are swapped, the rest kept.
        let t = path_c(&p, true);
        assert_eq!((t.local_lid, t.remote_lid), (7, 3));
        assert_eq!((t.local_gid, t.remote_gid), ([2; 16], [1; 16]));
        assert_eq!((t.flow_label, t.sl), (c.flow_label, c.sl));
        // Every field that does not fit is refused, naming it.
        let bad = [
            ibcm_path {
                flow_label: 1 << 20,
                ..c
            },
            ibcm_path { rate: 64, ..c },
            ibcm_path { sl: 16, ..c },
            ibcm_path {
                subnet_local: 2,
                ..c
            },
            ibcm_path {
                local_ack_timeout: 32,
                ..c
            },
        ];
        for (b, what) in bad.iter().zip([
            "flow_label",
            "rate",
            "sl",
            "subnet_local",
            "local_ack_timeout",
        ]) {
            let e = path_of(b).unwrap_err();
            assert_eq!(e.code, IBCM_EINVAL, "{what}");
            assert!(e.msg.contains(what), "{what}: {}", e.msg);
        }
    }

    #[test]
    fn event_peers_are_what_connect_takes() {
        let lid = PeerAddr::Ib(IbAddr {
            lid: Lid(5),
            gid: None,
            ..IbAddr::roce(Gid::ZERO)
        });
        assert_eq!(peer_string(&lid), "lid:5");
        assert_eq!(
            peer(&peer_string(&lid)),
            Ok(Peer::Ib(PathTarget::Lid(Lid(5))))
        );
        let g = Gid("fe80::2:c903:0:3"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets());
        let grh = PeerAddr::Ib(IbAddr {
            lid: Lid(5),
            gid: Some(g),
            ..IbAddr::roce(Gid::ZERO)
        });
        assert_eq!(peer_string(&grh), "gid:fe80::2:c903:0:3");
        assert_eq!(peer(&peer_string(&grh)), Ok(Peer::Ib(PathTarget::Gid(g))));
        let roce = PeerAddr::Ib(IbAddr::roce(Gid::from_ip("10.0.0.2".parse().unwrap())));
        assert_eq!(peer_string(&roce), "10.0.0.2:4791");
        let udp = PeerAddr::Udp("10.0.0.3:4791".parse().unwrap());
        assert_eq!(peer_string(&udp), "10.0.0.3:4791");
    }

    #[test]
    fn defaults_are_ibcms() {
        let mut p = conn_param_default();
        p.qp_num = 0x11;
        let Connect {
            params: c, manual, ..
        } = connect_params(&p, "10.0.0.2", Vec::new(), None).unwrap();
        assert!(!manual);
        let d = ConnectParams::new(c.peer, ServiceId(0), Qpn::masked(0x11));
        assert_eq!(
            c.peer,
            ibcm::proto::PeerAddr::Udp("10.0.0.2:4791".parse().unwrap())
        );
        assert_eq!(
            (
                c.responder_resources,
                c.initiator_depth,
                c.path_mtu,
                c.retry_count
            ),
            (
                d.responder_resources,
                d.initiator_depth,
                d.path_mtu,
                d.retry_count
            )
        );
        assert_eq!(c.connect_timeout, Some(DEFAULT_CONNECT_TIMEOUT));
        assert_eq!(c.starting_psn, None);
    }

    #[test]
    fn bad_values_are_refused() {
        let mut p = conn_param_default();
        let e = connect_params(&p, "10.0.0.2", Vec::new(), None).unwrap_err();
        assert_eq!(e.code, IBCM_EINVAL, "QPN 0");
        p.qp_num = 1 << 24;
        assert_eq!(
            connect_params(&p, "x", Vec::new(), None).unwrap_err().code,
            IBCM_EINVAL
        );
        p.qp_num = 5;
        assert_eq!(
            connect_params(&p, "nowhere", Vec::new(), None)
                .unwrap_err()
                .code,
            IBCM_EINVAL
        );
        let e = connect_params(&p, "10.0.0.2:7", vec![0; 93], None).unwrap_err();
        assert_eq!(e.code, IBCM_ETOOLONG);
        p.transport = 7;
        assert_eq!(
            connect_params(&p, "10.0.0.2", Vec::new(), None)
                .unwrap_err()
                .code,
            IBCM_EINVAL
        );
        p.transport = 2;
        p.flags = IBCM_CONNECT_MANUAL_RTU | IBCM_CONNECT_SHARED_QPN | IBCM_CONNECT_PSN;
        p.starting_psn = 0x123;
        let Connect {
            params: c, manual, ..
        } = connect_params(&p, "10.0.0.2", Vec::new(), None).unwrap();
        assert!(manual && c.allow_shared_qpn);
        assert_eq!(
            (c.transport, c.starting_psn),
            (ReqTransport::Xrc, Psn::new(0x123))
        );
        p.flags = 0x80;
        assert_eq!(
            connect_params(&p, "10.0.0.2", Vec::new(), None)
                .unwrap_err()
                .code,
            IBCM_EINVAL
        );
        let mut a = accept_param_default();
        assert_eq!(accept_params(&a, Vec::new()).unwrap_err().code, IBCM_EINVAL);
        a.qp_num = 9;
        a.rnr_retry_count = 8;
        assert_eq!(accept_params(&a, Vec::new()).unwrap_err().code, IBCM_EINVAL);
        a.rnr_retry_count = 7;
        assert_eq!(
            accept_params(&a, vec![0; 197]).unwrap_err().code,
            IBCM_ETOOLONG
        );
        assert_eq!(
            accept_params(&a, Vec::new()).unwrap().local_qpn,
            Qpn::masked(9)
        );
    }

    #[test]
    fn rdma_cm_connects_by_ip_and_port() {
        let mut p = conn_param_default();
        p.qp_num = 0x11;
        p.flags = IBCM_CONNECT_RDMA_CM;
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let local = Some(ip);
        let Connect { params: c, .. } =
            connect_params(&p, "10.0.0.1:7174", b"hi".to_vec(), local).unwrap();
        assert_eq!(c.service_id, ServiceId(0x0106_1c06));
        assert_eq!(
            c.peer,
            ibcm::proto::PeerAddr::Udp("10.0.0.1:4791".parse().unwrap())
        );
        let h = c.cma_header.unwrap();
        assert_eq!(h.src, ip);
        assert!((32768..=60999).contains(&h.src_port), "{}", h.src_port);
        assert_eq!(h.dst, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(c.private_data, b"hi");
        // XRC: the IB port space.
        p.transport = 2;
        let Connect { params: c, .. } =
            connect_params(&p, "10.0.0.1:7174", Vec::new(), local).unwrap();
        assert_eq!(c.service_id, ServiceId(0x013f_1c06));
        p.transport = 0;
        let code = |p: &ibcm_conn_param, peer: &str, pd: usize, local| {
            connect_params(p, peer, vec![0; pd], local)
                .unwrap_err()
                .code
        };
        assert_eq!(code(&p, "10.0.0.1", 0, local), IBCM_EINVAL, "no port");
        assert_eq!(code(&p, "10.0.0.1:0", 0, local), IBCM_EINVAL, "port 0");
        assert_eq!(code(&p, "224.0.0.1:7174", 0, local), IBCM_EINVAL);
        assert_eq!(code(&p, "10.0.0.1:7174", 0, None), IBCM_EINVAL, "no source");
        assert_eq!(code(&p, "10.0.0.1:7174", 57, local), IBCM_ETOOLONG);
        p.service_id = 0x0106_1c06;
        assert_eq!(
            code(&p, "10.0.0.1:7174", 0, local),
            IBCM_EINVAL,
            "a service ID"
        );
    }

    #[test]
    fn sidr_parameters_are_checked() {
        let mut p = sidr_param_default();
        assert_eq!((p.timeout_ms, p.max_retries), (4096, 15));
        p.service_id = 7;
        let s = sidr_params(&p, "10.0.0.1", b"x".to_vec()).unwrap();
        assert_eq!((s.service_id, s.private_data.len()), (ServiceId(7), 1));
        assert_eq!(
            sidr_params(&p, "10.0.0.1", vec![0; 217]).unwrap_err().code,
            IBCM_ETOOLONG
        );
        p.timeout_ms = 0;
        assert_eq!(
            sidr_params(&p, "10.0.0.1", Vec::new()).unwrap_err().code,
            IBCM_EINVAL
        );
        let mut r = ibcm_sidr_rep_param {
            status: 0,
            qp_num: 0,
            qkey: 5,
            private_data: std::ptr::null(),
            private_data_len: 0,
        };
        let code = |r: &ibcm_sidr_rep_param, pd: usize| {
            sidr_rep_params(r, vec![0; pd])
                .map(|_| ())
                .map_err(|e| e.code)
        };
        assert_eq!(code(&r, 0), Err(IBCM_EINVAL), "success needs a QPN");
        r.qp_num = 0x1234;
        assert_eq!(code(&r, 0), Ok(()));
        assert_eq!(code(&r, 137), Err(IBCM_ETOOLONG));
        r.status = 6;
        assert_eq!(code(&r, 0), Err(IBCM_EINVAL));
        r.status = 2;
        r.qp_num = 0;
        assert_eq!(code(&r, 0), Ok(()), "a rejection names no QP");
    }

    #[test]
    fn random_psns_are_24_bits_and_vary() {
        let v: Vec<u32> = (0..64).map(|_| random_psn()).collect();
        assert!(v.iter().all(|p| *p <= 0x00ff_ffff));
        let distinct: std::collections::HashSet<_> = v.iter().collect();
        assert!(distinct.len() > 60, "{distinct:?}");
    }

    #[test]
    fn qp_attr_maps_field_for_field() {
        use ibcm::qp_attr::{qp_attr, Connection, QpState, Side};
        let req = ibcm_mad::Req {
            local_qpn: Qpn::masked(0x18),
            starting_psn: Psn::masked(0x647bbb),
            ..Default::default()
        };
        let rep = ibcm_mad::Rep {
            starting_psn: Psn::masked(0x0fd2ad),
            responder_resources: 1,
            ..Default::default()
        };
        let (port, link) = local_port(None).unwrap();
        let conn = Connection::new(&req, &rep, Side::Passive, link, port);
        let (a, m) = qp_attr(&conn, QpState::Rtr).unwrap();
        let (c, mask) = qp_attr_c(&a, m, conn.qp_type().unwrap());
        assert_eq!(mask as u32, m.bits());
        assert_eq!((c.qp_state, c.dest_qp_num, c.rq_psn), (2, 0x18, 0x0fd2ad));
        assert_eq!((c.max_dest_rd_atomic, c.ah_attr.is_global), (1, 1));
        assert_eq!(c.qp_type, ibcm_qp_type::IBCM_QPT_RC as u8);
        let bad = ibcm_port {
            port_num: 1,
            sgid_index: 0,
            lmc: 0,
            pkey_index: 0,
            link_layer: 3,
        };
        assert_eq!(local_port(Some(&bad)).unwrap_err().code, IBCM_EINVAL);
    }
}
