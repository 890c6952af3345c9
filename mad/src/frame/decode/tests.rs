//! Tests of the whole-packet decoder.

use super::*;
use crate::frame::{CrcStatus, MacAddr, PacketType, RoceV2UdRepr};
use crate::types::Psn;

fn eth(tags: &[VlanTag]) -> EthernetRepr {
    EthernetRepr {
        dst_addr: MacAddr([0x02, 0, 0, 0, 0, 2]),
        src_addr: MacAddr([0x02, 0, 0, 0, 0, 1]),
        vlan: VlanTags::from_slice(tags).unwrap(),
        ethertype: EtherType::IPV4,
    }
}

fn repr(v6: bool) -> RoceV2UdRepr {
    let (s, d) = if v6 {
        ("fd00::1", "fd00::2")
    } else {
        ("192.168.1.1", "192.168.1.2")
    };
    RoceV2UdRepr::gsi(
        s.parse().unwrap(),
        d.parse().unwrap(),
        77,
        0xd872,
        Psn::masked(9),
    )
    .unwrap()
}

fn mad() -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    for (i, b) in m.iter_mut().enumerate() {
        *b = i as u8;
    }
    m
}

fn frame(v6: bool, tags: &[VlanTag], payload: &[u8]) -> Vec<u8> {
    let r = repr(v6);
    let e = eth(tags);
    let mut f = vec![0xa5; r.frame_len(&e, payload.len())];
    assert_eq!(r.emit_frame(&e, payload, &mut f).unwrap(), f.len());
    f
}

#[test]
fn emit_then_decode_roundtrip() {
    let tag = VlanTag {
        tpid: EtherType::VLAN,
        pcp: 3,
        dei: false,
        vid: 0,
    };
    for v6 in [false, true] {
        for tags in [&[][..], &[tag][..], &[tag, tag, tag][..]] {
            let f = frame(v6, tags, &mad());
            let p = decode(1, &f).unwrap().into_ib().unwrap();
            let r = repr(v6);
            assert_eq!(
                p.encap,
                if v6 {
                    Encap::RoceV2Ipv6
                } else {
                    Encap::RoceV2Ipv4
                }
            );
            assert_eq!(p.icrc, CrcStatus::Ok);
            assert_eq!(p.vcrc, CrcStatus::Absent);
            assert_eq!(p.link.vlan(), tags);
            assert_eq!(p.bth, r.bth);
            assert_eq!(p.deth, Some(r.deth));
            assert_eq!(
                p.udp.map(|u| (u.src_port, u.dst_port)),
                Some((0xd872, 4791))
            );
            assert_eq!(p.mad().unwrap().unwrap(), &mad());
            let ip = p.ip.unwrap();
            assert_eq!(
                (ip.src_addr(), ip.dst_addr()),
                (r.ip.src_addr(), r.ip.dst_addr())
            );
            assert_eq!(ip.payload_len(), 8 + 12 + 8 + 256 + 4);
            match ip {
                IpRepr::V4(v4) => {
                    assert_eq!((v4.ident, v4.ttl, v4.dont_frag), (77, 64, true));
                    let hl = 14 + 4 * tags.len();
                    assert!(ipv4::Packet::new_checked(&f[hl..])
                        .unwrap()
                        .verify_checksum());
                }
                IpRepr::V6(v6r) => assert_eq!(v6r.hop_limit, 64),
            }
            p.verify_icrc().unwrap();
        }
    }
}

#[test]
fn odd_payload_gets_padding() {
    let f = frame(false, &[], &[7u8; 13]);
    let p = decode(1, &f).unwrap().into_ib().unwrap();
    assert_eq!(p.bth.pad_count.get(), 3);
    assert_eq!(p.payload, &[7u8; 13]);
    assert!(p.icrc.is_ok());
    // A 13-byte payload to QP1 is a MAD that is too short.
    assert!(matches!(
        p.mad(),
        Some(Err(FrameError::Truncated {
            layer: "MAD",
            need: 256,
            have: 13,
            ..
        }))
    ));
    // The pad bytes are zero.
    assert_eq!(&f[f.len() - 7..f.len() - 4], &[0, 0, 0]);
}

#[test]
fn every_truncation_is_an_error_without_panic() {
    for v6 in [false, true] {
        let f = frame(v6, &[], &mad());
        for n in 0..f.len() {
            assert!(decode(1, &f[..n]).is_err(), "v6={v6} n={n}");
        }
    }
}

