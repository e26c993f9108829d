//! The statements of the scope registry (`idem_scopes`), the cache's namespace
//! (`idem_instance`) and the session's settings.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row};

use super::Statements;
use super::sql::Value;
use crate::config::Identifier;

/// The SQL of the scope registry and the instance row, for one schema.
#[derive(Debug)]
pub(super) struct Sql {
    /// Records a scope's owner and key definition, or reads the ones recorded.
    register_scope: String,
    /// Records the retention window a scope's handler declares.
    record_scope_retention: String,
    /// Records a scope's key definition where it is the expected one.
    record_key_definition: String,
    /// Notes a delivery answered by a key of the previous definition alone.
    previous_key_seen: String,
    /// Whether a scope has keys.
    has_keys: String,
    has_plain_keys: String,
    has_timed_keys: String,
    /// A scope of the same crate, message type and key that has keys and no handler in
    /// the binary: the scope of a handler renamed or moved.
    moved_from: String,
    /// Forgets a scope's owner.
    release_scope: String,
    /// Every scope, for operators.
    scopes: String,
    /// The status table's identity and the cache's secret.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    instance: String,
}

/// The columns of a scope's row that the registry reads.
const SCOPE_COLUMNS: &str =
    "owner, handler, shared, retention_ms, key_definition, previous_key_definition";

impl Sql {
    pub(super) fn new(schema: &Identifier) -> Self {
        Sql {
            register_scope: format!(
                "WITH inserted AS ( \
                    INSERT INTO {schema}.idem_scopes \
                        (scope, owner, handler, shared, retention_ms, key_definition, \
                         key_defined_at, message_type) \
                    VALUES ($1, $2, $3, $2 IS NULL, $4, $5, now(), $6) \
                    ON CONFLICT (scope) DO NOTHING RETURNING {SCOPE_COLUMNS}) \
                 SELECT {SCOPE_COLUMNS} FROM inserted \
                 UNION ALL \
                 SELECT {SCOPE_COLUMNS} FROM {schema}.idem_scopes \
                 WHERE scope = $1 AND NOT EXISTS (SELECT FROM inserted)"
            ),
            record_scope_retention: format!(
                "UPDATE {schema}.idem_scopes SET retention_ms = $2 WHERE scope = $1 \
                 AND retention_ms IS DISTINCT FROM $2"
            ),
            // `$2` is the recorded definition the change was decided on: a change that
            // another process made meanwhile is not overwritten (no row: decide again).
            record_key_definition: format!(
                "UPDATE {schema}.idem_scopes \
                 SET key_definition = $3, previous_key_definition = $4, message_type = $5, \
                     key_defined_at = CASE WHEN key_definition IS DISTINCT FROM $3 THEN now() \
                                           ELSE key_defined_at END \
                 WHERE scope = $1 AND key_definition IS NOT DISTINCT FROM $2"
            ),
            // At most once a minute: a redelivery storm of old facts writes nothing more.
            previous_key_seen: format!(
                "UPDATE {schema}.idem_scopes SET previous_key_seen_at = now() \
                 WHERE scope = $1 AND (previous_key_seen_at IS NULL \
                                       OR previous_key_seen_at < now() - interval '1 minute')"
            ),
            has_plain_keys: format!(
                "SELECT EXISTS (SELECT FROM {schema}.idem_keys WHERE scope = $1)"
            ),
            has_timed_keys: format!(
                "SELECT EXISTS (SELECT FROM {schema}.idem_timed_keys WHERE scope = $1)"
            ),
            // In the status table or in the buckets of the timed one.
            has_keys: format!(
                "SELECT EXISTS (SELECT FROM {schema}.idem_keys WHERE scope = $1) \
                     OR EXISTS (SELECT FROM {schema}.idem_timed_keys WHERE scope = $1)"
            ),
            // The same message type or the same key definition: a handler moved and
            // changed in one deploy (its key, or its message type renamed) is found too.
            // Scopes recorded by a release that kept neither (NULL) are not candidates:
            // nothing tells their handlers apart from retired ones.
            moved_from: format!(
                "SELECT s.scope, s.message_type = $4 AS same_message, \
                        s.key_definition = $3 AS same_key \
                 FROM {schema}.idem_scopes AS s \
                 WHERE s.owner = $2 AND s.scope <> $1 AND NOT s.shared \
                   AND s.scope <> ALL ($5::text[]) \
                   AND (s.key_definition = $3 OR s.message_type = $4) \
                   AND (EXISTS (SELECT FROM {schema}.idem_keys AS k WHERE k.scope = s.scope) \
                        OR EXISTS (SELECT FROM {schema}.idem_timed_keys AS k WHERE k.scope = s.scope)) \
                   AND NOT EXISTS (SELECT FROM {schema}.idem_keys AS k WHERE k.scope = $1) \
                   AND NOT EXISTS (SELECT FROM {schema}.idem_timed_keys AS k WHERE k.scope = $1) \
                 ORDER BY s.key_definition = $3 AND s.message_type = $4 DESC, s.created_at DESC \
                 LIMIT 1"
            ),
            release_scope: format!("DELETE FROM {schema}.idem_scopes WHERE scope = $1"),
            scopes: format!(
                "SELECT scope, owner, handler, shared, retention_ms, key_definition, key_defined_at, \
                        previous_key_definition, previous_key_seen_at, message_type, created_at \
                 FROM {schema}.idem_scopes ORDER BY scope"
            ),
            instance: format!(
                "SELECT id::text || ':' || current_database() || ':' || '{schema}' AS identity, \
                        cache_secret \
                 FROM {schema}.idem_instance LIMIT 1"
            ),
        }
    }
}

