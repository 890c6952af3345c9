//! Tests of the run loop.

use super::json::BATCH;
use super::*;
use crate::capture::{CaptureReader, PcapFileWriter, TsResolution};
use crate::trace::{classify, Item};

/// `--json` with malformed records between CM MADs (several batches): every CM MAD gets
/// its line, in order, and each malformed record its report.
#[test]
fn json_with_malformed_records_between_batches() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/captures/kernel/establish_dreq_active.pcap");
    let mut frames = Vec::new();
    let mut r = CaptureReader::open(&fixture).unwrap();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        if matches!(classify(&rec), Item::Cm(_)) {
            frames.push((rec.timestamp, rec.data.to_vec()));
        }
    }
    assert!(!frames.is_empty());
    let mut w = PcapFileWriter::new(Vec::new(), 1, TsResolution::Micro).unwrap();
    let mut malformed = Vec::new();
    let mut n = 0u64;
    for i in 0..(3 * BATCH) {
        let (ts, data) = &frames[i % frames.len()];
        n += 1;
        if i % 97 == 5 || i == BATCH - 1 || i == BATCH {
            // An IPv4 packet cut short: a malformed frame.
            w.write(*ts, &data[..40]).unwrap();
            malformed.push(n);
        } else {
            w.write(*ts, data).unwrap();
        }
    }
    let bytes = w.into_inner().unwrap();
    let path = std::env::temp_dir().join(format!("cm-trace-app-test-{}.pcap", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let file = path.to_str().unwrap().to_string();
    let opts = Options {
        view: View::Json,
        ..Options::default()
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let res = run(&opts, std::slice::from_ref(&file), &mut out, &mut err);
    let _ = std::fs::remove_file(&path);
    let res = res.unwrap();
    assert_eq!(res.stats.malformed, malformed.len() as u64);
    let out = String::from_utf8(out).unwrap();
    let err = String::from_utf8(err).unwrap();
    let shown: Vec<u64> = out
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["frame"].as_u64().unwrap()
        })
        .collect();
    let cm_frames: Vec<u64> = (1..=n).filter(|f| !malformed.contains(f)).collect();
    assert_eq!(shown, cm_frames);
    for f in &malformed {
        assert!(
            err.contains(&format!("malformed: frame {f}: ")),
            "frame {f} not reported: {err}"
        );
    }
}