#[test]
fn padding_and_fcs_after_the_packet_are_ignored() {
    let mut f = frame(false, &[], &[1, 2, 3, 4]);
    let clean = decode(1, &f).unwrap().into_ib().unwrap().payload.to_vec();
    f.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0]);
    let p = decode(1, &f).unwrap().into_ib().unwrap();
    assert!(p.icrc.is_ok());
    assert_eq!(p.payload, &clean[..]);
    // FCS flag bits of a pcap link type are masked off.
    let p = decode(0x1000_0000 | 1, &f).unwrap().into_ib().unwrap();
    assert_eq!(p.link.link_type, 1);
}

#[test]
fn corrupted_icrc_is_bad_not_an_error() {
    let mut f = frame(false, &[], &mad());
    let n = f.len();
    f[n - 1] ^= 0x80;
    let p = decode(1, &f).unwrap().into_ib().unwrap();
    assert!(p.icrc.is_bad());
    assert!(matches!(p.verify_icrc(), Err(FrameError::BadIcrc { .. })));
    // The masked TTL does not matter.
    let mut f = frame(false, &[], &mad());
    f[14 + 8] = 3;
    assert!(decode(1, &f).unwrap().into_ib().unwrap().icrc.is_ok());
}

#[test]
fn not_ib_classifications() {
    let f = frame(false, &[], &mad());
    let what = |lt: u32, d: &[u8]| match decode(lt, d) {
        Ok(Decoded::NotIb { what }) => what,
        other => panic!("{other:?}"),
    };
    let mut arp = f.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(what(1, &arp), "ARP");
    let mut tcp = f.clone();
    tcp[14 + 9] = 6;
    assert_eq!(what(1, &tcp), "TCP");
    let mut frag = f.clone();
    frag[14 + 6] = 0x20; // MF
    assert_eq!(what(1, &frag), "IPv4 fragment");
    let mut other_port = f.clone();
    other_port[14 + 20 + 3] = 0x35;
    assert_eq!(what(1, &other_port), "UDP, not to the RoCEv2 port");
    assert_eq!(decode(42, &f), Err(FrameError::UnsupportedLinkType(42)));
    // Raw IP link types.
    assert!(decode(101, &f[14..]).unwrap().ib().is_some());
    assert!(decode(228, &f[14..]).unwrap().ib().is_some());
    assert!(matches!(
        decode(229, &f[14..]),
        Err(FrameError::BadVersion { value: 4, .. })
    ));
}

#[test]
fn no_icrc_config() {
    let f = frame(false, &[], &mad());
    let cfg = DecodeConfig {
        icrc_present: false,
        ..DecodeConfig::DEFAULT
    };
    let p = decode_with(&cfg, 1, &f).unwrap().into_ib().unwrap();
    assert_eq!(p.icrc, CrcStatus::Absent);
    assert_eq!(p.payload.len(), 260);
}

#[test]
fn erf_ethernet_record() {
    let f = frame(false, &[], &mad());
    let mut rec = vec![0u8; 18];
    let erf = ErfRepr {
        timestamp: 1 << 32,
        erf_type: erf::TYPE_ETH,
        flags: 4,
        rlen: u16::try_from(18 + f.len()).unwrap(),
        lctr: 0,
        wlen: u16::try_from(f.len() + 4).unwrap(),
        ext_headers: 0,
    };
    erf.emit(&mut erf::Packet::new_unchecked(&mut rec[..]));
    rec.extend_from_slice(&f);
    let p = decode(197, &rec).unwrap().into_ib().unwrap();
    assert!(p.icrc.is_ok());
    assert_eq!(p.link.erf, Some(erf));
    assert_eq!(p.packet_offset, 18 + 14);
    // Another record type is not IB.
    rec[8] = 3;
    assert!(matches!(decode(197, &rec), Ok(Decoded::NotIb { .. })));
}

