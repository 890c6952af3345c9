//! The data path of a connection: the RC (or XRC) traffic on the QPNs its CM exchange
//! announced, in both directions. A packet belongs to a connection when it goes to one end's
//! address and QPN (REQ Local QPN for the active end; REP Local QPN, or for XRC the TGT QPN in
//! the REP's Local EECN, for the passive end), so an XRC INI's traffic to its TGT QP counts for
//! its connection.
//!
//! Counted: packets and bytes (wire length) by opcode family; ACKs, RNR NAKs and NAKs by
//! AETH syndrome; CNPs and ECN Congestion Experienced marks; first and last packet times; and,
//! per direction over the request packets (everything but ACKs, READ responses and atomic
//! ACKs), retransmissions (a request PSN at or before the highest one seen, in 24-bit serial
//! order: go-back-N resends) and PSN gaps (a request PSN more than one past the highest, when
//! the request before it was not an RDMA READ, which uses one PSN per response packet).
//!
//! The same packet seen twice in one direction within 1 ms (no NAK between) is one packet
//! captured at both ends (a `mergecap` of both hosts' captures): counted in `duplicates` only.
//! (A resend of the very last packet within 1 ms of it, without a NAK, would be taken for one
//! too; RC retransmission timers are longer.)
//!
//! XRC requests carry the receiving process's XRC SRQ number (XRCETH). When the connection's
//! REP announced SRQ numbers in its private data (ibcm's XRC REP format, or the 4-byte SRQN
//! `rdma_xserver` sends), an XRC request from the active end's address to the passive end's
//! address with one of them is counted on that connection (`srq_packets`), even when several
//! INI QPs share one TGT QP (the TGT QPN alone cannot tell them apart).
//!
//! A SIDR exchange has a data path too: the UD SENDs to the QPN its SIDR_REP announced, at the
//! responder's address (to the passive end; `qkey_mismatches` counts those whose DETH Q_Key
//! is not the SIDR_REP's: the receiving QP drops them), and the UD SENDs from that QP (DETH
//! source QPN) back to the requester's address (to the active end). UD has no ACKs, so only
//! packets, bytes, ECN marks, duplicates and times are counted.
//!
//! The verdict: `broken` for an established connection whose QPs NAKed or retransmitted, or a
//! resolved SIDR exchange with UD SENDs under another Q_Key; `no data` for an established
//! connection (resolved SIDR exchange) without a packet while the capture had RC (UD) traffic
//! (a capture of the CM's QP1 alone gets no verdict).

use std::time::Duration;

use crate::trace::RcPacket;

/// Opcode families, in the order of [`DataStats::families`].
pub(crate) const FAMILIES: [&str; 7] = [
    "send",
    "write",
    "read_req",
    "read_resp",
    "ack",
    "atomic",
    "cnp",
];

/// The family of an RC / XRC opcode (its low 5 bits) or a CNP.
fn family(opcode: u8) -> usize {
    if opcode == 0x81 {
        return 6;
    }
    match opcode & 0x1f {
        0x00..=0x05 | 0x16 | 0x17 => 0,
        0x06..=0x0b => 1,
        0x0c => 2,
        0x0d..=0x10 => 3,
        0x11 => 4,
        0x12..=0x14 => 5,
        _ => 0,
    }
}

/// Whether an opcode is a response (its PSN is that of the request it answers).
fn is_response(opcode: u8) -> bool {
    opcode == 0x81 || matches!(opcode & 0x1f, 0x0d..=0x12)
}

/// NAK codes (AETH syndrome low bits of a NAK), in the order of [`DataStats::nak_codes`].
pub(crate) const NAK_CODES: [&str; 5] = [
    "psn_sequence_error",
    "invalid_request",
    "remote_access_error",
    "remote_operational_error",
    "invalid_rd_request",
];

/// How many of the SRQ numbers a REP announces (up to 47) are kept.
pub(crate) const MAX_SRQNS: usize = 16;

/// How many recent packets per direction are remembered to recognise duplicate captures.
const RECENT: usize = 4;
/// Largest time between two copies of one packet taken as a duplicate capture.
const DUP_WINDOW: Duration = Duration::from_millis(1);

/// A packet as remembered for duplicate detection: opcode, PSN, length, AETH syndrome, time.
type Seen = (u8, u32, u32, Option<u8>, Duration);

