//! "did you mean" for a misspelled argument name.

/// `did you mean `x`? ` for an entry of `valid` (a list such as "`key`, `scope`") within
/// two edits of `name`, fewer than half the longer name's letters (two short names such
/// as `at` and `id` are two edits apart, and nothing alike), or nothing.
pub(super) fn did_you_mean(name: &str, valid: &str) -> String {
    valid
        .split(", ")
        .map(|valid| valid.trim_matches('`'))
        .map(|valid| (edit_distance(name, valid), valid))
        .filter(|(distance, valid)| {
            let longer = name.chars().count().max(valid.chars().count());
            *distance <= 2 && distance * 2 < longer
        })
        .min()
        .map_or_else(String::new, |(_, valid)| {
            format!("did you mean `{valid}`? ")
        })
}

/// The Levenshtein distance between `a` and `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substituted = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substituted.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::did_you_mean;

    #[test]
    fn a_near_name_is_suggested_and_a_short_unlike_one_is_not() {
        assert_eq!(
            did_you_mean("scpoe", "`key`, `scope`"),
            "did you mean `scope`? "
        );
        assert_eq!(
            did_you_mean("keys", "`key`, `scope`"),
            "did you mean `key`? "
        );
        assert_eq!(did_you_mean("ky", "`key`, `scope`"), "did you mean `key`? ");
        assert_eq!(did_you_mean("at", "`id`"), "");
        assert_eq!(did_you_mean("retries", "`key`, `scope`"), "");
    }
}
