//! The daemon side's limits and options ([`ServerConfig`], [`Reservation`]): every bound it
//! keeps per session, per user and per node (docs/ibcmd.md §4).

use std::time::Duration;

#[cfg(doc)]
use super::NodeServer;

/// A range of service IDs only one Unix user may listen on (`ibcmd --reserve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// First service ID of the range.
    pub first: u64,
    /// Last service ID of the range (inclusive).
    pub last: u64,
    /// The user.
    pub uid: u32,
}

impl std::str::FromStr for Reservation {
    type Err = String;

    /// `SID=UID` or `FIRST-LAST=UID`, service IDs in hex with `0x` or decimal, e.g.
    /// `0x0000000001061144=0` (rdma_cm TCP port 4420, NVMe-oF, for root).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not SID=UID or FIRST-LAST=UID");
        let (range, uid) = s.split_once('=').ok_or_else(bad)?;
        let num = |t: &str| {
            let t = t.trim();
            match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => t.parse().ok(),
            }
        };
        let (first, last) = match range.split_once('-') {
            Some((a, b)) => (num(a).ok_or_else(bad)?, num(b).ok_or_else(bad)?),
            None => {
                let v = num(range).ok_or_else(bad)?;
                (v, v)
            }
        };
        if first > last {
            return Err(format!("{s:?}: the range is empty"));
        }
        let uid = uid.trim().parse().map_err(|_| bad())?;
        Ok(Reservation { first, last, uid })
    }
}

/// Limits per session.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections (live, TimeWait excluded) a session may hold.
    pub max_connections: usize,
    /// Listeners (CM and XRC) a session may hold.
    pub max_listeners: usize,
    /// SIDR requests a session may have in flight, and SIDR_REQs for its services it may
    /// leave unanswered at once (more are answered "rejected").
    pub max_sidr: usize,
    /// Sessions one Unix user may have open at once, counted from their accept, hello or not
    /// (a further session is refused at once).
    pub max_sessions_per_user: usize,
    /// Connections one Unix user may hold over all its sessions (as `max_connections`).
    /// Both count the connections the XRC target accepted for the sessions' XRC services.
    pub max_connections_per_user: usize,
    /// Live TGT QPs the XRC services of one Unix user's sessions may have created (orphans
    /// included, until destroyed); a REQ that would create one more is rejected with REJ 3.
    /// Default 16,384: a quarter of the sim backend's 65,536, so one user cannot take them
    /// all (`ibcmd --max-tgt-qps-per-user`).
    pub max_tgt_qps_per_user: usize,
    /// Live TGT QPs the XRC services of all users but root may have created together
    /// (orphans included): what stays of the backend's QPs is root's, whatever the other
    /// users hold or leave behind. Default 49,152: three quarters of the sim backend's
    /// 65,536 (`ibcmd --max-tgt-qps-non-root`).
    pub max_tgt_qps_non_root: usize,
    /// Service IDs reserved for one user: another user's listen (CM or XRC) there is refused.
    pub reserved: Vec<Reservation>,
    /// Messages queued towards a client before it counts as stuck and is dropped.
    pub queue: usize,
    /// Bytes queued towards a client before it counts as stuck and is dropped.
    pub queue_bytes: usize,
    /// Bytes queued towards all the sessions of one Unix user: the session whose message
    /// would go over it counts as stuck and is dropped.
    pub queue_bytes_per_user: usize,
    /// How long a new session may take to say hello before it is closed.
    pub hello_timeout: Duration,
    /// Descriptors kept for root's sessions: the sessions of other users are refused at
    /// accept once the open descriptors would leave fewer than this many free below
    /// `RLIMIT_NOFILE`.
    pub reserved_fds: usize,
    /// REQs a listener may have delivered to its client and not yet answered (accepted,
    /// rejected or dropped), like a SYN backlog: a REQ beyond it is rejected by the daemon
    /// with REJ 3 "no resources" and never reaches the client, so a flood cannot fill the
    /// session's queue (`ibcmd --listen-backlog`). Default 1,024.
    pub listen_backlog: usize,
    /// [`NodeServer::shutdown`]: how long to wait for the peers' answers to the DREQs (the
    /// connections still unanswered then stay in the journal, for the next start).
    pub shutdown_grace: std::time::Duration,
    /// The IP address of the CM the server feeds (`ibcmd --addr`), told to clients at
    /// their hello so that they refuse a peer of the other address family at once; `None`
    /// (the default): not told.
    pub addr: Option<std::net::IpAddr>,
    /// Path queries ([`Op::ResolvePath`](super::proto::Op::ResolvePath)) a session may have
    /// in flight at once (more are refused, "quota: N path queries in flight"). Default 64.
    pub max_path_queries: usize,
    /// Path queries one Unix user's sessions may have in flight together (as above, "… of
    /// uid U"). Default 256: a quarter of the SA client's 1,024 queries at once, so that one
    /// user cannot take them all.
    pub max_path_queries_per_user: usize,
    /// LAP exchanges a session may have at once: its LAPs waiting for their APR
    /// ([`Op::LoadAltPath`](super::proto::Op::LoadAltPath): more are refused, "quota: N LAP
    /// exchanges") and the LAPs of its connections held for it unanswered (when it answers
    /// its LAPs, [`Op::LapPolicy`](super::proto::Op::LapPolicy): more are answered APR
    /// "rejected" by the daemon). Told to clients at hello (`apm`); 0 serves no path
    /// migration (clients refuse the calls at once). Default 1,024 (at most one exchange per
    /// connection at a time: a session may have 65,536 connections).
    pub max_laps: usize,
    /// LAP exchanges one Unix user's sessions may have together (as above, "… of uid U").
    /// Default 4,096.
    pub max_laps_per_user: usize,
    /// The CM runs on a native InfiniBand port (`ibcmd --umad DEV` whose port's link layer is
    /// InfiniBand): peers are addressed by LID (or GID), so a peer a client names by IP (a
    /// [`Udp`](crate::proto::PeerAddr::Udp) address) is refused, for connects and SIDR
    /// requests ("name peers lid:N or gid:G"). `false` (the default): peers are used as
    /// given (or as [`Self::roce_umad`] says).
    pub infiniband: bool,
    /// The CM runs on RoCE through umad (`ibcmd --umad`): a peer a client names by IP
    /// (a [`Udp`](crate::proto::PeerAddr::Udp) address, what libibcm sends) is turned into
    /// the RoCE address that transport sends to ([`IbAddr::roce`](crate::proto::IbAddr::roce)
    /// of the IPv4-mapped GID) before the endpoint sees it, for connects and SIDR requests;
    /// `false` (the default): peers are used as given.
    pub roce_umad: bool,
}

