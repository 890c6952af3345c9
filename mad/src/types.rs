//! Identifier and small-integer newtypes used by every CM message.
//!
//! Every identifier or number with a unit is a newtype (no bare `u32` QPNs). Fields that are
//! narrower than a byte on the wire (3-bit retry counts, 5-bit timeout exponents, 24-bit QPNs)
//! have types that cannot hold an out-of-range value, so an emitter never has to truncate.

use core::fmt;
use core::time::Duration;

macro_rules! plain_newtype {
    ($(#[$m:meta])* $name:ident($inner:ty), $fmt:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl $name {
            /// The raw value.
            #[inline]
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "(", $fmt, ")"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $fmt, self.0)
            }
        }

        impl From<$inner> for $name {
            #[inline]
            fn from(v: $inner) -> Self {
                Self(v)
            }
        }

        impl From<$name> for $inner {
            #[inline]
            fn from(v: $name) -> Self {
                v.0
            }
        }
    };
}

plain_newtype!(
    /// Communication ID (32 bits): the CM's per-connection identifier (IBTA 12.6.4).
    CommId(u32),
    "{:#010x}"
);
plain_newtype!(
    /// Service ID (64 bits): what a REQ or SIDR_REQ asks to connect to (IBTA A3).
    ServiceId(u64),
    "{:#018x}"
);
plain_newtype!(
    /// A 64-bit EUI-64 GUID (CA GUID, node GUID).
    Guid(u64),
    "{:#018x}"
);
plain_newtype!(
    /// MAD Transaction ID (64 bits).
    Tid(u64),
    "{:#018x}"
);
plain_newtype!(
    /// Partition key (16 bits; bit 15 = full membership).
    Pkey(u16),
    "{:#06x}"
);
plain_newtype!(
    /// Queue key (32 bits). CM MADs travel with Q_Key 0x8001_0000 ([`Qkey::GSI`]).
    Qkey(u32),
    "{:#010x}"
);
plain_newtype!(
    /// Local identifier (16-bit IB link address; 0xFFFF = permissive, used on RoCE).
    Lid(u16),
    "{}"
);
plain_newtype!(
    /// SIDR Request ID (32 bits), echoed by the SIDR_REP.
    RequestId(u32),
    "{:#010x}"
);

impl Tid {
    /// The low 32 bits: the part the sender chose. umad rewrites the high half of every
    /// request MAD it sends with its agent's `hi_tid` (so a retransmission or a reply seen
    /// through another agent may differ there); compare TIDs with [`Tid::same_transaction`].
    pub const fn low(self) -> u32 {
        self.0 as u32
    }

    /// Whether two TIDs name the same transaction, ignoring the high 32 bits that umad
    /// rewrites.
    pub const fn same_transaction(self, other: Tid) -> bool {
        self.low() == other.low()
    }
}

impl Qkey {
    /// The well-known Q_Key of QP1 (GSI), `IB_QP1_QKEY`.
    pub const GSI: Qkey = Qkey(0x8001_0000);
}

impl Pkey {
    /// The default full-member P_Key.
    pub const DEFAULT: Pkey = Pkey(0xffff);
}

impl Lid {
    /// The permissive LID, 0xFFFF.
    pub const PERMISSIVE: Lid = Lid(0xffff);
}

/// Error returned when a value does not fit the width of a wire field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("value {value:#x} does not fit in {bits} bits")]
pub struct OutOfRange {
    /// The value that was offered.
    pub value: u64,
    /// The width of the field, in bits.
    pub bits: u32,
}

