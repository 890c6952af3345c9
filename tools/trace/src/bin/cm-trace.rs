//! `cm-trace`: decode InfiniBand CM MADs from pcap / pcapng / ERF captures, and show the
//! connections they set up and tear down.
//!
//! ```text
//! cm-trace FILE...                one line per CM MAD, then a summary per file
//! cm-trace -V FILE...             every field of every CM MAD
//! cm-trace --json FILE...         one JSON object per CM MAD (see the crate docs)
//! cm-trace --ladder FILE...       one ladder diagram per connection (--json: one object each)
//! cm-trace --stats [--json] FILE  connection statistics (see the crate docs)
//! cm-trace --timeline out.svg ... one row per connection, as SVG (or .html)
//! ```
//! `-` reads standard input; a pipe is a live view (the output is flushed after every packet;
//! `-l` does it for any input; `--stats` shows the statistics so far on standard error every
//! `--refresh` seconds; Ctrl-C ends the input with the final summary). Malformed frames are reported with their number and reason and
//! never stop the run; frames cut by the snaplen are decoded as far as captured. The exit
//! status is non-zero only when an input cannot be read at all, or has a damaged record header
//! before its end: the message gives the record number, its byte offset and the bytes skipped
//! to the next plausible record header, from which the file is read on.
//!
//! On native InfiniBand the Subnet Administration MADs (class 0x03) are decoded too: every
//! view shows them, and a PathRecord answer is shown at the head of the ladder of the
//! connection whose REQ followed it (flagged when the REQ disagrees with the record).

use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use ibcm_mad::{CommId, ServiceId};
use ibcm_trace::TrackerConfig;
use ibcm_trace::{field_table, parse_msg, parse_u64, AddrMatch, ExprError, Filter, TimeBound};
use ibcm_trace::{run, Options, View};
use ibcm_trace::{ColorChoice, TimeFormat};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Color {
    Auto,
    Always,
    Never,
}

