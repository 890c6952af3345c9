//! Packet framing around a MAD: link layers, IPv4/IPv6/UDP, RoCEv1 GRH, native IB LRH/GRH,
//! BTH/DETH, ICRC and VCRC (docs/framing.md).
//!
//! Two levels:
//! * Per-header [smoltcp]-style **views** (`Packet<T: AsRef<[u8]>>`, e.g. [`bth::Packet`]) and
//!   **reprs** (e.g. [`BthRepr`]) with `parse`, `emit` and `buffer_len`. A view made by
//!   `new_checked` never panics in an accessor; `emit` never panics, and writes the whole
//!   header into a buffer of at least `buffer_len()` bytes.
//! * The whole-packet [`decode()`] (what cm-trace and the tests call), which goes from a capture
//!   record's bytes and link type to a [`Decoded`] packet, and the RoCEv2 emitters of
//!   [`RoceV2UdRepr`] (what the CM's UDP transport and the test generators call).
//!
//! Nothing here allocates or panics on any input. Malformed input gives a [`FrameError`] naming
//! the layer and the byte offset (from the start of the buffer given to [`decode()`]).
//!
//! # Example
//! ```
//! use ibcm_mad::frame::{decode, EtherType, EthernetRepr, MacAddr, RoceV2UdRepr, VlanTags};
//! use ibcm_mad::types::Psn;
//!
//! // A CM MAD to QP1 over RoCEv2/IPv4, as Linux rxe would send it.
//! let repr = RoceV2UdRepr::gsi(
//!     "10.0.0.1".parse().unwrap(),
//!     "10.0.0.2".parse().unwrap(),
//!     0x1234,        // IPv4 ID
//!     0xd872,        // UDP source port
//!     Psn::masked(7),
//! )
//! .unwrap();
//! let eth = EthernetRepr {
//!     dst_addr: MacAddr([0x02, 0, 0, 0, 0, 2]),
//!     src_addr: MacAddr([0x02, 0, 0, 0, 0, 1]),
//!     vlan: VlanTags::new(),
//!     ethertype: EtherType::IPV4,
//! };
//! let mad = [0u8; 256];
//! let mut frame = vec![0; repr.frame_len(&eth, mad.len())];
//! repr.emit_frame(&eth, &mad, &mut frame).unwrap();
//! assert_eq!(frame.len(), 322);
//!
//! // LINKTYPE_ETHERNET = 1.
//! let packet = decode(1, &frame).unwrap().into_ib().unwrap();
//! assert!(packet.icrc.is_ok());
//! assert_eq!(packet.bth.dest_qp.get(), 1);
//! assert_eq!(packet.mad().unwrap().unwrap(), &mad);
//! ```
//!
//! [smoltcp]: https://docs.rs/smoltcp/latest/smoltcp/wire/index.html

/// Defines the `Packet<T>` view struct and its constructors for one header module. The module
/// supplies `check_len`.
macro_rules! view {
    ($(#[$m:meta])*) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length. Accessors never panic, but read
            /// zeros for fields beyond a short buffer; use [`Self::new_checked`] on untrusted
            /// input.
            pub const fn new_unchecked(buffer: T) -> Self {
                Packet { buffer }
            }

            /// Wraps a buffer after [`Self::check_len`].
            ///
            /// # Errors
            /// [`FrameError::Truncated`] (or [`FrameError::BadLength`] for a length field that
            /// contradicts the header) with offsets relative to the buffer.
            pub fn new_checked(buffer: T) -> Result<Self, FrameError> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Consumes the view, giving back the buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The whole underlying buffer.
            pub fn as_bytes(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }
    };
}

pub mod bth;
pub mod deth;
pub mod eth;
pub mod grh;
pub mod icrc;
pub mod ipv4;
pub mod ipv6;
pub mod link;
pub mod lrh;
pub mod udp;
pub mod vcrc;
pub mod xrceth;

mod build;
mod decode;
mod wire;

pub use bth::{BthRepr, Opcode};
pub use build::{IbUdRepr, RoceV2UdRepr, RoceV2XrcSendRepr};
pub use decode::{
    decode, decode_with, DecodeConfig, Decoded, IbPacket, IpRepr, LinkInfo, L2, MAD_LEN,
};
pub use deth::DethRepr;
pub use eth::{EtherType, EthernetRepr, MacAddr, VlanTag, VlanTags};
pub use grh::GrhRepr;
pub use ipv4::Ipv4Repr;
pub use ipv6::Ipv6Repr;
pub use link::{ErfRepr, PacketType, Sll2Repr, SllRepr};
pub use lrh::{Lnh, LrhRepr};
pub use udp::UdpRepr;
pub use xrceth::XrcethRepr;

/// The IANA UDP destination port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// How an InfiniBand transport packet (BTH onwards) is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encap {
    /// RoCEv2: Ethernet / IPv4 / UDP (dst port 4791) / BTH.
    RoceV2Ipv4,
    /// RoCEv2: Ethernet / IPv6 / UDP (dst port 4791) / BTH.
    RoceV2Ipv6,
    /// RoCEv1: Ethernet (ethertype 0x8915) / GRH / BTH.
    RoceV1,
    /// Native InfiniBand, LRH.LNH = 2 (IBA local): LRH / BTH.
    IbLocal,
    /// Native InfiniBand, LRH.LNH = 3 (IBA global): LRH / GRH / BTH.
    IbGlobal,
}

