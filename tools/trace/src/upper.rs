//! Upper layers recognised in CM private data and Service IDs, and what a librdmacm
//! application sees of a connection's end.
//!
//! * **NVMe-oF (RDMA transport binding)**: rdma_cm TCP port 4420 (I/O and discovery
//!   controllers) or 8009 (discovery). REQ user data (after the 36-byte rdma_cm header):
//!   `RECFMT`, `QID`, `HRQSIZE`, `HSQSIZE`, `CNTLID` (little-endian 16-bit each); REP:
//!   `RECFMT`, `CRQSIZE`; a consumer-defined REJ (reason 28): `RECFMT`, `STS` (the
//!   `nvme_rdma_cm_status` codes of the kernel's `include/linux/nvme-rdma.h`).
//! * **iSER**: rdma_cm TCP port 3260; the REQ user data's first byte is the iSER CM header's
//!   flags (`0x80` zero-based virtual addresses not supported, `0x40` send with invalidate not
//!   supported: `drivers/infiniband/ulp/iser/iscsi_iser.h`).
//! * **IPoIB connected mode**: Service ID `0x1000000000000000 | QPN` (the kernel's
//!   `IPOIB_CM_IETF_ID`, `drivers/infiniband/ulp/ipoib/ipoib_cm.c`); REQ and REP private data
//!   `qpn`, `mtu` (big-endian 32-bit).
//! * **SRP**: a REQ whose private data is an SRP_LOGIN_REQ (opcode 0x00, its reserved bytes
//!   zero, a plausible initiator-to-target IU length, the rest of the 92 bytes zero); a REP
//!   with an SRP_LOGIN_RSP (opcode 0xc0) and a REJ with an SRP_LOGIN_REJ (opcode 0xc2, its
//!   reason) on a connection whose REQ was a login.
//!
//! # rdma_cm events (kernel `drivers/infiniband/core/cma.c`, `cma_ib_handler`)
//! A received REJ becomes `RDMA_CM_EVENT_REJECTED` with `status` = the REJ reason, whatever the
//! reason (28 consumer defined with the private data, 8 invalid Service ID when nothing
//! listens, …); a REQ or REP retried until the CM gives up (`IB_CM_REQ_ERROR` /
//! `IB_CM_REP_ERROR`) becomes `RDMA_CM_EVENT_UNREACHABLE` with status `-ETIMEDOUT` (-110); a
//! REP the active side cannot use (its QP transition fails) gives
//! `RDMA_CM_EVENT_CONNECT_ERROR`; an RTU `RDMA_CM_EVENT_ESTABLISHED`; a DREQ or DREP received,
//! and a DREQ that timed out (status -110), `RDMA_CM_EVENT_DISCONNECTED`.

use ibcm_mad::cma::PortSpace;
use ibcm_mad::{CmMessage, ServiceId, Side};

use crate::conn::{Conn, ConnKind, Outcome, Phase};

/// What a librdmacm application gets when a connection fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RdmaCmEvent {
    /// Whose application.
    pub(crate) side: Side,
    /// `RDMA_CM_EVENT_…`.
    pub(crate) event: &'static str,
    /// The event's `status`.
    pub(crate) status: i32,
}

/// `-ETIMEDOUT`.
const ETIMEDOUT: i32 = -110;

fn other(s: Side) -> Side {
    match s {
        Side::Active => Side::Passive,
        Side::Passive => Side::Active,
    }
}

/// The rdma_cm event of a failed connection of an rdma_cm Service ID (module docs), `None`
/// for other Service IDs and for connections that did not fail.
pub(crate) fn rdma_cm_event(c: &Conn) -> Option<RdmaCmEvent> {
    c.service_id?.rdma_cm_port()?;
    let ev = |side, event, status| {
        Some(RdmaCmEvent {
            side,
            event,
            status,
        })
    };
    match c.outcome {
        Outcome::Rejected { reason, by } => {
            ev(other(by), "RDMA_CM_EVENT_REJECTED", i32::from(reason.raw()))
        }
        Outcome::TimedOut { phase, .. } => match phase {
            Phase::Req | Phase::SidrReq => ev(Side::Active, "RDMA_CM_EVENT_UNREACHABLE", ETIMEDOUT),
            Phase::Rep => ev(Side::Passive, "RDMA_CM_EVENT_UNREACHABLE", ETIMEDOUT),
            Phase::Dreq => ev(
                c.dreq.map_or(Side::Active, |d| d.1),
                "RDMA_CM_EVENT_DISCONNECTED",
                ETIMEDOUT,
            ),
        },
        Outcome::Resolved { status } if status.raw() != 0 && c.kind == ConnKind::Sidr => ev(
            Side::Active,
            "RDMA_CM_EVENT_UNREACHABLE",
            i32::from(status.raw()),
        ),
        _ => None,
    }
}

