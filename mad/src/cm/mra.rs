//! MRA, Message Receipt Acknowledgement (0x0011): IBTA Table 107; docs/wire.md §2.2.

use bytes::BufMut;

use super::wire::Rd;
use super::MAD_DATA_LEN;
use crate::codes::MsgKind;
use crate::types::{CommId, PrivateData, TimeoutExp};

/// Message Receipt Acknowledgement: "your message arrived, the answer will take a while".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mra {
    /// Off 0, 32 bits: Local Communication ID.
    pub local_comm_id: CommId,
    /// Off 4, 32 bits: Remote Communication ID (0 when MRAing a REQ whose sender is unknown).
    pub remote_comm_id: CommId,
    /// Off 8, mask 0xC0: which message is acknowledged (REQ, REP or other = LAP).
    pub message_mraed: MsgKind,
    /// Off 9, mask 0xF8: Service Timeout (time until the real answer).
    pub service_timeout: TimeoutExp,
    /// Off 10, 222 bytes: private data.
    pub private_data: PrivateData<222>,
}

impl Mra {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 222;

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let local_comm_id = r.u32();
        let remote_comm_id = r.u32();
        let b8 = r.u8();
        let b9 = r.u8();
        let private_data = PrivateData(r.array::<222>());
        Mra {
            local_comm_id: CommId(local_comm_id),
            remote_comm_id: CommId(remote_comm_id),
            message_mraed: MsgKind::from_raw_lut(b8 >> 6),
            service_timeout: TimeoutExp::masked(b9 >> 3),
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        buf.put_u32(self.local_comm_id.0);
        buf.put_u32(self.remote_comm_id.0);
        buf.put_u8((self.message_mraed.raw() & 0x03) << 6);
        buf.put_u8(self.service_timeout.get() << 3);
        buf.put_slice(self.private_data.as_bytes());
    }
}