/// Minimal native IB UD packet (LNH = 2) built by hand: LRH, BTH, DETH, MAD, ICRC, VCRC.
fn ib_packet(lnh: Lnh) -> Vec<u8> {
    let global = lnh == Lnh::IbaGlobal;
    let words = (8 + if global { 40 } else { 0 } + 12 + 8 + 256 + 4) / 4;
    let lrh = LrhRepr {
        vl: crate::types::U4::masked(0),
        lver: crate::types::U4::masked(0),
        sl: crate::types::U4::masked(0),
        lnh,
        dlid: crate::types::Lid(1),
        pkt_len: words,
        slid: crate::types::Lid(4),
    };
    let mut p = vec![0xa5u8; usize::from(words) * 4 + 2];
    lrh.emit(&mut lrh::Packet::new_unchecked(&mut p[..]));
    let mut at = 8;
    if global {
        let grh = GrhRepr {
            traffic_class: 0,
            flow_label: crate::types::FlowLabel::masked(0),
            payload_len: 12 + 8 + 256 + 4,
            next_header: grh::NEXT_HEADER_IBA,
            hop_limit: 255,
            sgid: crate::types::Gid([1; 16]),
            dgid: crate::types::Gid([2; 16]),
        };
        grh.emit(&mut grh::Packet::new_unchecked(&mut p[at..]));
        at += 40;
    }
    let r = repr(false);
    r.bth.emit(&mut bth::Packet::new_unchecked(&mut p[at..]));
    r.deth
        .emit(&mut deth::Packet::new_unchecked(&mut p[at + 12..]));
    p[at + 20..at + 20 + 256].copy_from_slice(&mad());
    let end = usize::from(words) * 4;
    icrc::fill(
        if global {
            Encap::IbGlobal
        } else {
            Encap::IbLocal
        },
        &mut p[..end],
    )
    .unwrap();
    let v = vcrc::compute(&p[..end]);
    p[end..].copy_from_slice(&v.to_le_bytes());
    p
}

#[test]
fn native_ib_packets() {
    for lnh in [Lnh::IbaLocal, Lnh::IbaGlobal] {
        let p = ib_packet(lnh);
        let d = decode(247, &p).unwrap().into_ib().unwrap();
        assert!(d.icrc.is_ok() && d.vcrc.is_ok(), "{lnh:?}");
        assert_eq!(d.grh.is_some(), lnh == Lnh::IbaGlobal);
        assert_eq!(d.mad().unwrap().unwrap(), &mad());
        vcrc::verify(&p).unwrap();
        // VCRC cut off: absent, not an error.
        let d = decode(247, &p[..p.len() - 2]).unwrap().into_ib().unwrap();
        assert_eq!(d.vcrc, CrcStatus::Absent);
        // Corrupt VCRC.
        let mut bad = p.clone();
        let n = bad.len();
        bad[n - 1] ^= 1;
        assert!(decode(247, &bad).unwrap().into_ib().unwrap().vcrc.is_bad());
        assert!(matches!(
            vcrc::verify(&bad),
            Err(FrameError::BadVcrc { .. })
        ));
        for n in 0..p.len() - 2 {
            assert!(decode(247, &p[..n]).is_err(), "{lnh:?} {n}");
        }
    }
    let mut raw = ib_packet(Lnh::IbaLocal);
    raw[1] &= 0xfc;
    assert!(matches!(decode(247, &raw), Ok(Decoded::NotIb { .. })));
}

#[test]
fn rocev1_packet() {
    let ib = ib_packet(Lnh::IbaGlobal);
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&[0x89, 0x15]);
    f.extend_from_slice(&ib[8..ib.len() - 2]);
    icrc::fill(Encap::RoceV1, &mut f[14..]).unwrap();
    let p = decode(1, &f).unwrap().into_ib().unwrap();
    assert_eq!(p.encap, Encap::RoceV1);
    assert!(p.icrc.is_ok());
    assert_eq!(p.grh.unwrap().sgid, crate::types::Gid([1; 16]));
    // LNH = 3 and RoCEv1 share the ICRC definition.
    assert_eq!(&f[f.len() - 4..], &ib[ib.len() - 6..ib.len() - 2]);
}

#[test]
fn sll_with_vlan_tag() {
    let f = frame(false, &[], &mad());
    let mut s = vec![0, 4, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x81, 0x00];
    s.extend_from_slice(&[0x20, 0x64, 0x08, 0x00]);
    s.extend_from_slice(&f[14..]);
    let p = decode(113, &s).unwrap().into_ib().unwrap();
    assert_eq!(p.link.vlan().len(), 1);
    assert_eq!((p.link.vlan()[0].pcp, p.link.vlan()[0].vid), (1, 100));
    assert_eq!(p.link.pkttype(), Some(PacketType::OUTGOING));
    assert!(p.icrc.is_ok());
}

#[test]
fn arbitrary_bytes_never_panic() {
    use proptest::prelude::*;
    let lts = [1u32, 101, 113, 197, 228, 229, 247, 276];
    proptest!(ProptestConfig::with_cases(2000), |(lt in 0..lts.len(), data in proptest::collection::vec(any::<u8>(), 0..400))| {
        let _ = decode(lts[lt], &data);
    });
    // Mutations of a valid frame.
    let f = frame(false, &[], &mad());
    proptest!(ProptestConfig::with_cases(2000), |(i in 0..f.len(), v in any::<u8>())| {
        let mut g = f.clone();
        g[i] = v;
        let _ = decode(1, &g);
    });
}
