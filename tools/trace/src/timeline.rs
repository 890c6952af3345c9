//! `cm-trace --timeline out.svg` (or `out.html`): one row per connection on a common time
//! axis. Setup (first REQ → RTU, or → REJ / last message) and teardown (DREQ → DREP) are bars,
//! the established time between them a thin line; REJs, retransmissions, MRAs and bad ICRCs
//! are marked. Every bar and mark has a tooltip (`<title>`).
//!
//! Memory is bounded: at most [`Timeline::max_rows`] connections are kept (the earliest
//! starting ones); the picture says how many more there were.

use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::conn::{Conn, ConnKind, Detail, Outcome};
use crate::ladder::outcome_text;
use crate::render::human;

/// One drawn connection.
#[derive(Debug, Clone)]
struct Row {
    file: usize,
    first: Duration,
    conn: Conn,
}

impl PartialEq for Row {
    fn eq(&self, o: &Self) -> bool {
        self.key() == o.key()
    }
}
impl Eq for Row {}
impl PartialOrd for Row {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Row {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key().cmp(&o.key())
    }
}
impl Row {
    fn key(&self) -> (Duration, usize, u64) {
        (self.first, self.file, self.conn.id)
    }
}

/// The timeline under construction.
#[derive(Debug)]
pub(crate) struct Timeline {
    rows: BinaryHeap<Row>,
    /// Largest number of rows drawn.
    pub max_rows: usize,
    /// Connections not drawn.
    pub dropped: u64,
    files: Vec<String>,
}

const LABEL_W: f64 = 330.0;
const PLOT_W: f64 = 900.0;
const ROW_H: f64 = 20.0;
const TOP: f64 = 74.0;
const RIGHT_PAD: f64 = 20.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Tick steps of a minute and more, in seconds: minutes, hours and days as a clock divides
/// them (not 20000 s).
const CLOCK_STEPS: [f64; 13] = [
    60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 10_800.0, 21_600.0, 43_200.0,
    86_400.0, 172_800.0,
];
const DAY: f64 = 86_400.0;

/// A "nice" tick step for a span of `span` seconds, about 8 ticks: 1, 2 or 5 × 10^n seconds
/// below a minute; then minutes, hours and days ([`CLOCK_STEPS`]); then 1, 2 or 5 × 10^n
/// days.
fn tick_step(span: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / 8.0;
    if raw >= 45.0 {
        if let Some(&c) = CLOCK_STEPS.iter().find(|&&c| c >= raw * 0.75) {
            return c;
        }
        return nice(raw / DAY) * DAY;
    }
    nice(raw)
}

