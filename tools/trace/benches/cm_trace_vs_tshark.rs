//! cm-trace vs tshark on the same large capture, measured in one run.
//!
//! `cargo bench -p ibcm-trace --bench cm_trace_vs_tshark` generates a RoCEv2 capture of at
//! least 1,000,000 CM packets from the real fixture captures (`ibcm_trace::generate`: distinct
//! comm IDs per connection, valid ICRCs) in the temporary directory, then times
//! * `cm-trace --json FILE` (the release binary), and
//! * `tshark -n -r FILE -T fields -e …` with the fields that correspond to cm-trace's required
//!   JSON keys (frame, time, addresses, attribute, TID, comm IDs, Service ID, QPNs, EECN,
//!   transport type, REJ reason, ICRC),
//!
//! both writing into a pipe that this process drains (1 MiB reads, lines counted with
//! `memchr`), and prints `cm-trace: X s; tshark: Y s; ratio: Z` (wall-clock times), with the
//! load averages before and after (the machine may be shared). On a loaded machine the
//! wall-clock ratio swings with the other processes, so the CPU time (user + system) of each
//! command, from this process's children times in `/proc/self/stat`, is printed too, as
//! `cpu ratio`: cm-trace's threads (tracking, decoding and formatting, writing) all count
//! there, so it is the ratio of work, not of waiting.
//!
//! **The floor**, measured in the same run: cm-trace's JSON output, written into the same
//! kind of drained pipe by this binary re-executed as a writer that does nothing else (it
//! collects `cm-trace --json`'s output in memory first, then writes it three times over in
//! 1 MiB `write` calls into a pipe enlarged to 1 MiB, as cm-trace's writer thread does), timed
//! from the first byte of each copy to its last, the best of the three. It is what moving
//! that many bytes to the consumer costs on this machine; the benchmark prints cm-trace's
//! time as a multiple of it and tshark's time divided by it, the highest ratio a tool that
//! writes cm-trace's output with `write` could reach here. The capture is deleted afterwards.
//!
//! **cm-trace's own work**, measured in the same run: `cm-trace --json FILE` with standard
//! output on `/dev/null` (writing costs nothing, nothing reads), best of three. tshark's time
//! divided by it is the highest ratio cm-trace's decoding, tracking and formatting as they are
//! allow even if moving the output were free.
//!
//! Last measured 2026-12-02 on the project's 2-core machine: see docs/benchmarks.md §4,
//! "cm-trace vs tshark", for the runs, the history and where the time goes. The goal of 100×
//! is not reached.
//!
//! `CM_TRACE_BENCH_PACKETS=N` changes the size. Without `--bench` (as `cargo test --benches`
//! runs it) it is a smoke run with 2,000 packets.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ibcm_trace::{default_template_paths, generate, load_template, GenConfig};

const CM_TRACE: &str = env!("CARGO_BIN_EXE_cm-trace");

/// tshark fields equivalent to cm-trace's JSON keys.
const FIELDS: &[&str] = &[
    "frame.number",
    "frame.time_epoch",
    "ip.src",
    "ip.dst",
    "infiniband.mad.attributeid",
    "infiniband.mad.transactionid",
    "infiniband.cm.req",
    "infiniband.cm.rep",
    "infiniband.cm.rtu.localcommid",
    "infiniband.cm.rej.localcommid",
    "infiniband.cm.dreq.localcommid",
    "infiniband.cm.drsp.localcommid",
    "infiniband.cm.rep.remotecommid",
    "infiniband.cm.rtu.remotecommid",
    "infiniband.cm.rej.remotecommid",
    "infiniband.cm.dreq.remotecommid",
    "infiniband.cm.drsp.remotecommid",
    "infiniband.cm.req.serviceid",
    "infiniband.cm.req.localqpn",
    "infiniband.cm.rep.localqpn",
    "infiniband.cm.rep.localeecn",
    "infiniband.cm.req.remoteqpneecn",
    "infiniband.cm.req.transpsvctype",
    "infiniband.cm.req.ext_transport",
    "infiniband.cm.rej.reason",
    "infiniband.invariant.crc",
];

