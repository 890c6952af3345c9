//! APR, Alternate Path Response (0x001A): IBTA Table 116; docs/wire.md §2.7.

use bytes::BufMut;

use super::wire::Rd;
use super::MAD_DATA_LEN;
use crate::codes::AprStatus;
use crate::types::{CommId, PrivateData};

/// Alternate Path Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Apr {
    /// Off 0, 32 bits: Local Communication ID.
    pub local_comm_id: CommId,
    /// Off 4, 32 bits: Remote Communication ID.
    pub remote_comm_id: CommId,
    /// Off 8, 8 bits: Additional Information Length.
    pub additional_info_length: u8,
    /// Off 9, 8 bits: AP Status.
    pub ap_status: AprStatus,
    /// Off 12, 72 bytes: Additional Information.
    pub additional_info: [u8; 72],
    /// Off 84, 148 bytes: private data.
    pub private_data: PrivateData<148>,
}

impl Default for Apr {
    fn default() -> Self {
        Apr {
            local_comm_id: CommId::default(),
            remote_comm_id: CommId::default(),
            additional_info_length: 0,
            ap_status: AprStatus::Success,
            additional_info: [0; 72],
            private_data: PrivateData::zeroed(),
        }
    }
}

impl Apr {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 148;

    /// The meaningful part of the additional information (at most 72 bytes).
    pub fn additional_info_bytes(&self) -> &[u8] {
        let n = usize::from(self.additional_info_length).min(72);
        self.additional_info.get(..n).unwrap_or(&[])
    }

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let local_comm_id = r.u32();
        let remote_comm_id = r.u32();
        let additional_info_length = r.u8();
        let ap_status = r.u8();
        r.skip(2);
        let additional_info = r.array::<72>();
        let private_data = PrivateData(r.array::<148>());
        Apr {
            local_comm_id: CommId(local_comm_id),
            remote_comm_id: CommId(remote_comm_id),
            additional_info_length,
            ap_status: AprStatus::from_raw_lut(ap_status),
            additional_info,
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        buf.put_u32(self.local_comm_id.0);
        buf.put_u32(self.remote_comm_id.0);
        buf.put_u8(self.additional_info_length);
        buf.put_u8(self.ap_status.raw());
        buf.put_u16(0);
        buf.put_slice(&self.additional_info);
        buf.put_slice(self.private_data.as_bytes());
    }
}