macro_rules! bits_newtype {
    ($(#[$m:meta])* $name:ident($inner:ty, $bits:expr), $fmt:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name($inner);

        impl $name {
            /// Width of the field on the wire, in bits.
            pub const BITS: u32 = $bits;
            /// Largest representable value.
            pub const MAX: $inner = ((1u64 << $bits) - 1) as $inner;

            /// Creates the value, or `None` if `v` needs more than [`Self::BITS`] bits.
            #[inline]
            pub const fn new(v: $inner) -> Option<Self> {
                if v <= Self::MAX {
                    Some(Self(v))
                } else {
                    None
                }
            }

            /// Creates the value from the low [`Self::BITS`] bits of `v` (higher bits are
            /// discarded, as a wire parser does).
            #[inline]
            pub const fn masked(v: $inner) -> Self {
                Self(v & Self::MAX)
            }

            /// The raw value.
            #[inline]
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl TryFrom<$inner> for $name {
            type Error = OutOfRange;
            fn try_from(v: $inner) -> Result<Self, OutOfRange> {
                Self::new(v).ok_or(OutOfRange { value: v as u64, bits: $bits })
            }
        }

        impl From<$name> for $inner {
            #[inline]
            fn from(v: $name) -> Self {
                v.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "(", $fmt, ")"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $fmt, self.0)
            }
        }
    };
}

bits_newtype!(
    /// Queue pair number (24 bits).
    Qpn(u32, 24),
    "{:#08x}"
);
bits_newtype!(
    /// End-to-end context number (24 bits). For XRC, REP's Local EECN carries the TGT QPN.
    Eecn(u32, 24),
    "{:#08x}"
);
bits_newtype!(
    /// Packet sequence number (24 bits).
    Psn(u32, 24),
    "{:#08x}"
);
bits_newtype!(
    /// Enhanced Connection Establishment vendor ID (24 bits, Linux ≥ 5.8; in bytes IBTA
    /// marks reserved).
    VendorId(u32, 24),
    "{:#08x}"
);
bits_newtype!(
    /// IPv6/GRH flow label (20 bits).
    FlowLabel(u32, 20),
    "{:#07x}"
);
bits_newtype!(
    /// A 2-bit field.
    U2(u8, 2),
    "{}"
);
bits_newtype!(
    /// A 3-bit field (Retry Count, RNR Retry Count; RNR 7 = infinite).
    U3(u8, 3),
    "{}"
);
bits_newtype!(
    /// A 4-bit field (Max CM Retries, Service Level).
    U4(u8, 4),
    "{}"
);
bits_newtype!(
    /// A 7-bit field (REJ Reject Info Length).
    U7(u8, 7),
    "{}"
);
bits_newtype!(
    /// A 27-bit field (ClassPortInfo CapabilityMask2).
    U27(u32, 27),
    "{:#x}"
);

/// A 5-bit CM timeout exponent *n*: the time is 4.096 µs × 2ⁿ (docs/wire.md §4.2).
///
/// Used by Remote/Local CM Response Timeout, Service Timeout, Local ACK Timeout and Target
/// ACK Delay.
///
/// ```
/// use ibcm_mad::TimeoutExp;
/// let t = TimeoutExp::new(20).unwrap();
/// assert_eq!(t.to_duration().as_micros(), 4_294_967);
/// assert_eq!(t.linux_ms(), 4096);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TimeoutExp(u8);

impl TimeoutExp {
    /// Width of the field on the wire, in bits.
    pub const BITS: u32 = 5;
    /// Largest exponent (≈ 2.44 h).
    pub const MAX: u8 = 31;

    /// Creates the exponent, or `None` if `n > 31`.
    #[inline]
    pub const fn new(n: u8) -> Option<Self> {
        if n <= Self::MAX {
            Some(Self(n))
        } else {
            None
        }
    }

    /// Creates the exponent from the low 5 bits of `n`.
    #[inline]
    pub const fn masked(n: u8) -> Self {
        Self(n & Self::MAX)
    }

    /// The raw exponent.
    #[inline]
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The exact time this exponent stands for: 4096 ns × 2ⁿ.
    pub const fn to_duration(self) -> Duration {
        Duration::from_nanos(4096u64 << self.0)
    }

    /// Linux's rounding (`cm_convert_to_ms`): `1 << max(n − 8, 0)` milliseconds.
    pub const fn linux_ms(self) -> u64 {
        1u64 << self.0.saturating_sub(8)
    }

    /// The smallest exponent whose time is at least `d` (saturating at 31).
    pub fn from_duration_ceil(d: Duration) -> Self {
        let ns = d.as_nanos();
        let mut n = 0u8;
        while n < Self::MAX && (4096u128 << n) < ns {
            n += 1;
        }
        Self(n)
    }
}

impl TryFrom<u8> for TimeoutExp {
    type Error = OutOfRange;
    fn try_from(v: u8) -> Result<Self, OutOfRange> {
        Self::new(v).ok_or(OutOfRange {
            value: u64::from(v),
            bits: 5,
        })
    }
}

impl fmt::Debug for TimeoutExp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TimeoutExp({} = {:?})", self.0, self.to_duration())
    }
}

