//! `-t`: how the per-MAD views show a packet's time, with tshark's letters.
//!
//! | `-t` | text / `-V` column | extra JSON key |
//! |---|---|---|
//! | `r` (default) | seconds since the first frame of the file | `time_rel` |
//! | `a` | time of day, UTC (`17:54:51.123456`) | `time_utc` |
//! | `ad` | date and time of day, UTC (`2026-12-01 17:54:51.123456`) | `time_utc` |
//! | `e` | seconds since the Unix epoch | none (`time` is already that) |
//! | `d` | seconds since the previous captured frame (CM or not) | `time_delta` |
//! | `dd` | seconds since the previous frame shown | `time_delta_displayed` |
//!
//! tshark's `a` / `ad` print local time; cm-trace always prints UTC (tshark's `u` / `ud`,
//! also accepted here): `TZ=UTC tshark -t ad` gives the same column.

use std::io::Write;
use std::str::FromStr;
use std::time::Duration;

use crate::put::{put_f64, put_secs};

/// A time format of the per-MAD views (`-t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeFormat {
    /// `r`: seconds since the first frame of the file (the text views' default).
    #[default]
    Relative,
    /// `a` / `u`: time of day, UTC.
    Absolute,
    /// `ad` / `ud`: date and time of day, UTC.
    AbsoluteDate,
    /// `e`: seconds since the Unix epoch.
    Epoch,
    /// `d`: seconds since the previous captured frame.
    Delta,
    /// `dd`: seconds since the previous frame shown.
    DeltaDisplayed,
}

impl FromStr for TimeFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "r" => TimeFormat::Relative,
            "a" | "u" => TimeFormat::Absolute,
            "ad" | "ud" => TimeFormat::AbsoluteDate,
            "e" => TimeFormat::Epoch,
            "d" => TimeFormat::Delta,
            "dd" => TimeFormat::DeltaDisplayed,
            _ => {
                return Err(format!(
                    "bad time format {s:?}: r, a, ad, u, ud, e, d or dd"
                ))
            }
        })
    }
}

/// The times a packet's shown time is relative to, taken when it is tracked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TimeRef {
    /// The first frame of the file.
    pub(crate) t0: Duration,
    /// The previous captured frame (this one's own time for the first).
    pub(crate) prev: Duration,
    /// The previous frame shown (this one's own time for the first shown).
    pub(crate) prev_shown: Duration,
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day) → days since 1970-01-01 (proleptic Gregorian).
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `YYYY-MM-DD HH:MM:SS[.fraction]` (or with `T`) as UTC, to the time since the epoch.
pub(crate) fn parse_utc(s: &str) -> Option<Duration> {
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let mo: u32 = d.next()?.parse().ok()?;
    let da: u32 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) {
        return None;
    }
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':');
    let h: u64 = t.next()?.parse().ok()?;
    let mi: u64 = t.next()?.parse().ok()?;
    let se: u64 = t.next().map_or(Some(0), |x| x.parse().ok())?;
    if t.next().is_some() || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let nanos: u32 = if frac.is_empty() {
        0
    } else if frac.len() <= 9 && frac.bytes().all(|b| b.is_ascii_digit()) {
        format!("{frac:0<9}").parse().ok()?
    } else {
        return None;
    };
    let days = u64::try_from(days_from_civil(y, mo, da)).ok()?;
    Some(Duration::new(
        days * 86_400 + h * 3600 + mi * 60 + se,
        nanos,
    ))
}

/// Appends `ts` (since the Unix epoch) as UTC: `HH:MM:SS.ffffff`, preceded by `YYYY-MM-DD `
/// when `date`.
pub(crate) fn put_utc(out: &mut Vec<u8>, ts: Duration, date: bool) {
    let secs = ts.as_secs();
    let days = (secs / 86_400) as i64;
    let sod = secs % 86_400;
    if date {
        let (y, m, d) = civil_from_days(days);
        let _ = write!(out, "{y:04}-{m:02}-{d:02} ");
    }
    let _ = write!(
        out,
        "{:02}:{:02}:{:02}.{:06}",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        ts.subsec_micros()
    );
}

/// The difference `ts - base` (zero if `base` is later).
fn since(ts: Duration, base: Duration) -> Duration {
    ts.checked_sub(base).unwrap_or_default()
}

