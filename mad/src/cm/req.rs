//! REQ, Connect Request (attribute 0x0010): IBTA Vol 1 Table 106; docs/wire.md §2.1, §3.1.

use bytes::BufMut;

use super::path::PathInfo;
use super::wire::{put_u24, Rd};
use super::MAD_DATA_LEN;
use crate::codes::{ExtTransportType, Mtu, TransportType};
use crate::types::{
    CommId, Eecn, Guid, Pkey, PrivateData, Psn, Qkey, Qpn, ServiceId, TimeoutExp, VendorId, U3, U4,
};

/// Connect Request. 232 bytes; private data at Off 140, 92 bytes.
///
/// Field docs give the offset in the CM payload (MAD offset − 24), the width and mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Req {
    /// Off 0, 32 bits: Local Communication ID.
    pub local_comm_id: CommId,
    /// Off 5, 24 bits: ECE vendor ID (IBTA reserved; Linux ≥ 5.8).
    pub ece_vendor_id: VendorId,
    /// Off 8, 64 bits: Service ID.
    pub service_id: ServiceId,
    /// Off 16, 64 bits: Local CA GUID.
    pub local_ca_guid: Guid,
    /// Off 28, 32 bits: Local Q_Key (Linux leaves it 0 for RC/UC/XRC).
    pub local_qkey: Qkey,
    /// Off 32, 24 bits: Local QPN (for XRC: the INI QPN).
    pub local_qpn: Qpn,
    /// Off 35, 8 bits: Responder Resources.
    pub responder_resources: u8,
    /// Off 36, 24 bits: Local EECN.
    pub local_eecn: Eecn,
    /// Off 39, 8 bits: Initiator Depth.
    pub initiator_depth: u8,
    /// Off 40, 24 bits: Remote EECN.
    pub remote_eecn: Eecn,
    /// Off 43, mask 0xF8: Remote CM Response Timeout.
    pub remote_cm_response_timeout: TimeoutExp,
    /// Off 43, mask 0x06: Transport Service Type.
    pub transport_service_type: TransportType,
    /// Off 43, mask 0x01: End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// Off 44, 24 bits: Starting PSN (the sender's receive PSN).
    pub starting_psn: Psn,
    /// Off 47, mask 0xF8: Local CM Response Timeout.
    pub local_cm_response_timeout: TimeoutExp,
    /// Off 47, mask 0x07: Retry Count.
    pub retry_count: U3,
    /// Off 48, 16 bits: Partition Key.
    pub partition_key: Pkey,
    /// Off 50, mask 0xF0: Path Packet Payload MTU.
    pub path_mtu: Mtu,
    /// Off 50, mask 0x08: RDC Exists.
    pub rdc_exists: bool,
    /// Off 50, mask 0x07: RNR Retry Count.
    pub rnr_retry_count: U3,
    /// Off 51, mask 0xF0: Max CM Retries.
    pub max_cm_retries: U4,
    /// Off 51, mask 0x08: SRQ.
    pub srq: bool,
    /// Off 51, mask 0x07: Extended Transport Type.
    pub extended_transport_type: ExtTransportType,
    /// Off 52..96: primary path.
    pub primary_path: PathInfo,
    /// Off 96..140: alternate path (all zero when there is none).
    pub alternate_path: PathInfo,
    /// Off 139, mask 0x04: SAP Supported.
    pub sap_supported: bool,
    /// Off 140, 92 bytes: private data.
    pub private_data: PrivateData<92>,
}

/// The connection type a REQ asks for, as the Linux receiver decodes it
/// (`cm_req_get_qp_type`, docs/wire.md §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReqTransport {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// XRC: Transport Service Type 3 with Extended Transport Type 1.
    Xrc,
    /// Anything else (RD, or type 3 with another extended type).
    Other,
}

impl Req {
    /// Size of the private data area.
    pub const PRIVATE_DATA_LEN: usize = 92;

    /// The connection type this REQ asks for.
    pub fn transport(&self) -> ReqTransport {
        match (self.transport_service_type, self.extended_transport_type) {
            (TransportType::Rc, _) => ReqTransport::Rc,
            (TransportType::Uc, _) => ReqTransport::Uc,
            (TransportType::Extended, ExtTransportType::Xrc) => ReqTransport::Xrc,
            _ => ReqTransport::Other,
        }
    }

    /// Whether this is an XRC REQ (Transport Service Type 3 + Extended Transport Type 1).
    pub fn is_xrc(&self) -> bool {
        self.transport() == ReqTransport::Xrc
    }

    /// Sets the transport fields for `t` the way Linux's `cm_req_set_qp_type` does. For
    /// [`ReqTransport::Xrc`] it also clears the fields Linux leaves 0 for an XRC INI (Responder
    /// Resources, Retry Count, RNR Retry Count, SRQ).
    pub fn set_transport(&mut self, t: ReqTransport) {
        let (tst, ext) = match t {
            ReqTransport::Rc | ReqTransport::Other => (TransportType::Rc, ExtTransportType::None),
            ReqTransport::Uc => (TransportType::Uc, ExtTransportType::None),
            ReqTransport::Xrc => (TransportType::Extended, ExtTransportType::Xrc),
        };
        self.transport_service_type = tst;
        self.extended_transport_type = ext;
        if t == ReqTransport::Xrc {
            self.responder_resources = 0;
            self.retry_count = U3::default();
            self.rnr_retry_count = U3::default();
            self.srq = false;
        }
    }

