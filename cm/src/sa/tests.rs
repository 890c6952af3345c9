use std::time::{Duration, Instant};

use ibcm_mad::sa::{
    attr, comp, method, rmpp_flags, rmpp_type, PathRecord, RmppHeader, SaMad, SaStatus, SA_DATA_LEN,
};
use ibcm_mad::{Gid, Lid, Pkey, Tid, U4};

use super::*;

/// Any instant will do as the origin; the client never reads the clock.
fn origin() -> Instant {
    #[allow(clippy::disallowed_methods)]
    Instant::now()
}

fn gid(n: u8) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[15] = n;
    Gid(g)
}

fn rec(n: u8) -> PathRecord {
    PathRecord {
        sgid: gid(1),
        dgid: gid(n),
        slid: Lid(1),
        dlid: Lid(u16::from(n)),
        pkey: Pkey(0xffff),
        reversible: true,
        hop_limit: 0,
        mtu: ibcm_mad::Mtu::Mtu2048,
        rate: ibcm_mad::Rate::G10,
        packet_life_time: 18,
        ..PathRecord::default()
    }
}

fn client() -> SaClient {
    SaClient::new(SaConfig::new(1, Lid(1)), 0x100)
}

/// The SA's single-MAD answer to `req`.
fn answer(req: &[u8], recs: &[PathRecord], status: u16) -> [u8; 256] {
    let q = SaMad::parse(req).unwrap();
    let mut a = q.clone();
    a.header.method = Method::from_raw(q.header.method.raw() | 0x80);
    a.header.status = status;
    // umad/ibsim rewrite the high 32 bits of the TID
    a.header.tid = Tid(q.header.tid.0 | 0xdead_beef_0000_0000);
    a.attr_offset = PathRecord::ATTR_OFFSET;
    a.data = [0; SA_DATA_LEN];
    for (i, r) in recs.iter().enumerate() {
        a.data[i * 64..i * 64 + 64].copy_from_slice(&r.to_bytes());
    }
    a.to_bytes()
}

fn paths(ev: Option<SaEvent>) -> (QueryId, Result<Vec<PathRecord>, SaError>) {
    match ev {
        Some(SaEvent::PathRecords { id, result }) => (id, result),
        None => panic!("no event"),
    }
}

#[test]
fn get_by_gids_sends_the_kernel_mask_and_takes_the_answer() {
    let now = origin();
    let mut c = client();
    let id = c.query(&PathQuery::by_gids(gid(1), gid(4), Pkey(0xffff)), now);
    let tx = c.poll_transmit().unwrap();
    assert_eq!(tx.dest.lid, Lid(1));
    assert_eq!(tx.dest.qkey, ibcm_mad::Qkey::GSI);
    let m = SaMad::parse(&tx.mad).unwrap();
    assert_eq!(m.header.method, method::GET);
    assert_eq!(m.header.attr_id, attr::PATH_RECORD);
    assert_eq!(
        m.comp_mask,
        comp::DGID | comp::SGID | comp::PKEY | comp::NUMB_PATH | comp::REVERSIBLE
    );
    let t = PathRecord::parse(&m.data).unwrap();
    assert_eq!(
        (t.sgid, t.dgid, t.numb_path, t.reversible),
        (gid(1), gid(4), 1, true)
    );
    c.handle_mad(&answer(&tx.mad, &[rec(4)], 0), now);
    assert_eq!(paths(c.poll_event()), (id, Ok(vec![rec(4)])));
    assert_eq!(c.in_flight(), 0);
    assert!(c.poll_transmit().is_none());
}

#[test]
fn by_lids_is_what_saquery_asks() {
    let q = PathQuery::by_lids(Lid(3), Lid(4));
    assert_eq!(q.comp_mask(), comp::SLID | comp::DLID);
    let m = q.to_mad(Tid(7));
    let t = PathRecord::parse(&m.data).unwrap();
    assert_eq!((t.slid, t.dlid), (Lid(3), Lid(4)));
}

#[test]
fn an_error_status_ends_the_query() {
    let now = origin();
    let mut c = client();
    let id = c.query(&PathQuery::by_lids(Lid(3), Lid(99)), now);
    let tx = c.poll_transmit().unwrap();
    c.handle_mad(&answer(&tx.mad, &[], 0x0300), now);
    assert_eq!(
        paths(c.poll_event()),
        (
            id,
            Err(SaError::Status {
                sa: SaStatus::NoRecords,
                mad_status: 0x0300
            })
        )
    );
}

