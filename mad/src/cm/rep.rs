//! REP, Connect Reply (0x0013): IBTA Table 110; docs/wire.md §2.4, §3.2.

use bytes::BufMut;

use super::wire::{put_u24, Rd};
use super::MAD_DATA_LEN;
use crate::codes::FailoverAccepted;
use crate::types::{CommId, Eecn, Guid, PrivateData, Psn, Qkey, Qpn, TimeoutExp, VendorId, U3};

/// Connect Reply.
///
/// For XRC, the target answers with its **TGT QPN in the Local EE Context Number field**,
/// Local QPN 0 and SRQ = 1 ([`Rep::xrc_tgt_qpn`], [`Rep::set_xrc_tgt_qpn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rep {
    /// Off 0, 32 bits: Local Communication ID.
    pub local_comm_id: CommId,
    /// Off 4, 32 bits: Remote Communication ID.
    pub remote_comm_id: CommId,
    /// Off 8, 32 bits: Local Q_Key.
    pub local_qkey: Qkey,
    /// Off 12, 24 bits: Local QPN (0 from an XRC TGT).
    pub local_qpn: Qpn,
    /// ECE vendor ID, split over Off 15 (bits 23:16), Off 19 (15:8) and Off 23 (7:0).
    pub ece_vendor_id: VendorId,
    /// Off 16, 24 bits: Local EE Context Number (XRC: the TGT QPN).
    pub local_eecn: Eecn,
    /// Off 20, 24 bits: Starting PSN.
    pub starting_psn: Psn,
    /// Off 24, 8 bits: Responder Resources.
    pub responder_resources: u8,
    /// Off 25, 8 bits: Initiator Depth.
    pub initiator_depth: u8,
    /// Off 26, mask 0xF8: Target ACK Delay.
    pub target_ack_delay: TimeoutExp,
    /// Off 26, mask 0x06: Failover Accepted.
    pub failover_accepted: FailoverAccepted,
    /// Off 26, mask 0x01: End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// Off 27, mask 0xE0: RNR Retry Count.
    pub rnr_retry_count: U3,
    /// Off 27, mask 0x10: SRQ.
    pub srq: bool,
    /// Off 28, 64 bits: Local CA GUID.
    pub local_ca_guid: Guid,
    /// Off 36, 196 bytes: private data.
    pub private_data: PrivateData<196>,
}

impl Default for Rep {
    fn default() -> Self {
        Rep {
            local_comm_id: CommId::default(),
            remote_comm_id: CommId::default(),
            local_qkey: Qkey::default(),
            local_qpn: Qpn::default(),
            ece_vendor_id: VendorId::default(),
            local_eecn: Eecn::default(),
            starting_psn: Psn::default(),
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: TimeoutExp::default(),
            failover_accepted: FailoverAccepted::Accepted,
            end_to_end_flow_control: false,
            rnr_retry_count: U3::default(),
            srq: false,
            local_ca_guid: Guid::default(),
            private_data: PrivateData::zeroed(),
        }
    }
}

impl Rep {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 196;

    /// The TGT QPN an XRC target put in the Local EECN field.
    pub fn xrc_tgt_qpn(&self) -> Qpn {
        Qpn::masked(self.local_eecn.get())
    }

    /// The QPN the receiver must use as the remote QPN: the EECN field when the receiver is
    /// an XRC INI (`cm_rep_get_qpn`), Local QPN otherwise.
    pub fn remote_qpn_for(&self, receiver_is_xrc_ini: bool) -> Qpn {
        if receiver_is_xrc_ini {
            self.xrc_tgt_qpn()
        } else {
            self.local_qpn
        }
    }

    /// Formats this REP as an XRC target does (`cm_format_rep` for `IB_QPT_XRC_TGT`): the TGT
    /// QPN goes into Local EECN, Local QPN is 0, SRQ is 1, Initiator Depth and End-to-End Flow
    /// Control are 0.
    pub fn set_xrc_tgt_qpn(&mut self, tgt_qpn: Qpn) {
        self.local_eecn = Eecn::masked(tgt_qpn.get());
        self.local_qpn = Qpn::default();
        self.srq = true;
        self.initiator_depth = 0;
        self.end_to_end_flow_control = false;
    }

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let local_comm_id = r.u32();
        let remote_comm_id = r.u32();
        let local_qkey = r.u32();
        let local_qpn = r.u24();
        let ece_hi = r.u8();
        let local_eecn = r.u24();
        let ece_mid = r.u8();
        let starting_psn = r.u24();
        let ece_lo = r.u8();
        let responder_resources = r.u8();
        let initiator_depth = r.u8();
        let b26 = r.u8();
        let b27 = r.u8();
        let local_ca_guid = r.u64();
        let private_data = PrivateData(r.array::<196>());
        Rep {
            local_comm_id: CommId(local_comm_id),
            remote_comm_id: CommId(remote_comm_id),
            local_qkey: Qkey(local_qkey),
            local_qpn: Qpn::masked(local_qpn),
            ece_vendor_id: VendorId::masked(u32::from_be_bytes([0, ece_hi, ece_mid, ece_lo])),
            local_eecn: Eecn::masked(local_eecn),
            starting_psn: Psn::masked(starting_psn),
            responder_resources,
            initiator_depth,
            target_ack_delay: TimeoutExp::masked(b26 >> 3),
            failover_accepted: FailoverAccepted::from_raw_lut((b26 >> 1) & 0x03),
            end_to_end_flow_control: b26 & 0x01 != 0,
            rnr_retry_count: U3::masked(b27 >> 5),
            srq: b27 & 0x10 != 0,
            local_ca_guid: Guid(local_ca_guid),
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        let [_, ece_hi, ece_mid, ece_lo] = self.ece_vendor_id.get().to_be_bytes();
        buf.put_u32(self.local_comm_id.0);
        buf.put_u32(self.remote_comm_id.0);
        buf.put_u32(self.local_qkey.0);
        put_u24(buf, self.local_qpn.get());
        buf.put_u8(ece_hi);
        put_u24(buf, self.local_eecn.get());
        buf.put_u8(ece_mid);
        put_u24(buf, self.starting_psn.get());
        buf.put_u8(ece_lo);
        buf.put_u8(self.responder_resources);
        buf.put_u8(self.initiator_depth);
        buf.put_u8(
            (self.target_ack_delay.get() << 3)
                | ((self.failover_accepted.raw() & 0x03) << 1)
                | u8::from(self.end_to_end_flow_control),
        );
        buf.put_u8((self.rnr_retry_count.get() << 5) | (u8::from(self.srq) << 4));
        buf.put_u64(self.local_ca_guid.0);
        buf.put_slice(self.private_data.as_bytes());
    }
}
