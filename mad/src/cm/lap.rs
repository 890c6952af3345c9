//! LAP, Load Alternate Path (0x0019): IBTA Table 115; docs/wire.md §2.6.

use bytes::BufMut;

use super::path::PathInfo;
use super::wire::{put_u24, Rd};
use super::MAD_DATA_LEN;
use crate::types::{CommId, PrivateData, Qpn, TimeoutExp};

/// Load Alternate Path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lap {
    /// Off 0, 32 bits: Local Communication ID.
    pub local_comm_id: CommId,
    /// Off 4, 32 bits: Remote Communication ID.
    pub remote_comm_id: CommId,
    /// Off 12, 24 bits: Remote QPN/EECN.
    pub remote_qpn_eecn: Qpn,
    /// Off 15, mask 0xF8: Remote CM Response Timeout.
    pub remote_cm_response_timeout: TimeoutExp,
    /// Off 20..64: the alternate path to load (LAP layout: flow label + traffic class in one
    /// word, then hop limit, packet rate, SL/subnet local, ACK timeout).
    pub alternate_path: PathInfo,
    /// Off 64, 168 bytes: private data.
    pub private_data: PrivateData<168>,
}

impl Lap {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 168;

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let local_comm_id = r.u32();
        let remote_comm_id = r.u32();
        r.skip(4);
        let remote_qpn_eecn = r.u24();
        let b15 = r.u8();
        r.skip(4);
        let alternate_path = PathInfo::read_lap(&mut r);
        let private_data = PrivateData(r.array::<168>());
        Lap {
            local_comm_id: CommId(local_comm_id),
            remote_comm_id: CommId(remote_comm_id),
            remote_qpn_eecn: Qpn::masked(remote_qpn_eecn),
            remote_cm_response_timeout: TimeoutExp::masked(b15 >> 3),
            alternate_path,
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        buf.put_u32(self.local_comm_id.0);
        buf.put_u32(self.remote_comm_id.0);
        buf.put_u32(0);
        put_u24(buf, self.remote_qpn_eecn.get());
        buf.put_u8(self.remote_cm_response_timeout.get() << 3);
        buf.put_u32(0);
        self.alternate_path.emit_lap(buf);
        buf.put_slice(self.private_data.as_bytes());
    }
}
