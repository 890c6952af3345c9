//! Every `docs/NAME.md` cited anywhere in the repository exists, and every section number cited
//! with it (`docs/wire.md §2.4`, `docs/xrc.md §1.2–1.3`) is a heading of that file; nothing cites
//! documents that live outside the repository (`spec/…md`); and every repository path written
//! in backticks in the Markdown documents (`cm/src/proto/conn.rs`, `tools/trace/src/capture/`)
//! exists, so the documents follow the tree when files move.

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

/// The Markdown documents whose backticked repository paths must exist: `docs/*.md`, the
/// READMEs and the fixtures' provenance notes.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = [
        "README.md",
        "xrc/README.md",
        "tests/conformance/README.md",
        "fuzz/README.md",
        "fixtures/mads/README.md",
    ]
    .iter()
    .map(|p| root.join(p))
    .collect();
    for dir in ["docs", "fixtures"] {
        let mut mds: Vec<PathBuf> = fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}/: {e}"))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        mds.sort();
        out.extend(mds);
    }
    out
}

/// The top-level folders a repository path starts with.
const ROOTS: [&str; 9] = [
    "cm/",
    "mad/",
    "xrc/",
    "tools/",
    "tests/",
    "fixtures/",
    "docs/",
    "fuzz/",
    ".ci/",
];

/// Repository paths written in backticks in `md`, each with its line number, a trailing
/// `:line` or `#anchor` removed. Spans with spaces or globs (`*`, `<`, `{`) are not paths.
///
/// A section headed "Moves of …" is the record of an earlier layout (docs/README.md: an
/// old → new table): of its table rows only the last cell, the current place, is read.
fn backticked_paths(md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut moves: Option<usize> = None; // heading level of the "Moves of …" section we are in
    for (i, line) in md.lines().enumerate() {
        if line.starts_with('#') {
            let level = line.chars().take_while(|&c| c == '#').count();
            if moves.is_some_and(|l| level <= l) {
                moves = None;
            }
            if line[level..].trim_start().starts_with("Moves of") {
                moves = Some(level);
            }
        }
        let text = match moves {
            Some(_) if line.starts_with('|') => line
                .trim_end()
                .trim_end_matches('|')
                .rsplit('|')
                .next()
                .unwrap_or(""),
            _ => line,
        };
        // odd-numbered pieces between backticks are code spans
        for span in text.split('`').skip(1).step_by(2) {
            if !ROOTS.iter().any(|r| span.starts_with(r))
                || span.contains(|c: char| c.is_whitespace() || matches!(c, '*' | '<' | '{'))
            {
                continue;
            }
            let mut p = span.split('#').next().unwrap_or(span);
            if let Some((head, tail)) = p.rsplit_once(':') {
                if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '-') {
                    p = head;
                }
            }
            out.push((i + 1, p.to_owned()));
        }
    }
    out
}

#[test]
fn every_backticked_path_in_the_documents_exists() {
    let root = root();
    let mut bad = Vec::new();
    let mut n = 0;
    for doc in documents(&root) {
        let rel = doc
            .strip_prefix(&root)
            .unwrap_or(&doc)
            .display()
            .to_string();
        let md = fs::read_to_string(&doc).unwrap_or_else(|e| panic!("{rel}: {e}"));
        for (line, path) in backticked_paths(&md) {
            n += 1;
            if !root.join(&path).exists() {
                bad.push(format!("{rel}:{line}: `{path}` does not exist"));
            }
        }
    }
    assert!(n > 50, "found only {n} paths: the scanner is broken");
    assert!(
        bad.is_empty(),
        "{} paths that do not exist:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn the_path_scanner_skips_non_paths_and_strips_lines() {
    let md = "a `cm/src/lib.rs:12` b `tools/trace/` c `mad/src/cm/<message>.rs` d `cargo test`\n\
              e `docs/wire.md#x` f `xrc/src/{a,b}.rs` g `tests/run --install-only` h `src/x.rs`";
    assert_eq!(
        backticked_paths(md),
        vec![
            (1, "cm/src/lib.rs".to_owned()),
            (1, "tools/trace/".to_owned()),
            (2, "docs/wire.md".to_owned()),
        ]
    );
    let moves = "## Moves of May\n| x | `cm/old.rs` | `cm/new.rs` |\n`cm/a.rs`\n\
                 ### sub\n| `cm/b.rs` | `cm/c.rs` |\n## Next\n| `cm/d.rs` | `cm/e.rs` |";
    let found: Vec<String> = backticked_paths(moves)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        found,
        ["cm/new.rs", "cm/a.rs", "cm/c.rs", "cm/d.rs", "cm/e.rs"]
    );
}