impl Encap {
    /// A short name for display ("RoCEv2/IPv4", …).
    pub const fn name(self) -> &'static str {
        match self {
            Encap::RoceV2Ipv4 => "RoCEv2/IPv4",
            Encap::RoceV2Ipv6 => "RoCEv2/IPv6",
            Encap::RoceV1 => "RoCEv1",
            Encap::IbLocal => "IB LNH=2",
            Encap::IbGlobal => "IB LNH=3",
        }
    }

    /// Whether the packet is native InfiniBand (has an LRH and a VCRC).
    pub const fn is_native_ib(self) -> bool {
        matches!(self, Encap::IbLocal | Encap::IbGlobal)
    }
}

impl core::fmt::Display for Encap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// Outcome of checking a CRC carried in a packet (ICRC: `u32`, VCRC: `u16`).
///
/// Values are CRC values, not wire bytes: both CRCs are stored little-endian, so the wire bytes
/// are `value.to_le_bytes()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrcStatus<T> {
    /// The CRC on the wire matches the computed one.
    Ok,
    /// The CRC on the wire does not match.
    Bad {
        /// The CRC computed over the packet.
        expected: T,
        /// The CRC found on the wire.
        found: T,
    },
    /// The packet carries no such CRC (VCRC cut off; ICRC declared absent in
    /// [`DecodeConfig::icrc_present`]).
    Absent,
    /// Checking was switched off ([`DecodeConfig::verify_crc`]).
    NotChecked,
}

impl<T> CrcStatus<T> {
    /// Whether the status is [`CrcStatus::Ok`].
    pub const fn is_ok(&self) -> bool {
        matches!(self, CrcStatus::Ok)
    }

    /// Whether the status is [`CrcStatus::Bad`].
    pub const fn is_bad(&self) -> bool {
        matches!(self, CrcStatus::Bad { .. })
    }
}

impl<T: PartialEq> CrcStatus<T> {
    /// Compares a computed CRC with the one found on the wire. Under `cfg(fuzzing)` the check
    /// always passes, so that fuzzers reach the layers behind it.
    pub fn compare(expected: T, found: T) -> Self {
        if cfg!(fuzzing) || expected == found {
            CrcStatus::Ok
        } else {
            CrcStatus::Bad { expected, found }
        }
    }
}

/// ICRC status (CRC-32 value).
pub type IcrcStatus = CrcStatus<u32>;
/// VCRC status (CRC-16 value).
pub type VcrcStatus = CrcStatus<u16>;

