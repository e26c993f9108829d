//! Durations in the arguments (`lease = "30s"`, `cache_ttl = "10m"`, `retention = "30d"`).
//!
//! The grammar, which the `idem` CLI's duration options follow too (the table of cases
//! in this module's tests is the reference):
//!
//! ```text
//! duration = digits unit        (surrounding whitespace is ignored)
//! digits   = one or more ASCII digits, read as a u64 (leading zeros allowed)
//! unit     = "ms" | "s" | "m" | "h" | "d"
//! ```
//!
//! The value in milliseconds must fit a `u64`. Nothing else is a duration: no sign, no
//! fraction, no space between the number and the unit, no compound (`1h30m`), no other
//! unit name. Zero is a duration; the arguments of the attribute refuse it
//! ([`argument_millis`]), since none of them means anything at zero.

use syn::LitStr;
use syn::meta::ParseNestedMeta;

/// The string of a duration argument (`lease`, `cache_ttl`, `retention`); a bare number
/// is refused with the unit it lacks.
pub(super) fn duration_literal(meta: &ParseNestedMeta<'_>, name: &str) -> syn::Result<LitStr> {
    let value = meta.value()?;
    if value.peek(syn::LitInt) || value.peek(syn::LitFloat) {
        let number: syn::Lit = value.parse()?;
        return Err(syn::Error::new(
            number.span(),
            format!(
                "`{name}` is a duration in a string, with its unit: `{name} = \"{}\"`; a bare number has no unit",
                number_with_unit(&number, if name == "retention" { "d" } else { "s" })
            ),
        ));
    }
    value.parse()
}

/// The milliseconds of the duration argument `name`, greater than zero, or the error
/// that says what the argument takes.
pub(super) fn argument_millis(literal: &LitStr, name: &str) -> syn::Result<u64> {
    match parse_duration_millis(&literal.value()) {
        Some(millis) if millis > 0 => Ok(millis),
        _ => {
            let (examples, meaning) = match name {
                "lease" => ("\"500ms\", \"30s\", \"5m\" or \"1h\"", ""),
                "cache_ttl" => ("\"90s\", \"10m\" or \"1h\"", ""),
                _ => (
                    "\"36h\", \"7d\" or \"90d\"",
                    ": how long the handler's `success` keys are kept",
                ),
            };
            Err(syn::Error::new(
                literal.span(),
                format!(
                    "`{name}` must be a duration such as {examples}, greater than zero{meaning}"
                ),
            ))
        }
    }
}

/// `30` with a unit, for the error's example.
fn number_with_unit(number: &syn::Lit, unit: &str) -> String {
    match number {
        syn::Lit::Int(int) => format!("{}{unit}", int.base10_digits()),
        _ => format!("30{unit}"),
    }
}

/// A duration of the grammar in the module docs, in milliseconds; `None` if it is not one.
pub(super) fn parse_duration_millis(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
}

#[cfg(test)]
mod tests {
    use super::parse_duration_millis;

    /// The duration grammar, case by case: the input and its milliseconds, or `None` where
    /// it is not a duration. The CLI's duration options are held to the same table.
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
    fn durations_follow_the_table() {
        for (input, expected) in CASES {
            assert_eq!(
                parse_duration_millis(input),
                *expected,
                "duration {input:?}"
            );
        }
    }
}
