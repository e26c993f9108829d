//! A scope's key definition: recorded by its first handler, compared by every later one,
//! and changed only where the scope has no keys or the change is declared
//! (`previous_key`).

use super::{Checked, Error, KeyChanged, Refusal};
use crate::store::{DefinitionChange, ScopeRow};

/// What a handler does with the definition recorded for its scope.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Run: the recorded definition is the handler's, or the previous one of a declared
    /// transition that the handler is the old side of.
    Accept,
    /// Record the handler's definition, with `previous` as the definition its keys
    /// replace (a declared transition), then run.
    Record { previous: Option<String> },
    /// The definitions differ: refuse while the scope has keys; otherwise record.
    Changed,
}

/// The decision for a handler of definition `ours` (previous definition `our_previous`,
/// declared with `previous_key`) on a scope that recorded `recorded` and
/// `recorded_previous`.
fn decide(
    recorded: Option<&str>,
    recorded_previous: Option<&str>,
    ours: &str,
    our_previous: Option<&str>,
) -> Decision {
    // A handler that declares its previous key records it wherever it records its own
    // definition: members of the previous definition's build may still be running.
    let declared = || our_previous.map(str::to_owned);
    let Some(recorded) = recorded else {
        // A new scope, or one recorded by a release that kept no definition.
        return Decision::Record {
            previous: declared(),
        };
    };
    if alike(recorded, ours) {
        return match (recorded_previous, our_previous) {
            // The transition is over: the new build no longer declares the old key.
            (Some(_), None) => Decision::Record { previous: None },
            // A fingerprint added or removed: the keys are the same, the new one is
            // recorded.
            _ if recorded != ours => Decision::Record {
                previous: declared().or(recorded_previous.map(str::to_owned)),
            },
            _ => Decision::Accept,
        };
    }
    if our_previous.is_some_and(|previous| alike(recorded, previous)) {
        return Decision::Record {
            previous: Some(recorded.to_owned()),
        };
    }
    if recorded_previous.is_some_and(|previous| alike(previous, ours)) {
        // A member of the old build during a declared transition: the new build claims
        // the old keys too.
        return Decision::Accept;
    }
    Decision::Changed
}

/// Whether two definitions derive the same keys, keep them in the same table and compare
/// payloads alike: the same key and time part, and the same fingerprint or none on one
/// side (a fingerprint missing on either side never refuses a payload, so adding or
/// removing one changes nothing recorded).
fn alike(a: &str, b: &str) -> bool {
    a == b
        || (key_of(a) == key_of(b)
            && time_of(a) == time_of(b)
            && (fingerprint_of(a).is_none() || fingerprint_of(b).is_none()))
}

/// The fingerprint's part of a definition, if it has one.
fn fingerprint_of(definition: &str) -> Option<&str> {
    let key = key_of(definition);
    let at = definition.find(key)? + key.len();
    let rest = definition[at..].trim_start();
    rest.starts_with("fingerprint(").then_some(rest)
}

/// Compares the handler's key definition with the one its scope recorded in `row`, and
/// records it where the decision says so.
pub(super) async fn check(
    checked: &Checked<'_>,
    mut row: crate::store::ScopeRow,
) -> Result<(), Error> {
    let Checked {
        pool,
        statements,
        spec,
        ..
    } = *checked;
    let scope = spec.scope;
    let ours = checked.definition.as_str();
    let our_previous = checked.previous.as_ref().map(|previous| previous.as_str());
    // The scope's keys are where this handler keeps its own, whatever is recorded: a
    // scope released (`release_scope`) is recorded again with this handler's definition,
    // and a handler that keeps its keys by the fact's time would not find those of the
    // status table (or the other way round). Once per scope and process, an indexed probe
    // (the primary key's `scope` prefix).
    //
    // Except for a declared move into the time buckets (`event_time` with a
    // `previous_key` whose keys are in the status table): its new build claims the keys
    // of both tables, and its old build those of the status table while the move lasts.
    // A build that keeps its keys by the fact's time without that declaration is refused
    // while the status table holds any key of the scope: a fact that succeeded under such
    // a key alone would run again. The declaration stays until the status table's cleanup
    // has deleted them (past their retention window).
    let timed = time_of(ours).is_some();
    let moving = moving_into_buckets(
        ours,
        our_previous,
        row.key_definition.as_deref(),
        row.previous_key_definition.as_deref(),
    );
    if !moving && statements.has_keys_in(pool, scope, !timed).await? {
        return Err(elsewhere(checked, &row, timed));
    }
    // A change that another process recorded meanwhile is decided on again.
    for _ in 0..3 {
        let recorded = row.key_definition.as_deref();
        let previous = match decide(
            recorded,
            row.previous_key_definition.as_deref(),
            ours,
            our_previous,
        ) {
            Decision::Accept => return Ok(()),
            Decision::Record { previous } => previous,
            Decision::Changed if statements.has_keys(pool, scope).await? => {
                return Err(changed(checked, recorded.unwrap_or_default()));
            }
            Decision::Changed => our_previous.map(str::to_owned),
        };
        let change = DefinitionChange {
            scope,
            expected: recorded,
            key_definition: ours,
            previous_key_definition: previous.as_deref(),
            message_type: checked.message_type,
        };
        match statements.record_key_definition(pool, change).await {
            Ok(true) => return Ok(()),
            Ok(false) => row = reread(checked).await?,
            Err(error) if permission_denied(&error) => {
                // Grants older than the key definition: the handler runs as before, and
                // the definition is left to a role that may record it.
                tracing::warn!(
                    scope,
                    %error,
                    "idem: the key definition of the scope could not be recorded; grant the consumer's role what `idem_runtime::privileges` lists"
                );
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        }
    }
    Err(Error::Database(sqlx::Error::RowNotFound))
}

/// The scope's row as recorded now.
async fn reread(checked: &Checked<'_>) -> Result<ScopeRow, Error> {
    super::owner::register(checked).await
}

fn permission_denied(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("42501"))
}

