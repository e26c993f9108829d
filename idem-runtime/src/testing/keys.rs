//! What the deliveries under test did to the status table (and to the time buckets of
//! handlers with `event_time`): the keys whose rows appeared or changed between two
//! snapshots.

use std::collections::HashMap;

use uuid::Uuid;

use crate::Idem;
use crate::key::IdempotencyKey;
use crate::store::Status;

/// The committed rows of a status table, by scope and key.
#[derive(Debug)]
pub(crate) struct KeySnapshot {
    rows: HashMap<(String, Uuid), RowState>,
}

/// What tells a row's versions apart.
#[derive(Debug, Clone, PartialEq)]
struct RowState {
    status: String,
    attempts: i32,
    updated_at: chrono::DateTime<chrono::Utc>,
    lease_owner: Option<Uuid>,
    result: Option<String>,
}

/// A key whose row appeared or changed between two snapshots.
#[derive(Debug, Clone)]
pub(crate) struct TouchedKey {
    pub scope: String,
    pub key: IdempotencyKey,
    pub status: Status,
}

impl std::fmt::Display for TouchedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} in scope {} ({:?})",
            self.key, self.scope, self.status
        )
    }
}

impl KeySnapshot {
    /// The committed rows of the status table of `idem` and of its time buckets now.
    ///
    /// # Panics
    ///
    /// When the table cannot be read (not migrated?).
    pub(crate) async fn take(idem: &Idem) -> Self {
        let statements = idem.statements();
        let rows = statements
            .snapshot_rows(idem.pool())
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "read the status table {} (is it migrated? testing::idem does it): {error}",
                    statements.table_name()
                )
            });
        let rows = rows
            .into_iter()
            .map(
                |(scope, key, status, attempts, updated_at, lease_owner, result)| {
                    let state = RowState {
                        status,
                        attempts,
                        updated_at,
                        lease_owner,
                        result,
                    };
                    ((scope, key), state)
                },
            )
            .collect();
        KeySnapshot { rows }
    }

    /// The keys whose rows appeared or changed since `before`, ordered by scope and key.
    pub(crate) fn touched_since(&self, before: &KeySnapshot) -> Vec<TouchedKey> {
        let mut touched: Vec<TouchedKey> = self
            .rows
            .iter()
            .filter(|(id, state)| before.rows.get(*id) != Some(*state))
            .map(|((scope, key), state)| TouchedKey {
                scope: scope.clone(),
                key: IdempotencyKey::from_uuid(*key),
                status: Status::parse(&state.status).expect("a known status"),
            })
            .collect();
        touched.sort_by(|a, b| (&a.scope, a.key.as_uuid()).cmp(&(&b.scope, b.key.as_uuid())));
        touched
    }
}

/// Checks that the deliveries since `before` left their keys `success`, and at least one.
///
/// # Panics
///
/// When no key changed, or a key that changed is not `success`; `context` opens the
/// message.
pub(crate) async fn assert_all_succeeded(idem: &Idem, before: &KeySnapshot, context: &str) {
    let touched = KeySnapshot::take(idem).await.touched_since(before);
    let table = idem.statements().table_name();
    assert!(
        !touched.is_empty(),
        "{context}: no key of the status table {table} was written: is the delivery an \
         #[idempotent] handler called with this Idem?"
    );
    let unsettled: Vec<String> = touched
        .iter()
        .filter(|key| key.status != Status::Success)
        .map(ToString::to_string)
        .collect();
    assert!(
        unsettled.is_empty(),
        "{context}: expected every key written to be success in {table}, found: {}",
        unsettled.join(", ")
    );
}
