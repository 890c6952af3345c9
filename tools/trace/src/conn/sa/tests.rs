use super::*;

use ibcm_mad::frame::Encap;
use ibcm_mad::sa::{attr, comp, method, rmpp_flags, RmppHeader, SaMad};
use ibcm_mad::{Lid, Mtu, Pkey, Qkey, Qpn, Tid, TimeoutExp, U4};

use crate::sa::tests::OPENSM;
use crate::sa::SaEvent;
use crate::trace::{Icrc, Wire};

const SM: u16 = 1;
const A: u16 = 3;

fn lid(l: u16) -> WireAddr {
    WireAddr::Lid(Lid(l))
}

fn event(mad: &SaMad, (from, to): (u16, u16), frame: u64, us: u64) -> SaEvent {
    SaEvent {
        frame,
        time: Duration::from_micros(us),
        encap: Encap::IbLocal,
        src: lid(from),
        dst: lid(to),
        mad: SaMad::parse(&mad.to_bytes()).unwrap(),
        icrc: Icrc::Ok,
        wire: Wire {
            pkey: Pkey::DEFAULT,
            psn: ibcm_mad::Psn::masked(0),
            dest_qp: Qpn::masked(1),
            src_qp: Some(Qpn::masked(1)),
            qkey: Some(Qkey::GSI),
            udp_src_port: None,
            lids: Some((Lid(from), Lid(to))),
            hop_limit: None,
            traffic_class: None,
            icrc_value: None,
        },
    }
}

fn get(tid: u64) -> SaMad {
    let mut q = SaMad::request(
        method::GET,
        Tid(tid),
        attr::PATH_RECORD,
        comp::SLID | comp::DLID,
    );
    let t = PathRecord {
        slid: Lid(3),
        dlid: Lid(4),
        ..PathRecord::parse_fixed(&[0; 64])
    };
    q.data[..64].copy_from_slice(&t.to_bytes());
    q
}

/// OpenSM's answer with TID `tid`.
fn opensm(tid: u64) -> SaMad {
    let mut a = SaMad::parse(OPENSM).unwrap();
    a.header.tid = Tid(tid);
    a
}

fn record() -> PathRecord {
    opensm(0).to_bytes()[56..]
        .first_chunk::<64>()
        .map(PathRecord::parse_fixed)
        .unwrap()
}

/// A REQ whose primary path is what `cm_format_req` makes of OpenSM's record.
fn req() -> Req {
    let r = record();
    Req {
        partition_key: r.pkey,
        path_mtu: r.mtu,
        primary_path: PathInfo {
            local_lid: r.slid,
            remote_lid: r.dlid,
            local_gid: r.sgid,
            remote_gid: r.dgid,
            packet_rate: r.rate,
            sl: r.sl,
            subnet_local: true,
            local_ack_timeout: TimeoutExp::masked(19),
            ..PathInfo::default()
        },
        ..Req::default()
    }
}

fn drained(t: &mut SaTable) -> Vec<Exchange> {
    t.finish_all();
    let mut v = std::mem::take(&mut t.done);
    v.sort_by_key(|x| x.id);
    v
}

#[test]
fn query_and_answer_pair_by_the_whole_tid() {
    let mut t = SaTable::default();
    let tid = 0x0001_0000_0000_51b9;
    t.observe(&event(&get(tid), (A, SM), 1, 0));
    t.observe(&event(&get(tid + 1), (A, SM), 2, 10));
    t.observe(&event(&opensm(tid), (SM, A), 3, 45));
    assert!(t.has_answers());
    let x = drained(&mut t);
    assert_eq!(x.len(), 2);
    assert_eq!(x[0].tid, tid);
    assert_eq!(x[0].query.map(|q| q.frame), Some(1));
    assert_eq!(x[0].answer.map(|a| (a.frame, a.records)), Some((3, 1)));
    assert!(!x[0].tid_low);
    assert_eq!(x[0].records, vec![record()]);
    assert!(x[1].answer.is_none(), "the other query is unanswered");
}

#[test]
fn an_answer_with_rewritten_upper_tid_bits_pairs_by_the_lower_ones() {
    let mut t = SaTable::default();
    // The query as the sender's user space logged it; the answer with the MAD layer's agent
    // number in bits 63–32.
    t.observe(&event(&get(0x0000_0000_0000_51b9), (A, SM), 1, 0));
    t.observe(&event(&opensm(0x0001_0000_0000_51b9), (SM, A), 2, 45));
    // Not for an answer going elsewhere: that is an exchange of its own.
    t.observe(&event(&get(0x0000_0000_0000_0777), (A, SM), 3, 100));
    t.observe(&event(&opensm(0x0002_0000_0000_0777), (SM, 9), 4, 145));
    let x = drained(&mut t);
    assert_eq!(x.len(), 3);
    assert!(x[0].tid_low);
    assert_eq!(x[0].query.map(|q| q.frame), Some(1));
    assert_eq!(x[0].answer.map(|a| a.frame), Some(2));
    assert_eq!(x[0].tid, 0x0001_0000_0000_51b9, "the answer's TID");
    assert!(x[1].answer.is_none());
    assert!(x[2].query.is_none() && x[2].answer.is_some() && !x[2].tid_low);
}

