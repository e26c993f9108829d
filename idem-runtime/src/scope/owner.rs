//! Who owns a scope: the handler that runs with it first, in the process and in the
//! database, and the scopes a handler takes over when it was renamed or moved.

use super::{Checked, Error, Handler, Refusal, ScopeConflict};
use crate::store::{ScopeRegistration, ScopeRow};

/// Whether two handlers of one process may use one scope: the same handler, or both
/// declaring it shared.
pub(super) fn compare(scope: &str, first: Handler, ours: Handler) -> Result<(), Error> {
    let compatible = if first.shared || ours.shared {
        first.shared && ours.shared
    } else {
        first.identity == ours.identity
    };
    if compatible {
        return Ok(());
    }
    let message = if first.shared != ours.shared {
        let (shared, alone) = if first.shared {
            (first.identity, ours.identity)
        } else {
            (ours.identity, first.identity)
        };
        format!(
            "scope `{scope}` is declared shared by `{shared}` but not by `{alone}`: declare `shared_scope = true` on every handler of the scope, or give `{alone}` a scope of its own"
        )
    } else {
        format!(
            "handlers `{}` and `{}` both use scope `{scope}`, so each would skip the other's messages as duplicates: give one of them its own `scope = \"...\"`, or declare `shared_scope = true` on both if they are meant to share their keys",
            first.identity, ours.identity
        )
    };
    Err(conflict(scope, message))
}

/// The longest scope, in bytes.
const MAX_SCOPE: usize = 200;

/// Refuses a scope that the status table cannot hold or index: empty, with a NUL
/// character, or longer than [`MAX_SCOPE`] bytes. A deployment error, like a conflict.
pub(super) fn check_name(scope: &str) -> Result<(), Error> {
    let problem = if scope.is_empty() {
        "it is empty"
    } else if scope.contains('\0') {
        "it contains a NUL character"
    } else if scope.len() > MAX_SCOPE {
        "it is longer than 200 bytes"
    } else {
        return Ok(());
    };
    Err(conflict(
        scope,
        format!(
            "scope {scope:.60?} cannot be used: {problem}; give the handler a short, plain `scope = \"...\"`"
        ),
    ))
}

/// Records the scope's owner (its crate and handler; none when shared), retention window
/// and key definition unless the scope is recorded, compares the owner, and returns the
/// recorded row. Records the handler's retention window when it differs from the
/// recorded one.
pub(super) async fn register(checked: &Checked<'_>) -> Result<ScopeRow, Error> {
    let Checked {
        pool,
        statements,
        spec,
        identity,
        crate_name,
        ..
    } = *checked;
    let scope = spec.scope;
    let owner = (!spec.shared_scope).then_some((crate_name, identity));
    let retention = spec
        .retention
        .map(|window| i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1));
    let registration = ScopeRegistration {
        scope,
        owner,
        retention_ms: retention,
        key_definition: checked.definition.as_str(),
        message_type: checked.message_type,
    };
    // A registration committed while this one waited is not in this statement's
    // snapshot: the second try sees it.
    for _ in 0..2 {
        let Some(row) = statements.register_scope(pool, registration).await? else {
            continue;
        };
        verdict(checked, owner, &row)?;
        if row.retention_ms != retention {
            // The handler's window changed (or a handler sharing the scope declares
            // another): the last handler to start records its own. A role without the
            // privilege (grants older than `retention_ms`) still handles its messages.
            let updated = statements
                .record_scope_retention(pool, scope, retention)
                .await;
            if let Err(error) = updated {
                tracing::warn!(
                    scope,
                    %error,
                    "idem: the retention window of the scope could not be recorded; cleaners go on with the recorded one ({:?} ms)",
                    row.retention_ms
                );
            }
        }
        return Ok(row);
    }
    Err(Error::Database(sqlx::Error::RowNotFound))
}

