//! Ethernet II header with any number (up to [`MAX_VLAN_TAGS`]) of stacked 802.1Q (0x8100),
//! 802.1ad (0x88A8) and 0x9100 VLAN tags (docs/framing.md §3.1).
//!
//! The view covers the untagged 14-byte header (destination, source, outer EtherType);
//! [`EthernetRepr::parse`] walks the tag stack. Tags are parsed whatever their VID: RoCE
//! deployments use priority-tagged frames (VID 0) for PFC.

use core::fmt;

use super::wire::{array_at, need, set_bytes, set_u16, u16_at};
use super::FrameError;

/// Field offsets of the untagged header.
pub mod field {
    use core::ops::Range;

    /// Destination MAC address.
    pub const DST: Range<usize> = 0..6;
    /// Source MAC address.
    pub const SRC: Range<usize> = 6..12;
    /// EtherType, or the TPID of the first VLAN tag.
    pub const ETHERTYPE: Range<usize> = 12..14;
    /// First byte after the untagged header.
    pub const PAYLOAD: usize = ETHERTYPE.end;
}

/// Length of the untagged header.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// Length of one VLAN tag (TPID + TCI).
pub const VLAN_TAG_LEN: usize = 4;

/// Most VLAN tags [`EthernetRepr::parse`] accepts; more gives [`FrameError::TooManyVlanTags`].
pub const MAX_VLAN_TAGS: usize = 8;

const LAYER: &str = "Ethernet";

/// An EtherType (or VLAN TPID). Any 16-bit value is valid; the constants name the ones the
/// decoder knows.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EtherType(pub u16);

impl EtherType {
    /// IPv4.
    pub const IPV4: EtherType = EtherType(0x0800);
    /// ARP.
    pub const ARP: EtherType = EtherType(0x0806);
    /// IPv6.
    pub const IPV6: EtherType = EtherType(0x86dd);
    /// RoCEv1 (GRH follows).
    pub const ROCE: EtherType = EtherType(0x8915);
    /// 802.1Q VLAN tag (C-tag).
    pub const VLAN: EtherType = EtherType(0x8100);
    /// 802.1ad (QinQ) service tag.
    pub const QINQ: EtherType = EtherType(0x88a8);
    /// Pre-standard QinQ tag.
    pub const VLAN_9100: EtherType = EtherType(0x9100);
    /// LLDP.
    pub const LLDP: EtherType = EtherType(0x88cc);
    /// MAC control (PAUSE / PFC).
    pub const MAC_CONTROL: EtherType = EtherType(0x8808);

    /// Whether this value is a VLAN tag protocol identifier (0x8100, 0x88A8, 0x9100).
    pub const fn is_vlan_tpid(self) -> bool {
        matches!(self.0, 0x8100 | 0x88a8 | 0x9100)
    }

    /// A short description of the protocol, for "not RoCE" classifications.
    pub const fn describe(self) -> &'static str {
        match self.0 {
            0x0800 => "IPv4",
            0x0806 => "ARP",
            0x8035 => "RARP",
            0x86dd => "IPv6",
            0x8808 => "Ethernet MAC control (PAUSE/PFC)",
            0x8847 | 0x8848 => "MPLS",
            0x8863 | 0x8864 => "PPPoE",
            0x888e => "EAPOL",
            0x88cc => "LLDP",
            0x88f7 => "PTP",
            0x8906 => "FCoE",
            0x8915 => "RoCEv1",
            0x8100 | 0x88a8 | 0x9100 => "VLAN tag",
            0..=0x05dc => "IEEE 802.3 length frame (LLC)",
            _ => "other EtherType",
        }
    }
}

impl fmt::Debug for EtherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EtherType({:#06x})", self.0)
    }
}

