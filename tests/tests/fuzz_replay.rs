//! Stable replay of the fuzz targets over their seed corpus, the regressions and the fixtures.

use std::path::Path;

use ibcm_tests::fuzz::{self, TARGETS};
use ibcm_tests::{all_captures, fixtures_dir};

fn files_in(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    v.sort();
    v.into_iter()
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".keep"))
        .map(|p| std::fs::read(&p).unwrap())
        .collect()
}

#[test]
fn replay_corpus_and_regressions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (name, body) in TARGETS {
        let mut inputs = files_in(&root.join("fuzz/corpus").join(name));
        let corpus = inputs.len();
        inputs.extend(files_in(
            &fixtures_dir().join("fuzz-regressions").join(name),
        ));
        assert!(
            corpus > 0,
            "{name}: empty seed corpus (run fuzz/make_corpus.py)"
        );
        for input in &inputs {
            body(input);
            // Every prefix too: truncations are where parsers break.
            for n in [0, 1, 7, 23, 24, 100, 255, 256] {
                if n < input.len() {
                    body(&input[..n]);
                }
            }
        }
    }
}

#[test]
fn fixtures_through_every_target() {
    for mad in files_in(&fixtures_dir().join("mads")) {
        fuzz::mad_parse(&mad);
        fuzz::mad_roundtrip(&mad);
    }
    for cap in all_captures() {
        let bytes = std::fs::read(&cap).unwrap();
        fuzz::capture_read(&bytes);
        // The whole run over the captures with SA MADs (the others are in its corpus).
        let name = cap.to_string_lossy();
        if name.contains("ib_erf_infiniband")
            || name.contains("ib_linktype247")
            || name.contains("sa_pathrecord")
        {
            fuzz::trace_views(&bytes);
        }
    }
}
