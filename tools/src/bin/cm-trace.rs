//! `cm-trace`: decode InfiniBand CM MADs from pcap / pcapng captures.
//!
//! ```text
//! cm-trace FILE...          one line per CM MAD, then a summary
//! cm-trace --json FILE...   one JSON object per CM MAD (schema: ibcm_tools::render::JsonEvent)
//! ```
//! `-` reads standard input. Malformed frames are reported with their number and reason and
//! never stop the run. The exit status is non-zero only when a file cannot be read at all.

use std::io::{self, BufWriter, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use ibcm_mad::capture::CaptureReader;
use ibcm_tools::render;
use ibcm_tools::trace::{classify, Item, Totals};

/// Decode InfiniBand CM (MAD class 0x07) messages from capture files.
#[derive(Debug, Parser)]
#[command(name = "cm-trace", version, about)]
struct Args {
    /// One JSON object per CM MAD instead of text.
    #[arg(long)]
    json: bool,
    /// Capture files (pcap, pcapng; `-` for standard input).
    #[arg(required = true)]
    files: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut failed = false;
    let multi = args.files.len() > 1;
    let mut grand = Totals::default();
    for file in &args.files {
        match run_file(&args, file, multi, &mut out, &mut grand) {
            Ok(()) => {}
            Err(e) => {
                let _ = out.flush();
                eprintln!("cm-trace: {file}: {e:#}");
                failed = true;
            }
        }
    }
    if let Err(e) = out.flush() {
        if e.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("cm-trace: {e}");
            return ExitCode::FAILURE;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn open(file: &str) -> Result<CaptureReader<Box<dyn Read>>> {
    let reader: Box<dyn Read> = if file == "-" {
        Box::new(io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(file).with_context(|| "cannot open")?)
    };
    CaptureReader::new(reader).with_context(|| "not a readable capture")
}

fn run_file(
    args: &Args,
    file: &str,
    multi: bool,
    out: &mut impl Write,
    grand: &mut Totals,
) -> Result<()> {
    let mut reader = open(file)?;
    let mut totals = Totals::default();
    let mut t0: Option<Duration> = None;
    if multi && !args.json {
        writeln!(out, "== {file}")?;
    }
    while let Some(rec) = reader.next_record() {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                // A damaged record ends the file (the reader cannot resynchronise).
                totals.malformed += 1;
                report_malformed(args, out, file, &e.to_string())?;
                break;
            }
        };
        let t = *t0.get_or_insert(rec.timestamp);
        let item = classify(&rec);
        totals.count(&item);
        match &item {
            Item::Cm(ev) => {
                if args.json {
                    render::write_json(out, ev, multi.then_some(file))?;
                } else {
                    render::write_text(out, ev, t)?;
                }
            }
            Item::Malformed { frame, reason } => {
                report_malformed(args, out, file, &format!("frame {frame}: {reason}"))?;
            }
            Item::NonCm { .. } => {}
        }
    }
    let summary = format!(
        "{} frames: {} CM, {} non-CM, {} malformed{}",
        totals.frames,
        totals.cm,
        totals.non_cm,
        totals.malformed,
        if totals.bad_icrc > 0 {
            format!(", {} CM with bad ICRC", totals.bad_icrc)
        } else {
            String::new()
        }
    );
    if args.json {
        out.flush()?;
        eprintln!("cm-trace: {file}: {summary}");
    } else {
        writeln!(out, "-- {summary}")?;
    }
    grand.frames += totals.frames;
    Ok(())
}

fn report_malformed(args: &Args, out: &mut impl Write, file: &str, what: &str) -> Result<()> {
    if args.json {
        out.flush()?;
        eprintln!("cm-trace: {file}: malformed: {what}");
    } else {
        writeln!(out, "!! malformed: {what}")?;
    }
    Ok(())
}
