//! idem's duration grammar, as the command line takes it (`--older-than 7d`,
//! `--statement-timeout 2s`, `--scope-window S=90d`).
//!
//! The grammar is the one `#[idempotent]` takes for `lease`, `cache_ttl` and `retention`
//! (idem-macros, `src/args/duration.rs`: `parse_duration_millis`): a whole number of ASCII
//! digits, then a unit among `ms`, `s`, `m`, `h` and `d`, nothing between them,
//! surrounding whitespace ignored, at most `u64::MAX` milliseconds. The two parsers are
//! copies held together by one table of cases, `tests::CASES` here and the same table
//! beside the macro's parser (the reference): change both or neither.
//!
//! Zero is a duration. The attribute's arguments refuse it (none of them means anything
//! at zero); the command line takes it (`--older-than 0s` selects every key).

use std::time::Duration;

/// The milliseconds in one unit of the grammar.
fn unit_millis(unit: &str) -> Option<u64> {
    Some(match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    })
}

/// `500ms`, `90s`, `15m`, `2h`, `7d`; the error says what is wrong, for clap to show.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90s, 15m, 2h or 7d"))?;
    let factor =
        unit_millis(unit).ok_or_else(|| format!("{text:?}: the unit is one of ms, s, m, h, d"))?;
    number
        .checked_mul(factor)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    /// The duration grammar, case by case: the input and its milliseconds, or `None` where
    /// it is not a duration. A copy of the table beside `#[idempotent]`'s parser
    /// (idem-macros, `src/args/duration.rs`), which is the reference: keep the two
    /// identical.
    const CASES: &[(&str, Option<u64>)] = &[
        // The documented forms, one per unit.
        ("500ms", Some(500)),
        ("30s", Some(30_000)),
        ("15m", Some(900_000)),
        ("1h", Some(3_600_000)),
        ("7d", Some(604_800_000)),
        // Zero is a duration (the attribute's arguments refuse it on their own).
        ("0s", Some(0)),
        ("0ms", Some(0)),
        // Leading zeros, and whitespace around the whole.
        ("007s", Some(7_000)),
        (" 30s ", Some(30_000)),
        ("\t1h\n", Some(3_600_000)),
        // The largest values: the milliseconds fit a u64.
        ("18446744073709551615ms", Some(u64::MAX)),
        ("18446744073709551s", Some(18_446_744_073_709_551_000)),
        ("18446744073709552s", None),
        ("213503982334d", Some(18_446_744_073_657_600_000)),
        ("213503982335d", None),
        ("18446744073709551616ms", None),
        // No unit, or no number.
        ("30", None),
        ("s", None),
        ("ms", None),
        ("", None),
        ("   ", None),
        // Units are these five, in lower case, written once.
        ("30S", None),
        ("1H", None),
        ("30sec", None),
        ("5min", None),
        ("2hours", None),
        ("1w", None),
        ("1y", None),
        ("1M", None),
        ("30us", None),
        ("30ss", None),
        // No space inside, no sign, no fraction, no compound, no separator.
        ("30 s", None),
        ("3 0s", None),
        ("-5s", None),
        ("+5s", None),
        ("1.5h", None),
        ("1h30m", None),
        ("1h 30m", None),
        ("1_000ms", None),
        ("1,000ms", None),
        // ASCII digits only.
        ("٣s", None),
    ];

    #[test]
    fn the_grammar_is_the_macros() {
        for &(text, millis) in CASES {
            let parsed = parse_duration(text)
                .ok()
                .map(|duration| u64::try_from(duration.as_millis()).unwrap());
            assert_eq!(parsed, millis, "{text:?}");
        }
    }

    #[test]
    fn a_refusal_says_what_is_wrong() {
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(
            parse_duration("90")
                .unwrap_err()
                .contains("the unit is one of")
        );
        assert!(
            parse_duration("213503982335d")
                .unwrap_err()
                .contains("too long")
        );
    }
}
