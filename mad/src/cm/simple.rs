//! RTU (0x0014), DREQ (0x0015) and DREP (0x0016): IBTA Tables 111–113; docs/wire.md §2.5.

use bytes::BufMut;

use super::wire::{put_u24, Rd};
use super::MAD_DATA_LEN;
use crate::types::{CommId, PrivateData, Qpn};

/// Ready To Use: the active side's last handshake message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rtu {
    /// Off 0, 32 bits: Local Communication ID.
    pub local_comm_id: CommId,
    /// Off 4, 32 bits: Remote Communication ID.
    pub remote_comm_id: CommId,
    /// Off 8, 224 bytes: private data.
    pub private_data: PrivateData<224>,
}

/// Disconnect Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Dreq {
    /// Off 0, 32 bits: Local Communication ID.
    pub local_comm_id: CommId,
    /// Off 4, 32 bits: Remote Communication ID.
    pub remote_comm_id: CommId,
    /// Off 8, 24 bits: Remote QPN/EECN (for XRC from the INI: the TGT QPN). A receiver
    /// ignores a DREQ whose value is not its local QPN.
    pub remote_qpn_eecn: Qpn,
    /// Off 12, 220 bytes: private data.
    pub private_data: PrivateData<220>,
}

/// Disconnect Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Drep {
    /// Off 0, 32 bits: Local Communication ID.
    pub local_comm_id: CommId,
    /// Off 4, 32 bits: Remote Communication ID.
    pub remote_comm_id: CommId,
    /// Off 8, 224 bytes: private data.
    pub private_data: PrivateData<224>,
}

impl Rtu {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 224;

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let local_comm_id = r.u32();
        let remote_comm_id = r.u32();
        let private_data = PrivateData(r.array::<224>());
        Rtu {
            local_comm_id: CommId(local_comm_id),
            remote_comm_id: CommId(remote_comm_id),
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        buf.put_u32(self.local_comm_id.0);
        buf.put_u32(self.remote_comm_id.0);
        buf.put_slice(self.private_data.as_bytes());
    }
}

impl Drep {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 224;

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let rtu = Rtu::parse_body(data);
        Drep {
            local_comm_id: rtu.local_comm_id,
            remote_comm_id: rtu.remote_comm_id,
            private_data: rtu.private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        buf.put_u32(self.local_comm_id.0);
        buf.put_u32(self.remote_comm_id.0);
        buf.put_slice(self.private_data.as_bytes());
    }
}

impl Dreq {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 220;

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let local_comm_id = r.u32();
        let remote_comm_id = r.u32();
        let remote_qpn_eecn = r.u24();
        r.skip(1);
        let private_data = PrivateData(r.array::<220>());
        Dreq {
            local_comm_id: CommId(local_comm_id),
            remote_comm_id: CommId(remote_comm_id),
            remote_qpn_eecn: Qpn::masked(remote_qpn_eecn),
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        buf.put_u32(self.local_comm_id.0);
        buf.put_u32(self.remote_comm_id.0);
        put_u24(buf, self.remote_qpn_eecn.get());
        buf.put_u8(0);
        buf.put_slice(self.private_data.as_bytes());
    }
}
