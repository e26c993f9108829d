//! Applying a set of migrations in a schema of their own, in one transaction.
//!
//! Through a transaction pooler a session keeps nothing between transactions: neither a
//! `search_path` set for it, nor a session-level advisory lock, nor a prepared statement.
//! So the whole run is one transaction: a transaction-scoped advisory lock (the one
//! sqlx's migrator takes for the database, so that a migrator of either kind waits for
//! the other), the schema, `SET LOCAL search_path`, sqlx's bookkeeping table
//! `_sqlx_migrations` in that schema (its layout and checksums, so that sqlx's migrator
//! and idem read the same state), and each pending migration with its row there. No
//! startup parameter is needed, which PgBouncer would refuse (`options`), and no statement
//! is prepared.

use std::collections::HashMap;

use sqlx::migrate::{MigrateError, Migration, Migrator};
use sqlx::{Connection, Executor, PgConnection, PgPool, Row};

use crate::config::Identifier;

/// The migrations of the status table (`migrations/` of the crate, packaged with it).
///
/// They create the status table `idem_keys`, the scope owners `idem_scopes` and the
/// cache namespace `idem_instance` in the current
/// `search_path`; [`Idem::migrate`](crate::Idem::migrate) applies them in the configured schema.
///
/// Migrations newer than this release, applied by a later one on the same database, are
/// tolerated (sqlx's `ignore_missing`): a release keeps working on the schema of the next,
/// so a consumer group can run both during a rolling upgrade and roll back. Releases only
/// add migrations, and a migration never drops or changes what the previous release's
/// statements use (see the README's "Upgrading and changing handlers").
pub static MIGRATOR: Migrator = Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("./migrations")
};

/// Creates `schema` if needed and applies `migrator`'s migrations in it, in one
/// transaction, tracked in the schema's own `_sqlx_migrations` table (the table sqlx's
/// migrator writes, so `sqlx migrate` and earlier versions of idem read the same state).
///
/// Safe to call from every process at once, directly or through a pooler in session or
/// transaction pooling: the callers are serialized by a transaction-scoped advisory lock,
/// and those that find everything applied do nothing. The migrations run in the one
/// transaction: a migration marked `-- no-transaction` is not supported.
///
/// This is what [`Idem::migrate`](crate::Idem::migrate) does for the status table; other
/// crates built on idem (idem-kafka) apply their own tables' migrations with it. One
/// schema, one migrator: two migrators tracked in one schema's `_sqlx_migrations` each
/// find the other's versions and refuse to run.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::config::Identifier;
/// static APP: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");
/// idem_runtime::migrations::migrate_schema(&pool, &Identifier::new("app_events")?, &APP).await?;
/// # Ok(()) }
/// ```
pub async fn migrate_schema(
    pool: &PgPool,
    schema: &Identifier,
    migrator: &Migrator,
) -> Result<(), MigrateError> {
    let mut conn = pool.acquire().await?;
    // A migrator of an earlier idem creates the schema before it takes its lock: when the
    // two race, one of them sees the other's schema appear under it, and tries again.
    let mut tries = 3;
    loop {
        tries -= 1;
        match migrate_in_transaction(&mut conn, schema, migrator).await {
            Err(error) if tries > 0 && schema_raced(&error) => continue,
            result => return result,
        }
    }
}

async fn migrate_in_transaction(
    conn: &mut PgConnection,
    schema: &Identifier,
    migrator: &Migrator,
) -> Result<(), MigrateError> {
    let mut tx = conn.begin().await?;
    match apply(&mut tx, schema, migrator).await {
        Ok(()) => Ok(tx.commit().await?),
        Err(error) => {
            tx.rollback().await?;
            Err(error)
        }
    }
}

/// Every statement is a simple query (the values written in as hexadecimal and digits):
/// nothing is prepared, so nothing is left on a pooler's server connection, and nothing
/// collides with what other clients left there.
async fn apply(
    conn: &mut PgConnection,
    schema: &Identifier,
    migrator: &Migrator,
) -> Result<(), MigrateError> {
    prepare(conn, schema).await?;
    let applied = applied(conn).await?;
    let known = |version: i64| {
        migrator
            .iter()
            .any(|m| m.version == version && !m.migration_type.is_down_migration())
    };
    if !migrator.ignore_missing
        && let Some(&version) = applied.keys().filter(|&&v| !known(v)).min()
    {
        return Err(MigrateError::VersionMissing(version));
    }
    for migration in migrator.iter() {
        if migration.migration_type.is_down_migration() {
            continue;
        }
        match applied.get(&migration.version) {
            Some(checksum) if checksum[..] != migration.checksum[..] => {
                return Err(MigrateError::VersionMismatch(migration.version));
            }
            Some(_) => {}
            None => run(conn, migration).await?,
        }
    }
    Ok(())
}

