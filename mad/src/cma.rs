//! rdma_cm conventions on top of the IB CM (docs/wire.md §5): port spaces and Service IDs,
//! and the 36-byte CMA IP header at the start of REQ / SIDR_REQ private data.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{EmitError, ParseError};
use crate::types::ServiceId;

macro_rules! port_spaces {
    ($($(#[$m:meta])* $v:ident = $val:expr => $name:literal,)*) => {
        /// rdma_cm port space (`enum rdma_ucm_port_space`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum PortSpace {
            $($(#[$m])* $v,)*
            /// Another value.
            Unknown(u16),
        }

        impl PortSpace {
            /// Raw value.
            pub const fn raw(self) -> u16 {
                match self { $(PortSpace::$v => $val,)* PortSpace::Unknown(v) => v }
            }
            /// From the raw value.
            pub const fn from_raw(v: u16) -> Self {
                match v { $($val => PortSpace::$v,)* other => PortSpace::Unknown(other) }
            }
            /// Name as rdma_cm spells it.
            pub const fn name(self) -> &'static str {
                match self { $(PortSpace::$v => $name,)* PortSpace::Unknown(_) => "unknown" }
            }
        }
    };
}

port_spaces! {
    /// RDMA_PS_IPOIB (UD).
    Ipoib = 0x0002 => "IPOIB",
    /// RDMA_PS_TCP (RC).
    Tcp = 0x0106 => "TCP",
    /// RDMA_PS_UDP (UD, SIDR).
    Udp = 0x0111 => "UDP",
    /// RDMA_PS_IB (any QP type; needed for XRC).
    Ib = 0x013f => "IB",
}

/// `IB_CMA_SERVICE_ID`: the prefix of every IP-based rdma_cm Service ID.
pub const CMA_SERVICE_ID_PREFIX: u64 = 0x0000_0000_0100_0000;
/// `IB_CMA_SERVICE_ID_MASK`.
pub const CMA_SERVICE_ID_MASK: u64 = 0xffff_ffff_ff00_0000;

impl ServiceId {
    /// The Service ID rdma_cm uses for `port` in `ps` (`rdma_get_service_id`: `ps << 16 + port`).
    ///
    /// ```
    /// use ibcm_mad::{ServiceId, cma::PortSpace};
    /// assert_eq!(ServiceId::rdma_cm(PortSpace::Tcp, 7174), ServiceId(0x0000_0000_0106_1c06));
    /// assert_eq!(ServiceId(0x0106_1c06).rdma_cm_port(), Some((PortSpace::Tcp, 7174)));
    /// ```
    pub const fn rdma_cm(ps: PortSpace, port: u16) -> ServiceId {
        ServiceId(((ps.raw() as u64) << 16) + port as u64)
    }

    /// For an IP-based rdma_cm Service ID (`sid & 0xFFFFFFFFFF000000 == 0x01000000`), the port
    /// space and port; `None` for any other Service ID.
    pub const fn rdma_cm_port(self) -> Option<(PortSpace, u16)> {
        if self.0 & CMA_SERVICE_ID_MASK != CMA_SERVICE_ID_PREFIX {
            return None;
        }
        Some((
            PortSpace::from_raw(((self.0 >> 16) & 0xffff) as u16),
            (self.0 & 0xffff) as u16,
        ))
    }
}

/// The CMA private-data header (`struct cma_hdr`, 36 bytes) that rdma_cm prepends to the
/// private data of REQ and SIDR_REQ for IP (AF_INET/AF_INET6) connections.
///
/// | Off | Size | Field |
/// |---:|---:|---|
/// | 0 | 1 | cma_version (0) |
/// | 1 | 1 | IP version in the high nibble (4 or 6) |
/// | 2 | 2 | source port (the active side's) |
/// | 4 | 16 | source address (IPv4: 12 zero bytes + address — *not* `::ffff`-mapped) |
/// | 20 | 16 | destination address |
///
/// ```
/// use ibcm_mad::cma::CmaHeader;
/// let h = CmaHeader::new("10.0.0.2:49152".parse().unwrap(), "10.0.0.1".parse().unwrap());
/// let mut pd = [0u8; 92];
/// h.emit(&mut pd).unwrap();
/// assert_eq!(&pd[..4], &[0x00, 0x40, 0xc0, 0x00]);
/// assert_eq!(CmaHeader::parse(&pd).unwrap(), h);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// cma_version; rdma_cm accepts only 0.
    pub cma_version: u8,
    /// Source port (the active side's rdma_cm port).
    pub src_port: u16,
    /// Source address.
    pub src: IpAddr,
    /// Destination address (must match the listener's bound address).
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Size on the wire.
    pub const LEN: usize = 36;
    /// Bytes of user private data left after the header in a REQ (92 − 36).
    pub const REQ_USER_LEN: usize = 56;
    /// Bytes of user private data left after the header in a SIDR_REQ (216 − 36).
    pub const SIDR_REQ_USER_LEN: usize = 180;

    /// A version-0 header from the active side's socket address to the listener's address.
    /// Both addresses should be of the same family; an IPv4 destination with an IPv6 source
    /// (or the reverse) is emitted as IPv6 (IPv4 addresses mapped `::ffff:a.b.c.d`).
    pub fn new(src: core::net::SocketAddr, dst: IpAddr) -> Self {
        CmaHeader {
            cma_version: 0,
            src_port: src.port(),
            src: src.ip(),
            dst,
        }
    }

    /// IP version the header declares: 4 when both addresses are IPv4, else 6.
    pub fn ip_version(&self) -> u8 {
        match (self.src, self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            _ => 6,
        }
    }

    /// Parses the header at the start of `pd` (REQ or SIDR_REQ private data).
    ///
    /// # Errors
    /// [`ParseError::Truncated`] below 36 bytes; [`ParseError::InvalidField`] for an IP
    /// version other than 4 or 6 (offset 1). The cma_version is reported, not checked.
    pub fn parse(pd: &[u8]) -> Result<Self, ParseError> {
        let truncated = ParseError::Truncated {
            offset: 0,
            need: Self::LEN,
            have: pd.len(),
        };
        let (_, (cma_version, ipv, src_port, src, dst)) =
            cma_hdr(pd).map_err(|_: nom::Err<nom::error::Error<&[u8]>>| truncated)?;
        let (src, dst) = match ipv >> 4 {
            4 => (v4_tail(src), v4_tail(dst)),
            6 => (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
            ),
            other => {
                return Err(ParseError::InvalidField {
                    field: "cma_hdr ip_version",
                    value: u64::from(other),
                    offset: 1,
                })
            }
        };
        Ok(CmaHeader {
            cma_version,
            src_port,
            src,
            dst,
        })
    }

    /// Writes the 36 bytes at the start of `out`.
    ///
    /// # Errors
    /// [`EmitError::BufferTooSmall`] when `out` is shorter than 36 bytes.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), EmitError> {
        let have = out.len();
        let h = out
            .first_chunk_mut::<{ Self::LEN }>()
            .ok_or(EmitError::BufferTooSmall {
                need: Self::LEN,
                have,
            })?;
        let v = self.ip_version();
        let bytes = |ip: IpAddr| -> [u8; 16] {
            match (v, ip) {
                (4, IpAddr::V4(a)) => {
                    let mut b = [0u8; 16];
                    let [.., w, x, y, z] = &mut b;
                    [*w, *x, *y, *z] = a.octets();
                    b
                }
                (_, IpAddr::V4(a)) => a.to_ipv6_mapped().octets(),
                (_, IpAddr::V6(a)) => a.octets(),
            }
        };
        let [p0, p1] = self.src_port.to_be_bytes();
        let mut tmp = [0u8; Self::LEN];
        let (head, rest) = tmp.split_at_mut(4);
        head.copy_from_slice(&[self.cma_version, v << 4, p0, p1]);
        let (s, d) = rest.split_at_mut(16);
        s.copy_from_slice(&bytes(self.src));
        d.copy_from_slice(&bytes(self.dst));
        *h = tmp;
        Ok(())
    }

    /// The user's part of REQ private data (after the header).
    pub fn user_data(pd: &[u8]) -> &[u8] {
        pd.get(Self::LEN..).unwrap_or(&[])
    }
}