impl fmt::Display for TimeoutExp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.0, self.to_duration())
    }
}

/// A 128-bit global identifier (port GID, or an IPv6 / IPv4-mapped address on RoCE).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID.
    pub const ZERO: Gid = Gid([0; 16]);

    /// The GID as an IPv6 address.
    pub fn to_ipv6(self) -> core::net::Ipv6Addr {
        core::net::Ipv6Addr::from(self.0)
    }

    /// The RoCE GID of an IP address: IPv4 becomes `::ffff:a.b.c.d` (`rdma_ip2gid`), IPv6 is
    /// taken as is.
    pub fn from_ip(ip: core::net::IpAddr) -> Self {
        match ip {
            core::net::IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            core::net::IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for on RoCE: an IPv4-mapped GID gives the IPv4 address,
    /// anything else the IPv6 address.
    pub fn to_ip(self) -> core::net::IpAddr {
        let v6 = self.to_ipv6();
        match v6.to_ipv4_mapped() {
            Some(v4) => core::net::IpAddr::V4(v4),
            None => core::net::IpAddr::V6(v6),
        }
    }

    /// Subnet prefix (high 64 bits).
    pub fn subnet_prefix(self) -> u64 {
        u64::from_be_bytes([
            self.0[0], self.0[1], self.0[2], self.0[3], self.0[4], self.0[5], self.0[6], self.0[7],
        ])
    }

    /// Interface ID (low 64 bits), usually the port GUID.
    pub fn interface_id(self) -> u64 {
        u64::from_be_bytes([
            self.0[8], self.0[9], self.0[10], self.0[11], self.0[12], self.0[13], self.0[14],
            self.0[15],
        ])
    }
}

impl From<[u8; 16]> for Gid {
    fn from(b: [u8; 16]) -> Self {
        Gid(b)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl fmt::Display for Gid {
    /// IPv4-mapped GIDs print as the IPv4 address, others in IPv6 notation.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_ipv6().to_ipv4_mapped() {
            Some(v4) => write!(f, "::ffff:{v4}"),
            None => write!(f, "{}", self.to_ipv6()),
        }
    }
}

/// Error from [`PrivateData::from_slice`]: the data does not fit the message's area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("private data of {len} bytes does not fit the {max}-byte area")]
pub struct PrivateDataTooLong {
    /// Length offered.
    pub len: usize,
    /// Size of the area in this message.
    pub max: usize,
}

/// Private data of exactly `N` bytes.
///
/// The wire has no private-data length field (docs/interop.md §7.1): every message carries its
/// whole fixed area. A shorter payload is zero-padded by [`PrivateData::from_slice`]; a longer
/// one is refused.
///
/// ```
/// use ibcm_mad::PrivateData;
/// let pd = PrivateData::<92>::from_slice(b"hello").unwrap();
/// assert_eq!(&pd.as_bytes()[..6], b"hello\0");
/// assert!(PrivateData::<4>::from_slice(b"hello").is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrivateData<const N: usize>(pub [u8; N]);

impl<const N: usize> PrivateData<N> {
    /// Size of the area, in bytes.
    pub const LEN: usize = N;

    /// All-zero private data.
    pub const fn zeroed() -> Self {
        Self([0; N])
    }

    /// Copies `data` into a zero-padded area.
    ///
    /// # Errors
    /// [`PrivateDataTooLong`] if `data.len() > N`.
    pub fn from_slice(data: &[u8]) -> Result<Self, PrivateDataTooLong> {
        let mut out = [0u8; N];
        out.get_mut(..data.len())
            .ok_or(PrivateDataTooLong {
                len: data.len(),
                max: N,
            })?
            .copy_from_slice(data);
        Ok(Self(out))
    }

    /// The whole area.
    pub const fn as_bytes(&self) -> &[u8; N] {
        &self.0
    }

    /// The area without its trailing zero bytes (for display; the wire cannot tell them
    /// apart from padding).
    pub fn trimmed(&self) -> &[u8] {
        // Mostly zeros as a rule (up to 224 bytes of them): whole 8-byte words are skipped
        // first, then the bytes of the last nonzero word.
        let b = self.0.as_slice();
        let mut end = b.len();
        while let Some(w) = end
            .checked_sub(8)
            .and_then(|s| b.get(s..end))
            .and_then(|w| w.first_chunk::<8>())
        {
            if u64::from_ne_bytes(*w) != 0 {
                break;
            }
            end -= 8;
        }
        let head = b.get(..end).unwrap_or(&[]);
        let end = head.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1);
        head.get(..end).unwrap_or(&[])
    }

    /// Whether every byte is zero.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
}