impl fmt::Display for EtherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// Whether the group (multicast) bit is set.
    pub const fn is_multicast(self) -> bool {
        self.0[0] & 0x01 != 0
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

view!(
    /// A view of the untagged Ethernet II header.
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the 14-byte untagged header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn check_len(&self) -> Result<(), FrameError> {
        need(LAYER, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Destination address.
    pub fn dst_addr(&self) -> MacAddr {
        MacAddr(array_at(self.buffer.as_ref(), field::DST.start))
    }

    /// Source address.
    pub fn src_addr(&self) -> MacAddr {
        MacAddr(array_at(self.buffer.as_ref(), field::SRC.start))
    }

    /// The outer EtherType (a TPID when the frame is tagged).
    pub fn ethertype(&self) -> EtherType {
        EtherType(u16_at(self.buffer.as_ref(), field::ETHERTYPE.start))
    }

    /// Everything after the untagged header (VLAN tags included).
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(field::PAYLOAD..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, v: MacAddr) {
        set_bytes(self.buffer.as_mut(), field::DST.start, &v.0);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, v: MacAddr) {
        set_bytes(self.buffer.as_mut(), field::SRC.start, &v.0);
    }

    /// Sets the outer EtherType.
    pub fn set_ethertype(&mut self, v: EtherType) {
        set_u16(self.buffer.as_mut(), field::ETHERTYPE.start, v.0);
    }

    /// Everything after the untagged header, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.buffer
            .as_mut()
            .get_mut(field::PAYLOAD..)
            .unwrap_or(&mut [])
    }
}

/// One VLAN tag: TPID and the TCI fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    /// Tag protocol identifier (0x8100, 0x88A8 or 0x9100).
    pub tpid: EtherType,
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits; 0 = priority tag only).
    pub vid: u16,
}

impl VlanTag {
    /// Builds a tag from its TPID and 16-bit TCI.
    pub const fn from_tci(tpid: EtherType, tci: u16) -> Self {
        VlanTag {
            tpid,
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }

    /// The 16-bit TCI (PCP, DEI and VID masked to their widths).
    pub const fn tci(&self) -> u16 {
        ((self.pcp as u16 & 0x7) << 13) | ((self.dei as u16) << 12) | (self.vid & 0x0fff)
    }
}

/// A bounded stack of VLAN tags, outermost first (no allocation).
#[derive(Clone, Copy, Default)]
pub struct VlanTags {
    tags: [VlanTag; MAX_VLAN_TAGS],
    len: usize,
}

impl VlanTags {
    /// No tags.
    pub const fn new() -> Self {
        VlanTags {
            tags: [VlanTag {
                tpid: EtherType(0),
                pcp: 0,
                dei: false,
                vid: 0,
            }; MAX_VLAN_TAGS],
            len: 0,
        }
    }

    /// Builds a stack from a slice, outermost first.
    ///
    /// # Errors
    /// [`FrameError::TooManyVlanTags`] for more than [`MAX_VLAN_TAGS`] tags.
    pub fn from_slice(tags: &[VlanTag]) -> Result<Self, FrameError> {
        let mut out = VlanTags::new();
        for &t in tags {
            out.push(t)?;
        }
        Ok(out)
    }

    /// Appends an inner tag.
    ///
    /// # Errors
    /// [`FrameError::TooManyVlanTags`] (offset: where the tag would start) when full.
    pub fn push(&mut self, tag: VlanTag) -> Result<(), FrameError> {
        let slot = self
            .tags
            .get_mut(self.len)
            .ok_or(FrameError::TooManyVlanTags {
                offset: field::ETHERTYPE.start + self.len * VLAN_TAG_LEN,
                max: MAX_VLAN_TAGS,
            })?;
        *slot = tag;
        self.len += 1;
        Ok(())
    }