/// The kernel's `IPOIB_CM_IETF_ID`.
const IPOIB_CM_IETF_ID: u64 = 0x1000_0000_0000_0000;

/// The upper layer a Service ID names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ulp {
    /// NVMe over Fabrics, RDMA transport.
    NvmeOf,
    /// iSCSI Extensions for RDMA.
    Iser,
    /// IPoIB connected mode, for the QPN in the Service ID.
    IpoibCm(u32),
}

impl Ulp {
    /// The upper layer of a Service ID.
    pub(crate) fn of(sid: ServiceId) -> Option<Ulp> {
        if sid.0 >> 24 == IPOIB_CM_IETF_ID >> 24 {
            return Some(Ulp::IpoibCm((sid.0 & 0xff_ffff) as u32));
        }
        match sid.rdma_cm_port()? {
            (PortSpace::Tcp, 4420 | 8009) => Some(Ulp::NvmeOf),
            (PortSpace::Tcp, 3260) => Some(Ulp::Iser),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Ulp::NvmeOf => "NVMe-oF",
            Ulp::Iser => "iSER",
            Ulp::IpoibCm(_) => "IPoIB-CM",
        }
    }
}

/// NVMe-oF RDMA CM request private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NvmeReq {
    pub(crate) recfmt: u16,
    pub(crate) qid: u16,
    pub(crate) hrqsize: u16,
    pub(crate) hsqsize: u16,
    pub(crate) cntlid: u16,
}

/// NVMe-oF RDMA CM accept (REP) private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NvmeRep {
    pub(crate) recfmt: u16,
    pub(crate) crqsize: u16,
}

/// NVMe-oF RDMA CM reject private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NvmeRej {
    pub(crate) recfmt: u16,
    pub(crate) status: u16,
}

/// An upper-layer header decoded from a message's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upper {
    NvmeReq(NvmeReq),
    NvmeRep(NvmeRep),
    NvmeRej(NvmeRej),
    /// iSER CM header flags.
    Iser(u8),
    /// IPoIB-CM private data: QPN and MTU.
    Ipoib {
        qpn: u32,
        mtu: u32,
    },
    /// SRP_LOGIN_REQ: initiator-to-target IU length, buffer formats, flags.
    SrpLoginReq {
        it_iu_len: u32,
        buf_fmt: u16,
        flags: u8,
    },
    /// SRP_LOGIN_RSP: request limit delta, largest IU lengths.
    SrpLoginRsp {
        req_lim_delta: u32,
        max_it_iu_len: u32,
        max_ti_iu_len: u32,
    },
    /// SRP_LOGIN_REJ: reason.
    SrpLoginRej {
        reason: u32,
    },
}

fn le16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn zero(b: &[u8], from: usize, to: usize) -> bool {
    b.get(from..to).is_some_and(|s| s.iter().all(|&x| x == 0))
}

/// An SRP_LOGIN_REQ in a REQ's private data.
fn srp_login_req(pd: &[u8]) -> Option<Upper> {
    let it_iu_len = be32(pd, 16)?;
    let buf_fmt = be16(pd, 24)?;
    let ok = pd.first() == Some(&0)
        && zero(pd, 1, 8)
        && zero(pd, 20, 24)
        && zero(pd, 27, 32)
        && zero(pd, 64, pd.len())
        && (64..=1 << 20).contains(&it_iu_len)
        && buf_fmt & !0x0006 == 0;
    ok.then(|| Upper::SrpLoginReq {
        it_iu_len,
        buf_fmt,
        flags: pd.get(26).copied().unwrap_or(0),
    })
}

