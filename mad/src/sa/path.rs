//! The PathRecord attribute (0x0035; IBTA Vol 1 §15.2.5.16, Table 227), 64 bytes.
//!
//! | Off | Bits | Field | ComponentMask bit |
//! |----:|-----:|-------|------------------:|
//! | 0 | 64 | ServiceID (reserved before IBTA 1.2.1) | 0 and 1 |
//! | 8 | 128 | DGID | 2 |
//! | 24 | 128 | SGID | 3 |
//! | 40 | 16 | DLID | 4 |
//! | 42 | 16 | SLID | 5 |
//! | 44 | 1 | RawTraffic (bit 31 of the word) | 6 |
//! | 44 | 3 | reserved | 7 |
//! | 44 | 20 | FlowLabel (bits 27–8) | 8 |
//! | 47 | 8 | HopLimit | 9 |
//! | 48 | 8 | TClass | 10 |
//! | 49 | 1 | Reversible (bit 7) | 11 |
//! | 49 | 7 | NumbPath | 12 |
//! | 50 | 16 | P_Key | 13 |
//! | 52 | 12 | QoSClass (bits 15–4) | 14 |
//! | 53 | 4 | SL (bits 3–0) | 15 |
//! | 54 | 2 | MTUSelector (bits 7–6) | 16 |
//! | 54 | 6 | MTU | 17 |
//! | 55 | 2 | RateSelector (bits 7–6) | 18 |
//! | 55 | 6 | Rate | 19 |
//! | 56 | 2 | PacketLifeTimeSelector (bits 7–6) | 20 |
//! | 56 | 6 | PacketLifeTime | 21 |
//! | 57 | 8 | Preference | 22 |
//! | 58 | 48 | reserved | – |
//!
//! The same packing as the kernel's `path_rec_table` (`drivers/infiniband/core/sa_query.c`)
//! and OpenSM's `ib_path_rec_t`.

use bytes::BufMut;

use crate::cm::wire::Rd;
use crate::codes::{Mtu, Rate};
use crate::error::ParseError;
use crate::types::{FlowLabel, Gid, Lid, Pkey, U4};

/// ComponentMask bits of a PathRecord query (`IB_SA_PATH_REC_*` in `include/rdma/ib_sa.h`).
pub mod comp {
    /// ServiceID (two bits, as the kernel sets them).
    pub const SERVICE_ID: u64 = 0b11;
    /// DGID.
    pub const DGID: u64 = 1 << 2;
    /// SGID.
    pub const SGID: u64 = 1 << 3;
    /// DLID.
    pub const DLID: u64 = 1 << 4;
    /// SLID.
    pub const SLID: u64 = 1 << 5;
    /// RawTraffic.
    pub const RAW_TRAFFIC: u64 = 1 << 6;
    /// FlowLabel.
    pub const FLOW_LABEL: u64 = 1 << 8;
    /// HopLimit.
    pub const HOP_LIMIT: u64 = 1 << 9;
    /// TClass.
    pub const TRAFFIC_CLASS: u64 = 1 << 10;
    /// Reversible.
    pub const REVERSIBLE: u64 = 1 << 11;
    /// NumbPath.
    pub const NUMB_PATH: u64 = 1 << 12;
    /// P_Key.
    pub const PKEY: u64 = 1 << 13;
    /// QoSClass.
    pub const QOS_CLASS: u64 = 1 << 14;
    /// SL.
    pub const SL: u64 = 1 << 15;
    /// MTUSelector.
    pub const MTU_SELECTOR: u64 = 1 << 16;
    /// MTU.
    pub const MTU: u64 = 1 << 17;
    /// RateSelector.
    pub const RATE_SELECTOR: u64 = 1 << 18;
    /// Rate.
    pub const RATE: u64 = 1 << 19;
    /// PacketLifeTimeSelector.
    pub const PACKET_LIFE_TIME_SELECTOR: u64 = 1 << 20;
    /// PacketLifeTime.
    pub const PACKET_LIFE_TIME: u64 = 1 << 21;
    /// Preference.
    pub const PREFERENCE: u64 = 1 << 22;
}

