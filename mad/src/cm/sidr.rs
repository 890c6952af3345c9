//! SIDR_REQ (0x0017) and SIDR_REP (0x0018): IBTA Tables 119/120; docs/wire.md §2.8.

use bytes::BufMut;

use super::wire::{put_u24, Rd};
use super::MAD_DATA_LEN;
use crate::codes::SidrStatus;
use crate::types::{Pkey, PrivateData, Qkey, Qpn, RequestId, ServiceId, VendorId};

/// Service ID Resolution Request: "which UD QP serves this Service ID?".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SidrReq {
    /// Off 0, 32 bits: Request ID.
    pub request_id: RequestId,
    /// Off 4, 16 bits: Partition Key.
    pub partition_key: Pkey,
    /// Off 8, 64 bits: Service ID.
    pub service_id: ServiceId,
    /// Off 16, 216 bytes: private data.
    pub private_data: PrivateData<216>,
}

/// Service ID Resolution Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRep {
    /// Off 0, 32 bits: Request ID (echo of the SIDR_REQ's).
    pub request_id: RequestId,
    /// Off 4, 8 bits: Status.
    pub status: SidrStatus,
    /// Off 5, 8 bits: Additional Information Length.
    pub additional_info_length: u8,
    /// ECE vendor ID: Off 6 (16 bits, IBTA reserved) holds bits 23:8, Off 11 (8 bits) bits
    /// 7:0. Linux writes only 16 bits of it (docs/wire.md §2.8 quirk).
    pub ece_vendor_id: VendorId,
    /// Off 8, 24 bits: QPN of the serving UD QP.
    pub qpn: Qpn,
    /// Off 12, 64 bits: Service ID.
    pub service_id: ServiceId,
    /// Off 20, 32 bits: Q_Key of the serving QP.
    pub qkey: Qkey,
    /// Off 24, 72 bytes: Additional Information (a ClassPortInfo for status Redirect).
    pub additional_info: [u8; 72],
    /// Off 96, 136 bytes: private data.
    pub private_data: PrivateData<136>,
}

impl Default for SidrRep {
    fn default() -> Self {
        SidrRep {
            request_id: RequestId::default(),
            status: SidrStatus::Success,
            additional_info_length: 0,
            ece_vendor_id: VendorId::default(),
            qpn: Qpn::default(),
            service_id: ServiceId::default(),
            qkey: Qkey::default(),
            additional_info: [0; 72],
            private_data: PrivateData::zeroed(),
        }
    }
}

impl SidrReq {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 216;

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let request_id = r.u32();
        let partition_key = r.u16();
        r.skip(2);
        let service_id = r.u64();
        let private_data = PrivateData(r.array::<216>());
        SidrReq {
            request_id: RequestId(request_id),
            partition_key: Pkey(partition_key),
            service_id: ServiceId(service_id),
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        buf.put_u32(self.request_id.0);
        buf.put_u16(self.partition_key.0);
        buf.put_u16(0);
        buf.put_u64(self.service_id.0);
        buf.put_slice(self.private_data.as_bytes());
    }
}

impl SidrRep {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 136;

    /// The meaningful part of the additional information (at most 72 bytes).
    pub fn additional_info_bytes(&self) -> &[u8] {
        let n = usize::from(self.additional_info_length).min(72);
        self.additional_info.get(..n).unwrap_or(&[])
    }

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let request_id = r.u32();
        let status = r.u8();
        let additional_info_length = r.u8();
        let ece_hi = r.u16();
        let qpn = r.u24();
        let ece_lo = r.u8();
        let service_id = r.u64();
        let qkey = r.u32();
        let additional_info = r.array::<72>();
        let private_data = PrivateData(r.array::<136>());
        SidrRep {
            request_id: RequestId(request_id),
            status: SidrStatus::from_raw_lut(status),
            additional_info_length,
            ece_vendor_id: VendorId::masked((u32::from(ece_hi) << 8) | u32::from(ece_lo)),
            qpn: Qpn::masked(qpn),
            service_id: ServiceId(service_id),
            qkey: Qkey(qkey),
            additional_info,
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        let vid = self.ece_vendor_id.get();
        buf.put_u32(self.request_id.0);
        buf.put_u8(self.status.raw());
        buf.put_u8(self.additional_info_length);
        buf.put_u16((vid >> 8) as u16);
        put_u24(buf, self.qpn.get());
        buf.put_u8((vid & 0xff) as u8);
        buf.put_u64(self.service_id.0);
        buf.put_u32(self.qkey.0);
        buf.put_slice(&self.additional_info);
        buf.put_slice(self.private_data.as_bytes());
    }
}