/// One direction's request PSN state and recent packets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Dir {
    /// Highest request PSN seen.
    highest: Option<u32>,
    /// The request with that PSN was an RDMA READ.
    read: bool,
    /// The last packets (a ring).
    recent: [Option<Seen>; RECENT],
    next: usize,
}

/// The data-path counters of a connection (both directions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataStats {
    /// Packets.
    pub packets: u64,
    /// Bytes on the wire.
    pub bytes: u64,
    /// Packets by family ([`FAMILIES`]).
    pub families: [u64; 7],
    /// Positive ACKs (AETH syndrome 00x xxxx, in ACKs, READ responses, atomic ACKs).
    pub acks: u64,
    /// RNR NAKs (syndrome 01x xxxx).
    pub rnr_naks: u64,
    /// NAKs (syndrome 11x xxxx) by code ([`NAK_CODES`]; other codes are counted in `naks`
    /// only).
    pub nak_codes: [u64; 5],
    /// NAKs and RNR NAKs.
    pub naks: u64,
    /// Request packets resent (go-back-N): a PSN at or before the highest seen.
    pub retransmissions: u64,
    /// Request PSNs more than one past the highest seen (packets lost before the capture
    /// point, or not captured).
    pub psn_gaps: u64,
    /// CNPs.
    pub cnps: u64,
    /// Packets marked ECN Congestion Experienced.
    pub ecn_ce: u64,
    /// Packets seen twice (the same opcode, PSN, length and syndrome within 1 ms in the same
    /// direction, no NAK between): one packet captured at both ends (merged captures), not
    /// counted again.
    pub duplicates: u64,
    /// First and last packet.
    pub first: Option<Duration>,
    /// Last packet.
    pub last: Option<Duration>,
    /// XRC requests counted by their XRC SRQ number (one the REP announced).
    pub srq_packets: u64,
    /// SIDR: UD SENDs to the announced QPN with another Q_Key than the SIDR_REP's.
    pub qkey_mismatches: u64,
    /// XRC: the SRQ numbers the REP announced (the first [`MAX_SRQNS`]).
    pub srqns: [u32; MAX_SRQNS],
    /// How many of `srqns` are set.
    pub srqn_count: u8,
    /// SIDR: the Q_Key of a SIDR_REP with status 0.
    pub ud_qkey: Option<u32>,
    /// Per direction: to the passive end, to the active end.
    dirs: [Dir; 2],
    /// The capture had RC traffic (on any QP) when the connection finished.
    pub capture_has_rc: bool,
}

/// The data-path verdict of an established connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Data flowed without NAKs or retransmissions.
    Ok,
    /// The QPs NAKed or retransmitted after the CM said established (SIDR: UD SENDs under
    /// another Q_Key).
    Broken,
    /// Nothing flowed.
    NoData,
}

impl Verdict {
    /// `ok`, `broken`, `no_data`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Broken => "broken",
            Verdict::NoData => "no_data",
        }
    }

    /// The sentence the ladder shows.
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Ok => "data flowed",
            Verdict::Broken => "established but broken",
            Verdict::NoData => "no data",
        }
    }
}

impl DataStats {
    /// The SRQ numbers the REP announced (the first [`MAX_SRQNS`]).
    pub fn srqns(&self) -> &[u32] {
        self.srqns
            .get(..usize::from(self.srqn_count))
            .unwrap_or(&[])
    }