/// Appends the time column of a text view; `width`: digits before the decimal point of the
/// second counts (right-aligned).
pub(crate) fn put_time(
    out: &mut Vec<u8>,
    fmt: TimeFormat,
    ts: Duration,
    r: &TimeRef,
    width: usize,
) {
    match fmt {
        TimeFormat::Relative => put_secs(out, since(ts, r.t0), width),
        TimeFormat::Delta => put_secs(out, since(ts, r.prev), width),
        TimeFormat::DeltaDisplayed => put_secs(out, since(ts, r.prev_shown), width),
        TimeFormat::Epoch => put_secs(out, ts, width),
        TimeFormat::Absolute => put_utc(out, ts, false),
        TimeFormat::AbsoluteDate => put_utc(out, ts, true),
    }
}

/// Appends the JSON member `-t` asks for (none for `e`, whose value is `time`).
pub(crate) fn json_time(out: &mut Vec<u8>, fmt: TimeFormat, ts: Duration, r: &TimeRef) {
    let secs = |out: &mut Vec<u8>, key: &[u8], d: Duration| {
        out.extend_from_slice(key);
        put_f64(out, d.as_secs_f64());
    };
    match fmt {
        TimeFormat::Relative => secs(out, b",\"time_rel\":", since(ts, r.t0)),
        TimeFormat::Delta => secs(out, b",\"time_delta\":", since(ts, r.prev)),
        TimeFormat::DeltaDisplayed => {
            secs(out, b",\"time_delta_displayed\":", since(ts, r.prev_shown));
        }
        TimeFormat::Epoch => {}
        TimeFormat::Absolute | TimeFormat::AbsoluteDate => {
            out.extend_from_slice(b",\"time_utc\":\"");
            put_utc(out, ts, fmt == TimeFormat::AbsoluteDate);
            out.push(b'"');
        }
    }
}

/// Appends the JSON `time` value of a capture time: the shortest decimal that reads back as
/// `d.as_secs_f64()` (what `ryu` prints, and what cm-trace has always written).
///
/// For a microsecond time in 2001..2106 (every pcap with µs timestamps, and ns ones on whole
/// µs) that decimal is `secs.micros` with the trailing zeros left out, when it rounds to that
/// double: the doubles there are less than 1 µs apart, so no shorter decimal and no other one
/// of six decimals rounds to it. That is checked exactly (integers), and the digits are
/// written from the integers; any other time goes through `ryu`.
pub(crate) fn put_epoch(out: &mut Vec<u8>, d: Duration) {
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    let f = d.as_secs_f64();
    if nanos.is_multiple_of(1000) && (1_000_000_000..1 << 32).contains(&secs) {
        let us = nanos / 1000;
        if rounds_to(secs * 1_000_000 + u64::from(us), f) {
            crate::put::put_u64(out, secs);
            let mut digits = *b".000000";
            let mut v = us;
            for b in digits.iter_mut().skip(1).rev() {
                *b = b'0' + (v % 10) as u8;
                v /= 10;
            }
            // Trailing zeros left out; a whole second keeps one (`….0`, as ryu writes).
            let zeros = decimal_trailing_zeros(us);
            let len = 7 - zeros.min(5) as usize;
            out.extend_from_slice(digits.get(..len).unwrap_or(&digits));
            return;
        }
    }
    put_f64(out, f);
}

/// Decimal digits at the end of `us` (below 10^6) that are zero (6 for zero).
#[inline]
fn decimal_trailing_zeros(us: u32) -> u32 {
    if us == 0 {
        return 6;
    }
    let mut v = us;
    let mut n = 0;
    while v.is_multiple_of(10) {
        v /= 10;
        n += 1;
    }
    n
}