/// Clock ticks per second of `/proc` times (`getconf CLK_TCK`), when it can be asked.
fn clock_ticks() -> Option<u64> {
    let o = Command::new("getconf").arg("CLK_TCK").output().ok()?;
    String::from_utf8(o.stdout).ok()?.trim().parse().ok()
}

/// CPU time (user + system) of this process's waited-for children, from `/proc/self/stat`
/// (fields 16 and 17, after the command name in parentheses).
fn children_cpu(ticks: Option<u64>) -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (the state): cutime is field 16, cstime 17.
    let cutime: u64 = f.get(13)?.parse().ok()?;
    let cstime: u64 = f.get(14)?.parse().ok()?;
    let hz = ticks.filter(|&t| t > 0)?;
    Some(Duration::from_secs_f64(
        (cutime + cstime) as f64 / hz as f64,
    ))
}

/// The children's CPU time since `cpu0` (an earlier [`children_cpu`]), when both are known.
fn cpu_since(cpu0: Option<Duration>, ticks: Option<u64>) -> Option<Duration> {
    Some(children_cpu(ticks)?.saturating_sub(cpu0?))
}

/// The lowest wall-clock time and the lowest CPU time of several runs of one command.
#[derive(Default)]
struct Best {
    wall: Option<Duration>,
    cpu: Option<Duration>,
}