/// 1, 2, 5 or 10 × 10^n, nearest to `raw` (> 0).
fn nice(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let m = if norm < 1.5 {
        1.0
    } else if norm < 3.5 {
        2.0
    } else if norm < 7.5 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// A tick label: the time since the start in the unit of the step (`5 ms`, `30 s`,
/// `1 h 30 min`, `2 d 12 h`).
fn fmt_tick(t: f64, step: f64) -> String {
    if step >= 60.0 {
        // Whole minutes (every step from a minute on is a whole number of them).
        let total = (t / 60.0).round() as u64;
        let (d, h, m) = (total / 1440, total / 60 % 24, total % 60);
        let mut parts = Vec::new();
        if d > 0 {
            parts.push(format!("{d} d"));
        }
        if h > 0 {
            parts.push(format!("{h} h"));
        }
        if m > 0 || parts.is_empty() {
            parts.push(format!("{m} min"));
        }
        parts.join(" ")
    } else if step >= 1.0 {
        format!("{t:.0} s")
    } else if step >= 0.001 {
        format!("{:.0} ms", t * 1e3)
    } else {
        format!("{:.0} µs", t * 1e6)
    }
}

impl Timeline {
    /// An empty timeline drawing at most `max_rows` connections.
    pub(crate) fn new(max_rows: usize) -> Self {
        Timeline {
            rows: BinaryHeap::new(),
            max_rows: max_rows.max(1),
            dropped: 0,
            files: Vec::new(),
        }
    }

    /// Registers an input file; returns its index for [`Timeline::add`].
    pub(crate) fn file(&mut self, name: &str) -> usize {
        self.files.push(name.to_string());
        self.files.len() - 1
    }

    /// Adds a finished connection.
    pub(crate) fn add(&mut self, file: usize, c: &Conn) {
        self.rows.push(Row {
            file,
            first: c.first,
            conn: c.clone(),
        });
        if self.rows.len() > self.max_rows {
            self.rows.pop();
            self.dropped += 1;
        }
    }

    /// Number of rows that will be drawn.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// The SVG document.
    pub(crate) fn svg(&self) -> String {
        let mut rows: Vec<&Row> = self.rows.iter().collect();
        rows.sort_by_key(|r| (r.first, r.file, r.conn.id));
        let t0 = rows.iter().map(|r| r.conn.first).min().unwrap_or_default();
        let t1 = rows.iter().map(|r| r.conn.last).max().unwrap_or_default();
        let span = t1.checked_sub(t0).unwrap_or_default().as_secs_f64();
        let span = if span > 0.0 { span } else { 1e-3 };
        let x = |t: Duration| -> f64 {
            let rel = t.checked_sub(t0).unwrap_or_default().as_secs_f64();
            LABEL_W + rel / span * PLOT_W
        };
        let width = LABEL_W + PLOT_W + RIGHT_PAD;
        let extra = if self.dropped > 0 { 1.0 } else { 0.0 };
        let height = TOP + (rows.len() as f64 + extra) * ROW_H + 40.0;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="11">"##
        );
        s.push_str("<title>cm-trace timeline</title>\n");
        let _ = writeln!(
            s,
            r##"<rect x="0" y="0" width="{width:.0}" height="{height:.0}" fill="#ffffff"/>"##
        );
        let files = match self.files.as_slice() {
            [one] => esc(one),
            many => format!("{} files", many.len()),
        };
        let _ = writeln!(
            s,
            r##"<text x="10" y="18" font-size="13" font-weight="bold" fill="#222">cm-trace timeline: {} connection(s){}  {}</text>"##,
            rows.len(),
            if self.dropped > 0 {
                format!(" drawn, {} more not drawn", self.dropped)
            } else {
                String::new()
            },
            files
        );
        // Legend.
        let legend: [(&str, &str); 6] = [
            ("#4caf50", "setup REQ→RTU"),
            ("#a5d6a7", "established"),
            ("#1e88e5", "teardown DREQ→DREP"),
            ("#e53935", "rejected"),
            ("#fb8c00", "timed out / waiting"),
            ("#9e9e9e", "partial / SIDR"),
        ];
        let mut lx = 10.0;
        for (color, label) in legend {
            let _ = writeln!(
                s,
                r##"<rect x="{lx:.0}" y="28" width="14" height="9" fill="{color}"/><text x="{:.0}" y="37" fill="#333">{label}</text>"##,
                lx + 18.0
            );
            lx += 22.0 + label.chars().count() as f64 * 6.7 + 14.0;
        }
        let _ = writeln!(
            s,
            r##"<path d="M {lx:.0} 28 l 5 9 l -10 0 z" fill="#fb8c00"/><text x="{:.0}" y="37" fill="#333">retransmission</text>"##,
            lx + 9.0
        );
        lx += 9.0 + 14.0 * 6.7 + 14.0;
        let _ = writeln!(
            s,
            r##"<path d="M {lx:.0} 28 l 4.5 4.5 l -4.5 4.5 l -4.5 -4.5 z" fill="#fdd835" stroke="#8d6e00" stroke-width="0.7"/><text x="{:.0}" y="37" fill="#333">MRA</text>"##,
            lx + 9.0
        );
        lx += 9.0 + 3.0 * 6.7 + 14.0;
        let _ = writeln!(
            s,
            r##"<path d="M {:.1} 28.5 l 8 8 m 0 -8 l -8 8" stroke="#b71c1c" stroke-width="2"/><text x="{:.0}" y="37" fill="#333">REJ</text>"##,
            lx - 4.0,
            lx + 9.0
        );
        lx += 9.0 + 3.0 * 6.7 + 14.0;
        let _ = writeln!(
            s,
            r##"<circle cx="{lx:.0}" cy="32.5" r="4" fill="none" stroke="#b71c1c" stroke-width="1.5"/><text x="{:.0}" y="37" fill="#333">bad ICRC</text>"##,
            lx + 9.0
        );
        // Axis and grid.
        let step = tick_step(span);
        let axis_y = TOP - 8.0;
        let bottom = TOP + (rows.len() as f64 + extra) * ROW_H;
        let _ = writeln!(
            s,
            r##"<line x1="{LABEL_W:.0}" y1="{axis_y:.1}" x2="{:.0}" y2="{axis_y:.1}" stroke="#555"/>"##,
            LABEL_W + PLOT_W
        );
        let mut t = 0.0;
        let mut n = 0;
        while t <= span * 1.0001 && n < 100 {
            let tx = LABEL_W + t / span * PLOT_W;
            let _ = writeln!(
                s,
                r##"<line x1="{tx:.1}" y1="{:.1}" x2="{tx:.1}" y2="{bottom:.1}" stroke="#e0e0e0"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
                axis_y,
                axis_y - 4.0,
                fmt_tick(t, step)
            );
            t += step;
            n += 1;
        }
        for (i, r) in rows.iter().enumerate() {
            let y = TOP + i as f64 * ROW_H;
            self.row(&mut s, r, i, y, &x);
        }
        if self.dropped > 0 {
            let y = TOP + rows.len() as f64 * ROW_H + 13.0;
            let _ = writeln!(
                s,
                r##"<text x="10" y="{y:.1}" fill="#b71c1c">… {} more connection(s) not drawn (--timeline-max)</text>"##,
                self.dropped
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="10" y="{:.1}" fill="#777">time axis: capture time since {:.6} s (Unix epoch), {}</text>"##,
            bottom + 24.0,
            t0.as_secs_f64(),
            utc(t0.as_secs())
        );
        s.push_str("</svg>\n");
        s
    }

    fn row(&self, s: &mut String, r: &Row, index: usize, y: f64, x: &dyn Fn(Duration) -> f64) {
        let c = &r.conn;
        let mid = y + ROW_H / 2.0;
        if index % 2 == 1 {
            let _ = writeln!(
                s,
                r##"<rect x="0" y="{y:.1}" width="{:.0}" height="{ROW_H:.0}" fill="#f7f7f7"/>"##,
                LABEL_W + PLOT_W + RIGHT_PAD
            );
        }
        let addr = |e: &crate::conn::End| {
            e.addr
                .as_ref()
                .map_or_else(|| "?".to_string(), ToString::to_string)
        };
        let mut label = format!("#{} {}→{}", c.id, addr(&c.active), addr(&c.passive));
        if let Some((ps, port)) = c.service_id.and_then(|s| s.rdma_cm_port()) {
            let _ = write!(label, " {}:{port}", ps.name());
        }
        if c.kind == ConnKind::Xrc {
            label.push_str(" XRC");
        }
        if label.chars().count() > 48 {
            label = label.chars().take(47).collect::<String>() + "…";
        }
        let tip = esc(&format!(
            "conn {} ({}){}: {}",
            c.id,
            c.kind.as_str(),
            if self.files.len() > 1 {
                format!(" in {}", self.files.get(r.file).map_or("", String::as_str))
            } else {
                String::new()
            },
            outcome_text(c)
        ));
        let _ = writeln!(
            s,
            r##"<text x="6" y="{:.1}" fill="#222"><title>{tip}</title>{}</text>"##,
            mid + 4.0,
            esc(&label)
        );
        let bar = |s: &mut String, a: Duration, b: Duration, color: &str, h: f64, what: &str| {
            let x0 = x(a);
            let w = (x(b) - x0).max(2.0);
            let _ = writeln!(
                s,
                r##"<rect x="{x0:.1}" y="{:.1}" width="{w:.1}" height="{h:.1}" fill="{color}" rx="1.5"><title>{}</title></rect>"##,
                mid - h / 2.0,
                esc(&format!("conn {}: {what}", c.id))
            );
        };
        let start = c.req.unwrap_or(c.first);
        let setup_end = c
            .rtu
            .or(c.rej.map(|r| r.0))
            .or(c.sidr_rep.map(|r| r.0))
            .unwrap_or(match c.outcome {
                Outcome::TimedOut { .. } | Outcome::Waiting { .. } => c.last,
                _ => c.rep.unwrap_or(start),
            });
        let (color, what) = match c.outcome {
            Outcome::Rejected { reason, .. } => (
                "#e53935",
                format!("rejected, reason {} ({})", reason.raw(), reason.name()),
            ),
            Outcome::TimedOut { phase, .. } => (
                "#fb8c00",
                format!("timed out waiting for {}", phase.answer()),
            ),
            Outcome::Waiting { phase } => {
                ("#fb8c00", format!("still waiting for {}", phase.answer()))
            }
            Outcome::Partial | Outcome::Resolved { .. } => ("#9e9e9e", "partial".to_string()),
            _ => (
                "#4caf50",
                format!(
                    "setup {}",
                    c.setup_latency().map_or_else(|| "?".to_string(), human)
                ),
            ),
        };
        let established = c.established();
        if c.req.is_some() || c.kind == ConnKind::Sidr || !established {
            bar(s, start, setup_end, color, 12.0, &what);
        }
        if established {
            let from = c.rtu.or(c.rep).unwrap_or(c.first);
            let to = c.dreq.map(|d| d.0).unwrap_or(c.last);
            if to > from {
                bar(s, from, to, "#a5d6a7", 4.0, "established");
            }
            if let Some((dreq, side)) = c.dreq {
                let end = c.drep.unwrap_or(c.last);
                let what = format!(
                    "teardown by the {} side{}",
                    side.as_str(),
                    c.teardown_latency()
                        .map_or(String::new(), |d| format!(", {}", human(d)))
                );
                bar(s, dreq, end, "#1e88e5", 12.0, &what);
            }
        }
        for e in &c.events {
            let ex = x(e.time);
            let name = if e.attr.is_known() {
                e.attr.name()
            } else {
                "UNKNOWN"
            };
            let tip = |what: &str| esc(&format!("frame {}: {name} {what}", e.frame));
            if e.dup {
                // A duplicate capture of a packet already drawn.
                continue;
            }
            if e.retrans {
                let _ = writeln!(
                    s,
                    r##"<path d="M {ex:.1} {:.1} l 5 9 l -10 0 z" fill="#fb8c00" stroke="#8a4b00" stroke-width="0.6"><title>{}</title></path>"##,
                    mid - 10.0,
                    tip("retransmission")
                );
            }
            match e.detail {
                Detail::Mra(_, t) => {
                    let _ = writeln!(
                        s,
                        r##"<path d="M {ex:.1} {:.1} l 4.5 4.5 l -4.5 4.5 l -4.5 -4.5 z" fill="#fdd835" stroke="#8d6e00" stroke-width="0.7"><title>{}</title></path>"##,
                        mid - 4.5,
                        tip(&format!("service timeout {}", human(t.to_duration())))
                    );
                }
                Detail::Rej(reason, _) => {
                    let _ = writeln!(
                        s,
                        r##"<path d="M {:.1} {:.1} l 8 8 m 0 -8 l -8 8" stroke="#b71c1c" stroke-width="2"><title>{}</title></path>"##,
                        ex - 4.0,
                        mid - 4.0,
                        tip(&format!("reason {} ({})", reason.raw(), reason.name()))
                    );
                }
                _ => {}
            }
            if e.icrc == crate::trace::Icrc::Bad {
                let _ = writeln!(
                    s,
                    r##"<circle cx="{ex:.1}" cy="{mid:.1}" r="5" fill="none" stroke="#b71c1c" stroke-width="1.5"><title>{}</title></circle>"##,
                    tip("bad ICRC")
                );
            }
        }
    }

    /// A self-contained HTML page around the SVG.
    pub(crate) fn html(&self) -> String {
        format!(
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>cm-trace timeline</title>\
             <style>body{{margin:12px;background:#fff}}</style></head><body>\n{}</body></html>\n",
            self.svg()
        )
    }
}

/// `secs` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (the proleptic Gregorian
/// calendar; days to a civil date by H. Hinnant's `civil_from_days`).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_over_hours_and_days() {
        // Three days: 12-hour ticks labelled in days and hours.
        let step = tick_step(3.0 * DAY);
        assert_eq!(step, 43_200.0);
        assert_eq!(fmt_tick(1.5 * DAY, step), "1 d 12 h");
        assert_eq!(fmt_tick(0.0, step), "0 min");
        // Two hours: 15 minutes.
        let step = tick_step(7200.0);
        assert_eq!(step, 900.0);
        assert_eq!(fmt_tick(4500.0, step), "1 h 15 min");
        // A year: 50 days.
        assert_eq!(tick_step(365.0 * DAY), 50.0 * DAY);
        // Under a minute: unchanged.
        assert_eq!(fmt_tick(30.0, tick_step(100.0)), "30 s");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_487_678_249), "2017-02-21 11:57:29 UTC");
    }

    #[test]
    fn ticks() {
        assert!((tick_step(10.0) - 1.0).abs() < 1e-9);
        assert!((tick_step(0.1) - 0.01).abs() < 1e-12);
        assert!((tick_step(0.0) - 1.0).abs() < 1e-9);
    }
}