/// The refusal of a handler whose definition `ours` differs from the recorded one.
fn changed(checked: &Checked<'_>, recorded: &str) -> Error {
    let scope = checked.spec.scope;
    let ours = checked.definition.as_str();
    let (recorded_key, our_key) = (key_of(recorded), key_of(ours));
    if time_of(recorded) != time_of(ours) && without_time(recorded) == without_time(ours) {
        // Into the time buckets, the move can be declared; out of them, it cannot.
        let remedy = if time_of(ours).is_some() {
            format!(
                "Declare the move with `previous_key = \"{}\"` next to `event_time`: a fact that succeeded under the status table's key is then a duplicate, and the builds of both definitions can run side by side during the deploy (remove it once no fact of the old keys can be delivered again). Or give this handler a `scope` of its own, or revert the change",
                fields_of(recorded_key)
            )
        } else {
            "Give this handler a `scope` of its own (the old scope's keys expire with its retention window), or revert the change".to_owned()
        };
        let message = format!(
            "scope `{scope}` has keys derived as `{recorded}`, and this handler derives them as `{ours}`: one of them keeps its keys by the fact's time (`event_time`, in the time buckets) and the other in the status table, so a fact delivered again would not find its key and would run again. {remedy}"
        );
        return Error::Refused(Refusal::KeyChanged(KeyChanged::new(
            scope, recorded, ours, message,
        )));
    }
    let what = if recorded_key == our_key {
        "the payload fingerprint's fields changed, so a duplicate of a key recorded with the old fingerprint would be refused as another payload"
    } else {
        "the key changed, so every fact delivered again would derive another key and run again"
    };
    let declare = if recorded_key == our_key {
        " give the handler a `scope` of its own for the new fingerprint.".to_owned()
    } else {
        format!(
            " declare the change with `previous_key = \"{}\"` next to the new `key`, so that a fact that succeeded under either definition is a duplicate (remove it once no fact of the old key can be delivered again).",
            fields_of(recorded_key)
        )
    };
    let message = format!(
        "scope `{scope}` has keys derived as `{recorded}`, and this handler derives them as `{ours}`: {what}. If this build is the newer one: revert the change, or{declare} If it is an older build (a rollback past a key change), deploy a build of the recorded key instead. Only if the keys are the same for every fact (a key field renamed, nothing else), call `Idem::release_scope(\"{scope}\")` (`idem scopes release {scope}`) once the old version has stopped, and the next run records the new definition"
    );
    Error::Refused(Refusal::KeyChanged(KeyChanged::new(
        scope, recorded, ours, message,
    )))
}

/// The refusal of a handler whose scope has keys in the other table than its own
/// (`row`: the scope's record).
fn elsewhere(checked: &Checked<'_>, row: &ScopeRow, timed: bool) -> Error {
    let scope = checked.spec.scope;
    let ours = checked.definition.as_str();
    let recorded = row.key_definition.as_deref();
    let message = if timed {
        // The status table's keys were derived by the recorded definition without a time
        // part: the previous one of a move, the recorded one, or (a scope released since)
        // the same fields as this handler's.
        let old = [row.previous_key_definition.as_deref(), recorded]
            .into_iter()
            .flatten()
            .find(|definition| time_of(definition).is_none())
            .unwrap_or(ours);
        let fields = fields_of(key_of(old));
        format!(
            "scope `{scope}` has keys kept in the status table, and this handler keeps its keys by the fact's time (`event_time`) without `previous_key`: a fact that succeeded under a key of the status table alone would not find it and would run again. Keep (or declare) the move with `previous_key = \"{fields}\"` next to `event_time` until the status table's cleanup has deleted the scope's keys there (they are past their retention window; `idem purge`): a fact that succeeded under them is then a duplicate. Or give this handler a `scope` of its own (the old scope's keys expire with their retention window), or revert the change"
        )
    } else {
        format!(
            "scope `{scope}` has keys kept by the fact's time (in the time buckets), and this handler keeps its keys in the status table (no `event_time`): a fact delivered again would not find its key and would run again. Give this handler a `scope` of its own (the old scope's keys expire with its retention window), or revert the change"
        )
    };
    Error::Refused(Refusal::KeyChanged(KeyChanged::new(
        scope,
        recorded.unwrap_or("(none recorded)"),
        ours,
        message,
    )))
}

