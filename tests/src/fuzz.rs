//! Bodies of the fuzz targets. Each takes arbitrary bytes and must never panic; the
//! round-trip target also checks an invariant. The cargo-fuzz harnesses in `fuzz/` and the
//! stable replay test `tests/tests/fuzz_replay.rs` both call these functions.

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::frame;
use ibcm_mad::{AttrId, CmMessage, Mad, MadHeader};
use ibcm_trace::{CaptureError, CaptureReader};

/// Link types the `frame_decode` target chooses from with its first input byte.
pub const LINK_TYPES: [u32; 8] = [1, 101, 228, 229, 113, 276, 247, 197];

/// `mad_parse`: every MAD parser on arbitrary bytes.
pub fn mad_parse(data: &[u8]) {
    let _ = MadHeader::parse(data);
    if let Ok(m) = Mad::parse(data) {
        let _ = m.msg.to_string();
        let _ = m.msg.local_comm_id();
        let _ = m.msg.is_xrc();
    }
    if let Some((&sel, rest)) = data.split_first() {
        let attr = AttrId::from_raw(0x10 + u16::from(sel % 12));
        if let Ok(m) = CmMessage::parse(attr, rest) {
            let _ = m.to_string();
        }
    }
    let _ = CmaHeader::parse(data);
}

/// `mad_roundtrip`: parse → emit → parse gives the same message, and emitting is stable.
pub fn mad_roundtrip(data: &[u8]) {
    let Ok(m) = Mad::parse(data) else {
        return;
    };
    let bytes = m.to_bytes();
    let again = Mad::parse(&bytes).expect("an emitted MAD must parse");
    assert_eq!(m, again, "parse(emit(parse(x))) != parse(x)");
    assert_eq!(again.to_bytes(), bytes, "emit is not stable");
    if let Ok(h) = CmaHeader::parse(data) {
        let mut out = [0u8; 36];
        h.emit(&mut out).expect("36-byte buffer");
        assert_eq!(CmaHeader::parse(&out).expect("emitted header parses"), h);
    }
}

/// `frame_decode`: the first byte picks a link type, the rest is a captured frame.
pub fn frame_decode(data: &[u8]) {
    let Some((&sel, frame_bytes)) = data.split_first() else {
        return;
    };
    let lt = LINK_TYPES[usize::from(sel) % LINK_TYPES.len()];
    if let Ok(frame::Decoded::Ib(p)) = frame::decode(lt, frame_bytes) {
        let _ = p.verify_icrc();
        let _ = p.src_qp();
        if let Some(Ok(mad)) = p.mad() {
            mad_parse(mad);
        }
    }
}

/// `capture_read`: arbitrary bytes as a capture file; every record is classified.
pub fn capture_read(data: &[u8]) {
    let Ok(mut r) = CaptureReader::new(data) else {
        return;
    };
    let mut n = 0;
    while let Some(rec) = r.next_record() {
        match rec {
            Ok(rec) => {
                let _ = ibcm_trace::classify(&rec);
            }
            // Damage skipped over: reading goes on (the resynchronising scan is fuzzed too).
            Err(CaptureError::Skipped { resumed: true, .. }) => {}
            Err(_) => break,
        }
        n += 1;
        if n > 10_000 {
            break;
        }
    }
}

