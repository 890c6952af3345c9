//! REJ, Connect Reject (0x0012): IBTA Table 108; docs/wire.md §2.3.

use bytes::BufMut;

use super::wire::Rd;
use super::MAD_DATA_LEN;
use crate::codes::{MsgKind, RejReason};
use crate::types::{CommId, Guid, PrivateData, U7};

/// Connect Reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rej {
    /// Off 0, 32 bits: Local Communication ID (0 when rejecting a REQ from REQ_RCVD).
    pub local_comm_id: CommId,
    /// Off 4, 32 bits: Remote Communication ID.
    pub remote_comm_id: CommId,
    /// Off 8, mask 0xC0: which message is rejected.
    pub message_rejected: MsgKind,
    /// Off 9, mask 0xFE: Reject Info Length (ARI length in bytes, 7 bits).
    pub reject_info_length: U7,
    /// Off 10, 16 bits: Reason.
    pub reason: RejReason,
    /// Off 12, 72 bytes: Additional Rejection Information.
    pub ari: [u8; 72],
    /// Off 84, 148 bytes: private data.
    pub private_data: PrivateData<148>,
}

impl Default for Rej {
    fn default() -> Self {
        Rej {
            local_comm_id: CommId::default(),
            remote_comm_id: CommId::default(),
            message_rejected: MsgKind::Req,
            reject_info_length: U7::default(),
            reason: RejReason::ConsumerReject,
            ari: [0; 72],
            private_data: PrivateData::zeroed(),
        }
    }
}

impl Rej {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 148;
    /// Size of the ARI area.
    pub const ARI_LEN: usize = 72;

    /// The meaningful part of the ARI: its first `reject_info_length` bytes (at most 72).
    pub fn ari_bytes(&self) -> &[u8] {
        let n = usize::from(self.reject_info_length.get()).min(Self::ARI_LEN);
        self.ari.get(..n).unwrap_or(&[])
    }

    /// Sets the ARI (at most 72 bytes; longer input is cut) and its length.
    pub fn set_ari(&mut self, ari: &[u8]) {
        let n = ari.len().min(Self::ARI_LEN);
        self.ari = [0; 72];
        if let (Some(dst), Some(src)) = (self.ari.get_mut(..n), ari.get(..n)) {
            dst.copy_from_slice(src);
        }
        self.reject_info_length = U7::masked(n as u8);
    }

    /// For reason 4 (Timeout) the ARI is the rejecting CA's GUID (8 bytes); Linux matches the
    /// REJ to the connection through it (docs/interop.md §7.5).
    pub fn timeout_ca_guid(&self) -> Option<Guid> {
        if self.reason != RejReason::Timeout || self.reject_info_length.get() < 8 {
            return None;
        }
        self.ari
            .first_chunk::<8>()
            .map(|b| Guid(u64::from_be_bytes(*b)))
    }

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let local_comm_id = r.u32();
        let remote_comm_id = r.u32();
        let b8 = r.u8();
        let b9 = r.u8();
        let reason = r.u16();
        let ari = r.array::<72>();
        let private_data = PrivateData(r.array::<148>());
        Rej {
            local_comm_id: CommId(local_comm_id),
            remote_comm_id: CommId(remote_comm_id),
            message_rejected: MsgKind::from_raw_lut(b8 >> 6),
            reject_info_length: U7::masked(b9 >> 1),
            reason: RejReason::from_raw(reason),
            ari,
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        buf.put_u32(self.local_comm_id.0);
        buf.put_u32(self.remote_comm_id.0);
        buf.put_u8((self.message_rejected.raw() & 0x03) << 6);
        buf.put_u8(self.reject_info_length.get() << 1);
        buf.put_u16(self.reason.raw());
        buf.put_slice(&self.ari);
        buf.put_slice(self.private_data.as_bytes());
    }
}