    #[inline(always)]
    pub(crate) fn parse_body(data: &[u8; MAD_DATA_LEN]) -> Self {
        let mut r = Rd::new(data);
        let local_comm_id = r.u32();
        r.skip(1);
        let ece_vendor_id = r.u24();
        let service_id = r.u64();
        let local_ca_guid = r.u64();
        r.skip(4);
        let local_qkey = r.u32();
        let local_qpn = r.u24();
        let responder_resources = r.u8();
        let local_eecn = r.u24();
        let initiator_depth = r.u8();
        let remote_eecn = r.u24();
        let b43 = r.u8();
        let starting_psn = r.u24();
        let b47 = r.u8();
        let partition_key = r.u16();
        let b50 = r.u8();
        let b51 = r.u8();
        let (primary_path, _reserved) = PathInfo::read_req(&mut r);
        let (alternate_path, alt_low) = PathInfo::read_req(&mut r);
        let private_data = PrivateData(r.array::<92>());
        Req {
            local_comm_id: CommId(local_comm_id),
            ece_vendor_id: VendorId::masked(ece_vendor_id),
            service_id: ServiceId(service_id),
            local_ca_guid: Guid(local_ca_guid),
            local_qkey: Qkey(local_qkey),
            local_qpn: Qpn::masked(local_qpn),
            responder_resources,
            local_eecn: Eecn::masked(local_eecn),
            initiator_depth,
            remote_eecn: Eecn::masked(remote_eecn),
            remote_cm_response_timeout: TimeoutExp::masked(b43 >> 3),
            transport_service_type: TransportType::from_raw_lut((b43 >> 1) & 0x03),
            end_to_end_flow_control: b43 & 0x01 != 0,
            starting_psn: Psn::masked(starting_psn),
            local_cm_response_timeout: TimeoutExp::masked(b47 >> 3),
            retry_count: U3::masked(b47),
            partition_key: Pkey(partition_key),
            path_mtu: Mtu::from_raw_lut(b50 >> 4),
            rdc_exists: b50 & 0x08 != 0,
            rnr_retry_count: U3::masked(b50),
            max_cm_retries: U4::masked(b51 >> 4),
            srq: b51 & 0x08 != 0,
            extended_transport_type: ExtTransportType::from_raw_lut(b51 & 0x07),
            primary_path,
            alternate_path,
            sap_supported: alt_low & 0x04 != 0,
            private_data,
        }
    }