#[test]
fn retries_resend_the_same_mad_then_time_out() {
    let t0 = origin();
    let mut c = client();
    let id = c.query(&PathQuery::by_lids(Lid(3), Lid(4)), t0);
    let first = c.poll_transmit().unwrap();
    let mut t = t0;
    for i in 0..3 {
        assert_eq!(c.poll_timeout(), Some(t + Duration::from_secs(1)));
        t += Duration::from_millis(999);
        c.handle_timeout(t);
        assert!(c.poll_transmit().is_none(), "attempt {i} resent early");
        t += Duration::from_millis(1);
        c.handle_timeout(t);
        assert_eq!(c.poll_transmit().unwrap().mad, first.mad);
    }
    t += Duration::from_secs(1);
    c.handle_timeout(t);
    assert!(c.poll_transmit().is_none());
    assert_eq!(
        paths(c.poll_event()),
        (id, Err(SaError::Timeout { attempts: 4 }))
    );
    assert_eq!(c.stats().resent, 3);
    assert_eq!(c.stats().timeouts, 1);
    // a late answer is stray
    c.handle_mad(&answer(&first.mad, &[rec(4)], 0), t);
    assert!(c.poll_event().is_none());
    assert_eq!(c.stats().stray, 1);
}

#[test]
fn answers_match_by_the_low_32_tid_bits_only() {
    let now = origin();
    let mut c = client();
    let a = c.query(&PathQuery::by_lids(Lid(3), Lid(4)), now);
    let b = c.query(&PathQuery::by_lids(Lid(3), Lid(5)), now);
    let ta = c.poll_transmit().unwrap();
    let tb = c.poll_transmit().unwrap();
    c.handle_mad(&answer(&tb.mad, &[rec(5)], 0), now);
    c.handle_mad(&answer(&ta.mad, &[rec(4)], 0), now);
    assert_eq!(paths(c.poll_event()), (b, Ok(vec![rec(5)])));
    assert_eq!(paths(c.poll_event()), (a, Ok(vec![rec(4)])));
}

#[test]
fn garbage_is_stray_and_never_panics() {
    let now = origin();
    let mut c = client();
    c.query(&PathQuery::by_lids(Lid(3), Lid(4)), now);
    for n in [0usize, 1, 23, 55, 56, 100, 256, 300] {
        c.handle_mad(&vec![0xa5; n], now);
    }
    assert!(c.poll_event().is_none());
    assert_eq!(c.in_flight(), 1);
}

/// The segments of an RMPP GetTableResp carrying `recs`, as the SA sends them.
fn segments(req: &[u8], recs: &[PathRecord]) -> Vec<[u8; 256]> {
    let mut data: Vec<u8> = recs.iter().flat_map(|r| r.to_bytes()).collect();
    let total = data.len();
    let n = total.div_ceil(SA_DATA_LEN).max(1);
    data.resize(n * SA_DATA_LEN, 0);
    let q = SaMad::parse(req).unwrap();
    (0..n)
        .map(|i| {
            let mut a = q.clone();
            a.header.method = method::GET_TABLE_RESP;
            a.attr_offset = PathRecord::ATTR_OFFSET;
            let last = i + 1 == n;
            let pad = n * SA_DATA_LEN - total;
            a.rmpp = RmppHeader {
                version: 1,
                rmpp_type: rmpp_type::DATA,
                resp_time: 0x1f,
                flags: rmpp_flags::ACTIVE
                    | if i == 0 { rmpp_flags::FIRST } else { 0 }
                    | if last { rmpp_flags::LAST } else { 0 },
                status: 0,
                data1: i as u32 + 1,
                data2: if i == 0 {
                    (n * 220 - pad) as u32
                } else if last {
                    (220 - pad) as u32
                } else {
                    0
                },
            };
            a.data
                .copy_from_slice(&data[i * SA_DATA_LEN..(i + 1) * SA_DATA_LEN]);
            a.to_bytes()
        })
        .collect()
}

#[test]
fn rmpp_get_table_is_reassembled_and_acknowledged() {
    let now = origin();
    let mut c = client();
    let q = PathQuery {
        table: true,
        sgid: Some(gid(1)),
        ..PathQuery::default()
    };
    let id = c.query(&q, now);
    let req = c.poll_transmit().unwrap();
    assert_eq!(
        SaMad::parse(&req.mad).unwrap().header.method,
        method::GET_TABLE
    );
    let recs: Vec<_> = (2..=9).map(rec).collect(); // 8 records: 512 bytes, 3 segments
    let segs = segments(&req.mad, &recs);
    assert_eq!(segs.len(), 3);
    // segment 1, segment 3 (a gap: dropped, no ACK), segment 1 again (re-ACKed), 2, 3
    for (s, want_ack) in [
        (0, Some(1)),
        (2, None),
        (0, Some(1)),
        (1, Some(2)),
        (2, Some(3)),
    ] {
        c.handle_mad(&segs[s], now);
        let ack = c.poll_transmit().map(|t| SaMad::parse(&t.mad).unwrap());
        assert_eq!(ack.as_ref().map(|a| a.rmpp.data1), want_ack, "segment {s}");
        if let Some(a) = ack {
            assert_eq!(a.rmpp.rmpp_type, rmpp_type::ACK);
            assert_eq!(a.rmpp.flags, rmpp_flags::ACTIVE);
            assert_eq!(a.rmpp.data2, a.rmpp.data1 + 16);
            assert_eq!(a.header.method, method::GET_TABLE);
            assert_eq!(a.header.tid, SaMad::parse(&req.mad).unwrap().header.tid);
        }
    }
    assert_eq!(paths(c.poll_event()), (id, Ok(recs)));
    assert_eq!(c.stats().rmpp_segments, 5);
    assert_eq!(c.stats().rmpp_acks, 4);
}