    /// Takes the SRQ numbers a REP announced in its private data: ibcm's XRC REP format, or
    /// else the 4-byte big-endian SRQN `rdma_xserver` sends (top byte zero, not zero).
    pub(crate) fn set_srqns(&mut self, private: &[u8]) {
        let mut n = 0;
        let mut put = |v: u32| {
            if let Some(slot) = self.srqns.get_mut(n) {
                *slot = v;
                n += 1;
            }
        };
        match ibcm_mad::xrc::XrcRepData::parse(private) {
            Ok((x, _)) => x.srqns.iter().for_each(|s| put(s.get())),
            Err(_) => {
                if let Some(s) =
                    ibcm_mad::xrc::XrcRepData::first_srqn_compat(private).filter(|s| s.get() != 0)
                {
                    put(s.get());
                }
            }
        }
        self.srqn_count = u8::try_from(n).unwrap_or(0);
    }
    /// Whether `p` is a second copy of a recent packet in its direction (then counted in
    /// `duplicates`); otherwise remembers it.
    fn duplicate(&mut self, p: &RcPacket, d: usize) -> bool {
        let seen: Seen = (p.opcode.0, p.psn.get(), p.len, p.syndrome, p.time);
        let Some(dir) = self.dirs.get_mut(d) else {
            return false;
        };
        let dup = dir.recent.iter().flatten().any(|&(o, psn, len, syn, t)| {
            (o, psn, len, syn) == (seen.0, seen.1, seen.2, seen.3)
                && p.time.checked_sub(t).is_some_and(|dt| dt <= DUP_WINDOW)
        });
        if dup {
            self.duplicates += 1;
            return true;
        }
        if let Some(slot) = dir.recent.get_mut(dir.next % RECENT) {
            *slot = Some(seen);
        }
        dir.next = (dir.next + 1) % RECENT;
        false
    }

    /// Counts the packet, its bytes, times and ECN mark.
    fn count(&mut self, p: &RcPacket) {
        self.packets += 1;
        self.bytes += u64::from(p.len);
        self.first.get_or_insert(p.time);
        self.last = Some(self.last.map_or(p.time, |l| l.max(p.time)));
        if p.ce {
            self.ecn_ce += 1;
        }
    }

    /// Counts one UD SEND of a SIDR exchange: to the announced QPN (`to_active` false; `qkey`
    /// is the SIDR_REP's Q_Key) or from it back to the requester.
    pub(crate) fn add_ud(&mut self, p: &RcPacket, to_active: bool, qkey: Option<u32>) {
        if self.duplicate(p, usize::from(to_active)) {
            return;
        }
        self.count(p);
        if let Some(f) = self.families.first_mut() {
            *f += 1;
        }
        let sent = p.deth.map(|(_, q)| q.0);
        if !to_active && qkey.is_some() && sent != qkey {
            self.qkey_mismatches += 1;
        }
    }

    /// Counts one packet going to the passive end (`to_active` false) or the active end.
    pub(crate) fn add(&mut self, p: &RcPacket, to_active: bool) {
        let op = p.opcode.0;
        let d = usize::from(to_active);
        if self.duplicate(p, d) {
            return;
        }
        // A NAK asks for a resend: what follows in the other direction is not a duplicate.
        if p.syndrome.is_some_and(|s| (s >> 5) & 0x03 != 0) {
            if let Some(other) = self.dirs.get_mut(1 - d) {
                other.recent = [None; RECENT];
            }
        }
        self.count(p);
        if let Some(f) = self.families.get_mut(family(op)) {
            *f += 1;
        }
        if op == 0x81 {
            self.cnps += 1;
        }
        if let Some(s) = p.syndrome {
            match (s >> 5) & 0x03 {
                0 => self.acks += 1,
                1 => {
                    self.rnr_naks += 1;
                    self.naks += 1;
                }
                3 => {
                    self.naks += 1;
                    if let Some(n) = self.nak_codes.get_mut(usize::from(s & 0x1f)) {
                        *n += 1;
                    }
                }
                _ => {}
            }
        }
        if is_response(op) {
            return;
        }
        let psn = p.psn.get();
        let Some(dir) = self.dirs.get_mut(usize::from(to_active)) else {
            return;
        };
        match dir.highest {
            None => {
                dir.highest = Some(psn);
                dir.read = op & 0x1f == 0x0c;
            }
            Some(h) => {
                // 24-bit serial arithmetic: 1..2^23 ahead is new, the rest is a resend.
                let ahead = psn.wrapping_sub(h) & 0x00ff_ffff;
                if ahead == 0 || ahead >= 1 << 23 {
                    self.retransmissions += 1;
                } else {
                    if ahead > 1 && !dir.read {
                        self.psn_gaps += 1;
                    }
                    dir.highest = Some(psn);
                    dir.read = op & 0x1f == 0x0c;
                }
            }
        }
    }