impl<const N: usize> Default for PrivateData<N> {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl<const N: usize> fmt::Debug for PrivateData<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateData<{N}>(")?;
        for b in self.trimmed() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// Which side of a connection: the one that sent the REQ (or SIDR_REQ) or the one that answered
/// it. The CM core says which side an endpoint is (`ibcm::proto::Side`); the capture decoder
/// says which side sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// Sent the REQ (or SIDR_REQ).
    Active,
    /// Received the REQ and answered it.
    Passive,
}

impl Side {
    /// `"active"` or `"passive"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Side::Active => "active",
            Side::Passive => "passive",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qpn_range() {
        assert_eq!(Qpn::new(0xff_ffff).map(Qpn::get), Some(0xff_ffff));
        assert_eq!(Qpn::new(0x100_0000), None);
        assert_eq!(Qpn::masked(0x1ab_cdef).get(), 0xab_cdef);
        assert!(Qpn::try_from(0x100_0000).is_err());
    }

    #[test]
    fn timeout_conversions() {
        let t = TimeoutExp::masked(24);
        assert_eq!(t.linux_ms(), 65536);
        assert_eq!(TimeoutExp::masked(3).linux_ms(), 1);
        assert_eq!(
            TimeoutExp::from_duration_ceil(Duration::from_millis(1)).get(),
            8
        );
        assert_eq!(TimeoutExp::from_duration_ceil(Duration::ZERO).get(), 0);
        assert_eq!(
            TimeoutExp::from_duration_ceil(Duration::from_secs(1_000_000)).get(),
            31
        );
    }

    #[test]
    fn gid_ip() {
        let ip: core::net::IpAddr = "10.0.0.1".parse().unwrap();
        let g = Gid::from_ip(ip);
        assert_eq!(g.to_string(), "::ffff:10.0.0.1");
        assert_eq!(g.to_ip(), ip);
        let ip6: core::net::IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(Gid::from_ip(ip6).to_ip(), ip6);
    }

    #[test]
    fn trimmed_removes_exactly_the_trailing_zeros() {
        // Every length of nonzero head (with a zero inside it) in a 40-byte area: the word
        // loop and the byte loop both end in the right place.
        for last in 0..=40 {
            let mut b = [0u8; 40];
            for (i, x) in b.iter_mut().enumerate().take(last) {
                *x = if i == 1 { 0 } else { 7 };
            }
            let pd = PrivateData::<40>(b);
            let want = if last == 2 { &b[..1] } else { &b[..last] };
            assert_eq!(pd.trimmed(), want, "last {last}");
        }
        assert!(PrivateData::<224>::zeroed().trimmed().is_empty());
        assert_eq!(PrivateData::<3>([0, 0, 5]).trimmed(), &[0, 0, 5]);
    }

    #[test]
    fn private_data() {
        let pd = PrivateData::<4>::from_slice(&[1, 2]).unwrap();
        assert_eq!(pd.0, [1, 2, 0, 0]);
        assert_eq!(pd.trimmed(), &[1, 2]);
        assert_eq!(
            PrivateData::<1>::from_slice(&[1, 2]),
            Err(PrivateDataTooLong { len: 2, max: 1 })
        );
    }
}