impl Best {
    fn add(&mut self, wall: Duration, cpu: Option<Duration>) {
        self.wall = Some(self.wall.map_or(wall, |w| w.min(wall)));
        self.cpu = match (self.cpu, cpu) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// The lowest wall-clock time in seconds (above zero, to divide by).
    fn secs(&self) -> f64 {
        self.wall.map_or(0.0, |w| w.as_secs_f64()).max(1e-9)
    }
}

/// What one timed command did.
struct Timed {
    /// From the spawn to the exit.
    wall: Duration,
    /// When the first byte of its standard output was read.
    first: Option<Instant>,
    /// Lines it printed.
    lines: u64,
    /// Bytes it printed.
    bytes: u64,
    /// With [`timed`]'s `segment`: when each whole segment of that many bytes had been read.
    segment_ends: Vec<Instant>,
    /// Its CPU time (user + system), when known.
    cpu: Option<Duration>,
}

/// Runs a command with stdout into a pipe drained here (1 MiB reads, lines counted with
/// `memchr`, as a consumer that looks at every byte would). With `segment`, also notes when
/// each whole `segment` bytes of the output had arrived (to within one read).
fn timed(cmd: &mut Command, ticks: Option<u64>, segment: Option<u64>) -> Result<Timed, String> {
    let cpu0 = children_cpu(ticks);
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let (mut lines, mut bytes) = (0u64, 0u64);
    let mut first: Option<Instant> = None;
    let mut segment_ends = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match out.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    let got = buf.get(..n).unwrap_or_default();
                    lines += memchr::memchr_iter(b'\n', got).count() as u64;
                    bytes += n as u64;
                    if let Some(seg) = segment.filter(|&g| g > 0) {
                        while bytes / seg > segment_ends.len() as u64 {
                            segment_ends.push(now);
                        }
                    }
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let wall = start.elapsed();
    if !status.success() {
        return Err(format!("exit status {status}"));
    }
    let cpu = cpu_since(cpu0, ticks);
    Ok(Timed {
        wall,
        first,
        lines,
        bytes,
        segment_ends,
        cpu,
    })
}

/// With this variable naming a capture, the benchmark's binary is the floor's writer
/// ([`write_floor`]) instead of the benchmark.
const FLOOR_ENV: &str = "CM_TRACE_BENCH_FLOOR_CAPTURE";

/// How many times the floor's writer writes cm-trace's output, back to back.
const FLOOR_COPIES: u64 = 3;

/// The floor's writer: collects `cm-trace --json CAPTURE`'s output in memory, then writes it
/// [`FLOOR_COPIES`] times to standard output in 1 MiB `write` calls into a pipe enlarged to
/// 1 MiB, as cm-trace's writer thread does, and does nothing else. The time each copy takes
/// to arrive, drained by [`timed`], is what moving that output through the pipe costs on this
/// machine, without any decoding.
fn write_floor(capture: &std::ffi::OsStr) -> Result<(), String> {
    use std::io::Write;
    use std::os::fd::AsFd;
    let run = Command::new(CM_TRACE)
        .arg("--json")
        .arg(capture)
        .stderr(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if !run.status.success() {
        return Err(format!("cm-trace --json: exit status {}", run.status));
    }
    let fd = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| e.to_string())?;
    let _ = rustix::pipe::fcntl_setpipe_size(&fd, 1 << 20);
    let mut out = std::fs::File::from(fd);
    for _ in 0..FLOOR_COPIES {
        for chunk in run.stdout.chunks(1 << 20) {
            out.write_all(chunk).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

fn have_tshark() -> bool {
    Command::new("tshark")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    if let Some(path) = std::env::var_os(FLOOR_ENV) {
        if let Err(e) = write_floor(&path) {
            eprintln!("cm_trace_vs_tshark (floor writer): {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = bench() {
        eprintln!("cm_trace_vs_tshark: {e}");
        std::process::exit(1);
    }
}

fn bench() -> Result<(), String> {
    let full = std::env::args().any(|a| a == "--bench");
    let packets: u64 = std::env::var("CM_TRACE_BENCH_PACKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 1_000_000 } else { 2_000 });
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/captures");
    let templates = default_template_paths(&fixtures)
        .iter()
        .map(|p| load_template(p))
        .collect::<Result<Vec<_>, _>>()?;
    let path: PathBuf =
        std::env::temp_dir().join(format!("cm-trace-bench-{}.pcap", std::process::id()));
    let file = std::fs::File::create(&path).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let cfg = GenConfig {
        packets,
        ..GenConfig::default()
    };
    let sum = generate(
        &templates,
        &cfg,
        std::io::BufWriter::with_capacity(1 << 20, file),
    )?;
    let size = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
    println!(
        "capture: {} CM packets, {} connections, {:.1} MB ({} templates), generated in {:.2} s",
        sum.packets,
        sum.connections,
        size as f64 / 1e6,
        templates.len(),
        t.elapsed().as_secs_f64()
    );
    let result = compare(&path, sum.packets);
    let _ = std::fs::remove_file(&path);
    result
}

/// The load averages (1, 5, 15 minutes), when the system tells them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_string())
}

fn compare(path: &Path, packets: u64) -> Result<(), String> {
    let file = path.to_str().ok_or("temporary path is not UTF-8")?;
    println!("load average before: {}", load_average());
    let ticks = clock_ticks();
    if ticks.is_none() {
        println!("*** `getconf CLK_TCK` failed: CPU times are not shown");
    }
    // Warm the page cache, then take the best of three cm-trace runs.
    let _ = std::fs::read(path);
    let mut best = Best::default();
    let mut out_bytes = 0;
    for _ in 0..3 {
        let r = timed(Command::new(CM_TRACE).args(["--json", file]), ticks, None)?;
        if r.lines != packets {
            return Err(format!(
                "cm-trace printed {} lines for {packets} packets",
                r.lines
            ));
        }
        best.add(r.wall, r.cpu);
        out_bytes = r.bytes;
    }
    let ct = best.secs();
    let best_cpu = best.cpu;
    let cpu_text = |c: Option<Duration>| {
        c.map_or_else(
            || "unknown".to_string(),
            |c| format!("{:.2} s", c.as_secs_f64()),
        )
    };
    println!(
        "cm-trace --json: {ct:.3} s ({:.0} packets/s); CPU {}",
        packets as f64 / ct,
        cpu_text(best_cpu)
    );
    let discarded = discarded(file, ticks)?;
    let alone = discarded.secs();
    println!(
        "cm-trace --json with its output discarded (standard output /dev/null: no pipe, no \
         consumer): {alone:.3} s; CPU {} (best of 3)",
        cpu_text(discarded.cpu)
    );
    let floor = pipe_floor(path, out_bytes, ticks)?;
    println!(
        "floor: cm-trace's output ({:.1} MB) written into the same pipe by a program that only \
         writes it (1 MiB writes): {floor:.3} s from a copy's first byte to its last (best of \
         3 copies written back to back); cm-trace is at {:.2}× the floor",
        out_bytes as f64 / 1e6,
        ct / floor
    );
    if !have_tshark() {
        if std::env::var_os("IBCM_REQUIRE_TSHARK").is_some_and(|v| v != "0") {
            return Err("tshark is required (IBCM_REQUIRE_TSHARK=1) but cannot be run".into());
        }
        println!(
            "*** tshark not found: install it (DEBIAN_FRONTEND=noninteractive apt-get install -y \
             tshark) to get the ratio"
        );
        return Ok(());
    }
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-r", file, "-T", "fields"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let r = timed(&mut cmd, ticks, None)?;
    if r.lines != packets {
        return Err(format!(
            "tshark printed {} lines for {packets} packets",
            r.lines
        ));
    }
    let ts = r.wall.as_secs_f64();
    println!(
        "tshark -T fields ({} fields): {ts:.3} s ({:.0} packets/s); CPU {}",
        FIELDS.len(),
        packets as f64 / ts,
        cpu_text(r.cpu)
    );
    if let (Some(c), Some(t)) = (best_cpu, r.cpu) {
        if c > Duration::ZERO {
            println!(
                "cpu: cm-trace {:.2} s; tshark {:.2} s; cpu ratio: {:.1}",
                c.as_secs_f64(),
                t.as_secs_f64(),
                t.as_secs_f64() / c.as_secs_f64()
            );
        }
    }
    println!(
        "the highest ratio cm-trace's output allows here (tshark ÷ floor): {:.1}; with its own \
         work as it is and the output free (tshark ÷ the discarded run): {:.1}",
        ts / floor,
        ts / alone
    );
    println!(
        "cm-trace: {ct:.3} s; tshark: {ts:.3} s; ratio: {:.1}",
        ts / ct
    );
    println!("load average after: {}", load_average());
    Ok(())
}

/// `cm-trace --json FILE` with standard output on `/dev/null` (its writes cost nothing and
/// nothing reads them): the best wall-clock time and CPU time of three runs, cm-trace's own
/// work without the cost of moving its output.
fn discarded(file: &str, ticks: Option<u64>) -> Result<Best, String> {
    let mut best = Best::default();
    for _ in 0..3 {
        let cpu0 = children_cpu(ticks);
        let start = Instant::now();
        let status = Command::new(CM_TRACE)
            .args(["--json", file])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| e.to_string())?;
        let wall = start.elapsed();
        if !status.success() {
            return Err(format!("cm-trace --json > /dev/null: exit status {status}"));
        }
        best.add(wall, cpu_since(cpu0, ticks));
    }
    Ok(best)
}

/// The floor of `cm-trace --json` on `capture`: its output written [`FLOOR_COPIES`] times by
/// this binary in floor mode ([`write_floor`]) into the same kind of drained pipe; the best
/// copy, from its first byte to its last (so neither process start nor making the output
/// counts against it). Checks that all the bytes arrive (`bytes` per copy).
fn pipe_floor(capture: &Path, bytes: u64, ticks: Option<u64>) -> Result<f64, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let r = timed(Command::new(me).env(FLOOR_ENV, capture), ticks, Some(bytes))?;
    if r.bytes != FLOOR_COPIES * bytes {
        return Err(format!(
            "the floor's writer wrote {} bytes, {FLOOR_COPIES} copies of cm-trace's {bytes}",
            r.bytes
        ));
    }
    // A copy starts where the one before it ended; the first, at the first byte.
    let starts = std::iter::once(r.first).chain(r.segment_ends.iter().copied().map(Some));
    let best = starts
        .zip(&r.segment_ends)
        .filter_map(|(a, b)| a.map(|a| b.saturating_duration_since(a)))
        .min()
        .ok_or("the floor's writer wrote nothing")?;
    Ok(best.as_secs_f64().max(1e-9))
}
