//! cm-ping's REQ options beyond `--timeout-exp`/`--retries`: the two timers a REQ sets for
//! the *passive* side, and one test-only option for the conformance lab's stale-connection
//! cell (`tests/conformance/scenarios/kernel-paths.sh`).
//!
//! * `--local-timeout-exp N`: the REQ's Local CM Response Timeout. A Linux passive side
//!   resends its REP every ms(N) (`cm_req_handler` in `drivers/infiniband/core/cm.c` takes its
//!   REP timer from this field), so `--local-timeout-exp 17 --timeout-exp 22 --retries 2`
//!   makes the kernel's REP retries run out (~1.6 s) long before this side's REQ timer
//!   (~19 s) would resend the REQ.
//! * `--local-ack-timeout N`: the primary path's Local ACK Timeout. A Linux passive side
//!   derives its path's packet life time from it and stays in TimeWait ms(N) after a
//!   disconnect (`cm_format_paths_from_req`, `cm_enter_timewait`), and so does this endpoint.
//! * `--same-qpn` (test only): every connection of this cm-ping announces one QPN, even while
//!   an earlier one is established. A peer CM must then take the second REQ for a stale
//!   connection: REJ 10 to it and a DREQ to the first (Linux: `cm_match_req`). It exists so that
//!   the lab can watch the kernel detect that; no application does this with a real QP.

use std::net::IpAddr;

use clap::Args;
use ibcm::proto::{roce_path, ConnectParams};
use ibcm_mad::{Gid, TimeoutExp};

/// The REQ options (flattened into cm-ping's arguments).
#[derive(Debug, Clone, Args)]
pub(crate) struct ReqArgs {
    /// Connect: the REQ's Local CM Response Timeout exponent N (4.096 µs × 2^N: how long this
    /// side may take to answer the REP, and the peer's REP retransmission timer); default
    /// --timeout-exp.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=31))]
    pub(crate) local_timeout_exp: Option<u8>,
    /// Connect: the REQ's primary path Local ACK Timeout exponent N (default: packet life
    /// time 18 + 1 = 19). A Linux peer stays in TimeWait ms(N) after a disconnect.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=31))]
    pub(crate) local_ack_timeout: Option<u8>,
    /// Connect, TEST ONLY (conformance lab): every connection announces the same QPN, even
    /// while an earlier one is established, so that the peer CM detects a stale connection
    /// (REJ 10 to the new REQ, a DREQ to the old connection). Never use it with a real QP.
    #[arg(long, conflicts_with = "verbs")]
    pub(crate) same_qpn: bool,
}

impl ReqArgs {
    /// Sets the REQ fields these options name on `p`, a connection from `local` (the IP
    /// address whose GID this endpoint uses).
    pub(crate) fn apply(&self, p: &mut ConnectParams, local: IpAddr) {
        if let Some(n) = self.local_timeout_exp {
            p.local_cm_response_timeout = TimeoutExp::masked(n);
        }
        if let (Some(n), Some(remote)) = (self.local_ack_timeout, p.peer.gid()) {
            p.primary_path = Some(roce_path(
                Gid::from_ip(local),
                remote,
                TimeoutExp::masked(n),
            ));
        }
        p.allow_shared_qpn = self.same_qpn;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibcm::proto::PeerAddr;
    use ibcm_mad::{Qpn, ServiceId};

    fn params() -> ConnectParams {
        let peer = PeerAddr::Udp("10.0.0.2:4791".parse().unwrap());
        ConnectParams::new(peer, ServiceId(0x1234), Qpn::masked(0x11))
    }

    #[test]
    fn options_set_the_req_fields() {
        let a = ReqArgs {
            local_timeout_exp: Some(17),
            local_ack_timeout: Some(21),
            same_qpn: true,
        };
        let mut p = params();
        p.remote_cm_response_timeout = TimeoutExp::masked(22);
        a.apply(&mut p, "10.0.0.1".parse().unwrap());
        assert_eq!(p.local_cm_response_timeout.get(), 17);
        assert_eq!(p.remote_cm_response_timeout.get(), 22);
        let path = p.primary_path.unwrap();
        assert_eq!(path.local_ack_timeout.get(), 21);
        assert_eq!(path.local_gid, Gid::from_ip("10.0.0.1".parse().unwrap()));
        assert_eq!(path.remote_gid, Gid::from_ip("10.0.0.2".parse().unwrap()));
        assert!(p.allow_shared_qpn);
    }

    #[test]
    fn no_options_change_nothing() {
        let a = ReqArgs {
            local_timeout_exp: None,
            local_ack_timeout: None,
            same_qpn: false,
        };
        let mut p = params();
        a.apply(&mut p, "10.0.0.1".parse().unwrap());
        assert_eq!(p.local_cm_response_timeout.get(), 20);
        assert!(p.primary_path.is_none());
        assert!(!p.allow_shared_qpn);
    }
}