/// One scope as `idem_scopes` records it (see [`scope`](crate::scope)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[non_exhaustive]
pub struct ScopeInfo {
    /// The scope.
    pub scope: String,
    /// The crate that owns it; `None` when shared.
    pub owner: Option<String>,
    /// The handler that first ran with it, as the compiler names its path.
    pub handler: Option<String>,
    /// Declared shared by its handlers (`shared_scope = true`).
    pub shared: bool,
    /// The retention window its handler declares, in milliseconds (`None`: the default).
    pub retention_ms: Option<i64>,
    /// What its keys are made of (`idem:v1 key(order_id s) ...`); `None`: recorded by a
    /// release that kept no definition, until a handler of this release runs.
    pub key_definition: Option<String>,
    /// When the current definition was recorded.
    pub key_defined_at: Option<DateTime<Utc>>,
    /// The definition that a declared key change (`previous_key`) replaced, while the
    /// change lasts: deliveries claim the keys of both.
    pub previous_key_definition: Option<String>,
    /// The last delivery that a key of the previous definition answered alone: while it
    /// is recent, facts of the old definition are still being delivered, and
    /// `previous_key` must stay.
    pub previous_key_seen_at: Option<DateTime<Utc>>,
    /// The type of the message its handler takes.
    pub message_type: Option<String>,
    /// When the scope was first recorded.
    pub created_at: DateTime<Utc>,
}

/// A scope's row, as the registry reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ScopeRow {
    /// The crate that owns the scope; `None`: shared.
    pub owner: Option<String>,
    /// The handler that owns the scope, where recorded.
    pub handler: Option<String>,
    /// Declared shared by its handlers.
    pub shared: bool,
    /// The retention window of its `success` keys, in milliseconds.
    pub retention_ms: Option<i64>,
    /// What its keys are made of; `None`: not recorded (an earlier release).
    pub key_definition: Option<String>,
    /// The definition that the current one replaced by a declared transition.
    pub previous_key_definition: Option<String>,
}

/// The scope a handler was probably renamed or moved from, and what it has alike.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct MovedFrom {
    pub scope: String,
    /// Its handler takes a message of the same type.
    pub same_message: bool,
    /// Its keys were derived alike.
    pub same_key: bool,
}

/// What a handler registers with its scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScopeRegistration<'a> {
    pub scope: &'a str,
    /// The owner crate and handler; `None`: shared.
    pub owner: Option<(&'a str, &'a str)>,
    pub retention_ms: Option<i64>,
    pub key_definition: &'a str,
    pub message_type: &'a str,
}

/// A key definition to record (see [`Statements::record_key_definition`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DefinitionChange<'a> {
    pub scope: &'a str,
    /// The definition recorded when the change was decided.
    pub expected: Option<&'a str>,
    pub key_definition: &'a str,
    pub previous_key_definition: Option<&'a str>,
    pub message_type: &'a str,
}

impl Statements {
    /// Records `scope`'s owner (`None`: shared), retention window and key definition
    /// unless the scope is recorded, and returns the recorded row. `None` when a
    /// registration committed while this one waited is not in this statement's snapshot:
    /// the next call sees it.
    pub(crate) async fn register_scope(
        &self,
        pool: &PgPool,
        registration: ScopeRegistration<'_>,
    ) -> Result<Option<ScopeRow>, sqlx::Error> {
        let (crate_name, handler) = registration.owner.unzip();
        self.query(
            &self.scopes.register_scope,
            &[
                registration.scope.into(),
                crate_name.into(),
                handler.into(),
                registration.retention_ms.into(),
                registration.key_definition.into(),
                registration.message_type.into(),
            ],
        )
        .fetch_optional_as(pool)
        .await
    }