/// Why a frame could not be decoded or emitted.
///
/// Offsets are from the start of the buffer handed to [`decode()`] (for a view or repr used on
/// its own: from the start of that header). `layer` names the header ("IPv4", "BTH", …).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The data ends before the structure does (short capture / snaplen, or a buffer shorter
    /// than the header).
    #[error("{layer}: truncated at byte {offset}: need {need} bytes, have {have}")]
    Truncated {
        /// Header being read.
        layer: &'static str,
        /// Offset at which the structure starts.
        offset: usize,
        /// Bytes the structure needs from `offset` on.
        need: usize,
        /// Bytes available from `offset` on.
        have: usize,
    },
    /// The capture link type is not one this decoder handles.
    #[error("unsupported link type {0}")]
    UnsupportedLinkType(u32),
    /// A length field is impossible (too small for the headers it must cover, or larger than
    /// the enclosing length).
    #[error("{layer}: bad length {value} at byte {offset}")]
    BadLength {
        /// Header holding the length.
        layer: &'static str,
        /// Offset of the length field (or of the structure it describes).
        offset: usize,
        /// The value found (in bytes, or as coded for 4-byte-word fields).
        value: usize,
    },
    /// A version field holds an unexpected value (IPv4 ≠ 4, IPv6/GRH ≠ 6).
    #[error("{layer}: bad version {value} at byte {offset}")]
    BadVersion {
        /// Header holding the version.
        layer: &'static str,
        /// Offset of the version field.
        offset: usize,
        /// The value found.
        value: u8,
    },
    /// More stacked VLAN tags than [`eth::MAX_VLAN_TAGS`].
    #[error("Ethernet: more than {max} VLAN tags at byte {offset}")]
    TooManyVlanTags {
        /// Offset of the first tag beyond the limit.
        offset: usize,
        /// The limit.
        max: usize,
    },
    /// The ICRC does not match (from [`icrc::verify`] / [`IbPacket::verify_icrc`]; the
    /// decoder itself reports a [`CrcStatus`] instead).
    #[error("bad ICRC: computed {expected:#010x}, found {found:#010x}")]
    BadIcrc {
        /// The CRC computed over the packet.
        expected: u32,
        /// The CRC on the wire (read little-endian).
        found: u32,
    },
    /// The VCRC does not match (from [`vcrc::verify`]).
    #[error("bad VCRC: computed {expected:#06x}, found {found:#06x}")]
    BadVcrc {
        /// The CRC computed over LRH..ICRC.
        expected: u16,
        /// The CRC on the wire (read little-endian).
        found: u16,
    },
    /// An output buffer is too small for what is being emitted.
    #[error("{layer}: output buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// What was being emitted.
        layer: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A value given to an emitter does not fit its wire field (or is not supported there).
    #[error("{layer}: {field} = {value:#x} cannot be emitted")]
    FieldOutOfRange {
        /// Header being emitted.
        layer: &'static str,
        /// Field name.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
}

impl FrameError {
    /// Byte offset of the problem, when the error has one.
    pub fn offset(&self) -> Option<usize> {
        match *self {
            FrameError::Truncated { offset, .. }
            | FrameError::BadLength { offset, .. }
            | FrameError::BadVersion { offset, .. }
            | FrameError::TooManyVlanTags { offset, .. } => Some(offset),
            _ => None,
        }
    }

    /// The layer (header) the error is about, when it names one.
    pub fn layer(&self) -> Option<&'static str> {
        match *self {
            FrameError::Truncated { layer, .. }
            | FrameError::BadLength { layer, .. }
            | FrameError::BadVersion { layer, .. }
            | FrameError::BufferTooSmall { layer, .. }
            | FrameError::FieldOutOfRange { layer, .. } => Some(layer),
            FrameError::TooManyVlanTags { .. } => Some("Ethernet"),
            FrameError::BadIcrc { .. } => Some("ICRC"),
            FrameError::BadVcrc { .. } => Some("VCRC"),
            _ => None,
        }
    }

    /// Whether the error means "the data ends too early" (e.g. a small capture snaplen).
    pub fn is_truncated(&self) -> bool {
        matches!(self, FrameError::Truncated { .. })
    }

    /// Shifts the offset by `by` bytes (when a header was parsed on its own at offset `by`).
    #[must_use]
    pub fn shifted(self, by: usize) -> Self {
        match self {
            FrameError::Truncated {
                layer,
                offset,
                need,
                have,
            } => FrameError::Truncated {
                layer,
                offset: offset.saturating_add(by),
                need,
                have,
            },
            FrameError::BadLength {
                layer,
                offset,
                value,
            } => FrameError::BadLength {
                layer,
                offset: offset.saturating_add(by),
                value,
            },
            FrameError::BadVersion {
                layer,
                offset,
                value,
            } => FrameError::BadVersion {
                layer,
                offset: offset.saturating_add(by),
                value,
            },
            FrameError::TooManyVlanTags { offset, max } => FrameError::TooManyVlanTags {
                offset: offset.saturating_add(by),
                max,
            },
            other => other,
        }
    }
}