/// Byte offsets of the PathRecord fields (from the start of the record).
pub mod off {
    /// ServiceID.
    pub const SERVICE_ID: usize = 0;
    /// DGID.
    pub const DGID: usize = 8;
    /// SGID.
    pub const SGID: usize = 24;
    /// DLID.
    pub const DLID: usize = 40;
    /// SLID.
    pub const SLID: usize = 42;
    /// RawTraffic, FlowLabel and HopLimit (one 32-bit word).
    pub const FLOW: usize = 44;
    /// HopLimit.
    pub const HOP_LIMIT: usize = 47;
    /// TClass.
    pub const TCLASS: usize = 48;
    /// Reversible and NumbPath.
    pub const NUMB_PATH: usize = 49;
    /// P_Key.
    pub const PKEY: usize = 50;
    /// QoSClass and SL.
    pub const QOS_SL: usize = 52;
    /// MTUSelector and MTU.
    pub const MTU: usize = 54;
    /// RateSelector and Rate.
    pub const RATE: usize = 55;
    /// PacketLifeTimeSelector and PacketLifeTime.
    pub const PACKET_LIFE: usize = 56;
    /// Preference.
    pub const PREFERENCE: usize = 57;
}

/// A 2-bit selector of MTU, Rate or PacketLifeTime (IBTA Vol 1 Table 227).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Selector {
    /// 0: greater than the value given.
    #[default]
    GreaterThan,
    /// 1: less than the value given.
    LessThan,
    /// 2: exactly the value given.
    Exactly,
    /// 3: the largest available.
    Largest,
}

impl Selector {
    /// The selector of the top two bits of `b`.
    pub const fn from_top_bits(b: u8) -> Self {
        match b >> 6 {
            0 => Selector::GreaterThan,
            1 => Selector::LessThan,
            2 => Selector::Exactly,
            _ => Selector::Largest,
        }
    }

    /// The 2-bit code.
    pub const fn raw(self) -> u8 {
        match self {
            Selector::GreaterThan => 0,
            Selector::LessThan => 1,
            Selector::Exactly => 2,
            Selector::Largest => 3,
        }
    }
}

/// A PathRecord: one path between two ports, as the SA answers it (or as a query's template).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRecord {
    /// ServiceID.
    pub service_id: u64,
    /// Destination GID.
    pub dgid: Gid,
    /// Source GID.
    pub sgid: Gid,
    /// Destination LID.
    pub dlid: Lid,
    /// Source LID.
    pub slid: Lid,
    /// RawTraffic.
    pub raw_traffic: bool,
    /// Flow label for the GRH.
    pub flow_label: FlowLabel,
    /// Hop limit: 0 or 1 on a path inside the subnet (no GRH needed), more across routers.
    pub hop_limit: u8,
    /// Traffic class for the GRH.
    pub traffic_class: u8,
    /// Reversible: the path is usable in both directions.
    pub reversible: bool,
    /// NumbPath (7 bits): in a query, the most paths wanted; 0 in an answer.
    pub numb_path: u8,
    /// P_Key.
    pub pkey: Pkey,
    /// QoSClass (12 bits).
    pub qos_class: u16,
    /// Service level.
    pub sl: U4,
    /// MTU selector.
    pub mtu_selector: Selector,
    /// MTU (6-bit code).
    pub mtu: Mtu,
    /// Rate selector.
    pub rate_selector: Selector,
    /// Rate (6-bit code).
    pub rate: Rate,
    /// PacketLifeTime selector.
    pub packet_life_time_selector: Selector,
    /// PacketLifeTime (6 bits: 4.096 µs · 2^value).
    pub packet_life_time: u8,
    /// Preference (0 = most preferred).
    pub preference: u8,
}

impl PathRecord {
    /// Size on the wire.
    pub const LEN: usize = 64;
    /// AttributeOffset of a PathRecord table (in 8-byte words).
    pub const ATTR_OFFSET: u16 = (Self::LEN / 8) as u16;