    /// Records a scope's key definition, its previous one and its message type, where the
    /// recorded definition is still `change.expected`; whether it was.
    pub(crate) async fn record_key_definition(
        &self,
        pool: &PgPool,
        change: DefinitionChange<'_>,
    ) -> Result<bool, sqlx::Error> {
        let done = self
            .query(
                &self.scopes.record_key_definition,
                &[
                    change.scope.into(),
                    change.expected.into(),
                    change.key_definition.into(),
                    change.previous_key_definition.into(),
                    change.message_type.into(),
                ],
            )
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Notes that a delivery of `scope` was answered by a key of its previous definition
    /// alone (at most once a minute).
    pub(crate) async fn previous_key_seen(
        &self,
        pool: &PgPool,
        scope: &str,
    ) -> Result<(), sqlx::Error> {
        self.query(&self.scopes.previous_key_seen, &[scope.into()])
            .execute(pool)
            .await
            .map(drop)
    }

    /// Whether `scope` has keys in the time buckets (`timed`) or in the status table.
    pub(crate) async fn has_keys_in(
        &self,
        pool: &PgPool,
        scope: &str,
        timed: bool,
    ) -> Result<bool, sqlx::Error> {
        let statement = if timed {
            &self.scopes.has_timed_keys
        } else {
            &self.scopes.has_plain_keys
        };
        self.query(statement, &[scope.into()])
            .fetch_one(pool)
            .await?
            .try_get(0)
    }

    /// Whether `scope` has keys, in the status table or in the time buckets.
    pub(crate) async fn has_keys(&self, pool: &PgPool, scope: &str) -> Result<bool, sqlx::Error> {
        self.query(&self.scopes.has_keys, &[scope.into()])
            .fetch_one(pool)
            .await?
            .try_get(0)
    }

    /// The scope that a handler of `crate_name` with scope `scope` (which has no keys),
    /// `key_definition` and `message_type` was probably renamed or moved from: a scope of
    /// the same crate with the same message type or key definition that has keys and is
    /// none of the `compiled` scopes of the binary (one with both alike first).
    pub(crate) async fn moved_from(
        &self,
        pool: &PgPool,
        scope: &str,
        crate_name: &str,
        key_definition: &str,
        message_type: &str,
        compiled: &[String],
    ) -> Result<Option<MovedFrom>, sqlx::Error> {
        self.query(
            &self.scopes.moved_from,
            &[
                scope.into(),
                crate_name.into(),
                key_definition.into(),
                message_type.into(),
                Value::Texts(Some(compiled)),
            ],
        )
        .fetch_optional_as(pool)
        .await
    }

    /// Records the retention window of `scope` where it differs.
    pub(crate) async fn record_scope_retention(
        &self,
        pool: &PgPool,
        scope: &str,
        retention_ms: Option<i64>,
    ) -> Result<(), sqlx::Error> {
        self.query(
            &self.scopes.record_scope_retention,
            &[scope.into(), retention_ms.into()],
        )
        .execute(pool)
        .await
        .map(drop)
    }

    /// Every scope recorded, by name.
    pub(crate) async fn scopes(&self, pool: &PgPool) -> Result<Vec<ScopeInfo>, sqlx::Error> {
        self.query(&self.scopes.scopes, &[])
            .fetch_all_as(pool)
            .await
    }

    /// Forgets the owner and key definition of `scope`; whether they were recorded.
    pub(crate) async fn release_scope(
        &self,
        pool: &PgPool,
        scope: &str,
    ) -> Result<bool, sqlx::Error> {
        let done = self
            .query(&self.scopes.release_scope, &[scope.into()])
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The status table's identity (its random id, the database's name and the schema)
    /// and the secret stored with it.
    #[cfg(feature = "redis")]
    pub(crate) async fn cache_instance(
        &self,
        pool: &PgPool,
    ) -> Result<(String, Vec<u8>), sqlx::Error> {
        let row = self
            .query(&self.scopes.instance, &[])
            .fetch_one(pool)
            .await?;
        sqlx::FromRow::from_row(&row)
    }

    /// The lock timeout of the pool's sessions.
    pub(crate) async fn session_lock_timeout(&self, pool: &PgPool) -> Result<String, sqlx::Error> {
        self.query("SELECT current_setting('lock_timeout')", &[])
            .fetch_one(pool)
            .await?
            .try_get(0)
    }
}