#[test]
fn resent_queries_and_repeated_answers_are_counted_not_paired_again() {
    let mut t = SaTable::default();
    let tid = 0x42;
    t.observe(&event(&get(tid), (A, SM), 1, 0));
    t.observe(&event(&get(tid), (A, SM), 2, 1000));
    t.observe(&event(&opensm(tid), (SM, A), 3, 1045));
    t.observe(&event(&opensm(tid), (SM, A), 4, 1046));
    assert_eq!(t.counts.query_resends, 1);
    assert_eq!(t.counts.repeats, 1);
    assert_eq!(t.counts.mads, 4);
    let x = drained(&mut t);
    assert_eq!(x.len(), 1);
    assert_eq!(x[0].query.map(|q| (q.frame, q.sends)), Some((1, 2)));
    assert_eq!(x[0].repeats, 1);
}

/// A GetTableResp of `n` records in RMPP DATA segments, numbered as given.
fn table_segments(tid: u64, n: usize, order: &[u32]) -> Vec<SaMad> {
    let mut data = Vec::new();
    for i in 0..n {
        let r = PathRecord {
            slid: Lid(3),
            dlid: Lid(10 + i as u16),
            ..record()
        };
        data.extend_from_slice(&r.to_bytes());
    }
    let segs = data.len().div_ceil(200).max(1);
    order
        .iter()
        .map(|&seg| {
            let s = seg as usize;
            let mut m = opensm(tid);
            m.header.method = method::GET_TABLE_RESP;
            m.attr_offset = 8;
            m.data = [0; 200];
            let from = (s - 1) * 200;
            let chunk = data.get(from..(from + 200).min(data.len())).unwrap_or(&[]);
            m.data[..chunk.len()].copy_from_slice(chunk);
            let last = s == segs;
            m.rmpp = RmppHeader {
                version: 1,
                rmpp_type: ibcm_mad::sa::rmpp_type::DATA,
                resp_time: 0x1f,
                flags: rmpp_flags::ACTIVE
                    | if s == 1 { rmpp_flags::FIRST } else { 0 }
                    | if last { rmpp_flags::LAST } else { 0 },
                status: 0,
                data1: seg,
                data2: if last {
                    (20 + chunk.len()) as u32
                } else if s == 1 {
                    (20 * segs + data.len()) as u32
                } else {
                    0
                },
            };
            m
        })
        .collect()
}

#[test]
fn rmpp_table_answers_are_put_together_from_their_segments() {
    let mut t = SaTable::default();
    let mut q = get(7);
    q.header.method = method::GET_TABLE;
    t.observe(&event(&q, (A, SM), 1, 0));
    // 5 records = 320 bytes: two segments, the second one first, then an ACK from the
    // asker (only counted).
    let segs = table_segments(7, 5, &[2, 1]);
    t.observe(&event(&segs[1], (SM, A), 2, 10));
    let mut ack = segs[1].clone();
    ack.rmpp.rmpp_type = ibcm_mad::sa::rmpp_type::ACK;
    t.observe(&event(&ack, (A, SM), 3, 11));
    t.observe(&event(&segs[0], (SM, A), 4, 12));
    assert_eq!(t.counts.rmpp_control, 1);
    let x = drained(&mut t);
    assert_eq!(x.len(), 1);
    let a = x[0].answer.unwrap();
    assert_eq!((a.records, a.segments, a.partial), (5, 2, false));
    assert_eq!(a.frame, 4, "the last MAD of the answer");
    let dlids: Vec<u16> = x[0].records.iter().map(|r| r.dlid.0).collect();
    assert_eq!(dlids, vec![10, 11, 12, 13, 14]);
}

