//! Reader and writer tests on synthetic pcap and pcapng files.

use std::io::{self, Read};
use std::time::Duration;

use super::*;

fn write_pcap(resolution: TsResolution, frames: &[(Duration, &[u8])]) -> Vec<u8> {
    let mut w = PcapFileWriter::new(Vec::new(), 1, resolution).unwrap();
    for (ts, d) in frames {
        w.write(*ts, d).unwrap();
    }
    w.into_inner().unwrap()
}

#[test]
fn roundtrip_us_and_ns() {
    let frames: [(Duration, &[u8]); 2] = [
        (Duration::new(1_700_000_000, 123_456_000), &[1, 2, 3]),
        (Duration::new(1_700_000_001, 999_000), &[4; 70]),
    ];
    for res in [TsResolution::Micro, TsResolution::Nano] {
        let bytes = write_pcap(res, &frames);
        let mut r = CaptureReader::new(&bytes[..]).unwrap();
        assert_eq!(
            r.format(),
            CaptureFormat::Pcap {
                resolution: res,
                big_endian: false
            }
        );
        assert_eq!(r.link_type(), Some(1));
        for (i, (ts, d)) in frames.iter().enumerate() {
            let rec = r.next_record().unwrap().unwrap();
            assert_eq!(rec.number, i as u64 + 1);
            assert_eq!(rec.timestamp, *ts);
            assert_eq!(rec.data, *d);
            assert!(!rec.is_truncated());
        }
        assert!(r.next_record().is_none());
        assert!(r.next_record().is_none());
    }
}

#[test]
fn truncated_last_record_then_end() {
    let bytes = write_pcap(
        TsResolution::Micro,
        &[
            (Duration::from_secs(1), &[1; 40]),
            (Duration::from_secs(2), &[2; 40]),
        ],
    );
    for cut in [bytes.len() - 1, bytes.len() - 40, bytes.len() - 50] {
        let mut r = CaptureReader::new(&bytes[..cut]).unwrap();
        assert_eq!(r.next_record().unwrap().unwrap().number, 1);
        let err = r.next_record().unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                CaptureError::Truncated {
                    number: 2,
                    offset: 80,
                    ..
                }
            ),
            "{err}"
        );
        assert!(r.next_record().is_none());
    }
    // Cut exactly between records: a clean end.
    let mut r = CaptureReader::new(&bytes[..80]).unwrap();
    assert!(r.next_record().unwrap().is_ok());
    assert!(r.next_record().is_none());
}

#[test]
fn header_errors() {
    assert!(matches!(
        CaptureReader::new(&b"\xa1\xb2"[..]),
        Err(CaptureError::Truncated { number: 0, .. })
    ));
    assert!(matches!(
        CaptureReader::new(&b"GIF89a.........................."[..]),
        Err(CaptureError::UnknownFormat { magic: 0x4749_4638 })
    ));
    let bytes = write_pcap(TsResolution::Micro, &[]);
    for n in 4..bytes.len() {
        assert!(matches!(
            CaptureReader::new(&bytes[..n]),
            Err(CaptureError::Truncated { number: 0, .. })
        ));
    }
    let mut r = CaptureReader::new(&bytes[..]).unwrap();
    assert!(r.next_record().is_none());
}

#[test]
fn huge_record_is_skipped_to_the_end() {
    let mut bytes = write_pcap(TsResolution::Micro, &[(Duration::from_secs(1), &[1; 4])]);
    // incl_len = orig_len = 0x7fff_ffff
    bytes[24 + 8..24 + 16].copy_from_slice(&[0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f]);
    let mut r = CaptureReader::new(&bytes[..]).unwrap();
    let err = r.next_record().unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            CaptureError::Skipped {
                number: 1,
                offset: 24,
                skipped: 20,
                resumed: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("no plausible record header"),
        "{err}"
    );
    assert!(r.next_record().is_none());
}

