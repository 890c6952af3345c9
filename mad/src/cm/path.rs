//! Path information as carried by REQ (primary and alternate) and LAP (alternate).

use bytes::BufMut;

use super::wire::Rd;
use crate::codes::Rate;
use crate::types::{FlowLabel, Gid, Lid, TimeoutExp, U4};

/// One path as the CM describes it (REQ primary/alternate path, LAP alternate path).
///
/// The two messages lay the same fields out differently (docs/wire.md §2.1 vs §2.6); the
/// struct is shared. In a REQ, an alternate path whose Local Port LID is 0 means "no
/// alternate path" ([`PathInfo::is_present`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathInfo {
    /// Local Port LID (0xFFFF on RoCE with hop limit > 1).
    pub local_lid: Lid,
    /// Remote Port LID.
    pub remote_lid: Lid,
    /// Local Port GID (the sender's GID).
    pub local_gid: Gid,
    /// Remote Port GID (the receiver's GID).
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: FlowLabel,
    /// Packet rate (6 bits).
    pub packet_rate: Rate,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: U4,
    /// Subnet Local: 1 iff the path does not leave the subnet.
    pub subnet_local: bool,
    /// Local ACK timeout exponent (5 bits).
    pub local_ack_timeout: TimeoutExp,
}

impl PathInfo {
    /// Size of a path in a REQ and in a LAP.
    pub const LEN: usize = 44;

    /// A REQ carries an alternate path iff its Alternate Local Port LID is non-zero (or, for
    /// OPA, its local GID is set); an all-zero path is "absent".
    pub fn is_present(&self) -> bool {
        self.local_lid.0 != 0 || self.local_gid != Gid::ZERO
    }

    /// REQ layout: LIDs, GIDs, then flow label + packet rate in one 32-bit word, TC, hop limit,
    /// SL/subnet-local, ACK timeout. Returns the path and the low 3 bits of the last byte
    /// (reserved in the primary path; bit 0x04 is SAP Supported in the alternate path).
    #[inline(always)]
    pub(crate) fn read_req(r: &mut Rd<'_>) -> (PathInfo, u8) {
        let local_lid = r.u16();
        let remote_lid = r.u16();
        let local_gid = Gid(r.array::<16>());
        let remote_gid = Gid(r.array::<16>());
        let fl_rate = r.u32();
        let traffic_class = r.u8();
        let hop_limit = r.u8();
        let sl_sn = r.u8();
        let ack = r.u8();
        (
            PathInfo {
                local_lid: Lid(local_lid),
                remote_lid: Lid(remote_lid),
                local_gid,
                remote_gid,
                flow_label: FlowLabel::masked(fl_rate >> 12),
                packet_rate: Rate::from_raw_lut((fl_rate & 0x3f) as u8),
                traffic_class,
                hop_limit,
                sl: U4::masked(sl_sn >> 4),
                subnet_local: sl_sn & 0x08 != 0,
                local_ack_timeout: TimeoutExp::masked(ack >> 3),
            },
            ack & 0x07,
        )
    }

    /// Emits the REQ layout; `low_bits` go into the low 3 bits of the last byte.
    pub(crate) fn emit_req<B: BufMut>(&self, buf: &mut B, low_bits: u8) {
        buf.put_u16(self.local_lid.0);
        buf.put_u16(self.remote_lid.0);
        buf.put_slice(&self.local_gid.0);
        buf.put_slice(&self.remote_gid.0);
        buf.put_u32((self.flow_label.get() << 12) | u32::from(self.packet_rate.raw() & 0x3f));
        buf.put_u8(self.traffic_class);
        buf.put_u8(self.hop_limit);
        buf.put_u8((self.sl.get() << 4) | (u8::from(self.subnet_local) << 3));
        buf.put_u8((self.local_ack_timeout.get() << 3) | (low_bits & 0x07));
    }

    /// LAP layout: LIDs, GIDs, flow label + traffic class in one 32-bit word, hop limit,
    /// packet rate, SL/subnet-local, ACK timeout.
    #[inline(always)]
    pub(crate) fn read_lap(r: &mut Rd<'_>) -> PathInfo {
        let local_lid = r.u16();
        let remote_lid = r.u16();
        let local_gid = Gid(r.array::<16>());
        let remote_gid = Gid(r.array::<16>());
        let fl_tc = r.u32();
        let hop_limit = r.u8();
        let rate = r.u8();
        let sl_sn = r.u8();
        let ack = r.u8();
        PathInfo {
            local_lid: Lid(local_lid),
            remote_lid: Lid(remote_lid),
            local_gid,
            remote_gid,
            flow_label: FlowLabel::masked(fl_tc >> 12),
            packet_rate: Rate::from_raw_lut(rate & 0x3f),
            traffic_class: (fl_tc & 0xff) as u8,
            hop_limit,
            sl: U4::masked(sl_sn >> 4),
            subnet_local: sl_sn & 0x08 != 0,
            local_ack_timeout: TimeoutExp::masked(ack >> 3),
        }
    }

    /// Emits the LAP layout.
    pub(crate) fn emit_lap<B: BufMut>(&self, buf: &mut B) {
        buf.put_u16(self.local_lid.0);
        buf.put_u16(self.remote_lid.0);
        buf.put_slice(&self.local_gid.0);
        buf.put_slice(&self.remote_gid.0);
        buf.put_u32((self.flow_label.get() << 12) | u32::from(self.traffic_class));
        buf.put_u8(self.hop_limit);
        buf.put_u8(self.packet_rate.raw() & 0x3f);
        buf.put_u8((self.sl.get() << 4) | (u8::from(self.subnet_local) << 3));
        buf.put_u8(self.local_ack_timeout.get() << 3);
    }
}