    /// The tags, outermost first.
    pub fn as_slice(&self) -> &[VlanTag] {
        self.tags.get(..self.len).unwrap_or(&[])
    }
}

impl core::ops::Deref for VlanTags {
    type Target = [VlanTag];
    fn deref(&self) -> &[VlanTag] {
        self.as_slice()
    }
}

impl PartialEq for VlanTags {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for VlanTags {}

impl fmt::Debug for VlanTags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// An Ethernet II header with its VLAN tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Destination address.
    pub dst_addr: MacAddr,
    /// Source address.
    pub src_addr: MacAddr,
    /// VLAN tags, outermost first.
    pub vlan: VlanTags,
    /// The EtherType after the last tag.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Parses the header, walking every VLAN tag.
    ///
    /// # Errors
    /// [`FrameError::Truncated`] if a tag or the inner EtherType is cut off;
    /// [`FrameError::TooManyVlanTags`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
        packet.check_len()?;
        let buf = packet.buffer.as_ref();
        let mut vlan = VlanTags::new();
        let mut at = field::ETHERTYPE.start;
        let mut ethertype = packet.ethertype();
        while ethertype.is_vlan_tpid() {
            let end = at + VLAN_TAG_LEN + 2;
            if buf.len() < end {
                return Err(FrameError::Truncated {
                    layer: "VLAN tag",
                    offset: at,
                    need: VLAN_TAG_LEN + 2,
                    have: buf.len().saturating_sub(at),
                });
            }
            if vlan.len() == MAX_VLAN_TAGS {
                return Err(FrameError::TooManyVlanTags {
                    offset: at,
                    max: MAX_VLAN_TAGS,
                });
            }
            vlan.push(VlanTag::from_tci(ethertype, u16_at(buf, at + 2)))?;
            at += VLAN_TAG_LEN;
            ethertype = EtherType(u16_at(buf, at));
        }
        let fixed = Packet::new_unchecked(array_at::<HEADER_LEN>(buf, 0));
        Ok(EthernetRepr {
            dst_addr: fixed.dst_addr(),
            src_addr: fixed.src_addr(),
            vlan,
            ethertype,
        })
    }

    /// Header length including the tags: 14 + 4 × tags.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.vlan.len() * VLAN_TAG_LEN
    }

    /// Writes the header and tags (the payload starts at [`Self::buffer_len`]).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_dst_addr(self.dst_addr);
        packet.set_src_addr(self.src_addr);
        let buf = packet.buffer.as_mut();
        let mut at = field::ETHERTYPE.start;
        for tag in self.vlan.iter() {
            set_u16(buf, at, tag.tpid.0);
            set_u16(buf, at + 2, tag.tci());
            at += VLAN_TAG_LEN;
        }
        set_u16(buf, at, self.ethertype.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const QINQ: [u8; 24] = [
        0x24, 0x8a, 0x07, 0x00, 0x00, 0x01,
        0x24, 0x8a, 0x07, 0x00, 0x00, 0x02,
        0x88, 0xa8, 0x00, 0xc8,
        0x81, 0x00, 0x60, 0x64,
        0x08, 0x00,
        0x45, 0x00,
    ];

    #[test]
    fn deconstruct_qinq() {
        let p = Packet::new_checked(&QINQ[..]).unwrap();
        assert_eq!(p.ethertype(), EtherType::QINQ);
        let r = EthernetRepr::parse(&p).unwrap();
        assert_eq!(r.dst_addr.to_string(), "24:8a:07:00:00:01");
        assert_eq!(r.vlan.len(), 2);
        assert_eq!(r.vlan[0].vid, 200);
        assert_eq!(r.vlan[0].tpid, EtherType::QINQ);
        assert_eq!(
            r.vlan[1],
            VlanTag {
                tpid: EtherType::VLAN,
                pcp: 3,
                dei: false,
                vid: 100
            }
        );
        assert_eq!(r.ethertype, EtherType::IPV4);
        assert_eq!(r.buffer_len(), 22);
    }

    #[test]
    fn construct_qinq() {
        let r = EthernetRepr::parse(&Packet::new_unchecked(&QINQ[..])).unwrap();
        let mut buf = [0xa5u8; 22];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf[..], QINQ[..22]);
    }

    #[test]
    fn truncations() {
        for n in 0..22 {
            let p = Packet::new_unchecked(&QINQ[..n]);
            assert!(EthernetRepr::parse(&p).is_err(), "{n}");
        }
    }

    #[test]
    fn too_many_tags() {
        let mut buf = vec![0u8; 12];
        for _ in 0..=MAX_VLAN_TAGS {
            buf.extend_from_slice(&[0x81, 0x00, 0x00, 0x00]);
        }
        buf.extend_from_slice(&[0x08, 0x00]);
        let err = EthernetRepr::parse(&Packet::new_unchecked(&buf[..])).unwrap_err();
        assert_eq!(
            err,
            FrameError::TooManyVlanTags {
                offset: 12 + 4 * MAX_VLAN_TAGS,
                max: MAX_VLAN_TAGS
            }
        );
        buf.drain(12..16);
        let r = EthernetRepr::parse(&Packet::new_unchecked(&buf[..])).unwrap();
        assert_eq!(r.vlan.len(), MAX_VLAN_TAGS);
    }
}
