//! Duration strings (`"2s"`, `"500ms"`, `"1m30s"`), parsed and range-checked at compile time.

use std::time::Duration;

/// The bounds lock-core enforces at run time (`MIN_LEASE`, `MAX_LEASE`, `MAX_WAIT`,
/// `MAX_RESULT_TTL`), repeated
/// here because a proc-macro cannot read its runtime crate's constants. A UI pass test asserts
/// they still match lock-core's.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(10);
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
pub(crate) const MAX_RESULT_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

const UNITS: &str = "ms, s, m, h, d";

/// Parses a humantime-style duration: one or more `<integer><unit>` parts, optionally separated
/// by spaces, with units `ms`, `s`, `m`, `h`, `d` (or their long forms: `msec`, `millis`,
/// `milliseconds`, `sec`, `seconds`, `min`, `minutes`, `hr`, `hours`, `day`, `days`...). The
/// error says what is wrong and what to write.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(
            "empty duration: write a duration such as \"2s\", \"500ms\" or \"1m30s\"".into(),
        );
    }
    let mut total = Duration::ZERO;
    let mut rest = trimmed;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(match rest.chars().next() {
                Some('-') => "durations cannot be negative".to_owned(),
                _ => format!(
                    "expected a number in duration {text:?}: write it as number-unit parts such as \"2s\", \"500ms\" or \"1m30s\" (units: {UNITS})"
                ),
            });
        }
        let (number, after) = rest.split_at(digits);
        if after.starts_with(['.', ',']) {
            return Err(format!(
                "fractions are not supported in duration {text:?}: use a smaller unit, e.g. \"1500ms\" or \"1s500ms\" for 1.5s"
            ));
        }
        let after = after.trim_start();
        let letters = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(letters);
        let scale = match unit {
            "ms" | "msec" | "msecs" | "millis" | "millisecond" | "milliseconds" => {
                Duration::from_millis(1)
            }
            "s" | "sec" | "secs" | "second" | "seconds" => Duration::from_secs(1),
            "m" | "min" | "mins" | "minute" | "minutes" => Duration::from_secs(60),
            "h" | "hr" | "hrs" | "hour" | "hours" => Duration::from_secs(3600),
            "d" | "day" | "days" => Duration::from_secs(24 * 3600),
            "" => {
                return Err(format!(
                    "`{number}` in duration {text:?} has no unit: write e.g. \"{number}s\" or \"{number}ms\" (units: {UNITS})"
                ));
            }
            other => {
                return Err(format!(
                    "unknown unit `{other}` in duration {text:?}: use one of {UNITS} (the lock works in whole milliseconds)"
                ));
            }
        };
        let part = number
            .parse::<u32>()
            .ok()
            .and_then(|n| scale.checked_mul(n))
            .ok_or_else(|| format!("duration {text:?} is too large"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("duration {text:?} is too large"))?;
        rest = after;
    }
    Ok(total)
}

/// Formats a duration the way users write it (`"1m30s"`), for error messages.
pub(crate) fn display(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    // Days only from two days on: "24h" reads better than "1d".
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && (unit != "d" || ms >= 2 * size) {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    if ms > 0 {
        out.push_str(&format!("{ms}ms"));
    }
    out
}

/// Checks a lease against lock-core's bounds.
pub(crate) fn check_lease(lease: Duration) -> Result<(), String> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(format!(
            "lease of {} is out of range: lock_core accepts {} to {} (MIN_LEASE..=MAX_LEASE); the watchdog renews the lease every lease/3 while the body runs",
            display(lease),
            display(MIN_LEASE),
            display(MAX_LEASE),
        ));
    }
    Ok(())
}

/// Checks an idempotent result's TTL against lock-core's bounds.
pub(crate) fn check_result_ttl(ttl: Duration) -> Result<(), String> {
    if ttl.is_zero() || ttl > MAX_RESULT_TTL {
        return Err(format!(
            "idempotent TTL of {} is out of range: lock_core keeps a result more than 0s and at most {} (MAX_RESULT_TTL); the default, `idempotent` alone, is 24h",
            display(ttl),
            display(MAX_RESULT_TTL),
        ));
    }
    Ok(())
}

/// Checks a wait against lock-core's bound.
pub(crate) fn check_wait(wait: Duration) -> Result<(), String> {
    if wait > MAX_WAIT {
        return Err(format!(
            "wait of {} is out of range: lock_core waits at most {} (MAX_WAIT), so a stuck holder cannot stall callers forever",
            display(wait),
            display(MAX_WAIT),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse(" 1h "), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("2hours"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("2 minutes 5 seconds"), Ok(Duration::from_secs(125)));
        assert_eq!(parse("7d"), Ok(MAX_LEASE));
        assert_eq!(parse("1s500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_malformed_durations_with_a_hint() {
        for (bad, hint) in [
            ("", "empty duration"),
            ("30", "has no unit"),
            ("1.5s", "fractions are not supported"),
            ("5us", "unknown unit `us`"),
            ("-1s", "cannot be negative"),
            ("s", "expected a number"),
            ("1s x", "expected a number"),
            ("2 seconds please", "expected a number"),
            ("99999999999d", "too large"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(hint), "{bad:?}: {err}");
        }
    }

    #[test]
    fn range_checks_match_lock_core_bounds() {
        assert!(check_lease(Duration::from_millis(10)).is_ok());
        assert!(check_lease(Duration::from_millis(9)).is_err());
        assert!(check_lease(MAX_LEASE).is_ok());
        assert!(check_lease(MAX_LEASE + Duration::from_millis(1)).is_err());
        assert!(check_wait(Duration::ZERO).is_ok());
        assert!(check_wait(MAX_WAIT).is_ok());
        assert!(check_wait(MAX_WAIT + Duration::from_millis(1)).is_err());
        assert!(check_result_ttl(Duration::from_millis(1)).is_ok());
        assert!(check_result_ttl(MAX_RESULT_TTL).is_ok());
        assert!(check_result_ttl(Duration::ZERO).is_err());
        assert!(check_result_ttl(MAX_RESULT_TTL + Duration::from_millis(1)).is_err());
    }

    #[test]
    fn displays_like_users_write() {
        assert_eq!(display(Duration::from_millis(90_500)), "1m30s500ms");
        assert_eq!(display(MAX_LEASE), "7d");
        assert_eq!(display(MAX_WAIT), "24h");
        assert_eq!(display(MAX_WAIT + Duration::from_secs(1)), "24h1s");
        assert_eq!(display(Duration::ZERO), "0s");
    }
}