/// Garbage between records (a damaged header and what follows it): the reader skips to the
/// next plausible record header, says how many bytes it skipped, and reads on, also when the
/// input arrives one byte at a time.
#[test]
fn pcap_resynchronises_after_garbage() {
    let frames: Vec<(Duration, Vec<u8>)> = (0..6u8)
        .map(|i| {
            (
                Duration::new(1_700_000_000 + u64::from(i), 1000),
                vec![i; 60],
            )
        })
        .collect();
    let refs: Vec<(Duration, &[u8])> = frames.iter().map(|(t, d)| (*t, &d[..])).collect();
    let good = write_pcap(TsResolution::Micro, &refs);
    // Record 3 starts at 24 + 2 * 76; its header is overwritten with 0xee bytes.
    let mut bad = good.clone();
    bad[176..192].fill(0xee);
    for trickle in [false, true] {
        let mut r = if trickle {
            CaptureReader::new(Box::new(Trickle(&bad[..])) as Box<dyn Read>).unwrap()
        } else {
            CaptureReader::new(Box::new(&bad[..]) as Box<dyn Read>).unwrap()
        };
        let mut got = Vec::new();
        let mut errs = Vec::new();
        while let Some(rec) = r.next_record() {
            match rec {
                Ok(rec) => got.push((rec.number, rec.data[0])),
                Err(e) => errs.push(e),
            }
        }
        assert_eq!(
            got,
            [(1, 0), (2, 1), (4, 3), (5, 4), (6, 5)],
            "trickle {trickle}"
        );
        assert!(
            matches!(
                errs[..],
                [CaptureError::Skipped {
                    number: 3,
                    offset: 176,
                    skipped: 76,
                    resumed: true,
                    ..
                }]
            ),
            "{errs:?}"
        );
    }
}

/// A reader that hands out one byte at a time.
struct Trickle<'a>(&'a [u8]);

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match (self.0.split_first(), buf.first_mut()) {
            (Some((b, rest)), Some(out)) => {
                *out = *b;
                self.0 = rest;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

#[test]
fn byte_at_a_time() {
    let frames: Vec<(Duration, Vec<u8>)> = (0..50u8)
        .map(|i| {
            (
                Duration::from_secs(u64::from(i)),
                vec![i; usize::from(i) + 1],
            )
        })
        .collect();
    let refs: Vec<(Duration, &[u8])> = frames.iter().map(|(t, d)| (*t, &d[..])).collect();
    let bytes = write_pcap(TsResolution::Nano, &refs);
    let mut r = CaptureReader::new(Trickle(&bytes)).unwrap();
    let mut n = 0;
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        assert_eq!(rec.data, &frames[n].1[..]);
        n += 1;
    }
    assert_eq!(n, 50);
}

/// pcapng writer for tests: blocks in either byte order.
struct Ng {
    big: bool,
    out: Vec<u8>,
}

impl Ng {
    fn u16(&self, v: u16) -> [u8; 2] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn u32(&self, v: u32) -> [u8; 4] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn block(&mut self, ty: u32, body: &[u8]) {
        let pad = (4 - body.len() % 4) % 4;
        let len = u32::try_from(12 + body.len() + pad).unwrap();
        let (t, l) = (self.u32(ty), self.u32(len));
        self.out.extend_from_slice(&t);
        self.out.extend_from_slice(&l);
        self.out.extend_from_slice(body);
        self.out.extend(std::iter::repeat_n(0, pad));
        self.out.extend_from_slice(&l);
    }

    fn shb(&mut self, big: bool) {
        self.big = big;
        let mut b = self.u32(0x1a2b_3c4d).to_vec();
        b.extend_from_slice(&self.u16(1));
        b.extend_from_slice(&self.u16(0));
        b.extend_from_slice(&[0xff; 8]);
        self.block(0x0a0d_0d0a, &b);
    }

    fn idb(&mut self, link_type: u16, tsresol: Option<u8>, tsoffset: Option<i64>) {
        let mut b = self.u16(link_type).to_vec();
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.u32(65535));
        if let Some(r) = tsresol {
            b.extend_from_slice(&self.u16(9));
            b.extend_from_slice(&self.u16(1));
            b.extend_from_slice(&[r, 0, 0, 0]);
        }
        if let Some(o) = tsoffset {
            b.extend_from_slice(&self.u16(14));
            b.extend_from_slice(&self.u16(8));
            let o = if self.big {
                o.to_be_bytes()
            } else {
                o.to_le_bytes()
            };
            b.extend_from_slice(&o);
        }
        if tsresol.is_some() || tsoffset.is_some() {
            b.extend_from_slice(&[0, 0, 0, 0]);
        }
        self.block(1, &b);
    }

    fn epb(&mut self, interface: u32, ts: u64, data: &[u8], orig_len: u32) {
        let mut b = self.u32(interface).to_vec();
        b.extend_from_slice(&self.u32((ts >> 32) as u32));
        b.extend_from_slice(&self.u32(ts as u32));
        b.extend_from_slice(&self.u32(u32::try_from(data.len()).unwrap()));
        b.extend_from_slice(&self.u32(orig_len));
        b.extend_from_slice(data);
        b.extend(std::iter::repeat_n(0, (4 - data.len() % 4) % 4));
        // An epb_flags option, which must not cost anything.
        b.extend_from_slice(&self.u16(2));
        b.extend_from_slice(&self.u16(4));
        b.extend_from_slice(&self.u32(1));
        b.extend_from_slice(&[0, 0, 0, 0]);
        self.block(6, &b);
    }
}