/// `trace_views`: arbitrary bytes as a capture file, through cm-trace's whole run (tracking,
/// the SA PathRecord pairing and association with the REQs, every view: text, `-V`, JSON,
/// ladder, ladder JSON, stats, stats JSON; and the ladder with `--problems`). The input goes
/// through a temporary file (the run reads files); the JSON views must write JSON lines.
pub fn trace_views(data: &[u8]) {
    use ibcm_trace::{run, Filter, Options, View};
    let path = std::env::temp_dir().join(format!(
        "ibcm-fuzz-trace-views-{}-{:?}.pcap",
        std::process::id(),
        std::thread::current().id()
    ));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let file = path.to_string_lossy().into_owned();
    let views = [
        View::Text,
        View::Verbose,
        View::Json,
        View::Ladder,
        View::LadderJson,
        View::Stats,
        View::StatsJson,
    ];
    for (i, view) in views.into_iter().chain([View::Ladder]).enumerate() {
        let opts = Options {
            view,
            // One thread for `--json` (as for a pipe): nothing waits on a helper.
            live: true,
            filter: Filter {
                problems: i == views.len(),
                ..Filter::default()
            },
            ..Options::default()
        };
        let mut out = Vec::new();
        let _ = run(
            &opts,
            std::slice::from_ref(&file),
            &mut out,
            &mut std::io::sink(),
        );
        if matches!(view, View::Json | View::LadderJson | View::StatsJson) {
            for l in String::from_utf8_lossy(&out).lines() {
                assert!(
                    serde_json::from_str::<serde_json::Value>(l).is_ok(),
                    "not JSON: {l}"
                );
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// A fuzz target body.
pub type Target = fn(&[u8]);

/// All targets by name.
pub const TARGETS: [(&str, Target); 6] = [
    ("cm_endpoint", cm_endpoint),
    ("mad_parse", mad_parse),
    ("mad_roundtrip", mad_roundtrip),
    ("frame_decode", frame_decode),
    ("capture_read", capture_read),
    ("trace_views", trace_views),
];

/// `cm_endpoint`: two CM endpoints driven by a script read from the input: API calls
/// (connect, accept, reject, MRA, RTU, disconnect, SIDR requests and answers — or none —, LAP,
/// APR, path migration), message delivery, loss, corruption, injected MADs (random ones, and
/// ones naming a live connection's comm IDs: MRA, LAP, APR, DREQ, REJ, …), replays from a third
/// address (a spoofer) and time jumps.
///
/// Checks that nothing panics, that the counters stay consistent, that no table grows without
/// bound (half-open ≤ `max_half_open`, established ≤ `max_established`, unanswered incoming
/// SIDR_REQs ≤ `max_sidr_in`, counted from the events), that the spoofer never gets more than 3×
/// the bytes it sent (anti-amplification: it never proves it receives; the application's MRAs
/// count too), and that after everybody
/// disconnects and time passes — with incoming SIDR_REQs left unanswered — both tables are
/// empty (nothing leaks).
pub fn cm_endpoint(data: &[u8]) {
    use std::collections::VecDeque;
    use std::time::{Duration, Instant};

    use ibcm::proto::{
        AcceptParams, ConnId, ConnectParams, Endpoint, EndpointConfig, ListenOptions, PeerAddr,
        SidrRepParams, SidrReqParams, StatelessAccept,
    };
    use ibcm_mad::{
        AprStatus, Guid, PathInfo, Qkey, Qpn, RejReason, ServiceId, SidrStatus, TimeoutExp, U4,
    };

    const MAX_HALF_OPEN: usize = 8;
    const MAX_ESTABLISHED: usize = 16;
    const MAX_SIDR_IN: usize = 4;
    let a_addr = PeerAddr::Udp(std::net::SocketAddr::from(([127, 0, 0, 1], 4791)));
    let b_addr = PeerAddr::Udp(std::net::SocketAddr::from(([127, 0, 0, 2], 4791)));
    let spoofer = PeerAddr::Udp(std::net::SocketAddr::from(([127, 0, 0, 3], 4791)));
    let cfg = |seed: u64, guid: u64| EndpointConfig {
        rng_seed: Some(seed),
        local_ca_guid: Guid(guid),
        max_half_open: MAX_HALF_OPEN,
        max_established: MAX_ESTABLISHED,
        max_sidr_in: MAX_SIDR_IN,
        timewait: Some(Duration::from_millis(20)),
        // B answers statelessly from half of the half-open cap on (its listener has a
        // template, below): REQs, floods and RTUs reach the cookie paths too.
        stateless_threshold: MAX_HALF_OPEN / 2,
        stateless_slots: 64,
        ..Default::default()
    };
    let mut eps = [Endpoint::new(cfg(1, 1)), Endpoint::new(cfg(2, 2))];
    let addrs = [a_addr, b_addr];
    let sid = ServiceId(0x77);
    for ep in &mut eps {
        ep.listen(sid, ListenOptions::default());
    }
    let stateless = StatelessAccept::new(
        AcceptParams::new(Qpn::masked(0x9000)),
        Qpn::masked(0x9000),
        256,
    );
    // A valid template: a refusal would only leave B stateful (the replay test would show
    // no stateless event in its corpus).
    let _ = eps[1].set_stateless(sid, Some(stateless));
    #[allow(clippy::disallowed_methods)]
    let mut now = Instant::now();
    let template = Mad::new(ibcm_mad::Tid(0), CmMessage::Rtu(ibcm_mad::Rtu::default())).to_bytes();
    let mut h = Harness {
        wire: VecDeque::new(),
        pending: [Vec::new(), Vec::new()],
        live: [Vec::new(), Vec::new()],
        sidr_in: [Vec::new(), Vec::new()],
        sidr_out: [0, 0],
        laps: [Vec::new(), Vec::new()],
        seen: VecDeque::new(),
        to_spoofer: 0,
        from_spoofer: 0,
        active: [Default::default(), Default::default()],
        a_addr,
        spoofer,
    };

    let mut qpn = 0x100u32;
    for op in data.chunks(4) {
        let b = |k: usize| op.get(k).copied().unwrap_or(0);
        let side = usize::from(b(1) & 1);
        // Op bytes below 240 keep their meaning from before SIDR, LAP and the spoofer were
        // driven (so older inputs replay the same); 240.. are the newer operations.
        let code = if b(0) >= 240 {
            12 + (b(0) - 240) % 8
        } else {
            b(0) % 12
        };
        match code {
            0 | 1 => {
                qpn += 1;
                let mut p = ConnectParams::new(addrs[1 - side], sid, Qpn::masked(qpn));
                p.remote_cm_response_timeout = TimeoutExp::masked(b(2) % 16);
                p.packet_life_time = TimeoutExp::masked(b(3) % 12);
                p.max_cm_retries = U4::masked(b(2) >> 4);
                p.auto_rtu = b(3) & 0x80 == 0;
                if let Ok(c) = eps[side].connect(now, p) {
                    h.active[side].insert(c);
                }
            }
            2 | 3 => {
                // Deliver the next n MADs.
                for _ in 0..=b(2) % 8 {
                    if let Some((to, mad)) = h.wire.pop_front() {
                        eps[to].handle_datagram(now, addrs[1 - to], &mad);
                    }
                }
            }
            4 => {
                // Lose, duplicate or reorder one.
                match b(2) % 3 {
                    0 => drop(h.wire.pop_front()),
                    1 => {
                        if let Some(m) = h.wire.front().cloned() {
                            h.wire.push_back(m);
                        }
                    }
                    _ => {
                        if let Some(m) = h.wire.pop_front() {
                            h.wire.push_back(m);
                        }
                    }
                }
            }
            5 => {
                // Corrupt a byte of the next one.
                if let Some((_, m)) = h.wire.front_mut() {
                    let at = usize::from(b(2)) % m.len().max(1);
                    if let Some(x) = m.get_mut(at) {
                        *x ^= b(3) | 1;
                    }
                }
            }
            6 => {
                // Inject a MAD: a valid CM header with attribute and body bytes from the input.
                let mut m = template.to_vec();
                m[17] = 0x10 + b(2) % 11;
                for (k, x) in m.iter_mut().skip(24).enumerate() {
                    *x = data.get(k % data.len().max(1)).copied().unwrap_or(0) ^ b(3);
                }
                // Sometimes aim at a real connection of the receiver.
                if let Some(c) = h.live[side].first() {
                    if b(3) & 1 == 1 {
                        m[28..32].copy_from_slice(&c.0.to_be_bytes());
                    }
                }
                eps[side].handle_datagram(now, addrs[1 - side], &m);
            }
            7 => now += Duration::from_millis(u64::from(b(2)) * u64::from(b(3) % 64 + 1)),
            8 => {
                if let Some(c) = h.pending[side].pop() {
                    qpn += 1;
                    let _ = match b(2) % 4 {
                        0 => {
                            eps[side].reject(now, c, RejReason::from_raw(u16::from(b(3))), &[], &[])
                        }
                        1 => {
                            // Within the budget only (`CallError::AmplificationLimited`).
                            eps[side].mra(now, c, TimeoutExp::masked(b(3)), &[])
                        }
                        _ => eps[side].accept(now, c, AcceptParams::new(Qpn::masked(qpn))),
                    };
                }
            }
            9 => {
                if let Some(&c) = h.live[side].get(usize::from(b(2)) % h.live[side].len().max(1)) {
                    let _ = eps[side].disconnect(now, c, &[b(3)]);
                }
            }
            10 => {
                let id = ConnId::from(u32::from_be_bytes([b(0), b(1), b(2), b(3)]));
                let _ = eps[side].establish(now, id, &[]);
                let _ = eps[side].notify_established(now, id);
            }
            11 => eps[side].handle_timeout(now),
            12 => {
                // A SIDR_REQ to the other side (listened or not).
                let s = if b(2) & 1 == 0 { sid } else { ServiceId(0x78) };
                let mut p = SidrReqParams::new(addrs[1 - side], s);
                p.timeout = Duration::from_millis(u64::from(b(3) % 32 + 1) * 10);
                p.max_retries = b(2) >> 5;
                if eps[side].sidr_request(now, p).is_ok() {
                    h.sidr_out[side] += 1;
                }
            }
            13 => {
                // Answer an incoming SIDR_REQ — or, for b(2) < 64, leave it unanswered.
                if b(2) >= 64 {
                    if let Some(id) = h.sidr_in[side].pop() {
                        let p = if b(2) & 1 == 0 {
                            SidrRepParams::success(Qpn::masked(u32::from(b(3)) + 2), Qkey(7))
                        } else {
                            SidrRepParams {
                                status: SidrStatus::Rejected,
                                ..SidrRepParams::success(Qpn::default(), Qkey(0))
                            }
                        };
                        let _ = eps[side].sidr_reply(now, id, p);
                    }
                }
            }
            14 => {
                // LAP on a live connection, or a path migration.
                if let Some(&c) = h.live[side].get(usize::from(b(2)) % h.live[side].len().max(1)) {
                    if b(3) & 1 == 0 {
                        let _ = eps[side].load_alternate_path(now, c, PathInfo::default(), &[b(3)]);
                    } else {
                        let _ = eps[side].notify_path_migrated(now, c);
                    }
                }
            }
            15 => {
                // Answer a LAP: APR, or an MRA first.
                if let Some(c) = h.laps[side].pop() {
                    if b(2) & 1 == 0 {
                        let st = AprStatus::from_raw(b(3) % 14);
                        let _ = eps[side].apr(now, c, st, &[], &[]);
                    } else {
                        let _ = eps[side].mra(now, c, TimeoutExp::masked(b(3)), &[]);
                        h.laps[side].insert(0, c);
                    }
                }
            }
            16 | 17 => {
                // A MAD naming a live connection's comm IDs (MRA, LAP, APR, DREQ, REJ, RTU, …),
                // from its peer (16) or from the spoofer (17).
                let Some(&c) = h.live[side].get(usize::from(b(2)) % h.live[side].len().max(1))
                else {
                    continue;
                };
                let mut m = template.to_vec();
                m[17] = [0x11, 0x12, 0x14, 0x15, 0x16, 0x19, 0x1a, 0x13][usize::from(b(3) % 8)];
                for (k, x) in m.iter_mut().skip(32).enumerate() {
                    *x = data.get(k % data.len().max(1)).copied().unwrap_or(0) ^ b(3);
                }
                let remote = eps[side].remote_comm_id(c).map_or(0, |r| r.0);
                m[24..28].copy_from_slice(&remote.to_be_bytes());
                m[28..32].copy_from_slice(&c.0.to_be_bytes());
                if code == 16 {
                    eps[side].handle_datagram(now, addrs[1 - side], &m);
                } else {
                    h.from_spoofer += m.len();
                    eps[side].handle_datagram(now, spoofer, &m);
                }
            }
            _ => {
                // The spoofer replays a MAD seen on the wire (a REQ, an RTU, a DREQ, …), with
                // one byte changed for b(2) ≥ 128.
                if let Some((to, mut m)) =
                    h.seen.get(usize::from(b(2)) % h.seen.len().max(1)).cloned()
                {
                    if b(2) >= 128 {
                        let at = 24 + usize::from(b(3)) % 232;
                        if let Some(x) = m.get_mut(at) {
                            *x ^= 1 << (b(3) % 8);
                        }
                    }
                    h.from_spoofer += m.len();
                    eps[to].handle_datagram(now, spoofer, &m);
                }
            }
        }
        for ep in &mut eps {
            ep.handle_timeout(now);
        }
        h.drain(&mut eps);
        h.check(&eps, MAX_HALF_OPEN, MAX_ESTABLISHED, MAX_SIDR_IN);
    }
    // Wind down: every connection is closed from both sides and TimeWait passes; incoming
    // SIDR_REQs stay unanswered (they must expire by themselves). The tables must then be
    // empty.
    for _ in 0..200 {
        for (ep, pending) in eps.iter_mut().zip(h.pending.iter_mut()) {
            for c in ep.conn_ids() {
                let _ = ep.disconnect(now, c, &[]);
            }
            for c in std::mem::take(pending) {
                let _ = ep.reject(now, c, RejReason::ConsumerReject, &[], &[]);
            }
        }
        h.drain(&mut eps);
        while let Some((to, mad)) = h.wire.pop_front() {
            eps[to].handle_datagram(now, addrs[1 - to], &mad);
            h.drain(&mut eps);
        }
        now += Duration::from_secs(600);
        for ep in &mut eps {
            ep.handle_timeout(now);
        }
        h.drain(&mut eps);
        h.check(&eps, MAX_HALF_OPEN, MAX_ESTABLISHED, MAX_SIDR_IN);
        if eps.iter().all(Endpoint::is_empty) && h.wire.is_empty() {
            assert!(
                h.sidr_in.iter().all(Vec::is_empty) && h.sidr_out == [0, 0],
                "SIDR requests without a final event: in {:?}, out {:?}",
                h.sidr_in,
                h.sidr_out
            );
            return;
        }
    }
    panic!(
        "tables not empty after wind-down: {:?} / {:?} (unanswered SIDR_REQs {:?})",
        eps[0].conn_ids(),
        eps[1].conn_ids(),
        h.sidr_in
    );
}

/// The `cm_endpoint` harness's view of the two endpoints, kept from their events.
struct Harness {
    /// (to, bytes) in flight.
    wire: std::collections::VecDeque<(usize, Vec<u8>)>,
    /// REQs waiting for the application.
    pending: [Vec<ibcm::proto::ConnId>; 2],
    /// Established connections.
    live: [Vec<ibcm::proto::ConnId>; 2],
    /// Connections the local application started (`connect`): the established cap bounds
    /// what peers' REQs can make, not these (a local application bounds its own).
    active: [std::collections::HashSet<ibcm::proto::ConnId>; 2],
    /// Incoming SIDR_REQs not answered (until answered or `SidrReqExpired`).
    sidr_in: [Vec<ibcm::proto::ConnId>; 2],
    /// Outgoing SIDR_REQs without a reply or timeout yet.
    sidr_out: [usize; 2],
    /// LAPs waiting for an APR.
    laps: [Vec<ibcm::proto::ConnId>; 2],
    /// The last MADs sent between the endpoints (for the spoofer to replay).
    seen: std::collections::VecDeque<(usize, Vec<u8>)>,
    /// Bytes the endpoints sent to the spoofer, and received from it.
    to_spoofer: usize,
    from_spoofer: usize,
    /// Bytes of MRAs the application sent to the spoofer (outside the core's limit).
    a_addr: ibcm::proto::PeerAddr,
    spoofer: ibcm::proto::PeerAddr,
}

impl Harness {
    fn drain(&mut self, eps: &mut [ibcm::proto::Endpoint; 2]) {
        use ibcm::proto::EventKind;
        for (i, ep) in eps.iter_mut().enumerate() {
            while let Some(t) = ep.poll_transmit() {
                assert_eq!(t.mad.len(), 256, "the core sends whole MADs");
                if t.to == self.spoofer {
                    self.to_spoofer += t.mad.len();
                    continue;
                }
                let to = if t.to == self.a_addr { 0 } else { 1 };
                self.wire.push_back((to, t.mad.to_vec()));
                if self.seen.len() == 64 {
                    self.seen.pop_front();
                }
                self.seen.push_back((to, t.mad.to_vec()));
            }
            while let Some(ev) = ep.poll_event() {
                let c = ev.conn;
                match ev.kind {
                    EventKind::ReqReceived(_) => self.pending[i].push(c),
                    EventKind::Established | EventKind::StatelessEstablished(_) => {
                        self.live[i].push(c)
                    }
                    EventKind::Closed(_) | EventKind::TimewaitExit { .. } => {
                        self.live[i].retain(|x| *x != c);
                        self.pending[i].retain(|x| *x != c);
                        self.laps[i].retain(|x| *x != c);
                    }
                    EventKind::SidrReqReceived(_) => self.sidr_in[i].push(c),
                    EventKind::SidrReqExpired => self.sidr_in[i].retain(|x| *x != c),
                    EventKind::SidrReply { .. } | EventKind::SidrTimedOut => {
                        self.sidr_out[i] = self.sidr_out[i].saturating_sub(1);
                    }
                    EventKind::LapReceived { .. } => {
                        self.laps[i].retain(|x| *x != c);
                        self.laps[i].push(c);
                    }
                    _ => {}
                }
            }
        }
    }

    /// The bounds every table keeps, whatever arrives.
    fn check(
        &self,
        eps: &[ibcm::proto::Endpoint; 2],
        max_half_open: usize,
        max_established: usize,
        max_sidr_in: usize,
    ) {
        for (i, ep) in eps.iter().enumerate() {
            assert!(ep.half_open() <= ep.len());
            assert!(
                ep.half_open() <= max_half_open,
                "half-open {}",
                ep.half_open()
            );
            // Connections peers' REQs made (the endpoint's count less the local application's
            // own connects that are established now).
            let own = ep
                .conn_ids()
                .into_iter()
                .filter(|c| self.active[i].contains(c))
                .filter(|c| {
                    matches!(
                        ep.state(*c),
                        Some(
                            ibcm::proto::State::Established
                                | ibcm::proto::State::DreqSent
                                | ibcm::proto::State::DreqRcvd
                        )
                    )
                })
                .count();
            assert!(
                ep.established().saturating_sub(own) <= max_established,
                "endpoint {i}: established {} ({own} of them its own connects; half-open {}); {}",
                ep.established(),
                ep.half_open(),
                ep.stats()
            );
            assert!(
                self.sidr_in[i].len() <= max_sidr_in,
                "unanswered SIDR_REQs {}",
                self.sidr_in[i].len()
            );
            for c in ep.conn_ids() {
                assert!(ep.state(c).is_some());
            }
        }
        assert!(
            self.to_spoofer <= 3 * self.from_spoofer,
            "amplification: {} bytes to the spoofer for {} from it",
            self.to_spoofer,
            self.from_spoofer
        );
    }
}
