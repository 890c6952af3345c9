//! `ibcm-trace`: cm-trace, the InfiniBand CM capture decoder (and `cm-trace-gen`, which builds
//! large synthetic CM captures for benchmarking it).
//!
//! It depends on `ibcm-mad` (the codec: CM messages and packet framing) and on no other
//! workspace crate: no CM core, no async runtime. Reading capture files is done here.
//!
//! # Public face
//! What the binaries, the cross-crate tests (`ibcm-tests`), the fuzz targets and the benchmark
//! use; everything else is crate-private.
//! * Capture reading: [`CaptureReader`] (pcap / pcapng, streaming, constant memory) with its
//!   [`Record`], [`CaptureFormat`], [`TsResolution`], [`CaptureError`], [`MAX_RECORD_LEN`],
//!   and the [`PcapFileWriter`] for tests and generated captures.
//! * Decoding: [`classify`] turns one capture record into an [`Item`] (a [`CmEvent`], an
//!   [`SaEvent`] (a Subnet Administration MAD), a [`NonCm`] record, with an [`RcPacket`] for RC / XRC traffic, or a malformed frame), with
//!   the packet's [`WireAddr`]s, [`Wire`] details and [`Icrc`] verdict; frames cut by the
//!   snaplen are decoded as far as captured ([`MIN_CUT_MAD`]).
//! * The run loop: [`run`] with its [`Options`] ([`View`], [`Filter`] with [`AddrMatch`],
//!   [`TrackerConfig`]) and [`Outcomes`]; [`parse_msg`] and [`parse_u64`] read the filter
//!   arguments; [`ColorChoice`] is `--color`.
//! * Generated captures: [`generate`] from [`Template`]s ([`load_template`],
//!   [`default_template_paths`]) with a [`GenConfig`], giving a [`GenSummary`];
//!   [`data_scenario`] ([`DATA_SCENARIO`]): XRC traffic by SRQ number and UD traffic on a
//!   SIDR-resolved QP; [`sa_scenario`] ([`SA_SCENARIO`]): SA PathRecord exchanges (OpenSM's
//!   real answer) next to the native-IB CM exchanges they served.
//!
//! # Inside
//! * `capture`: pcap / pcapng / raw ERF reading and the pcap writer.
//! * `input`: opens a file or standard input and sniffs its format; `live` (feature `live`):
//!   `-i IFACE` through libpcap; `interrupt`: Ctrl-C ends a live capture or pipe read with
//!   the final summary (a pipe is read on a thread of its own).
//! * `trace`: capture record → CM event; `conn`: connection tracking (REQ … DREP by CA GUID
//!   and comm IDs) in bounded memory, over the `hash` table; `sa`: Subnet Administration
//!   MADs, the PathRecord exchanges the tracker pairs by TID and gives to the REQs they
//!   served, and the check of a REQ path against its record.
//! * Views: `render` (one line per MAD, JSON lines), `verbose` (`-V`), `ladder` (`--ladder`),
//!   `report` and `stats` (`--stats`), `timeline` (`--timeline`), `style` (colours).
//! * `filter`: message type, Service ID, comm ID, address, XRC and problem filters.
//! * `app`: the run loop (`app/file`: one input through the loop and the views written on the
//!   calling thread; `app/json`: the `--json` loop on three threads: tracking, decoding and
//!   formatting, writing); `gen`: the capture generator.
//! * `sys`: the crate's only `unsafe` code (huge-page advice for the connection tables).
//!
//! # Where nom is used, and where not (the workspace's rule: docs/framing.md §5.2)
//! nom parses the capture structures that are variable-length and off the per-packet hot
//! path: pcapng blocks (framing, section headers, interface descriptions and their options,
//! the packet block bodies) and raw ERF record headers. The classic pcap record header (16
//! bytes at fixed offsets, read once per packet) is read by hand: it is the hot path that the
//! `cm_trace_vs_tshark` benchmark measures. The classic pcap file header and the pcap writer
//! are pcap-file's. The link layers inside a record (ERF extension headers, Linux cooked
//! v1/v2, Ethernet, …) are decoded by `ibcm_mad::frame`, which does no I/O and keeps its own
//! fixed-offset readers.
// `unsafe` only in `sys` (memory advice to the kernel, each block with its SAFETY comment).
#![deny(unsafe_code)]

mod app;
mod capture;
mod conn;
mod expr;
mod filter;
mod gen;
mod hash;
mod input;
mod interrupt;
mod json_full;
mod ladder;
#[cfg(feature = "live")]
mod live;
mod operand;
mod put;
mod render;
mod report;
mod sa;
mod stats;
mod style;
#[allow(unsafe_code)]
mod sys;
mod timefmt;
mod timeline;
mod trace;
mod upper;
mod verbose;

pub use app::{run, Options, Outcomes, View};
pub use capture::{
    CaptureError, CaptureFormat, CaptureReader, PcapFileWriter, Record, TsResolution,
    MAX_RECORD_LEN,
};
pub use conn::TrackerConfig;
pub use expr::{field_table, ExprError, FilterExpr};
pub use filter::{parse_msg, Filter, TimeBound};
pub use gen::{
    data_scenario, default_template_paths, generate, load_template, sa_scenario, GenConfig,
    GenSummary, Template, DATA_SCENARIO, SA_SCENARIO,
};
#[cfg(feature = "live")]
pub use live::FILTER as LIVE_FILTER;
pub use operand::{parse_u64, AddrMatch};
pub use sa::SaEvent;
pub use style::ColorChoice;
pub use timefmt::TimeFormat;
pub use trace::{classify, CmEvent, Icrc, Item, NonCm, RcPacket, Wire, WireAddr, MIN_CUT_MAD};