    pub(crate) fn emit_body<B: BufMut>(&self, buf: &mut B) {
        buf.put_u32(self.local_comm_id.0);
        buf.put_u8(0);
        put_u24(buf, self.ece_vendor_id.get());
        buf.put_u64(self.service_id.0);
        buf.put_u64(self.local_ca_guid.0);
        buf.put_u32(0);
        buf.put_u32(self.local_qkey.0);
        put_u24(buf, self.local_qpn.get());
        buf.put_u8(self.responder_resources);
        put_u24(buf, self.local_eecn.get());
        buf.put_u8(self.initiator_depth);
        put_u24(buf, self.remote_eecn.get());
        buf.put_u8(
            (self.remote_cm_response_timeout.get() << 3)
                | ((self.transport_service_type.raw() & 0x03) << 1)
                | u8::from(self.end_to_end_flow_control),
        );
        put_u24(buf, self.starting_psn.get());
        buf.put_u8((self.local_cm_response_timeout.get() << 3) | self.retry_count.get());
        buf.put_u16(self.partition_key.0);
        buf.put_u8(
            ((self.path_mtu.raw() & 0x0f) << 4)
                | (u8::from(self.rdc_exists) << 3)
                | self.rnr_retry_count.get(),
        );
        buf.put_u8(
            (self.max_cm_retries.get() << 4)
                | (u8::from(self.srq) << 3)
                | (self.extended_transport_type.raw() & 0x07),
        );
        self.primary_path.emit_req(buf, 0);
        self.alternate_path
            .emit_req(buf, u8::from(self.sap_supported) << 2);
        buf.put_slice(self.private_data.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::{CmMessage, Mad};
    use crate::codes::Rate;
    use crate::types::{FlowLabel, Gid, Lid, Tid};

    const NVME_REQ: &[u8; 256] = include_bytes!("../../../fixtures/mads/nvme_f5_req.bin");

    fn gid4(a: u8, b: u8, c: u8, d: u8) -> Gid {
        Gid::from_ip(core::net::IpAddr::V4(core::net::Ipv4Addr::new(a, b, c, d)))
    }

    fn expected() -> Req {
        let mut pd = [0u8; 92];
        pd[1] = 0x40;
        pd[2] = 0xc3;
        pd[3] = 0x2c;
        pd[16..20].copy_from_slice(&[2, 2, 2, 1]);
        pd[32..36].copy_from_slice(&[2, 2, 2, 3]);
        pd[40] = 0x20;
        pd[42] = 0x1f;
        Req {
            local_comm_id: CommId(0x3eb0_bde5),
            ece_vendor_id: VendorId::default(),
            service_id: ServiceId(0x0000_0000_0106_1144),
            local_ca_guid: Guid(0x248a_0703_002f_df02),
            local_qkey: Qkey(0),
            local_qpn: Qpn::masked(0xdc),
            responder_resources: 0x10,
            local_eecn: Eecn::default(),
            initiator_depth: 0,
            remote_eecn: Eecn::default(),
            remote_cm_response_timeout: TimeoutExp::masked(0x14),
            transport_service_type: TransportType::Rc,
            end_to_end_flow_control: true,
            starting_psn: Psn::masked(0x01_7c2d),
            local_cm_response_timeout: TimeoutExp::masked(0x14),
            retry_count: U3::masked(7),
            partition_key: Pkey(0xffff),
            path_mtu: Mtu::Mtu1024,
            rdc_exists: false,
            rnr_retry_count: U3::masked(7),
            max_cm_retries: U4::masked(15),
            srq: false,
            extended_transport_type: ExtTransportType::None,
            primary_path: PathInfo {
                local_lid: Lid(0xffff),
                remote_lid: Lid(0xffff),
                local_gid: gid4(2, 2, 2, 1),
                remote_gid: gid4(2, 2, 2, 3),
                flow_label: FlowLabel::default(),
                // MAD byte 115 = 0x03. tshark 4.0 shows 0x00 here: it reads the rate from the
                // wrong byte (docs/framing.md §3.7 bug 1).
                packet_rate: Rate::G10,
                traffic_class: 0,
                hop_limit: 0x40,
                sl: U4::default(),
                subnet_local: false,
                local_ack_timeout: TimeoutExp::masked(0x13),
            },
            alternate_path: PathInfo::default(),
            sap_supported: false,
            private_data: PrivateData(pd),
        }
    }

    #[test]
    fn deconstruct() {
        let mad = Mad::parse(NVME_REQ).unwrap();
        assert_eq!(mad.header.tid, Tid(0x0000_0002_e5bd_b03e));
        let CmMessage::Req(req) = mad.msg else {
            panic!("not a REQ: {mad:?}")
        };
        assert_eq!(req, expected());
        assert_eq!(req.transport(), ReqTransport::Rc);
        assert!(!req.alternate_path.is_present());
        assert!(req.primary_path.is_present());
    }

    #[test]
    fn construct() {
        let mad = Mad::new(Tid(0x0000_0002_e5bd_b03e), CmMessage::Req(expected()));
        let mut buf = [0xa5u8; 256];
        mad.emit_into(&mut buf).unwrap();
        assert_eq!(&buf, NVME_REQ);
    }

    #[test]
    fn xrc_fields() {
        let mut req = expected();
        req.set_transport(ReqTransport::Xrc);
        assert!(req.is_xrc());
        assert_eq!(req.responder_resources, 0);
        let bytes = Mad::new(Tid(1), CmMessage::Req(req)).to_bytes();
        // Off 43 (MAD 67): transport type 3 in mask 0x06; Off 51 (MAD 75): ext type 1.
        assert_eq!(bytes[67] & 0x06, 0x06);
        assert_eq!(bytes[75] & 0x07, 0x01);
        assert_eq!(bytes[75] & 0x08, 0, "SRQ left 0 for XRC INI");
        let back = Mad::parse(&bytes).unwrap();
        assert_eq!(back.msg, CmMessage::Req(req));
    }

    #[test]
    fn bit_fields_all_ones() {
        // Every non-reserved bit set survives; reserved bits come back as zero.
        let mut raw = [0xffu8; 256];
        raw[..24].copy_from_slice(&NVME_REQ[..24]);
        let mad = Mad::parse(&raw).unwrap();
        let CmMessage::Req(req) = mad.msg else {
            panic!()
        };
        assert_eq!(req.retry_count.get(), 7);
        assert_eq!(req.max_cm_retries.get(), 15);
        assert!(req.srq && req.rdc_exists && req.sap_supported);
        assert_eq!(req.primary_path.flow_label.get(), 0xf_ffff);
        assert_eq!(req.primary_path.packet_rate.raw(), 0x3f);
        let out = mad.to_bytes();
        // reserved: Off 4 (MAD 28), Off 24..28 (MAD 48..52), Off 88 bits 0x0FC0 (MAD 114/115),
        // Off 94/95 low bits, Off 138 low 3 bits, Off 139 mask 0x03.
        assert_eq!(out[28], 0);
        assert_eq!(&out[48..52], &[0, 0, 0, 0]);
        assert_eq!(out[114], 0xf0);
        assert_eq!(out[115], 0x3f);
        assert_eq!(out[118], 0xf8);
        assert_eq!(out[119], 0xf8);
        assert_eq!(out[162], 0xf8);
        assert_eq!(out[163], 0xfc);
    }
}