/// The upper-layer header of `msg`, with its connection's Service ID `sid` (a REQ's own);
/// `have`: MAD bytes captured (private data needs the whole MAD, but for the REQ's first 56).
pub(crate) fn decode(msg: &CmMessage, sid: Option<ServiceId>, have: usize) -> Option<Upper> {
    let ulp = sid.and_then(Ulp::of);
    match (msg, ulp) {
        (CmMessage::Req(r), Some(Ulp::NvmeOf)) if have >= 210 => {
            let u = r.private_data.as_bytes().get(36..)?;
            Some(Upper::NvmeReq(NvmeReq {
                recfmt: le16(u, 0)?,
                qid: le16(u, 2)?,
                hrqsize: le16(u, 4)?,
                hsqsize: le16(u, 6)?,
                cntlid: le16(u, 8)?,
            }))
        }
        (CmMessage::Req(r), Some(Ulp::Iser)) if have >= 201 => {
            Some(Upper::Iser(*r.private_data.as_bytes().get(36)?))
        }
        (CmMessage::Req(r), Some(Ulp::IpoibCm(_))) if have >= 172 => {
            let pd = r.private_data.as_bytes();
            Some(Upper::Ipoib {
                qpn: be32(pd, 0)?,
                mtu: be32(pd, 4)?,
            })
        }
        (CmMessage::Req(r), None) if have >= 256 => srp_login_req(r.private_data.as_bytes()),
        (CmMessage::Rep(r), Some(Ulp::NvmeOf)) if have >= 64 => {
            let pd = r.private_data.as_bytes();
            Some(Upper::NvmeRep(NvmeRep {
                recfmt: le16(pd, 0)?,
                crqsize: le16(pd, 2)?,
            }))
        }
        (CmMessage::Rep(r), Some(Ulp::IpoibCm(_))) if have >= 68 => {
            let pd = r.private_data.as_bytes();
            Some(Upper::Ipoib {
                qpn: be32(pd, 0)?,
                mtu: be32(pd, 4)?,
            })
        }
        (CmMessage::Rep(r), None) if have >= 256 => {
            let pd = r.private_data.as_bytes();
            (pd.first() == Some(&0xc0) && zero(pd, 1, 4) && zero(pd, 52, pd.len())).then(|| {
                Upper::SrpLoginRsp {
                    req_lim_delta: be32(pd, 4).unwrap_or(0),
                    max_it_iu_len: be32(pd, 16).unwrap_or(0),
                    max_ti_iu_len: be32(pd, 20).unwrap_or(0),
                }
            })
        }
        (CmMessage::Rej(r), Some(Ulp::NvmeOf)) if have >= 112 && r.reason.raw() == 28 => {
            let pd = r.private_data.as_bytes();
            Some(Upper::NvmeRej(NvmeRej {
                recfmt: le16(pd, 0)?,
                status: le16(pd, 2)?,
            }))
        }
        (CmMessage::Rej(r), None) if have >= 256 && r.reason.raw() == 28 => {
            let pd = r.private_data.as_bytes();
            (pd.first() == Some(&0xc2) && zero(pd, 1, 4) && zero(pd, 32, pd.len())).then(|| {
                Upper::SrpLoginRej {
                    reason: be32(pd, 4).unwrap_or(0),
                }
            })
        }
        _ => None,
    }
}

/// The name of an NVMe-oF RDMA CM reject status.
pub(crate) fn nvme_status_name(s: u16) -> &'static str {
    match s {
        1 => "invalid length",
        2 => "invalid record format",
        3 => "invalid queue ID",
        4 => "invalid host SQ size",
        5 => "invalid host RQ size",
        6 => "no resources",
        7 => "invalid IRD",
        8 => "invalid ORD",
        9 => "invalid controller ID",
        _ => "unknown",
    }
}