    /// Parses the first 64 bytes of `bytes`.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] below 64 bytes; any 64 bytes parse (reserved bits are
    /// ignored).
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let b = bytes
            .first_chunk::<{ Self::LEN }>()
            .ok_or(ParseError::Truncated {
                offset: 0,
                need: Self::LEN,
                have: bytes.len(),
            })?;
        Ok(Self::parse_fixed(b))
    }

    /// Decodes 64 bytes.
    pub fn parse_fixed(b: &[u8; Self::LEN]) -> Self {
        let mut r = Rd::new(b);
        let service_id = r.u64();
        let dgid = Gid(r.array());
        let sgid = Gid(r.array());
        let dlid = Lid(r.u16());
        let slid = Lid(r.u16());
        let w11 = r.u32();
        let traffic_class = r.u8();
        let np = r.u8();
        let pkey = Pkey(r.u16());
        let qs = r.u16();
        let mtu = r.u8();
        let rate = r.u8();
        let plt = r.u8();
        let preference = r.u8();
        PathRecord {
            service_id,
            dgid,
            sgid,
            dlid,
            slid,
            raw_traffic: w11 & 0x8000_0000 != 0,
            flow_label: FlowLabel::masked(w11 >> 8),
            hop_limit: (w11 & 0xff) as u8,
            traffic_class,
            reversible: np & 0x80 != 0,
            numb_path: np & 0x7f,
            pkey,
            qos_class: qs >> 4,
            sl: U4::masked((qs & 0xf) as u8),
            mtu_selector: Selector::from_top_bits(mtu),
            mtu: Mtu::from_raw(mtu & 0x3f),
            rate_selector: Selector::from_top_bits(rate),
            rate: Rate::from_raw(rate & 0x3f),
            packet_life_time_selector: Selector::from_top_bits(plt),
            packet_life_time: plt & 0x3f,
            preference,
        }
    }

    /// Writes the 64 bytes (reserved bits zero; values wider than their field are masked).
    pub fn emit<B: BufMut>(&self, buf: &mut B) {
        buf.put_u64(self.service_id);
        buf.put_slice(&self.dgid.0);
        buf.put_slice(&self.sgid.0);
        buf.put_u16(self.dlid.0);
        buf.put_u16(self.slid.0);
        let w11 = (u32::from(self.raw_traffic) << 31)
            | (self.flow_label.get() << 8)
            | u32::from(self.hop_limit);
        buf.put_u32(w11);
        buf.put_u8(self.traffic_class);
        buf.put_u8((u8::from(self.reversible) << 7) | (self.numb_path & 0x7f));
        buf.put_u16(self.pkey.0);
        buf.put_u16(((self.qos_class & 0x0fff) << 4) | u16::from(self.sl.get()));
        buf.put_u8((self.mtu_selector.raw() << 6) | (self.mtu.raw() & 0x3f));
        buf.put_u8((self.rate_selector.raw() << 6) | (self.rate.raw() & 0x3f));
        buf.put_u8((self.packet_life_time_selector.raw() << 6) | (self.packet_life_time & 0x3f));
        buf.put_u8(self.preference);
        buf.put_slice(&[0; 6]);
    }

    /// The 64 bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        self.emit(&mut &mut out[..]);
        out
    }

    /// The records of a PathRecord table in `data` (the reassembled SA data of a
    /// GetTableResp), `attr_offset` 8-byte words apart; a trailing piece shorter than a
    /// record is not one. An `attr_offset` of 0 (a Get answer) reads one record.
    pub fn table(data: &[u8], attr_offset: u16) -> Vec<PathRecord> {
        let step = match usize::from(attr_offset) * 8 {
            0 => return PathRecord::parse(data).into_iter().collect(),
            s => s.max(Self::LEN),
        };
        data.chunks(step)
            .filter_map(|c| PathRecord::parse(c).ok())
            .collect()
    }
}