#[test]
fn rmpp_abort_ends_the_query() {
    let now = origin();
    let mut c = client();
    let id = c.query(
        &PathQuery {
            table: true,
            ..PathQuery::default()
        },
        now,
    );
    let req = c.poll_transmit().unwrap();
    let mut m = SaMad::parse(&segments(&req.mad, &[rec(2)])[0]).unwrap();
    m.rmpp.rmpp_type = rmpp_type::ABORT;
    m.rmpp.status = 118;
    c.handle_mad(&m.to_bytes(), now);
    assert_eq!(
        paths(c.poll_event()),
        (
            id,
            Err(SaError::RmppAborted {
                rmpp_type: 4,
                status: 118
            })
        )
    );
}

#[test]
fn a_table_cut_to_one_mad_gives_the_records_it_holds() {
    // What stock ibsim delivers: the first segment only, without the RMPP flags.
    let now = origin();
    let mut c = client();
    let id = c.query(
        &PathQuery {
            table: true,
            ..PathQuery::default()
        },
        now,
    );
    let req = c.poll_transmit().unwrap();
    c.handle_mad(&answer(&req.mad, &[rec(2), rec(3), rec(4)], 0), now);
    assert_eq!(
        paths(c.poll_event()),
        (id, Ok(vec![rec(2), rec(3), rec(4)]))
    );
}

#[test]
fn resolve_caches_by_port_dgid_pkey_sl_and_expires() {
    let t0 = origin();
    let mut cfg = SaConfig::new(1, Lid(1));
    cfg.cache_ttl = Duration::from_secs(10);
    let mut c = SaClient::new(cfg, 1);
    let sl = U4::masked(0);
    let Resolve::Pending(id) = c.resolve(gid(1), gid(4), Pkey(0xffff), sl, t0) else {
        panic!("cached before any answer")
    };
    // a second resolve of the same key joins the query in flight
    assert_eq!(
        c.resolve(gid(1), gid(4), Pkey(0xffff), sl, t0),
        Resolve::Pending(id)
    );
    let tx = c.poll_transmit().unwrap();
    assert!(c.poll_transmit().is_none());
    let m = SaMad::parse(&tx.mad).unwrap();
    assert_ne!(m.comp_mask & comp::SL, 0);
    c.handle_mad(&answer(&tx.mad, &[rec(4)], 0), t0);
    assert_eq!(paths(c.poll_event()), (id, Ok(vec![rec(4)])));
    let t1 = t0 + Duration::from_secs(9);
    assert_eq!(
        c.resolve(gid(1), gid(4), Pkey(0xffff), sl, t1),
        Resolve::Cached(rec(4))
    );
    // another SL or P_Key is another key
    assert!(matches!(
        c.resolve(gid(1), gid(4), Pkey(0x8001), sl, t1),
        Resolve::Pending(_)
    ));
    let t2 = t0 + Duration::from_secs(10);
    assert!(matches!(
        c.resolve(gid(1), gid(4), Pkey(0xffff), sl, t2),
        Resolve::Pending(_)
    ));
    assert_eq!(c.stats().cache_hits, 1);
}

#[test]
fn too_many_queries_are_refused() {
    let now = origin();
    let mut cfg = SaConfig::new(1, Lid(1));
    cfg.max_queries = 1;
    let mut c = SaClient::new(cfg, 1);
    c.query(&PathQuery::by_lids(Lid(3), Lid(4)), now);
    let id = c.query(&PathQuery::by_lids(Lid(3), Lid(5)), now);
    assert_eq!(paths(c.poll_event()), (id, Err(SaError::TooManyQueries)));
    assert_eq!(c.in_flight(), 1);
}

proptest::proptest! {
    /// Any bytes, after any requests: no panic, and a query ends at most once.
    #[test]
    fn handle_mad_never_panics(
        mads in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..8),
        rmpp in proptest::bool::ANY,
    ) {
        let now = origin();
        let mut c = client();
        let id = c.query(&PathQuery { table: true, ..PathQuery::default() }, now);
        let req = c.poll_transmit().unwrap();
        for mut m in mads {
            // make some of them look like answers to the query
            if m.len() >= 56 && rmpp {
                m[..24].copy_from_slice(&req.mad[..24]);
                m[3] = 0x92;
                m[4] = 0;
                m[5] = 0;
            }
            c.handle_mad(&m, now);
        }
        let mut ends = 0;
        while let Some(SaEvent::PathRecords { id: got, .. }) = c.poll_event() {
            proptest::prop_assert_eq!(got, id);
            ends += 1;
        }
        proptest::prop_assert!(ends <= 1);
        proptest::prop_assert_eq!(c.in_flight(), 1 - ends);
    }
}