impl ServerConfig {
    /// A peer a client named, as this server's transport addresses it ([`Self::roce_umad`]),
    /// or why it cannot be reached ([`Self::infiniband`]).
    pub(super) fn peer(&self, p: crate::proto::PeerAddr) -> Result<crate::proto::PeerAddr, String> {
        use crate::proto::{IbAddr, PeerAddr};
        match p {
            PeerAddr::Udp(sa) if self.infiniband => Err(format!(
                "peer {sa}: this node service runs on an InfiniBand port, where peers are \
                 named by LID or GID (lid:N, gid:G), not by IP"
            )),
            PeerAddr::Udp(sa) if self.roce_umad => {
                Ok(PeerAddr::Ib(IbAddr::roce(ibcm_mad::Gid::from_ip(sa.ip()))))
            }
            p => Ok(p),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 65_536,
            max_listeners: 1024,
            max_sidr: 1024,
            max_sessions_per_user: 1024,
            max_connections_per_user: 262_144,
            max_tgt_qps_per_user: 16_384,
            max_tgt_qps_non_root: 49_152,
            reserved: Vec::new(),
            queue: 8192,
            queue_bytes: 4 << 20,
            queue_bytes_per_user: 64 << 20,
            hello_timeout: Duration::from_secs(5),
            reserved_fds: 64,
            listen_backlog: 1024,
            shutdown_grace: std::time::Duration::from_secs(2),
            addr: None,
            max_path_queries: 64,
            max_path_queries_per_user: 256,
            max_laps: 1024,
            max_laps_per_user: 4096,
            infiniband: false,
            roce_umad: false,
        }
    }
}

#[cfg(test)]
mod peer_tests {
    use super::ServerConfig;
    use crate::proto::{IbAddr, PeerAddr};

    #[test]
    fn a_roce_umad_server_addresses_ip_peers_by_their_gid() {
        let ip: std::net::IpAddr = "10.77.0.1".parse().unwrap();
        let udp = PeerAddr::Udp(std::net::SocketAddr::new(ip, 4791));
        let plain = ServerConfig::default();
        assert_eq!(plain.peer(udp), Ok(udp));
        let roce = ServerConfig {
            roce_umad: true,
            ..ServerConfig::default()
        };
        let ib = PeerAddr::Ib(IbAddr::roce(ibcm_mad::Gid::from_ip(ip)));
        assert_eq!(roce.peer(udp), Ok(ib));
        assert_eq!(roce.peer(ib), Ok(ib), "an IB address is kept");
    }

    #[test]
    fn an_infiniband_server_refuses_ip_peers() {
        let cfg = ServerConfig {
            infiniband: true,
            ..ServerConfig::default()
        };
        let udp = PeerAddr::Udp("10.77.0.1:4791".parse().unwrap());
        let why = cfg.peer(udp).unwrap_err();
        assert!(
            why.contains("lid:N, gid:G") && why.contains("10.77.0.1"),
            "{why}"
        );
        let lid = PeerAddr::Ib(IbAddr {
            lid: ibcm_mad::Lid(4),
            gid: None,
            ..IbAddr::roce(ibcm_mad::Gid::ZERO)
        });
        assert_eq!(cfg.peer(lid), Ok(lid));
    }
}
