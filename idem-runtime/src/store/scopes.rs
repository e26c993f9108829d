//! The statements of the scope registry (`idem_scopes`), the cache's namespace
//! (`idem_instance`) and the session's settings.

use sqlx::{PgPool, Row};

use super::Statements;
use crate::config::Identifier;

/// The SQL of the scope registry and the instance row, for one schema.
#[derive(Debug)]
pub(super) struct Sql {
    /// Records a scope's owner, or reads the one recorded.
    register_scope: String,
    /// Records the retention window a scope's handler declares.
    record_scope_retention: String,
    /// Forgets a scope's owner.
    release_scope: String,
    /// The status table's identity and the cache's secret.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    instance: String,
}

impl Sql {
    pub(super) fn new(schema: &Identifier) -> Self {
        Sql {
            register_scope: format!(
                "WITH inserted AS ( \
                    INSERT INTO {schema}.idem_scopes (scope, owner, handler, shared, retention_ms) \
                    VALUES ($1, $2, $3, $2 IS NULL, $4) \
                    ON CONFLICT (scope) DO NOTHING RETURNING owner, handler, shared, retention_ms) \
                 SELECT owner, handler, shared, retention_ms FROM inserted \
                 UNION ALL \
                 SELECT owner, handler, shared, retention_ms FROM {schema}.idem_scopes \
                 WHERE scope = $1 AND NOT EXISTS (SELECT FROM inserted)"
            ),
            record_scope_retention: format!(
                "UPDATE {schema}.idem_scopes SET retention_ms = $2 WHERE scope = $1 \
                 AND retention_ms IS DISTINCT FROM $2"
            ),
            release_scope: format!("DELETE FROM {schema}.idem_scopes WHERE scope = $1"),
            instance: format!(
                "SELECT id::text || ':' || current_database() || ':' || '{schema}' AS identity, \
                        cache_secret \
                 FROM {schema}.idem_instance LIMIT 1"
            ),
        }
    }
}

/// A scope's row: its owner crate and handler, whether it is shared, its retention window
/// in milliseconds.
pub(crate) type ScopeRow = (Option<String>, Option<String>, bool, Option<i64>);

impl Statements {
    /// Records `scope`'s owner (`crate_name` and `handler`; `None`: shared) and its
    /// retention window unless the scope is recorded, and returns the recorded row.
    /// `None` when a registration committed while this one waited is not in this
    /// statement's snapshot: the next call sees it.
    pub(crate) async fn register_scope(
        &self,
        pool: &PgPool,
        scope: &str,
        crate_name: Option<&str>,
        handler: Option<&str>,
        retention_ms: Option<i64>,
    ) -> Result<Option<ScopeRow>, sqlx::Error> {
        self.query(
            &self.scopes.register_scope,
            &[
                scope.into(),
                crate_name.into(),
                handler.into(),
                retention_ms.into(),
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

    /// Forgets the owner of `scope`; whether one was recorded.
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