/// Takes sqlx's migrator lock for the transaction, creates the schema and sqlx's
/// bookkeeping table in it, and makes the schema the transaction's `search_path`.
async fn prepare(conn: &mut PgConnection, schema: &Identifier) -> Result<(), MigrateError> {
    let database: String = conn
        .fetch_one("SELECT current_database()")
        .await?
        .try_get(0)?;
    conn.execute(
        format!(
            "SELECT pg_advisory_xact_lock({}); \
             CREATE SCHEMA IF NOT EXISTS {schema}; \
             SET LOCAL search_path TO {schema}; \
             CREATE TABLE IF NOT EXISTS _sqlx_migrations ( \
                 version BIGINT PRIMARY KEY, \
                 description TEXT NOT NULL, \
                 installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), \
                 success BOOLEAN NOT NULL, \
                 checksum BYTEA NOT NULL, \
                 execution_time BIGINT NOT NULL)",
            lock_id(&database)
        )
        .as_str(),
    )
    .await?;
    Ok(())
}

/// The checksums of the applied migrations by version; a migration that failed half-way
/// (`success` false) is [`MigrateError::Dirty`].
async fn applied(conn: &mut PgConnection) -> Result<HashMap<i64, Vec<u8>>, MigrateError> {
    let mut applied = HashMap::new();
    for row in conn
        .fetch_all("SELECT version, checksum, success FROM _sqlx_migrations ORDER BY version")
        .await?
    {
        let version: i64 = row.try_get(0)?;
        if !row.try_get::<bool, _>(2)? {
            return Err(MigrateError::Dirty(version));
        }
        applied.insert(version, row.try_get::<Vec<u8>, _>(1)?);
    }
    Ok(applied)
}

/// Runs one pending migration and records it as sqlx's migrator does.
async fn run(conn: &mut PgConnection, migration: &Migration) -> Result<(), MigrateError> {
    let started = std::time::Instant::now();
    conn.execute(&*migration.sql)
        .await
        .map_err(|error| MigrateError::ExecuteMigration(error, migration.version))?;
    let elapsed = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
    conn.execute(
        format!(
            "INSERT INTO _sqlx_migrations \
                 (version, description, success, checksum, execution_time) \
             VALUES ({}, convert_from(decode('{}', 'hex'), 'UTF8'), TRUE, \
                     decode('{}', 'hex'), {elapsed})",
            migration.version,
            hex::encode(migration.description.as_bytes()),
            hex::encode(&migration.checksum),
        )
        .as_str(),
    )
    .await?;
    Ok(())
}

impl super::Statements {
    /// The versions and descriptions of the migrations applied successfully in `schema`
    /// (none where the schema or its `_sqlx_migrations` table does not exist), by version.
    pub(crate) async fn applied_migrations(
        &self,
        pool: &PgPool,
        schema: &Identifier,
    ) -> Result<Vec<(i64, String)>, sqlx::Error> {
        let tracked: Option<String> = self
            .query(
                "SELECT to_regclass(format('%I._sqlx_migrations', $1::text))::text",
                &[schema.as_str().into()],
            )
            .fetch_one(pool)
            .await?
            .try_get(0)?;
        let Some(table) = tracked else {
            return Ok(Vec::new());
        };
        self.query(
            &format!("SELECT version, description FROM {table} WHERE success ORDER BY version"),
            &[],
        )
        .fetch_all(pool)
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
    }
}

/// The advisory lock of sqlx's migrator for `database` (`Migrate::lock` of sqlx 0.8:
/// `0x3d32ad9e` times the CRC-32 of the database's name).
fn lock_id(database: &str) -> i64 {
    const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    0x3d32ad9e * i64::from(CRC.checksum(database.as_bytes()))
}

/// Two processes created the schema at once, and this one lost.
fn schema_raced(error: &MigrateError) -> bool {
    let MigrateError::Execute(sqlx::Error::Database(db)) = error else {
        return false;
    };
    matches!(db.code().as_deref(), Some("23505" | "42P06"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_lock_is_the_one_sqlx_takes() {
        // sqlx 0.8's `generate_lock_id("postgres")`.
        assert_eq!(super::lock_id("postgres"), 0x3d32ad9e * 0x156a_8775_i64);
    }
}