/// Decode InfiniBand CM (MAD class 0x07) messages from capture files and show connections.
///
/// Subnet Administration MADs (class 0x03) are decoded as well: SA PathRecord queries and
/// answers are paired by TID and shown next to the connection whose REQ followed the record
/// (in the ladder, as SA rows before its REQ; a REQ that disagrees with its record in SL, MTU,
/// P_Key, rate, flow label, traffic class, hop limit or ACK timeout is flagged as a problem).
#[derive(Debug, Parser)]
#[command(
    name = "cm-trace",
    version,
    max_term_width = 100,
    disable_version_flag = true
)]
struct Args {
    /// Print the version.
    #[arg(long, action = clap::ArgAction::Version)]
    version: Option<bool>,
    /// JSON: one object per CM (or SA) MAD; with --stats one object; with --ladder one per connection, and one per SA PathRecord exchange that served none (schema v3: TID, Service ID and CA GUID as "0x…" hex strings).
    #[arg(long)]
    json: bool,
    /// Every field of every CM message (and SA MAD: headers, PathRecords).
    #[arg(short = 'V', long, conflicts_with_all = ["json", "ladder", "stats"])]
    verbose: bool,
    /// One ladder diagram per connection (REQ … DREP), with its end state; the SA PathRecord exchange its REQ followed at its head.
    #[arg(long, conflicts_with = "stats")]
    ladder: bool,
    /// Connection statistics: attempted / established / rejected / timed out, latencies.
    #[arg(long)]
    stats: bool,
    /// Also draw a timeline of the connections into this SVG (.svg) or HTML (.html) file; other names are refused.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// Most connections drawn in the timeline.
    #[arg(long, value_name = "N", default_value_t = 500)]
    timeline_max: usize,
    /// Only these message types (REQ,REP,RTU,REJ,MRA,DREQ,DREP,SIDR_REQ,SIDR_REP,LAP,APR,CPI).
    #[arg(short = 'm', long = "msg", value_name = "TYPES", value_delimiter = ',')]
    msgs: Vec<String>,
    /// Only this Service ID (hex 0x… or decimal; repeatable).
    #[arg(short = 's', long = "service-id", value_name = "SID")]
    service_ids: Vec<String>,
    /// Only connections with this comm ID at either end (repeatable).
    #[arg(short = 'c', long = "comm-id", value_name = "ID")]
    comm_ids: Vec<String>,
    /// Only this IP address, GID (IPv6 notation) or lid:N at either end (repeatable).
    #[arg(short = 'a', long = "addr", value_name = "ADDR")]
    addrs: Vec<String>,
    /// Only messages matching this field expression, e.g. 'rej.reason == 28 && sid.port == 4420' (grammar and fields: --help-fields; connection views: connections with a matching message).
    #[arg(short = 'Y', long = "display-filter", value_name = "EXPR")]
    expr: Option<String>,
    /// Print the fields of -Y expressions and exit.
    #[arg(long, exclusive = true)]
    help_fields: bool,
    /// Only this rdma_cm port (of the Service ID; repeatable).
    #[arg(long = "port", value_name = "PORT")]
    ports: Vec<u16>,
    /// Only from this time: epoch seconds, UTC "YYYY-MM-DD HH:MM:SS[.frac]", or +SECONDS since the file's first frame.
    #[arg(long, value_name = "TIME", allow_hyphen_values = false)]
    from: Option<String>,
    /// Only up to this time (same forms as --from).
    #[arg(long, value_name = "TIME")]
    to: Option<String>,
    /// Only XRC connections.
    #[arg(long)]
    xrc: bool,
    /// Only problems: rejects, timeouts, retransmissions, bad ICRCs, REQs that disagree with their SA PathRecord (and failed or unanswered SA queries).
    #[arg(short = 'p', long)]
    problems: bool,
    /// Colour: auto (a terminal without NO_COLOR), always, never.
    #[arg(long, value_enum, default_value_t = Color::Auto)]
    color: Color,
    /// No progress bar on standard error.
    #[arg(long)]
    no_progress: bool,
    /// Write each packet's output as soon as it is decoded (done anyway when an input is a pipe, as in `tcpdump -U -w - | cm-trace -`).
    #[arg(short = 'l', long)]
    line_buffered: bool,
    /// Most connections tracked at once (the memory bound); older ones are finished early.
    #[arg(long, value_name = "N", default_value_t = 65_536, value_parser = at_least_one)]
    max_conns: usize,
    /// Seconds of capture time an ended connection waits for late retransmissions.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    grace: f64,
    /// Time format of the per-MAD views, as tshark's -t: r (relative to the first frame, the default), a / ad (UTC time of day / date and time), e (epoch), d (since the previous frame), dd (since the previous frame shown). With --json an extra key (time_rel, time_utc, time_delta, time_delta_displayed) next to `time`.
    #[arg(short = 't', value_name = "FORMAT", value_parser = parse_time)]
    time: Option<TimeFormat>,
    /// Capture live on this interface instead of reading files (RoCEv2 UDP 4791 and RoCEv1 by a kernel BPF filter; needs root or CAP_NET_RAW and a build with --features live).
    #[arg(
        short = 'i',
        long = "interface",
        value_name = "IFACE",
        conflicts_with = "files"
    )]
    interface: Option<String>,
    /// With --stats on a live input (-i, a pipe, -l): show the statistics so far on standard error every SECS seconds, whether packets arrive or not (0: after every packet instead; a terminal is redrawn). Ctrl-C ends a live capture or pipe read with the final report.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    refresh: f64,
    /// With -i: stop after this many packets (that passed the filter).
    #[arg(long, value_name = "N", requires = "interface")]
    count: Option<u64>,
    /// Capture files (pcap, pcapng, ERF; `-` for standard input).
    #[arg(required_unless_present_any = ["help_fields", "interface"], value_name = "FILE")]
    files: Vec<String>,
}