impl Upper {
    /// The protocol's name.
    pub(crate) fn protocol(&self) -> &'static str {
        match self {
            Upper::NvmeReq(_) | Upper::NvmeRep(_) | Upper::NvmeRej(_) => "NVMe-oF",
            Upper::Iser(_) => "iSER",
            Upper::Ipoib { .. } => "IPoIB-CM",
            Upper::SrpLoginReq { .. } | Upper::SrpLoginRsp { .. } | Upper::SrpLoginRej { .. } => {
                "SRP"
            }
        }
    }

    /// One-line text: `NVMe-oF qid=0 hrqsize=32 hsqsize=31`.
    pub(crate) fn text(&self) -> String {
        match *self {
            Upper::NvmeReq(r) => format!(
                "NVMe-oF qid={} hrqsize={} hsqsize={}{}",
                r.qid,
                r.hrqsize,
                r.hsqsize,
                if r.cntlid != 0 {
                    format!(" cntlid={}", r.cntlid)
                } else {
                    String::new()
                }
            ),
            Upper::NvmeRep(r) => format!("NVMe-oF crqsize={}", r.crqsize),
            Upper::NvmeRej(r) => format!(
                "NVMe-oF status={} ({})",
                r.status,
                nvme_status_name(r.status)
            ),
            Upper::Iser(f) => format!("iSER flags={f:#04x}"),
            Upper::Ipoib { qpn, mtu } => format!("IPoIB-CM qpn={qpn:#08x} mtu={mtu}"),
            Upper::SrpLoginReq { it_iu_len, .. } => {
                format!("SRP_LOGIN_REQ it_iu_len={it_iu_len}")
            }
            Upper::SrpLoginRsp {
                req_lim_delta,
                max_ti_iu_len,
                ..
            } => {
                format!("SRP_LOGIN_RSP req_lim_delta={req_lim_delta} max_ti_iu_len={max_ti_iu_len}")
            }
            Upper::SrpLoginRej { reason } => format!("SRP_LOGIN_REJ reason={reason:#010x}"),
        }
    }

    /// Appends the JSON object (`{"protocol":…, …}`).
    pub(crate) fn json(&self, out: &mut Vec<u8>) {
        use crate::put::put_u64;
        let num = |out: &mut Vec<u8>, key: &str, v: u64| {
            out.extend_from_slice(b",\"");
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"\":");
            put_u64(out, v);
        };
        let name = |out: &mut Vec<u8>, key: &str, v: &str| {
            out.extend_from_slice(b",\"");
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"\":\"");
            out.extend_from_slice(v.as_bytes());
            out.push(b'"');
        };
        out.extend_from_slice(b"{\"protocol\":\"");
        out.extend_from_slice(self.protocol().as_bytes());
        out.push(b'"');
        match *self {
            Upper::NvmeReq(r) => {
                num(out, "recfmt", u64::from(r.recfmt));
                num(out, "qid", u64::from(r.qid));
                num(out, "hrqsize", u64::from(r.hrqsize));
                num(out, "hsqsize", u64::from(r.hsqsize));
                num(out, "cntlid", u64::from(r.cntlid));
            }
            Upper::NvmeRep(r) => {
                num(out, "recfmt", u64::from(r.recfmt));
                num(out, "crqsize", u64::from(r.crqsize));
            }
            Upper::NvmeRej(r) => {
                num(out, "recfmt", u64::from(r.recfmt));
                num(out, "status", u64::from(r.status));
                name(out, "status_name", nvme_status_name(r.status));
            }
            Upper::Iser(f) => num(out, "flags", u64::from(f)),
            Upper::Ipoib { qpn, mtu } => {
                num(out, "qpn", u64::from(qpn));
                num(out, "mtu", u64::from(mtu));
            }
            Upper::SrpLoginReq {
                it_iu_len,
                buf_fmt,
                flags,
            } => {
                name(out, "msg", "SRP_LOGIN_REQ");
                num(out, "it_iu_len", u64::from(it_iu_len));
                num(out, "buf_fmt", u64::from(buf_fmt));
                num(out, "flags", u64::from(flags));
            }
            Upper::SrpLoginRsp {
                req_lim_delta,
                max_it_iu_len,
                max_ti_iu_len,
            } => {
                name(out, "msg", "SRP_LOGIN_RSP");
                num(out, "req_lim_delta", u64::from(req_lim_delta));
                num(out, "max_it_iu_len", u64::from(max_it_iu_len));
                num(out, "max_ti_iu_len", u64::from(max_ti_iu_len));
            }
            Upper::SrpLoginRej { reason } => {
                name(out, "msg", "SRP_LOGIN_REJ");
                num(out, "reason", u64::from(reason));
            }
        }
        out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibcm_mad::{PrivateData, Rej, RejReason, Req};

    #[test]
    fn service_ids_name_their_protocol() {
        assert_eq!(Ulp::of(ServiceId(0x0000_0000_0106_1144)), Some(Ulp::NvmeOf));
        assert_eq!(Ulp::of(ServiceId(0x0000_0000_0106_0cbc)), Some(Ulp::Iser));
        assert_eq!(
            Ulp::of(ServiceId(0x1000_0000_0000_0404)),
            Some(Ulp::IpoibCm(0x404))
        );
        assert_eq!(Ulp::of(ServiceId(0x0000_0000_0106_1b5b)), None);
    }

    #[test]
    fn nvme_reject_status() {
        let rej = Rej {
            reason: RejReason::from_raw(28),
            private_data: PrivateData::from_slice(&[0, 0, 6, 0]).unwrap(),
            ..Rej::default()
        };
        let u = decode(
            &CmMessage::Rej(rej),
            Some(ServiceId(0x0000_0000_0106_1144)),
            256,
        );
        assert_eq!(
            u,
            Some(Upper::NvmeRej(NvmeRej {
                recfmt: 0,
                status: 6
            }))
        );
        assert_eq!(u.unwrap().text(), "NVMe-oF status=6 (no resources)");
    }

    #[test]
    fn srp_login_is_recognised_and_other_data_is_not() {
        let mut pd = [0u8; 64];
        pd[16..20].copy_from_slice(&2116u32.to_be_bytes());
        pd[24..26].copy_from_slice(&6u16.to_be_bytes());
        let req = Req {
            private_data: PrivateData::from_slice(&pd).unwrap(),
            ..Req::default()
        };
        let u = decode(
            &CmMessage::Req(req),
            Some(ServiceId(0x0002_c903_0000_1234)),
            256,
        );
        assert!(
            matches!(
                u,
                Some(Upper::SrpLoginReq {
                    it_iu_len: 2116,
                    ..
                })
            ),
            "{u:?}"
        );
        let mut other = req;
        other.private_data = PrivateData::from_slice(b"hello").unwrap();
        assert_eq!(decode(&CmMessage::Req(other), None, 256), None);
    }
}
