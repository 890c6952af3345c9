//! Every `docs/NAME.md` cited anywhere in the repository exists, and every section number cited
//! with it (`docs/wire.md §2.4`, `docs/xrc.md §1.2–1.3`) is a heading of that file; nothing cites
//! documents that live outside the repository (`spec/…md`).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Source and text files of the repository (no build output, no VCS data, no captures).
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | ".git" | "out" | "build" | "corpus" | "artifacts"
            ) {
                files(&p, out);
            }
        } else if [".rs", ".md", ".py", ".sh", ".c", ".h", ".toml", "run"]
            .iter()
            .any(|x| name.ends_with(x))
        {
            out.push(p);
        }
    }
}

/// The section numbers of a Markdown file's headings (`## 2.4 REP …` → "2.4").
fn sections(md: &str) -> BTreeSet<String> {
    md.lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| {
            let t = l.trim_start_matches('#').trim_start();
            let t = t.strip_prefix('§').unwrap_or(t);
            let num: String = t
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let num = num.trim_end_matches('.').to_owned();
            (!num.is_empty()).then_some(num)
        })
        .collect()
}

/// `(doc, section)` pairs cited in `text`; section is empty for a bare `docs/x.md`.
fn citations(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("docs/") {
        rest = &rest[i + 5..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        let after = &rest[name.len()..];
        let Some(after) = after.strip_prefix(".md") else {
            continue;
        };
        let mut secs = Vec::new();
        let mut t = after.trim_start_matches(' ');
        if let Some(s) = t.strip_prefix('§') {
            t = s.trim_start();
            for part in t.split(['–', '-']).take(2) {
                let n: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect();
                let n = n.trim_end_matches('.').to_owned();
                if n.is_empty() {
                    break;
                }
                secs.push(n);
                if part.len() > secs.last().map_or(0, String::len) {
                    break; // text after the number: no range
                }
            }
        }
        if secs.is_empty() {
            out.push((format!("{name}.md"), String::new()));
        }
        for s in secs {
            out.push((format!("{name}.md"), s));
        }
    }
    out
}

#[test]
fn every_cited_doc_and_section_exists() {
    let root = root();
    let mut all = Vec::new();
    files(&root, &mut all);
    assert!(all.len() > 100, "walked only {} files", all.len());
    let mut bad = Vec::new();
    let mut n = 0;
    for f in &all {
        let Ok(text) = fs::read_to_string(f) else {
            continue;
        };
        let rel = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        if rel.ends_with("doc_citations.rs") {
            continue; // this file names the patterns it looks for
        }
        if text.contains("spec/cm-wire.md")
            || text.contains("spec/xrc.md")
            || text.contains("spec/framing.md")
        {
            bad.push(format!(
                "{rel}: cites spec/…md, which is not in this repository"
            ));
        }
        for (doc, sec) in citations(&text) {
            n += 1;
            let path = root.join("docs").join(&doc);
            let Ok(md) = fs::read_to_string(&path) else {
                bad.push(format!("{rel}: docs/{doc} does not exist"));
                continue;
            };
            if !sec.is_empty() && !sections(&md).contains(&sec) {
                bad.push(format!("{rel}: docs/{doc} has no section {sec}"));
            }
        }
    }
    assert!(n > 50, "found only {n} citations: the scanner is broken");
    assert!(
        bad.is_empty(),
        "{} bad citations:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn the_scanner_reads_ranges_and_bare_names() {
    let c = citations("see docs/xrc.md §1.2–1.3 and docs/wire.md §2.4. Also docs/README.md.");
    assert_eq!(
        c,
        vec![
            ("xrc.md".into(), "1.2".into()),
            ("xrc.md".into(), "1.3".into()),
            ("wire.md".into(), "2.4".into()),
            ("README.md".into(), String::new()),
        ]
    );
    assert!(sections("## 2.4 REP (0x0013)\n### §7.1 x\n").contains("7.1"));
}