/// Whether the handler `owner` (`None`: shared) may use the scope recorded as `row`.
fn verdict(
    checked: &Checked<'_>,
    owner: Option<(&str, &str)>,
    row: &ScopeRow,
) -> Result<(), Error> {
    let scope = checked.spec.scope;
    match (owner, row.owner.as_deref(), row.shared) {
        (None, _, true) => Ok(()),
        (Some((ours, our_handler)), Some(theirs), false) if ours == theirs => {
            match row.handler.as_deref() {
                None => Ok(()),
                Some(their_handler) if their_handler == our_handler => Ok(()),
                Some(their_handler) if renamed(checked, their_handler, our_handler) => {
                    tracing::info!(
                        scope,
                        recorded = their_handler,
                        handler = our_handler,
                        "idem: the scope's recorded handler is no handler of this binary: this one is it, renamed or moved, and keeps its keys"
                    );
                    Ok(())
                }
                Some(their_handler) => Err(conflict(
                    scope,
                    format!(
                        "scope `{scope}` belongs to handler `{their_handler}` in this database, and handler `{our_handler}` uses it too, so each would skip the other's messages as duplicates: give one of them its own `scope = \"...\"`; if they are meant to share the keys, declare `shared_scope = true` on both; if `{our_handler}` is `{their_handler}` renamed or moved, call `Idem::release_scope(\"{scope}\")` once the old version has stopped"
                    ),
                )),
            }
        }
        (Some((ours, _)), Some(theirs), false) => Err(conflict(
            scope,
            format!(
                "scope `{scope}` belongs to crate `{theirs}` in this database, and crate `{ours}` uses it too, so each would skip the other's messages as duplicates: give this handler its own `scope = \"...\"`; if `{ours}` is `{theirs}` renamed, call `Idem::release_scope(\"{scope}\")` once; if the crates are meant to share the keys, declare `shared_scope = true` on all their handlers of the scope"
            ),
        )),
        (Some((ours, _)), _, _) => Err(conflict(
            scope,
            format!(
                "scope `{scope}` is declared shared in this database, but this handler of crate `{ours}` does not declare `shared_scope = true`: declare it, or give the handler its own scope"
            ),
        )),
        (None, Some(theirs), _) => Err(conflict(
            scope,
            format!(
                "scope `{scope}` belongs to crate `{theirs}` in this database, which does not declare it shared: declare `shared_scope = true` on its handlers too and call `Idem::release_scope(\"{scope}\")` once, or give this handler its own scope"
            ),
        )),
        (None, None, false) => Ok(()),
    }
}

/// Whether the scope's recorded handler `theirs`, of this crate, is `ours` renamed or
/// moved (its scope kept, or turned into a method): the binary has no other handler of
/// the scope, and `theirs` is not another instantiation of the same generic handler.
/// The database keeps the first handler recorded, so that the previous build, still
/// running during a rolling deploy or started again by a rollback, keeps its scope too.
fn renamed(checked: &Checked<'_>, theirs: &str, ours: &str) -> bool {
    let without_generics = |path: &str| path.split('<').next().unwrap_or(path).to_owned();
    checked.registry.handlers_of(checked.spec.scope) <= 1
        && without_generics(theirs) != without_generics(ours)
}

fn conflict(scope: &str, message: String) -> Error {
    Error::Refused(Refusal::Conflict(ScopeConflict::new(scope, message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_is_shared_only_when_both_say_so() {
        let a = Handler {
            identity: "app::billing::handle",
            shared: false,
        };
        let b = Handler {
            identity: "app::shipping::handle",
            shared: false,
        };
        assert!(compare("s", a, a).is_ok());
        assert!(compare("s", a, b).is_err());
        let (shared_a, shared_b) = (Handler { shared: true, ..a }, Handler { shared: true, ..b });
        assert!(compare("s", shared_a, shared_b).is_ok());
        assert!(compare("s", shared_a, b).is_err());
    }
}
