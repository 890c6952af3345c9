//! Rough throughput checks for the frame decoder and the capture reader. Ignored by default
//! (timing in debug builds means nothing); run with
//! `cargo test -p ibcm-trace --release --test frame_perf -- --ignored --nocapture`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use ibcm_mad::frame::decode;
use ibcm_trace::{CaptureReader, PcapFileWriter, TsResolution};

const FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../fixtures/captures/real/rocev2_mlx_nvme-discover.pcap"
);

/// Frame 5 (CM REQ, 322 bytes).
fn req_frame() -> Vec<u8> {
    let mut r = CaptureReader::open(FILE).unwrap();
    loop {
        let rec = r.next_record().unwrap().unwrap();
        if rec.number == 5 {
            return rec.data.to_vec();
        }
    }
}

/// Best of five runs of about 100 ms each, in ns per call.
fn ns_per_iter(mut f: impl FnMut()) -> f64 {
    let mut iters = 1_000u64;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        if t.elapsed() > Duration::from_millis(100) {
            break;
        }
        iters *= 4;
    }
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

#[test]
#[ignore = "timing; run in release"]
fn decode_speed() {
    let frame = req_frame();
    assert_eq!(frame.len(), 322);
    let ns = ns_per_iter(|| {
        let d = decode(1, black_box(&frame)).unwrap();
        black_box(d.mad());
    });
    println!("decode + ICRC of a 322-byte RoCEv2 CM frame: {ns:.1} ns");
}

#[test]
#[ignore = "timing; run in release"]
fn capture_read_speed() {
    let frame = req_frame();
    let mut w = PcapFileWriter::new(Vec::new(), 1, TsResolution::Micro).unwrap();
    let n = 200_000u64;
    for i in 0..n {
        w.write(Duration::from_micros(1_700_000_000_000_000 + i), &frame)
            .unwrap();
    }
    let bytes = w.into_inner().unwrap();
    let t = Instant::now();
    let mut r = CaptureReader::new(&bytes[..]).unwrap();
    let mut count = 0u64;
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        black_box(decode(rec.link_type, rec.data).unwrap());
        count += 1;
    }
    let el = t.elapsed();
    assert_eq!(count, n);
    println!(
        "read + decode: {:.2} M records/s ({:.0} ns/record)",
        n as f64 / el.as_secs_f64() / 1e6,
        el.as_nanos() as f64 / n as f64
    );
}

#[test]
#[ignore = "timing; run in release"]
fn decode_parts() {
    use ibcm_mad::frame::{decode_with, icrc, DecodeConfig, Encap};
    let frame = req_frame();
    let cfg = DecodeConfig {
        verify_crc: false,
        ..DecodeConfig::DEFAULT
    };
    let ns = ns_per_iter(|| {
        black_box(decode_with(&cfg, 1, black_box(&frame)).unwrap());
    });
    println!("decode without CRC: {ns:.1} ns");
    let ns = ns_per_iter(|| {
        black_box(icrc::compute(Encap::RoceV2Ipv4, black_box(&frame[14..318])).unwrap());
    });
    println!("icrc::compute: {ns:.1} ns");
    let ns = ns_per_iter(|| {
        black_box(crc32fast::hash(black_box(&frame[14..318])));
    });
    println!("crc32fast::hash over 304 bytes: {ns:.1} ns");
}

/// For instruction counting under valgrind: `FRAME_PERF_N` decodes of the CM REQ
/// (`FRAME_PERF_CRC=0` to skip the CRC).
#[test]
#[ignore = "for valgrind instruction counts"]
fn decode_loop() {
    let frame = req_frame();
    let n: u64 = std::env::var("FRAME_PERF_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let cfg = ibcm_mad::frame::DecodeConfig {
        verify_crc: std::env::var("FRAME_PERF_CRC").map_or(true, |v| v != "0"),
        ..Default::default()
    };
    for _ in 0..n {
        black_box(ibcm_mad::frame::decode_with(&cfg, 1, black_box(&frame)).unwrap());
    }
}
