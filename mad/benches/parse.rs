//! MAD parse+validate throughput against memcpy of 256-byte buffers, measured in the same run,
//! plus ICRC throughput.
//!
//! Run with `cargo bench -p ibcm-mad --bench parse`. The last lines are
//! `parse: <MADs/s>; memcpy: <buffers/s>; ratio: <x.xx>` and `icrc: <GB/s> ...`.
//!
//! This is a plain bench binary (not criterion) so that it can print the ratio of two
//! measurements taken in one run. Each figure is the median of several timed rounds.

#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use ibcm_mad::Mad;

const MADS: [&[u8; 256]; 10] = [
    include_bytes!("../../fixtures/mads/nvme_f5_req.bin"),
    include_bytes!("../../fixtures/mads/nvme_f6_rep.bin"),
    include_bytes!("../../fixtures/mads/nvme_f7_rtu.bin"),
    include_bytes!("../../fixtures/mads/nvme_f64_dreq.bin"),
    include_bytes!("../../fixtures/mads/nvme_f65_drep.bin"),
    include_bytes!("../../fixtures/mads/ibping_f3_req.bin"),
    include_bytes!("../../fixtures/mads/ibping_f4_rep.bin"),
    include_bytes!("../../fixtures/mads/ibping_f5_rtu.bin"),
    include_bytes!("../../fixtures/mads/ibping_f126_dreq.bin"),
    include_bytes!("../../fixtures/mads/ibping_f127_drep.bin"),
];

/// Runs `f` (which processes `per_call` items) repeatedly for about `dur`, `rounds` times, and
/// returns the median rate in items per second.
fn rate(rounds: usize, dur: Duration, per_call: u64, mut f: impl FnMut()) -> f64 {
    // Calibrate the number of calls per round.
    let mut calls = 1u64;
    loop {
        let t = Instant::now();
        for _ in 0..calls {
            f();
        }
        if t.elapsed() >= dur / 10 || calls > 1 << 40 {
            break;
        }
        calls *= 2;
    }
    let calls = calls * 10;
    let mut rates: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..calls {
                f();
            }
            (calls * per_call) as f64 / t.elapsed().as_secs_f64()
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick" || a == "--test");
    let (rounds, dur) = if quick {
        (3, Duration::from_millis(50))
    } else {
        (9, Duration::from_millis(400))
    };

    // A working set of 1024 MADs (256 KiB, L2-resident), cycling through the real ones.
    let src: Vec<[u8; 256]> = (0..1024).map(|i| *MADS[i % MADS.len()]).collect();
    let n = src.len() as u64;

    let parse = rate(rounds, dur, n, || {
        for m in &src {
            let r = Mad::parse(black_box(m));
            black_box(&r);
        }
    });

    let mut dst = vec![[0u8; 256]; src.len()];
    let memcpy = rate(rounds, dur, n, || {
        for (d, s) in dst.iter_mut().zip(&src) {
            d.copy_from_slice(black_box(s));
        }
        black_box(&dst);
    });

    // Emit, for completeness.
    let parsed: Vec<Mad> = src.iter().filter_map(|m| Mad::parse(m).ok()).collect();
    let mut out = [0u8; 256];
    let emit = rate(rounds, dur, parsed.len() as u64, || {
        for m in &parsed {
            let _ = black_box(m).emit_into(&mut out);
            black_box(&out);
        }
    });

    println!(
        "parse+validate: {parse:.0} MADs/s ({:.1} ns/MAD)",
        1e9 / parse
    );
    println!(
        "emit:           {emit:.0} MADs/s ({:.1} ns/MAD)",
        1e9 / emit
    );
    println!(
        "memcpy 256 B:   {memcpy:.0} copies/s ({:.1} ns/copy)",
        1e9 / memcpy
    );
    println!(
        "parse: {parse:.0} MADs/s; memcpy: {memcpy:.0} buffers/s; ratio: {:.2}",
        parse / memcpy
    );

    icrc_bench(rounds, dur);
}

/// ICRC over a RoCEv2 CM frame and over a 4 KiB RoCEv2 frame.
fn icrc_bench(rounds: usize, dur: Duration) {
    use ibcm_mad::frame::icrc;
    let frame: &[u8] = include_bytes!("../../fixtures/mads/frame_nvme_f5_req.bin");
    let per = rate(rounds, dur, 1, || {
        black_box(icrc::rocev2_frame_icrc(black_box(frame)));
    });
    let bytes = frame.len() as f64;
    println!(
        "icrc: {:.2} GB/s over {}-byte RoCEv2 CM frames ({:.0} frames/s)",
        per * bytes / 1e9,
        frame.len(),
        per
    );
}
