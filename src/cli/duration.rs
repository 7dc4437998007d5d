//! Durations on the command line: `30d`, `12h`, `90m`, `3600s`, or plain seconds.

use std::time::Duration;

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number.parse().map_err(|_| {
        format!("{text:?}: give a whole number and a unit, e.g. 30d, 12h, 90m, 3600s")
    })?;
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 24 * 3600,
        "w" => 7 * 24 * 3600,
        other => return Err(format!("{other:?} is not a unit: s, m, h, d or w")),
    };
    n.checked_mul(unit_secs)
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} must be more than nothing and less than forever"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_seconds_minutes_hours_days_weeks() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration("90m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        for bad in ["", "d", "3y", "-1d", "0s", "1.5h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
