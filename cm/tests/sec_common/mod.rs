//! Helpers of the `sec_*` tests (issue 12): a listener, a legitimate client, hostile MADs.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use ibcm::proto::*;
use ibcm_mad::*;

pub(crate) const SID: ServiceId = ServiceId(0x77);
pub(crate) const L_GUID: Guid = Guid(0x0002_c903_0000_0002);
pub(crate) const A_GUID: Guid = Guid(0x0002_c903_0000_000a);

pub(crate) fn addr(s: &str) -> PeerAddr {
    PeerAddr::Udp(s.parse().unwrap())
}

pub(crate) fn l_addr() -> PeerAddr {
    addr("10.0.0.1:4791")
}

pub(crate) fn a_addr() -> PeerAddr {
    addr("10.0.0.2:4791")
}

pub(crate) fn t0() -> Instant {
    #[allow(clippy::disallowed_methods)]
    Instant::now()
}

/// A listener on [`SID`] and a client, with fixed seeds.
pub(crate) struct Pair {
    pub(crate) l: Endpoint,
    pub(crate) a: Endpoint,
    pub(crate) now: Instant,
    /// The listener's application accepts every REQ (QPNs counting up from here).
    pub(crate) next_qpn: u32,
    /// Established connections of the client.
    pub(crate) a_established: usize,
    /// Client connections that closed.
    pub(crate) a_closed: usize,
    /// Bytes the listener sent to each address that is not the client.
    pub(crate) sent_elsewhere: Vec<(PeerAddr, usize)>,
}

impl Pair {
    pub(crate) fn new(l_cfg: EndpointConfig) -> Self {
        let mut l = Endpoint::new(EndpointConfig {
            rng_seed: l_cfg.rng_seed.or(Some(11)),
            local_ca_guid: L_GUID,
            local_gid: Gid::from_ip("10.0.0.1".parse().unwrap()),
            ..l_cfg
        });
        l.listen(SID, ListenOptions::default());
        let a = Endpoint::new(EndpointConfig {
            rng_seed: Some(12),
            local_ca_guid: A_GUID,
            local_gid: Gid::from_ip("10.0.0.2".parse().unwrap()),
            ..Default::default()
        });
        Pair {
            l,
            a,
            now: t0(),
            next_qpn: 0x1000,
            a_established: 0,
            a_closed: 0,
            sent_elsewhere: Vec::new(),
        }
    }

    /// The listener's application accepts every pending REQ; returns what the listener sent
    /// (not delivered anywhere).
    pub(crate) fn l_step(&mut self) -> Vec<Transmit> {
        while let Some(ev) = self.l.poll_event() {
            if let EventKind::ReqReceived(_) = ev.kind {
                self.next_qpn += 1;
                let _ = self.l.accept(
                    self.now,
                    ev.conn,
                    AcceptParams::new(Qpn::masked(self.next_qpn)),
                );
            }
        }
        let mut v = Vec::new();
        while let Some(t) = self.l.poll_transmit() {
            v.push(t);
        }
        v
    }

    /// Moves MADs between the two until both are quiet; the listener accepts every REQ.
    pub(crate) fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(ev) = self.l.poll_event() {
                if let EventKind::ReqReceived(_) = ev.kind {
                    self.next_qpn += 1;
                    let _ = self.l.accept(
                        self.now,
                        ev.conn,
                        AcceptParams::new(Qpn::masked(self.next_qpn)),
                    );
                }
            }
            while let Some(t) = self.l.poll_transmit() {
                if t.to == a_addr() {
                    self.a.handle_datagram(self.now, l_addr(), &t.mad);
                    moved = true;
                } else {
                    self.note_elsewhere(t.to, t.mad.len());
                }
            }
            while let Some(t) = self.a.poll_transmit() {
                assert_eq!(t.to, l_addr());
                self.l.handle_datagram(self.now, a_addr(), &t.mad);
                moved = true;
            }
            while let Some(ev) = self.a.poll_event() {
                match ev.kind {
                    EventKind::Established => self.a_established += 1,
                    EventKind::Closed(_) => self.a_closed += 1,
                    _ => {}
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn note_elsewhere(&mut self, to: PeerAddr, n: usize) {
        match self.sent_elsewhere.iter_mut().find(|(a, _)| *a == to) {
            Some((_, b)) => *b += n,
            None => self.sent_elsewhere.push((to, n)),
        }
    }

    /// Advances time by `d`, firing both endpoints' timers on the way.
    pub(crate) fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        loop {
            let next = [self.l.poll_timeout(), self.a.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    self.l.handle_timeout(self.now);
                    self.a.handle_timeout(self.now);
                    self.pump();
                }
                _ => break,
            }
        }
        self.now = end;
        self.l.handle_timeout(self.now);
        self.a.handle_timeout(self.now);
        self.pump();
    }

    /// The client connects once; returns its connection.
    pub(crate) fn connect(&mut self, qpn: u32) -> ConnId {
        let mut p = ConnectParams::new(l_addr(), SID, Qpn::masked(qpn));
        p.starting_psn = Some(Psn::masked(1));
        let c = self.a.connect(self.now, p).unwrap();
        self.pump();
        c
    }
}

/// A hostile REQ: comm ID, CA GUID and QPN as given, the longest timeout and most retries.
pub(crate) fn hostile_req(comm: u32, guid: u64, qpn: u32, timeout: u8, retries: u8) -> Vec<u8> {
    let mut req = Req {
        local_comm_id: CommId(comm),
        service_id: SID,
        local_ca_guid: Guid(guid),
        local_qpn: Qpn::masked(qpn),
        local_cm_response_timeout: TimeoutExp::masked(timeout),
        remote_cm_response_timeout: TimeoutExp::masked(timeout),
        max_cm_retries: U4::masked(retries),
        primary_path: roce_path(
            Gid::from_ip("10.9.9.9".parse().unwrap()),
            Gid::from_ip("10.0.0.1".parse().unwrap()),
            TimeoutExp::masked(31),
        ),
        ..Req::default()
    };
    req.set_transport(ReqTransport::Rc);
    Mad::new(Tid(u64::from(comm)), CmMessage::Req(req))
        .to_bytes()
        .to_vec()
}

/// Parses a MAD the endpoint sent.
pub(crate) fn parse(b: &[u8]) -> CmMessage {
    Mad::parse(b).unwrap().msg
}

/// An RTU naming `ours` (the listener's comm ID) and `theirs`.
pub(crate) fn rtu(theirs: u32, ours: u32) -> Vec<u8> {
    let m = Rtu {
        local_comm_id: CommId(theirs),
        remote_comm_id: CommId(ours),
        private_data: PrivateData::zeroed(),
    };
    Mad::new(Tid(1), CmMessage::Rtu(m)).to_bytes().to_vec()
}