    /// The verdict for a connection that was established (`None` otherwise, or when the
    /// capture had no RC traffic at all).
    pub fn verdict(&self, established: bool) -> Option<Verdict> {
        if !established || !(self.capture_has_rc || self.packets > 0) {
            return None;
        }
        Some(if self.packets == 0 {
            Verdict::NoData
        } else if self.naks > 0 || self.retransmissions > 0 || self.qkey_mismatches > 0 {
            Verdict::Broken
        } else {
            Verdict::Ok
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::WireAddr;
    use ibcm_mad::frame::Opcode;
    use ibcm_mad::{Lid, Psn, Qpn};

    fn pkt(opcode: u8, psn: u32, syndrome: Option<u8>) -> RcPacket {
        RcPacket {
            time: Duration::from_secs(1),
            src: WireAddr::Lid(Lid(1)),
            dst: WireAddr::Lid(Lid(2)),
            dest_qp: Qpn::masked(5),
            psn: Psn::masked(psn),
            opcode: Opcode(opcode),
            syndrome,
            len: 100,
            ce: false,
            srqn: None,
            deth: None,
        }
    }

    #[test]
    fn go_back_n_gaps_and_naks() {
        let mut d = DataStats::default();
        // WRITE 10, 11, 13 (gap), NAK PSN sequence error, then 12, 13 resent... 12 is behind
        // the highest (13): both resends count.
        for psn in [10, 11, 13] {
            d.add(&pkt(0x0a, psn, None), false);
        }
        d.add(&pkt(0x11, 12, Some(0x60)), true);
        d.add(&pkt(0x0a, 12, None), false);
        d.add(&pkt(0x0a, 13, None), false);
        d.add(&pkt(0x11, 13, Some(0x00)), true);
        // RNR NAK.
        d.add(&pkt(0x11, 13, Some(0x20 | 0x0e)), true);
        assert_eq!(d.packets, 8);
        assert_eq!(d.psn_gaps, 1);
        assert_eq!(d.retransmissions, 2);
        assert_eq!(d.naks, 2);
        assert_eq!(d.rnr_naks, 1);
        assert_eq!(d.nak_codes[0], 1);
        assert_eq!(d.acks, 1);
        assert_eq!(d.families[1], 5);
        assert_eq!(d.families[4], 3);
        assert_eq!(d.verdict(true), Some(Verdict::Broken));
        assert_eq!(d.verdict(false), None);
    }

    #[test]
    fn read_uses_several_psns_and_psn_wraps() {
        let mut d = DataStats::default();
        d.add(&pkt(0x0c, 0xff_fffe, None), false);
        // The READ's 4 responses used 0xfffffe..=0x000001; the next request is 2.
        d.add(&pkt(0x04, 2, None), false);
        d.add(&pkt(0x04, 3, None), false);
        assert_eq!((d.psn_gaps, d.retransmissions), (0, 0));
        assert_eq!(d.verdict(true), Some(Verdict::Ok));
        let none = DataStats {
            capture_has_rc: true,
            ..DataStats::default()
        };
        assert_eq!(none.verdict(true), Some(Verdict::NoData));
        assert_eq!(DataStats::default().verdict(true), None);
    }

    #[test]
    fn srqns_from_either_rep_format_and_ud_qkey_mismatches() {
        let mut d = DataStats::default();
        // rdma_xserver: a bare 4-byte big-endian SRQN.
        d.set_srqns(&[0x00, 0x01, 0x02, 0x03, 0, 0, 0, 0]);
        assert_eq!(d.srqns(), &[0x0001_0203]);
        // Nothing that looks like one: none.
        d.set_srqns(&[0xff, 0, 0, 1]);
        assert!(d.srqns().is_empty());
        d.set_srqns(&[0, 0, 0, 0]);
        assert!(d.srqns().is_empty());

        let mut u = DataStats {
            ud_qkey: Some(7),
            ..DataStats::default()
        };
        let mut p = pkt(0x64, 1, None);
        p.deth = Some((Qpn::masked(9), ibcm_mad::Qkey(7)));
        u.add_ud(&p, false, u.ud_qkey);
        p.psn = Psn::masked(2);
        p.deth = Some((Qpn::masked(9), ibcm_mad::Qkey(8)));
        u.add_ud(&p, false, u.ud_qkey);
        // The same packet again within 1 ms: a duplicate capture.
        u.add_ud(&p, false, u.ud_qkey);
        assert_eq!((u.packets, u.qkey_mismatches, u.duplicates), (2, 1, 1));
        assert_eq!(u.verdict(true), Some(Verdict::Broken));
    }
}
