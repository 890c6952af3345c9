//! What a run is asked for: the [`View`] and the other [`Options`].

use std::path::PathBuf;

use crate::conn::TrackerConfig;
use crate::filter::Filter;
use crate::timefmt::TimeFormat;

/// What cm-trace prints on standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    /// One line per CM MAD, then a summary per file.
    #[default]
    Text,
    /// Every field of every CM MAD (`-V`).
    Verbose,
    /// One JSON object per CM MAD (`--json`).
    Json,
    /// One ladder diagram per connection (`--ladder`).
    Ladder,
    /// One JSON object per connection (`--ladder --json`).
    LadderJson,
    /// The statistics report (`--stats`).
    Stats,
    /// The statistics as one JSON object (`--stats --json`).
    StatsJson,
}

impl View {
    pub(super) fn records_events(self) -> bool {
        matches!(self, View::Ladder | View::LadderJson)
    }

    /// Whether the view shows each connection's data path (the per-MAD views do not, and
    /// pay nothing for it).
    pub(super) fn counts_data(self) -> bool {
        matches!(
            self,
            View::Ladder | View::LadderJson | View::Stats | View::StatsJson
        )
    }

    pub(super) fn per_mad(self) -> bool {
        matches!(self, View::Text | View::Verbose | View::Json)
    }

    pub(super) fn text_summaries(self) -> bool {
        matches!(self, View::Text | View::Verbose | View::Ladder)
    }
}

/// Run options.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The view.
    pub view: View,
    /// Filters.
    pub filter: Filter,
    /// Colour on standard output.
    pub color: bool,
    /// Show a progress bar on standard error for large files.
    pub progress: bool,
    /// Write the timeline (SVG, or HTML for a `.html` name) here.
    pub timeline: Option<PathBuf>,
    /// Largest number of connections drawn in the timeline.
    pub timeline_max: usize,
    /// Flush the output after every packet that printed something (`-l`); always done when an
    /// input is a pipe. The per-MAD JSON view then also runs on one thread, so that nothing
    /// waits for a batch of packets.
    pub live: bool,
    /// Connection tracking settings (`record_events` is set from the view).
    pub tracker: TrackerConfig,
    /// `-i`: capture live on this interface (instead of reading files; feature `live`).
    pub interface: Option<String>,
    /// `--count`: stop the live capture after this many packets (that passed its filter).
    pub count: Option<u64>,
    /// `-t`: the time column of the text views (`None`: relative), and the extra time key of
    /// the JSON lines (`None`: only `time`).
    pub time: Option<TimeFormat>,
    /// `--refresh`: with `--stats` on a live input (`-i`, a pipe, `-l`), the statistics so far
    /// go to standard error this often, whether packets arrive or not (zero: after every
    /// packet). [`Options::default`] has zero; the binary's default is 1 s.
    pub refresh: std::time::Duration,
}

/// Files larger than this get a progress bar (when enabled).
pub(crate) const PROGRESS_MIN_BYTES: u64 = 16 << 20;