fn build(args: &Args) -> Result<Options, String> {
    let mut filter = Filter::default();
    for m in &args.msgs {
        filter.msgs.push(parse_msg(m)?);
    }
    for s in &args.service_ids {
        let v = parse_u64(s).ok_or_else(|| format!("bad Service ID {s:?}"))?;
        filter.service_ids.push(ServiceId(v));
    }
    for c in &args.comm_ids {
        let v = parse_u64(c)
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| format!("bad comm ID {c:?}"))?;
        filter.comm_ids.push(CommId(v));
    }
    for a in &args.addrs {
        filter.addrs.push(a.parse::<AddrMatch>()?);
    }
    if let Some(e) = &args.expr {
        filter.expr = Some(e.parse().map_err(|e: ExprError| format!("-Y: {e}"))?);
    }
    filter.ports.clone_from(&args.ports);
    filter.from = args
        .from
        .as_deref()
        .map(str::parse::<TimeBound>)
        .transpose()?;
    filter.to = args
        .to
        .as_deref()
        .map(str::parse::<TimeBound>)
        .transpose()?;
    filter.xrc = args.xrc;
    filter.problems = args.problems;
    let view = match (args.verbose, args.json, args.ladder, args.stats) {
        (true, ..) => View::Verbose,
        (_, true, true, _) => View::LadderJson,
        (_, true, _, true) => View::StatsJson,
        (_, true, _, _) => View::Json,
        (_, _, true, _) => View::Ladder,
        (_, _, _, true) => View::Stats,
        _ => View::Text,
    };
    if !(args.grace.is_finite() && args.grace >= 0.0) {
        return Err(format!("bad --grace {}", args.grace));
    }
    if !(args.refresh.is_finite() && args.refresh >= 0.0) {
        return Err(format!("bad --refresh {}", args.refresh));
    }
    let choice = match args.color {
        Color::Auto => ColorChoice::Auto,
        Color::Always => ColorChoice::Always,
        Color::Never => ColorChoice::Never,
    };
    Ok(Options {
        view,
        filter,
        color: choice.enabled(io::stdout().is_terminal())
            && !matches!(view, View::Json | View::LadderJson | View::StatsJson),
        progress: !args.no_progress && io::stderr().is_terminal(),
        timeline: args.timeline.clone(),
        timeline_max: args.timeline_max,
        live: args.line_buffered,
        time: args.time,
        interface: args.interface.clone(),
        count: args.count,
        refresh: Duration::from_secs_f64(args.refresh.min(1e9)),
        tracker: TrackerConfig {
            max_live: args.max_conns,
            grace: Duration::from_secs_f64(args.grace.min(1e9)),
            ..TrackerConfig::default()
        },
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.help_fields {
        println!(
            "-Y fields (FIELD OP VALUE; OP: == != < > <= >=; && || ! and or not; parentheses):"
        );
        for (name, kind, doc) in field_table() {
            println!("  {name:<20} {kind:<11} {doc}");
        }
        return ExitCode::SUCCESS;
    }
    let opts = match build(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cm-trace: {e}");
            return ExitCode::from(2);
        }
    };
    let stdout = io::stdout();
    widen_pipe(&stdout);
    // Unlocked: the JSON view writes from a second thread.
    let mut out = BufWriter::with_capacity(1 << 16, stdout);
    let stderr = io::stderr();
    let mut err = stderr.lock();
    match run(&opts, &args.files, &mut out, &mut err) {
        Ok(r) if r.unreadable > 0 || r.damaged > 0 => ExitCode::FAILURE,
        Ok(_) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            let _ = out.flush();
            eprintln!("cm-trace: {e}");
            ExitCode::FAILURE
        }
    }
}

/// When standard output is a pipe, asks for a 1 MiB pipe buffer (Linux's default is 64 KiB):
/// the JSON view writes 1 MiB at a time, and a pipe that holds a whole chunk wakes its reader
/// once per chunk instead of sixteen times. Only a hint for speed: the output is the same
/// either way, so a refusal (a limit below 1 MiB in `/proc/sys/fs/pipe-max-size`) changes
/// nothing else.
fn widen_pipe(stdout: &io::Stdout) {
    use std::os::unix::fs::FileTypeExt;
    let is_pipe = std::fs::metadata("/dev/stdout").is_ok_and(|m| m.file_type().is_fifo());
    if is_pipe {
        let _ = rustix::pipe::fcntl_setpipe_size(stdout, 1 << 20);
    }
}

/// `--max-conns`: a positive number (a table of no connection tracks nothing).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// `-t`: tshark's time format letters.
fn parse_time(s: &str) -> Result<TimeFormat, String> {
    s.parse()
}
