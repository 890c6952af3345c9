//! The cm-trace run loop: inputs → records → CM events → connection tracking → the chosen
//! view. The binary (`src/bin/cm-trace.rs`) only parses the command line; the tests call
//! [`run`] directly.

mod file;
mod json;
mod options;
mod refresh;
mod track;

use std::io::{self, Write};

use crate::input::{OpenError, Opened, Source};
use crate::report::{stats_json, stats_text};
use crate::stats::TraceStats;
use crate::style::Palette;
use crate::timeline::Timeline;

pub use options::{Options, View};

use file::run_file;
use track::FileCtx;

/// What a run found.
#[derive(Debug, Default)]
pub struct Outcomes {
    /// Inputs that could not be read at all (the exit status is non-zero when there are any).
    pub unreadable: u64,
    /// Inputs damaged before their end (an impossible record header): the rest of the file
    /// was not read (the exit status is non-zero when there are any).
    pub damaged: u64,
    /// Statistics over all inputs.
    pub stats: TraceStats,
}

/// `--timeline PATH: error`.
fn path_error(path: &std::path::Path, e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("--timeline {}: {e}", path.display()))
}

/// Checks the timeline's file name (`.svg`, or `.html` / `.htm` for an HTML page: no other
/// format is written, so `out.png` is refused) and creates the file; says whether it is HTML.
fn open_timeline(path: &std::path::Path) -> io::Result<(std::fs::File, bool)> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let html = match ext.as_deref() {
        Some("svg") => false,
        Some("html" | "htm") => true,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "--timeline {}: not written: the timeline is SVG (.svg) or HTML (.html) only",
                    path.display()
                ),
            ))
        }
    };
    let file = std::fs::File::create(path).map_err(|e| path_error(path, &e))?;
    Ok((file, html))
}

/// Decodes `files` (`-` = standard input) and writes the chosen view to `out`; errors and
/// (for JSON views) summaries go to `err`.
///
/// # Errors
/// I/O errors writing `out` (a closed pipe included); a timeline file name other than `.svg` /
/// `.html` / `.htm`, or one that cannot be created (both before any input is read), or an
/// error writing it (the message names the file). Unreadable
/// inputs are reported on `err` and counted in [`Outcomes::unreadable`].
pub fn run<W: Write + Send>(
    opts: &Options,
    files: &[String],
    out: &mut W,
    err: &mut dyn Write,
) -> io::Result<Outcomes> {
    let pal = Palette { on: opts.color };
    let mut result = Outcomes::default();
    // The timeline file is checked and created before any input is read.
    let mut timeline_out = match &opts.timeline {
        Some(path) => Some(open_timeline(path)?),
        None => None,
    };
    let mut timeline = opts
        .timeline
        .as_ref()
        .map(|_| Timeline::new(opts.timeline_max.max(1)));
    let multi = files.len() > 1;
    let live: Vec<String> = opts.interface.iter().cloned().collect();
    let inputs = if live.is_empty() { files } else { &live[..] };
    for file in inputs {
        let opened = if live.is_empty() {
            Source::open(file)
        } else {
            Source::open_live(file, opts.count)
        };
        let Opened {
            mut src,
            counter,
            size,
            pipe,
            wait,
            gzip,
        } = match opened {
            Ok(x) => x,
            Err(e) => {
                out.flush()?;
                let what = match &e {
                    OpenError::Io(_) => e.to_string(),
                    OpenError::Format(s) => s.clone(),
                };
                let _ = writeln!(err, "cm-trace: {file}: {what}");
                result.unreadable += 1;
                continue;
            }
        };
        if !live.is_empty() {
            // Said once the capture is open: from here on, packets are seen.
            let _ = writeln!(
                err,
                "cm-trace: capturing on {file} (RoCEv2 UDP 4791 and RoCEv1)"
            );
            let _ = err.flush();
        }
        if pipe
            && gzip
            && !opts.refresh.is_zero()
            && matches!(opts.view, View::Stats | View::StatsJson)
        {
            let _ = writeln!(
                err,
                "cm-trace: {file}: a gzip-compressed pipe: the statistics so far are shown as \
                 packets arrive, not on the --refresh timer"
            );
        }
        let timeline_file = timeline.as_mut().map_or(0, |t| t.file(file));
        let mut ctx = FileCtx {
            live: opts.live || pipe,
            damaged: false,
            opts,
            pal,
            err: &mut *err,
            file,
            multi,
            buf: Vec::with_capacity(1 << 16),
            stats: TraceStats::default(),
            timeline: timeline.as_mut(),
            timeline_file,
            expr_conns: std::collections::HashSet::new(),
            t0: std::time::Duration::ZERO,
        };
        run_file(&mut ctx, out, &mut src, wait.as_ref(), &counter, size)?;
        if ctx.damaged {
            result.damaged += 1;
        }
        let stats = std::mem::take(&mut ctx.stats);
        result.stats.merge(&stats);
        if crate::interrupt::requested() {
            let _ = writeln!(
                err,
                "cm-trace: {file}: interrupted: the input ends here (the summary is of what was read)"
            );
            break;
        }
    }
    let mut buf = Vec::new();
    match opts.view {
        View::Stats => stats_text(&mut buf, &result.stats, &pal),
        View::StatsJson => stats_json(&mut buf, &result.stats),
        _ => {}
    }
    out.write_all(&buf)?;
    out.flush()?;
    if let (Some(path), Some(t), Some((file, html))) =
        (&opts.timeline, &timeline, timeline_out.as_mut())
    {
        let doc = if *html { t.html() } else { t.svg() };
        file.write_all(doc.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| path_error(path, &e))?;
        let _ = write!(
            err,
            "cm-trace: timeline with {} connection(s) written to {}",
            t.len(),
            path.display()
        );
        if t.dropped > 0 {
            let _ = write!(
                err,
                "; {} more connection(s) not drawn (at most {} drawn: --timeline-max N, or -p \
                 for the problems only)",
                t.dropped,
                opts.timeline_max.max(1)
            );
        }
        let _ = writeln!(err);
    }
    Ok(result)
}

#[cfg(test)]
mod tests;