#[test]
fn an_rmpp_answer_cut_short_keeps_what_came() {
    let mut t = SaTable::default();
    let segs = table_segments(9, 5, &[1, 2]);
    t.observe(&event(&segs[0], (SM, A), 1, 10));
    let mut stop = segs[0].clone();
    stop.rmpp.rmpp_type = ibcm_mad::sa::rmpp_type::ABORT;
    t.observe(&event(&stop, (A, SM), 2, 11));
    let x = drained(&mut t);
    let a = x[0].answer.unwrap();
    assert!(a.partial);
    assert_eq!(a.segments, 1);
    // The first segment's 200 bytes: three whole records.
    assert_eq!(x[0].records.len(), 3);
    // Without its Last segment at the end of the file: partial too.
    let mut t = SaTable::default();
    t.observe(&event(&segs[0], (SM, A), 1, 10));
    let x = drained(&mut t);
    assert!(x[0].answer.unwrap().partial);
    // A segment number past the bound is counted, not stored.
    let mut t = SaTable::default();
    let mut far = segs[1].clone();
    far.rmpp.data1 = 1000;
    t.observe(&event(&segs[0], (SM, A), 1, 10));
    t.observe(&event(&far, (SM, A), 2, 11));
    let x = drained(&mut t);
    assert!(x[0].answer.unwrap().partial);
}

#[test]
fn a_req_gets_the_newest_answer_before_it_for_its_path() {
    let mut t = SaTable::default();
    t.observe(&event(&get(1), (A, SM), 1, 0));
    t.observe(&event(&opensm(1), (SM, A), 2, 45));
    t.observe(&event(&get(2), (A, SM), 3, 1000));
    t.observe(&event(&opensm(2), (SM, A), 4, 1045));
    // An answer after the REQ does not count.
    t.observe(&event(&get(3), (A, SM), 5, 3000));
    t.observe(&event(&opensm(3), (SM, A), 6, 3045));
    let links = t.serve(&req(), Duration::from_micros(2000)).unwrap();
    let p = links.primary.unwrap();
    assert_eq!((p.exchange, p.answer.frame, p.index), (2, 4, 0));
    assert_eq!(p.query.map(|q| q.frame), Some(3));
    assert_eq!(p.differs, 0);
    assert!(links.alternate.is_none() && !links.differs());
    // Too early for any answer.
    assert!(t.serve(&req(), Duration::from_micros(10)).is_none());
    // The reverse direction is not this record's path.
    let mut back = req();
    std::mem::swap(
        &mut back.primary_path.local_gid,
        &mut back.primary_path.remote_gid,
    );
    std::mem::swap(
        &mut back.primary_path.local_lid,
        &mut back.primary_path.remote_lid,
    );
    assert!(t.serve(&back, Duration::from_micros(5000)).is_none());
    let x = drained(&mut t);
    assert_eq!(
        x.iter().map(|x| x.served).collect::<Vec<_>>(),
        vec![0, 1, 0]
    );
}

#[test]
fn a_disagreeing_req_and_an_alternate_path_are_told() {
    let mut t = SaTable::default();
    t.observe(&event(&get(1), (A, SM), 1, 0));
    t.observe(&event(&opensm(1), (SM, A), 2, 45));
    let mut r = req();
    r.primary_path.sl = U4::masked(3);
    r.path_mtu = Mtu::Mtu4096;
    r.alternate_path = PathInfo {
        local_ack_timeout: TimeoutExp::masked(10),
        ..r.primary_path
    };
    r.alternate_path.sl = U4::masked(0);
    let links = t.serve(&r, Duration::from_micros(100)).unwrap();
    let p = links.primary.unwrap();
    assert_eq!(
        p.differs,
        crate::sa::Field::Sl.bit() | crate::sa::Field::Mtu.bit()
    );
    let a = links.alternate.unwrap();
    assert_eq!(a.differs, crate::sa::Field::AckTimeout.bit());
    assert!(a.wide.is_none());
    assert!(links.differs());
    let note = links.note();
    assert_eq!(note.primary(), Some((2, p.differs)));
    assert_eq!(note.alternate(), Some((2, a.differs)));
    assert_eq!(
        crate::sa::view::differs_text(&p),
        "sl 3 (record 0), mtu 4096 (record 2048)"
    );
    assert_eq!(
        crate::sa::view::differs_text(&a),
        "local ACK timeout 10 (record pkt_life 18: at least 19)"
    );
}

#[test]
fn the_table_is_bounded() {
    let mut t = SaTable::default();
    for i in 0..(MAX_EXCHANGES as u64 + 10) {
        t.observe(&event(&get(i), (A, SM), i + 1, i));
    }
    assert_eq!(t.ring.len(), MAX_EXCHANGES);
    assert_eq!(t.done.len(), 10);
    assert!(t.open.len() <= MAX_EXCHANGES);
    // An answer to a query that left the table is an exchange of its own.
    t.observe(&event(&opensm(0), (SM, A), 99_999, 99_999));
    let x = drained(&mut t);
    assert_eq!(x.len(), MAX_EXCHANGES + 11);
    assert!(x
        .last()
        .is_some_and(|x| x.query.is_none() && x.answer.is_some()));
}

