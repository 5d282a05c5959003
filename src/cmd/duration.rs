//! Duration-valued flags of every subcommand (`--timeout`, `--hold`,
//! `--duration`, `--retry-budget`, `--expires`): one parser, humantime's
//! (`30s`, `500ms`, `1.5s`, `2m`, `1h 30m`, `30d`), plus a bare number of seconds
//! (`7`, `1.5`) as the flags took before. Flags whose name ends in a unit
//! (`--lease-ms`, `--memtable-age-max-s`: server settings and config keys)
//! stay plain numbers of that unit.

use std::time::Duration;

/// Parses `10s`, `500ms`, `2m`, `1h 30m` (humantime) or a bare number of
/// seconds (`7`, `1.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let secs: f64 = s
            .parse()
            .map_err(|_| format!("{s:?} is not a duration: want e.g. 30s, 500ms, 10m"))?;
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration ({e}): want e.g. 30s, 500ms, 10m, 1h 30m"))
}

/// [`parse_duration`] for `--timeout`: more than zero. A zero timeout
/// would give up before the first look, and "zero means forever" is a
/// guess a script should not have to make: give a long one instead.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s:?}: a timeout must be more than zero (for a long wait give e.g. 24h)"
        ));
    }
    Ok(d)
}

/// How a duration reads in messages: `1m 30s`, `1ms` (whole milliseconds).
pub fn show(d: Duration) -> String {
    let ms = Duration::from_millis(d.as_millis().min(u64::MAX.into()) as u64);
    humantime::format_duration(ms).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(parse: fn(&str) -> Result<Duration, String>, input: &str, want: Option<u64>) {
        assert_eq!(
            parse(input).ok().map(|d| d.as_millis() as u64),
            want,
            "{input:?}: {:?}",
            parse(input)
        );
    }

    #[test]
    fn durations() {
        for (input, want_ms) in [
            ("10s", Some(10_000)),
            ("500ms", Some(500)),
            ("2m", Some(120_000)),
            ("1h", Some(3_600_000)),
            ("1h 30m", Some(5_400_000)),
            ("1m30s", Some(90_000)),
            ("1.5s", Some(1500)),
            ("30d", Some(30 * 86_400_000)),
            ("7", Some(7000)),
            ("1.5", Some(1500)),
            (" 3s ", Some(3000)),
            ("0", Some(0)),
            ("", None),
            ("s", None),
            ("10x", None),
            ("-1s", None),
            ("garbage", None),
            ("1.2.3", None),
        ] {
            check(parse_duration, input, want_ms);
        }
    }

    #[test]
    fn timeouts_are_more_than_zero() {
        for (input, want_ms) in [
            ("1ms", Some(1)),
            ("10m", Some(600_000)),
            ("0", None),
            ("0s", None),
            ("0ms", None),
            ("garbage", None),
        ] {
            check(parse_timeout, input, want_ms);
        }
        assert!(parse_timeout("0").unwrap_err().contains("more than zero"));
    }

    #[test]
    fn shown_in_whole_milliseconds() {
        assert_eq!(show(Duration::from_micros(1500)), "1ms");
        assert_eq!(show(Duration::from_secs(90)), "1m 30s");
    }
}