fn sample_pcapng() -> Vec<u8> {
    let mut ng = Ng {
        big: false,
        out: Vec::new(),
    };
    ng.shb(false);
    ng.idb(1, None, None);
    ng.idb(276, Some(9), Some(100));
    ng.block(0x1234, &[1, 2, 3, 4, 5]); // unknown block
    ng.block(4, &[0, 0, 0, 0]); // NRB, end of records only
    ng.epb(0, 1_700_000_000_123_456, &[0xaa; 5], 5);
    ng.epb(1, 1_700_000_000_123_456_789, &[0xbb; 8], 60);
    let mut spb = ng.u32(3).to_vec();
    spb.extend_from_slice(&[0xcc, 0xcc, 0xcc, 0]);
    ng.block(3, &spb);
    ng.block(5, &{
        let mut b = ng.u32(0).to_vec();
        b.extend_from_slice(&[0; 8]);
        b
    }); // ISB
        // Second section, big-endian: binary resolution 2^-20, ERF.
    ng.shb(true);
    ng.idb(197, Some(0x80 | 20), None);
    ng.epb(0, (1_700_000_002u64 << 20) | (1 << 19), &[0xdd; 3], 3);
    // Obsolete Packet Block: interface 0 (u16), drops, timestamp, lengths.
    let mut pb = ng.u16(0).to_vec();
    pb.extend_from_slice(&ng.u16(0));
    pb.extend_from_slice(&ng.u32(0));
    pb.extend_from_slice(&ng.u32(1 << 20));
    pb.extend_from_slice(&ng.u32(2));
    pb.extend_from_slice(&ng.u32(2));
    pb.extend_from_slice(&[0xee, 0xee, 0, 0]);
    ng.block(2, &pb);
    ng.out
}

#[test]
fn pcapng_sections_interfaces_resolutions() {
    let bytes = sample_pcapng();
    let mut r = CaptureReader::new(&bytes[..]).unwrap();
    assert_eq!(r.format(), CaptureFormat::PcapNg);
    assert_eq!(r.link_type(), None);
    let mut got = Vec::new();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        got.push((
            rec.number,
            rec.interface,
            rec.link_type,
            rec.timestamp,
            rec.data.to_vec(),
            rec.orig_len,
        ));
    }
    assert_eq!(
        got,
        vec![
            (
                1,
                0,
                1,
                Duration::new(1_700_000_000, 123_456_000),
                vec![0xaa; 5],
                5
            ),
            (
                2,
                1,
                276,
                Duration::new(1_700_000_100, 123_456_789),
                vec![0xbb; 8],
                60
            ),
            (3, 0, 1, Duration::ZERO, vec![0xcc; 3], 3),
            (
                4,
                0,
                197,
                Duration::new(1_700_000_002, 500_000_000),
                vec![0xdd; 3],
                3
            ),
            (5, 0, 197, Duration::new(1, 0), vec![0xee; 2], 2),
        ]
    );
    assert_eq!(r.records_read(), 5);
}