#[test]
fn other_attributes_are_counted_only() {
    let mut t = SaTable::default();
    let mut m = get(5);
    m.header.attr_id = attr::NODE_RECORD;
    t.observe(&event(&m, (A, SM), 1, 0));
    assert_eq!(t.counts.mads, 1);
    assert!(drained(&mut t).is_empty());
}

#[test]
fn index_entries_leave_with_their_exchanges() {
    let mut t = SaTable::default();
    let n = MAX_EXCHANGES as u64 + 100;
    for i in 0..n {
        t.observe(&event(&get(i), (A, SM), 2 * i + 1, 2 * i));
        let mut a = opensm(i);
        // A path of its own per answer (another DGID).
        a.data[8..16].copy_from_slice(&i.to_be_bytes());
        t.observe(&event(&a, (SM, A), 2 * i + 2, 2 * i + 1));
    }
    assert_eq!(t.ring.len(), MAX_EXCHANGES);
    assert_eq!(t.by_gids.len(), MAX_EXCHANGES);
    assert_eq!(t.answered.len(), MAX_EXCHANGES);
    assert!(t.open.is_empty() && t.open_low.is_empty());
    // The oldest paths are gone with their exchanges; the newest is found.
    let mut r = req();
    let mut last = opensm(n - 1);
    last.data[8..16].copy_from_slice(&(n - 1).to_be_bytes());
    let rec = PathRecord::parse(&last.data).unwrap();
    r.primary_path.remote_gid = rec.dgid;
    assert!(t.serve(&r, Duration::from_secs(1)).is_some());
    let mut first = opensm(0);
    first.data[8..16].copy_from_slice(&0u64.to_be_bytes());
    r.primary_path.remote_gid = PathRecord::parse(&first.data).unwrap().dgid;
    assert!(t.serve(&r, Duration::from_secs(1)).is_none());
}

/// A GetTable answer whose two records are a REQ's primary and alternate paths: one pair of
/// SA rows at the head of the ladder, naming both records; the result names the alternate
/// path's disagreement.
#[test]
fn a_table_answer_serving_both_paths_reads_in_the_ladder() {
    use crate::conn::{Tracker, TrackerConfig};
    use crate::trace::CmEvent;
    use ibcm_mad::{CmMessage, Mad};

    let mut tr = Tracker::new(TrackerConfig {
        record_events: true,
        ..TrackerConfig::default()
    });
    let mut q = get(7);
    q.header.method = method::GET_TABLE;
    q.comp_mask = comp::SGID | comp::DGID | comp::NUMB_PATH;
    tr.observe_sa(&event(&q, (A, SM), 1, 0));
    // Two records: LIDs 3 → 4 and 5 → 6 between the same GIDs.
    let mut seg = table_segments(7, 2, &[1]).remove(0);
    let mut second = record();
    second.slid = Lid(5);
    second.dlid = Lid(6);
    seg.data[..64].copy_from_slice(&record().to_bytes());
    seg.data[64..128].copy_from_slice(&second.to_bytes());
    tr.observe_sa(&event(&seg, (SM, A), 2, 40));
    let mut r = req();
    r.alternate_path = PathInfo {
        local_lid: Lid(5),
        remote_lid: Lid(6),
        hop_limit: 9,
        ..r.primary_path
    };
    let ev = CmEvent {
        frame: 3,
        time: Duration::from_micros(100),
        encap: Encap::IbLocal,
        src: lid(A),
        dst: lid(4),
        mad: Mad::new(Tid(0x99), CmMessage::Req(r)),
        icrc: Icrc::Ok,
        wire: event(&q, (A, 4), 3, 100).wire,
        captured: None,
    };
    let note = tr.observe(&ev);
    assert_eq!(note.sa.primary().map(|p| p.0), Some(2));
    assert!(note.problem, "the alternate path disagrees");
    tr.finish_all();
    let mut text = Vec::new();
    tr.drain_finished(|c| {
        crate::ladder::ladder(&mut text, c, &crate::style::Palette::default());
        Ok::<(), ()>(())
    })
    .unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains(
            "    -0.000100       1  SA GetTable PathRecord dgid :: sgid :: numb_path 0\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "    -0.000060       2  SA GetTableResp 2 records: record 1 → primary path slid 3 \
             dlid 4 sl 0 mtu 2048 rate 10 Gb/s pkt_life 18 pkey 0xffff reversible; record 2 → \
             alternate path slid 5 dlid 6 sl 0 mtu 2048 rate 10 Gb/s pkt_life 18 pkey 0xffff \
             reversible  (RMPP, 1 segment(s))\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("alternate path differs from SA record: hop limit 9 (record 0)"),
        "{text}"
    );
    assert!(
        text.contains("REQ disagrees with its SA PathRecord (hop_limit)"),
        "{text}"
    );
    assert_eq!(text.matches("  SA Get").count(), 2, "{text}");
}
