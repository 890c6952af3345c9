//! `cm-trace-gen`: writes a large RoCEv2 CM capture built from the real fixture captures, with
//! a distinct comm-ID pair per connection and valid ICRCs (for benchmarking cm-trace).
//!
//! ```text
//! cm-trace-gen --packets 1000000 -o /tmp/cm-1m.pcap          # default template mix
//! cm-trace-gen --packets 50000 -o out.pcap a.pcap b.pcap      # own templates
//! cm-trace-gen --scenario xrc-srq-sidr-ud -o data.pcap         # XRC SRQs, SIDR + UD data
//! cm-trace-gen --scenario sa-pathrecord -o sa.pcap             # SA PathRecords + CM, native IB
//! ```

use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ibcm_trace::{default_template_paths, generate, load_template, GenConfig};

/// Build a large CM capture from real ones (one connection per template instance).
#[derive(Debug, Parser)]
#[command(name = "cm-trace-gen", version)]
struct Args {
    /// CM packets to write (at least).
    #[arg(long, default_value_t = 1_000_000)]
    packets: u64,
    /// Microseconds between connection starts.
    #[arg(long, default_value_t = 500)]
    spacing_us: u64,
    /// Output pcap.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Instead of the template mix, write a small scenario: `xrc-srq-sidr-ud` (two XRC
    /// connections on one TGT QP told apart by the SRQ numbers their REPs announced, a SIDR
    /// exchange and UD SENDs on the QP it resolved), or `sa-pathrecord` (native IB: SA
    /// PathRecord queries, OpenSM's real answer, and the CM exchanges that follow it, one
    /// REQ disagreeing with its record).
    #[arg(
        long,
        value_name = "NAME",
        value_parser = [ibcm_trace::DATA_SCENARIO, ibcm_trace::SA_SCENARIO]
    )]
    scenario: Option<String>,
    /// Template captures (Ethernet, one connection each); default: the fixture mix.
    templates: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/captures");
    if let Some(name) = &args.scenario {
        let out = match std::fs::File::create(&args.output) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("cm-trace-gen: {}: {e}", args.output.display());
                return ExitCode::FAILURE;
            }
        };
        let made = if name == ibcm_trace::SA_SCENARIO {
            ibcm_trace::sa_scenario(&fixtures, &GenConfig::default(), out)
        } else {
            ibcm_trace::data_scenario(&fixtures, &GenConfig::default(), out)
        };
        return match made {
            Ok(s) => {
                eprintln!(
                    "cm-trace-gen: {}: scenario {name}: {} packets, {} bytes of frames",
                    args.output.display(),
                    s.packets,
                    s.bytes
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cm-trace-gen: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let paths = if args.templates.is_empty() {
        default_template_paths(&fixtures)
    } else {
        args.templates.clone()
    };
    let mut templates = Vec::new();
    for p in &paths {
        match load_template(p) {
            Ok(t) => templates.push(t),
            Err(e) => {
                eprintln!("cm-trace-gen: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let file = match std::fs::File::create(&args.output) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cm-trace-gen: {}: {e}", args.output.display());
            return ExitCode::FAILURE;
        }
    };
    let cfg = GenConfig {
        packets: args.packets,
        spacing: Duration::from_micros(args.spacing_us),
        ..GenConfig::default()
    };
    match generate(&templates, &cfg, BufWriter::with_capacity(1 << 20, file)) {
        Ok(s) => {
            eprintln!(
                "cm-trace-gen: {}: {} CM packets, {} connections, {} bytes of frames, from {} templates",
                args.output.display(),
                s.packets,
                s.connections,
                s.bytes,
                templates.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cm-trace-gen: {e}");
            ExitCode::FAILURE
        }
    }
}
