//! Bodies of the fuzz targets. Each takes arbitrary bytes and must never panic; the
//! round-trip target also checks an invariant. The cargo-fuzz harnesses in `fuzz/` and the
//! stable replay test `tests/tests/fuzz_replay.rs` both call these functions.

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::frame;
use ibcm_mad::{AttrId, CmMessage, Mad, MadHeader};
use ibcm_trace::CaptureReader;

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
            Err(_) => break,
        }
        n += 1;
        if n > 10_000 {
            break;
        }
    }
}

/// A fuzz target body.
pub type Target = fn(&[u8]);

/// All targets by name.
pub const TARGETS: [(&str, Target); 5] = [
    ("cm_endpoint", cm_endpoint),
    ("mad_parse", mad_parse),
    ("mad_roundtrip", mad_roundtrip),
    ("frame_decode", frame_decode),
    ("capture_read", capture_read),
];

/// `cm_endpoint`: two CM endpoints driven by a script read from the input: API calls, message
/// delivery, loss, corruption, injected MADs and time jumps. Checks that nothing panics, that
/// the counters stay consistent, and that after everybody disconnects and TimeWait passes both
/// tables are empty (nothing leaks).
pub fn cm_endpoint(data: &[u8]) {
    use std::collections::VecDeque;
    use std::time::{Duration, Instant};

    use ibcm::proto::{
        AcceptParams, ConnectParams, Endpoint, EndpointConfig, EventKind, ListenOptions, PeerAddr,
    };
    use ibcm_mad::{Guid, Qpn, RejReason, ServiceId, TimeoutExp, U4};

    let a_addr = PeerAddr::Udp(std::net::SocketAddr::from(([127, 0, 0, 1], 4791)));
    let b_addr = PeerAddr::Udp(std::net::SocketAddr::from(([127, 0, 0, 2], 4791)));
    let cfg = |seed: u64, guid: u64| EndpointConfig {
        rng_seed: Some(seed),
        local_ca_guid: Guid(guid),
        max_half_open: 8,
        timewait: Some(Duration::from_millis(20)),
        ..Default::default()
    };
    let mut eps = [Endpoint::new(cfg(1, 1)), Endpoint::new(cfg(2, 2))];
    let addrs = [a_addr, b_addr];
    let sid = ServiceId(0x77);
    for ep in &mut eps {
        ep.listen(sid, ListenOptions::default());
    }
    #[allow(clippy::disallowed_methods)]
    let mut now = Instant::now();
    // (to, bytes) in flight.
    let mut wire: VecDeque<(usize, Vec<u8>)> = VecDeque::new();
    let mut pending: [Vec<ibcm::proto::ConnId>; 2] = [Vec::new(), Vec::new()];
    let mut live: [Vec<ibcm::proto::ConnId>; 2] = [Vec::new(), Vec::new()];
    let template = Mad::new(ibcm_mad::Tid(0), CmMessage::Rtu(ibcm_mad::Rtu::default())).to_bytes();

    let drain = |eps: &mut [Endpoint; 2],
                 wire: &mut VecDeque<(usize, Vec<u8>)>,
                 pending: &mut [Vec<ibcm::proto::ConnId>; 2],
                 live: &mut [Vec<ibcm::proto::ConnId>; 2]| {
        for (i, ep) in eps.iter_mut().enumerate() {
            while let Some(t) = ep.poll_transmit() {
                assert_eq!(t.mad.len(), 256, "the core sends whole MADs");
                let to = if t.to == a_addr { 0 } else { 1 };
                wire.push_back((to, t.mad.to_vec()));
            }
            while let Some(ev) = ep.poll_event() {
                match ev.kind {
                    EventKind::ReqReceived(_) => pending[i].push(ev.conn),
                    EventKind::Established => live[i].push(ev.conn),
                    EventKind::Closed(_) | EventKind::TimewaitExit { .. } => {
                        live[i].retain(|c| *c != ev.conn);
                        pending[i].retain(|c| *c != ev.conn);
                    }
                    _ => {}
                }
            }
        }
    };

    let ops = data.chunks(4);
    let mut qpn = 0x100u32;
    for op in ops {
        let b = |k: usize| op.get(k).copied().unwrap_or(0);
        let side = usize::from(b(1) & 1);
        match b(0) % 12 {
            0 | 1 => {
                qpn += 1;
                let mut p = ConnectParams::new(addrs[1 - side], sid, Qpn::masked(qpn));
                p.remote_cm_response_timeout = TimeoutExp::masked(b(2) % 16);
                p.packet_life_time = TimeoutExp::masked(b(3) % 12);
                p.max_cm_retries = U4::masked(b(2) >> 4);
                p.auto_rtu = b(3) & 0x80 == 0;
                let _ = eps[side].connect(now, p);
            }
            2 | 3 => {
                // Deliver the next n MADs.
                for _ in 0..=b(2) % 8 {
                    if let Some((to, mad)) = wire.pop_front() {
                        eps[to].handle_datagram(now, addrs[1 - to], &mad);
                    }
                }
            }
            4 => {
                // Lose, duplicate or reorder one.
                match b(2) % 3 {
                    0 => drop(wire.pop_front()),
                    1 => {
                        if let Some(m) = wire.front().cloned() {
                            wire.push_back(m);
                        }
                    }
                    _ => {
                        if let Some(m) = wire.pop_front() {
                            wire.push_back(m);
                        }
                    }
                }
            }
            5 => {
                // Corrupt a byte of the next one.
                if let Some((_, m)) = wire.front_mut() {
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
                if let Some(c) = live[side].first() {
                    if b(3) & 1 == 1 {
                        m[28..32].copy_from_slice(&c.0.to_be_bytes());
                    }
                }
                eps[side].handle_datagram(now, addrs[1 - side], &m);
            }
            7 => now += Duration::from_millis(u64::from(b(2)) * u64::from(b(3) % 64 + 1)),
            8 => {
                if let Some(c) = pending[side].pop() {
                    qpn += 1;
                    let _ = match b(2) % 4 {
                        0 => {
                            eps[side].reject(now, c, RejReason::from_raw(u16::from(b(3))), &[], &[])
                        }
                        1 => eps[side].mra(now, c, TimeoutExp::masked(b(3)), &[]),
                        _ => eps[side].accept(now, c, AcceptParams::new(Qpn::masked(qpn))),
                    };
                }
            }
            9 => {
                if let Some(&c) = live[side].get(usize::from(b(2)) % live[side].len().max(1)) {
                    let _ = eps[side].disconnect(now, c, &[b(3)]);
                }
            }
            10 => {
                let id = ibcm::proto::ConnId::from(u32::from_be_bytes([b(0), b(1), b(2), b(3)]));
                let _ = eps[side].establish(now, id, &[]);
                let _ = eps[side].notify_established(now, id);
            }
            _ => eps[side].handle_timeout(now),
        }
        for ep in &mut eps {
            ep.handle_timeout(now);
        }
        drain(&mut eps, &mut wire, &mut pending, &mut live);
        for ep in &eps {
            assert!(ep.half_open() <= ep.len());
            for c in ep.conn_ids() {
                assert!(ep.state(c).is_some());
            }
        }
    }
    // Wind down: every connection is closed from both sides and TimeWait passes; the tables
    // must then be empty.
    for _ in 0..200 {
        for side in 0..2 {
            for c in eps[side].conn_ids() {
                let _ = eps[side].disconnect(now, c, &[]);
            }
            for c in std::mem::take(&mut pending[side]) {
                let _ = eps[side].reject(now, c, RejReason::ConsumerReject, &[], &[]);
            }
        }
        drain(&mut eps, &mut wire, &mut pending, &mut live);
        while let Some((to, mad)) = wire.pop_front() {
            eps[to].handle_datagram(now, addrs[1 - to], &mad);
            drain(&mut eps, &mut wire, &mut pending, &mut live);
        }
        now += Duration::from_secs(600);
        for ep in &mut eps {
            ep.handle_timeout(now);
        }
        drain(&mut eps, &mut wire, &mut pending, &mut live);
        if eps.iter().all(Endpoint::is_empty) && wire.is_empty() {
            return;
        }
    }
    panic!(
        "tables not empty after wind-down: {:?} / {:?}",
        eps[0].conn_ids(),
        eps[1].conn_ids()
    );
}
