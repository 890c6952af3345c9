//! ClassPortInfo (attribute 0x0001), 72 bytes; docs/wire.md §2.9.
//!
//! Used by IBTA for CM redirection (REJ reason 24 ARI, SIDR_REP additional info). Linux's CM
//! never sends or parses it; its MAD layer answers a Get(ClassPortInfo) with status 0x000C.

use bytes::BufMut;

use super::wire::Rd;
use super::MAD_DATA_LEN;
use crate::types::{FlowLabel, Gid, Lid, Pkey, Qkey, Qpn, TimeoutExp, U27, U4};

/// ClassPortInfo attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassPortInfo {
    /// Off 0: BaseVersion.
    pub base_version: u8,
    /// Off 1: ClassVersion.
    pub class_version: u8,
    /// Off 2: CapabilityMask.
    pub capability_mask: u16,
    /// Off 4, high 27 bits: CapabilityMask2.
    pub capability_mask2: U27,
    /// Off 4, low 5 bits: RespTimeValue (a timeout exponent).
    pub resp_time_value: TimeoutExp,
    /// Off 8: RedirectGID.
    pub redirect_gid: Gid,
    /// Off 24, bits 31:24: RedirectTC.
    pub redirect_tc: u8,
    /// Off 24, bits 23:20: RedirectSL.
    pub redirect_sl: U4,
    /// Off 24, bits 19:0: RedirectFL.
    pub redirect_fl: FlowLabel,
    /// Off 28: RedirectLID.
    pub redirect_lid: Lid,
    /// Off 30: RedirectP_Key.
    pub redirect_pkey: Pkey,
    /// Off 32, low 24 bits: RedirectQP.
    pub redirect_qp: Qpn,
    /// Off 36: RedirectQ_Key.
    pub redirect_qkey: Qkey,
    /// Off 40: TrapGID.
    pub trap_gid: Gid,
    /// Off 56, bits 31:24: TrapTC.
    pub trap_tc: u8,
    /// Off 56, bits 23:20: TrapSL.
    pub trap_sl: U4,
    /// Off 56, bits 19:0: TrapFL.
    pub trap_fl: FlowLabel,
    /// Off 60: TrapLID.
    pub trap_lid: Lid,
    /// Off 62: TrapP_Key.
    pub trap_pkey: Pkey,
    /// Off 64, bits 31:24: TrapHL.
    pub trap_hl: u8,
    /// Off 64, low 24 bits: TrapQP.
    pub trap_qp: Qpn,
    /// Off 68: TrapQ_Key.
    pub trap_qkey: Qkey,
}

impl ClassPortInfo {
    /// Size of the attribute (the rest of the 232-byte MAD data is reserved).
    pub const LEN: usize = 72;

    /// Parses the 72-byte attribute (also used for the ARI of REJ reason 24 and a redirecting
    /// SIDR_REP's additional information).
    #[inline(always)]
    pub(crate) fn read_attr(r: &mut Rd<'_>) -> Self {
        let base_version = r.u8();
        let class_version = r.u8();
        let capability_mask = r.u16();
        let cap2_resp = r.u32();
        let redirect_gid = Gid(r.array::<16>());
        let redirect_tc_sl_fl = r.u32();
        let redirect_lid = r.u16();
        let redirect_pkey = r.u16();
        let redirect_qp = r.u32();
        let redirect_qkey = r.u32();
        let trap_gid = Gid(r.array::<16>());
        let trap_tc_sl_fl = r.u32();
        let trap_lid = r.u16();
        let trap_pkey = r.u16();
        let trap_hl_qp = r.u32();
        let trap_qkey = r.u32();
        ClassPortInfo {
            base_version,
            class_version,
            capability_mask,
            capability_mask2: U27::masked(cap2_resp >> 5),
            resp_time_value: TimeoutExp::masked((cap2_resp & 0x1f) as u8),
            redirect_gid,
            redirect_tc: (redirect_tc_sl_fl >> 24) as u8,
            redirect_sl: U4::masked((redirect_tc_sl_fl >> 20) as u8),
            redirect_fl: FlowLabel::masked(redirect_tc_sl_fl),
            redirect_lid: Lid(redirect_lid),
            redirect_pkey: Pkey(redirect_pkey),
            redirect_qp: Qpn::masked(redirect_qp),
            redirect_qkey: Qkey(redirect_qkey),
            trap_gid,
            trap_tc: (trap_tc_sl_fl >> 24) as u8,
            trap_sl: U4::masked((trap_tc_sl_fl >> 20) as u8),
            trap_fl: FlowLabel::masked(trap_tc_sl_fl),
            trap_lid: Lid(trap_lid),
            trap_pkey: Pkey(trap_pkey),
            trap_hl: (trap_hl_qp >> 24) as u8,
            trap_qp: Qpn::masked(trap_hl_qp),
            trap_qkey: Qkey(trap_qkey),
        }
    }

    /// Parses a ClassPortInfo out of a 72-byte (or longer) slice, e.g. a REJ 24 ARI.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let attr = b.first_chunk::<{ Self::LEN }>()?;
        Some(Self::read_attr(&mut Rd::new(attr)))
    }

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        Self::read_attr(&mut r)
    }

    /// Writes the 72-byte attribute.
    pub fn emit_attr<B: BufMut>(&self, buf: &mut B) {
        buf.put_u8(self.base_version);
        buf.put_u8(self.class_version);
        buf.put_u16(self.capability_mask);
        buf.put_u32((self.capability_mask2.get() << 5) | u32::from(self.resp_time_value.get()));
        buf.put_slice(&self.redirect_gid.0);
        buf.put_u32(
            (u32::from(self.redirect_tc) << 24)
                | (u32::from(self.redirect_sl.get()) << 20)
                | self.redirect_fl.get(),
        );
        buf.put_u16(self.redirect_lid.0);
        buf.put_u16(self.redirect_pkey.0);
        buf.put_u32(self.redirect_qp.get());
        buf.put_u32(self.redirect_qkey.0);
        buf.put_slice(&self.trap_gid.0);
        buf.put_u32(
            (u32::from(self.trap_tc) << 24)
                | (u32::from(self.trap_sl.get()) << 20)
                | self.trap_fl.get(),
        );
        buf.put_u16(self.trap_lid.0);
        buf.put_u16(self.trap_pkey.0);
        buf.put_u32((u32::from(self.trap_hl) << 24) | self.trap_qp.get());
        buf.put_u32(self.trap_qkey.0);
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        self.emit_attr(buf);
        buf.put_bytes(0, 232 - Self::LEN);
    }
}