/// Whether a handler of definition `ours` (previous `our_previous`) is a side of a
/// declared move of the scope's keys from the status table into the time buckets: the
/// new side declares a previous definition without a time part; the old side is the
/// previous definition recorded with a current one that has a time part.
fn moving_into_buckets(
    ours: &str,
    our_previous: Option<&str>,
    recorded: Option<&str>,
    recorded_previous: Option<&str>,
) -> bool {
    let new_side =
        time_of(ours).is_some() && our_previous.is_some_and(|previous| time_of(previous).is_none());
    let old_side = time_of(ours).is_none()
        && recorded.is_some_and(|recorded| time_of(recorded).is_some())
        && recorded_previous.is_some_and(|previous| alike(previous, ours));
    new_side || old_side
}

/// The time part of a definition, ` time(occurred_at)`, where its keys are kept by it.
fn time_of(definition: &str) -> Option<&str> {
    definition.find(" time(").map(|at| &definition[at..])
}

/// A definition without its time part.
fn without_time(definition: &str) -> &str {
    definition
        .find(" time(")
        .map_or(definition, |at| &definition[..at])
}

/// The key's part of a definition: `key(order_id s, event_type s)`.
fn key_of(definition: &str) -> &str {
    let start = definition.find(" key(").map_or(0, |at| at + 1);
    let rest = &definition[start..];
    let mut depth = 0_usize;
    for (at, character) in rest.char_indices() {
        match character {
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &rest[..=at];
                }
            }
            _ => {}
        }
    }
    rest
}

/// The field paths of a definition's key: `order_id, event_type`.
fn fields_of(key: &str) -> String {
    let inner = key
        .strip_prefix("key(")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or(key);
    inner
        .split(", ")
        .map(|part| part.split(' ').next().unwrap_or(part))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "idem:v1 key(order_id s)";
    const B: &str = "idem:v1 key(event_id u)";

    #[test]
    fn a_definition_is_kept_or_changed_only_by_a_declared_transition() {
        let record = |previous: Option<&str>| Decision::Record {
            previous: previous.map(str::to_owned),
        };
        // First recorded, or recorded by an earlier release; with the previous key
        // declared, it is recorded too, for the members of the old build still running.
        assert_eq!(decide(None, None, A, None), record(None));
        assert_eq!(decide(None, None, B, Some(A)), record(Some(A)));
        assert_eq!(decide(Some(A), None, A, None), Decision::Accept);
        // Changed without a declaration.
        assert_eq!(decide(Some(A), None, B, None), Decision::Changed);
        // The new build declares the old key: the transition starts.
        assert_eq!(decide(Some(A), None, B, Some(A)), record(Some(A)));
        // During it: the new build, and the old build, run.
        assert_eq!(decide(Some(B), Some(A), B, Some(A)), Decision::Accept);
        assert_eq!(decide(Some(B), Some(A), A, None), Decision::Accept);
        // The new build without `previous_key` ends it; the old build is refused after.
        assert_eq!(decide(Some(B), Some(A), B, None), record(None));
        assert_eq!(decide(Some(B), None, A, None), Decision::Changed);
        // A transitional build still running after the end runs (it claims both keys).
        assert_eq!(decide(Some(B), None, B, Some(A)), Decision::Accept);
        // A declaration of another old key is a change.
        assert_eq!(
            decide(Some(A), None, B, Some("idem:v1 key(x s)")),
            Decision::Changed
        );
        // A fingerprint added or removed keeps the keys and refuses no payload: recorded.
        let fingerprinted = "idem:v1 key(order_id s) fingerprint(amount i)";
        assert_eq!(decide(Some(A), None, fingerprinted, None), record(None));
        assert_eq!(decide(Some(fingerprinted), None, A, None), record(None));
        // Another fingerprint refuses the recorded keys' duplicates: a change.
        let other = "idem:v1 key(order_id s) fingerprint(currency s)";
        assert_eq!(
            decide(Some(fingerprinted), None, other, None),
            Decision::Changed
        );
    }

    #[test]
    fn the_refusal_names_the_old_key_fields() {
        let recorded = "idem:v1 key(order_ref s, order_no i) fingerprint(amount i)";
        assert_eq!(key_of(recorded), "key(order_ref s, order_no i)");
        assert_eq!(fields_of(key_of(recorded)), "order_ref, order_no");
        assert_eq!(
            key_of("idem:v1 key(a.b l[s], c l(s,i)) fingerprint(d i)"),
            "key(a.b l[s], c l(s,i))"
        );
        assert_eq!(fields_of("key(a.b l[s], c l(s,i))"), "a.b, c");
    }
}