/// Whether the decimal `micros` / 10^6 is strictly closer to `f` than half the distance to
/// its neighbouring doubles (so that it reads back as `f`), for a positive finite `f` below
/// 2^52.
fn rounds_to(micros: u64, f: f64) -> bool {
    let bits = f.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i64;
    if exp == 0 {
        return false;
    }
    let mant = u128::from((bits & ((1 << 52) - 1)) | 1 << 52);
    // f = mant / 2^shift.
    let shift = 1075 - exp;
    if !(1..=64).contains(&shift) {
        return false;
    }
    let scaled = u128::from(micros) << shift;
    let exact = mant * 1_000_000;
    scaled.abs_diff(exact) < 1_000_000u128 << (shift - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(secs: u64, nanos: u32, date: bool) -> String {
        let mut out = Vec::new();
        put_utc(&mut out, Duration::new(secs, nanos), date);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn utc_dates_match_known_instants() {
        assert_eq!(utc(0, 0, true), "1970-01-01 00:00:00.000000");
        // `date -u -d @951782400` = 2000-02-29 00:00:00 (a leap day of a century leap year).
        assert_eq!(utc(951_782_400, 5_000, true), "2000-02-29 00:00:00.000005");
        // `date -u -d @1764611691` = 2025-12-01 17:54:51.
        assert_eq!(
            utc(1_764_611_691, 123_456_789, true),
            "2025-12-01 17:54:51.123456"
        );
        assert_eq!(utc(1_764_611_691, 0, false), "17:54:51.000000");
        // 2100 is not a leap year: 2100-02-28 + 1 day = 2100-03-01 (`date -u -d @4107542400`).
        assert_eq!(utc(4_107_542_400, 0, true), "2100-03-01 00:00:00.000000");
    }

    #[test]
    fn utc_text_parses_back() {
        let t = Duration::new(1_764_611_691, 123_456_000);
        assert_eq!(parse_utc("2025-12-01 17:54:51.123456"), Some(t));
        assert_eq!(parse_utc("2025-12-01T17:54:51.123456"), Some(t));
        assert_eq!(
            parse_utc("2000-02-29 00:00"),
            Some(Duration::from_secs(951_782_400))
        );
        assert_eq!(parse_utc("2025-13-01 00:00:00"), None);
        assert_eq!(parse_utc("yesterday"), None);
    }

    #[test]
    fn parses_tshark_letters() {
        assert_eq!("ad".parse(), Ok(TimeFormat::AbsoluteDate));
        assert_eq!("ud".parse(), Ok(TimeFormat::AbsoluteDate));
        assert_eq!("dd".parse(), Ok(TimeFormat::DeltaDisplayed));
        assert!("x".parse::<TimeFormat>().is_err());
    }

    #[test]
    fn relative_and_deltas() {
        let r = TimeRef {
            t0: Duration::from_secs(10),
            prev: Duration::from_millis(12_500),
            prev_shown: Duration::from_secs(11),
        };
        let ts = Duration::from_secs(13);
        let col = |f| {
            let mut o = Vec::new();
            put_time(&mut o, f, ts, &r, 1);
            String::from_utf8(o).unwrap()
        };
        assert_eq!(col(TimeFormat::Relative), "3.000000");
        assert_eq!(col(TimeFormat::Delta), "0.500000");
        assert_eq!(col(TimeFormat::DeltaDisplayed), "2.000000");
        assert_eq!(col(TimeFormat::Epoch), "13.000000");
        let mut o = Vec::new();
        json_time(&mut o, TimeFormat::Delta, ts, &r);
        assert_eq!(o, b",\"time_delta\":0.5");
    }

    /// The integer `time` formatting writes exactly what ryu writes for `as_secs_f64`.
    #[test]
    fn epoch_matches_ryu() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut cases: Vec<Duration> = vec![
            Duration::new(1_000_000_000, 0),
            Duration::new(1_764_611_691, 0),
            Duration::new(1_764_611_691, 100_000),
            Duration::new(1_764_611_691, 999_999_000),
            Duration::new(1_764_611_691, 1_000),
            Duration::new(1_764_611_691, 123_456_789),
            Duration::new((1 << 32) - 1, 999_999_000),
            Duration::new(1 << 32, 1_000),
            Duration::new(999_999_999, 500_000),
            Duration::new(0, 1_000),
            Duration::new(1 << 30, 0),
            Duration::new((1 << 31) - 1, 999_999_000),
            Duration::new(1 << 31, 1_000),
        ];
        for _ in 0..200_000 {
            let secs = 1_000_000_000 + next() % ((1 << 32) - 1_000_000_000);
            let us = (next() % 1_000_000) as u32;
            // Some with trailing zeros.
            let us = match next() % 4 {
                0 => us / 1000 * 1000,
                1 => us / 10 * 10,
                _ => us,
            };
            cases.push(Duration::new(secs, us * 1000));
        }
        // The integer path is the one taken for ordinary capture times.
        let typical = Duration::new(1_764_611_691, 123_456_000);
        assert!(rounds_to(1_764_611_691_123_456, typical.as_secs_f64()));
        for d in cases {
            let mut got = Vec::new();
            put_epoch(&mut got, d);
            let mut want = Vec::new();
            put_f64(&mut want, d.as_secs_f64());
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "{d:?}"
            );
        }
    }
}