/// cma_version, IP version byte, source port, source and destination address.
type CmaFields = (u8, u8, u16, [u8; 16], [u8; 16]);

/// The five fields of `struct cma_hdr` in wire order: cma_version, IP version byte, source
/// port, source and destination address (16 bytes each). A nom parser: the header is the
/// variable-meaning front of the private data, not the measured MAD parse path.
fn cma_hdr(i: &[u8]) -> nom::IResult<&[u8], CmaFields> {
    use nom::number::complete::{be_u16, be_u8};
    use nom::Parser as _;
    (be_u8, be_u8, be_u16, addr16, addr16).parse(i)
}

/// 16 address bytes.
fn addr16(i: &[u8]) -> nom::IResult<&[u8], [u8; 16]> {
    use nom::Parser as _;
    nom::combinator::map_res(nom::bytes::complete::take(16usize), <[u8; 16]>::try_from).parse(i)
}

/// An IPv4 address in the last four of 16 bytes (rdma_cm's layout: zeros, not `::ffff`).
fn v4_tail(b: [u8; 16]) -> IpAddr {
    let [.., a, b2, c, d] = b;
    IpAddr::V4(Ipv4Addr::new(a, b2, c, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids() {
        assert_eq!(
            ServiceId::rdma_cm(PortSpace::Tcp, 7471),
            ServiceId(0x0000_0000_0106_1d2f)
        );
        assert_eq!(
            ServiceId::rdma_cm(PortSpace::Ib, 0x1d31),
            ServiceId(0x0000_0000_013f_1d31)
        );
        assert_eq!(
            ServiceId(0x0000_0000_0106_1144).rdma_cm_port(),
            Some((PortSpace::Tcp, 0x1144))
        );
        assert_eq!(ServiceId(0x1000_0000_0000_0404).rdma_cm_port(), None);
        assert_eq!(
            ServiceId(0x0000_0000_0177_0001).rdma_cm_port(),
            Some((PortSpace::Unknown(0x0177), 1))
        );
    }

    #[test]
    fn nvme_req_header() {
        let mad: &[u8; 256] = include_bytes!("../../fixtures/mads/nvme_f5_req.bin");
        let h = CmaHeader::parse(&mad[164..]).unwrap();
        assert_eq!(h.cma_version, 0);
        assert_eq!(h.src_port, 0xc32c);
        assert_eq!(h.src, "2.2.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(h.dst, "2.2.2.3".parse::<IpAddr>().unwrap());
        let mut out = [0u8; 36];
        h.emit(&mut out).unwrap();
        assert_eq!(&out[..], &mad[164..200]);
    }

    #[test]
    fn ipv6_and_errors() {
        let h = CmaHeader::new(
            "[fe80::2]:5000".parse().unwrap(),
            "fe80::1".parse().unwrap(),
        );
        let mut out = [0xa5u8; 40];
        h.emit(&mut out).unwrap();
        assert_eq!(out[1], 0x60);
        assert_eq!(out[36], 0xa5);
        assert_eq!(CmaHeader::parse(&out).unwrap(), h);
        for n in 0..36 {
            assert!(CmaHeader::parse(&out[..n]).is_err());
        }
        out[1] = 0x50;
        assert!(matches!(
            CmaHeader::parse(&out),
            Err(ParseError::InvalidField { offset: 1, .. })
        ));
        assert!(h.emit(&mut [0u8; 35]).is_err());
        // Mixed families are written as IPv6.
        let m = CmaHeader::new("10.0.0.1:1".parse().unwrap(), "fe80::1".parse().unwrap());
        let mut o = [0u8; 36];
        m.emit(&mut o).unwrap();
        assert_eq!(o[1], 0x60);
    }
}