#[test]
fn pcapng_truncated_and_corrupt() {
    let bytes = sample_pcapng();
    // Cut inside the last block: four good records, then one error, then the end.
    let mut r = CaptureReader::new(&bytes[..bytes.len() - 3]).unwrap();
    let mut ok = 0;
    let mut errs = Vec::new();
    while let Some(rec) = r.next_record() {
        match rec {
            Ok(_) => ok += 1,
            Err(e) => errs.push(e),
        }
    }
    assert_eq!(ok, 4);
    assert!(
        matches!(errs[..], [CaptureError::Truncated { number: 5, .. }]),
        "{errs:?}"
    );
    // Every cut gives some records then at most one error, never a panic or a loop.
    for cut in 0..bytes.len() {
        if let Ok(mut r) = CaptureReader::new(&bytes[..cut]) {
            let mut n = 0;
            while let Some(rec) = r.next_record() {
                n += 1;
                assert!(n <= 6);
                if rec.is_err() {
                    assert!(r.next_record().is_none());
                    break;
                }
            }
        }
    }
    // An EPB naming an interface that does not exist.
    let mut ng = Ng {
        big: false,
        out: Vec::new(),
    };
    ng.shb(false);
    ng.idb(1, None, None);
    ng.epb(3, 0, &[1], 1);
    let mut r = CaptureReader::new(&ng.out[..]).unwrap();
    let err = r.next_record().unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            CaptureError::Skipped {
                number: 1,
                offset: 48,
                resumed: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("interface 3"), "{err}");
    assert!(r.next_record().is_none());
}

#[test]
fn big_endian_pcap() {
    let mut b = Vec::new();
    b.extend_from_slice(&0xa1b2_3c4du32.to_be_bytes());
    b.extend_from_slice(&2u16.to_be_bytes());
    b.extend_from_slice(&4u16.to_be_bytes());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&65535u32.to_be_bytes());
    b.extend_from_slice(&(0x1000_0000u32 | 1).to_be_bytes());
    for v in [1_700_000_000u32, 999_999_999, 2, 4] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b.extend_from_slice(&[9, 9]);
    let mut r = CaptureReader::new(&b[..]).unwrap();
    assert_eq!(
        r.format(),
        CaptureFormat::Pcap {
            resolution: TsResolution::Nano,
            big_endian: true
        }
    );
    assert_eq!(r.link_type(), Some(0x1000_0001));
    let rec = r.next_record().unwrap().unwrap();
    assert_eq!(rec.timestamp, Duration::new(1_700_000_000, 999_999_999));
    assert_eq!(
        (rec.data, rec.orig_len, rec.is_truncated()),
        (&[9u8, 9][..], 4, true)
    );
    assert!(r.next_record().is_none());
}

/// Every single-byte change of a pcapng file reads to an end without a panic: its records,
/// with at most one skipped region or final error per damaged block, never more items than
/// blocks.
#[test]
fn pcapng_byte_flips() {
    let bytes = sample_pcapng();
    for at in 0..bytes.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[at] ^= flip;
            let Ok(mut r) = CaptureReader::new(&b[..]) else {
                continue;
            };
            let mut n = 0;
            while let Some(rec) = r.next_record() {
                n += 1;
                assert!(n <= 8, "byte {at} ^ {flip:#x}");
                if let Err(e) = rec {
                    if !matches!(e, CaptureError::Skipped { resumed: true, .. }) {
                        assert!(r.next_record().is_none());
                        break;
                    }
                }
            }
        }
    }
}
