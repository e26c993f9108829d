//! Whether the status table is there and up to date.

use serde::Serialize;

use super::AdminError;
use crate::{Idem, MIGRATOR};

/// One migration of the status table and whether the schema has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MigrationState {
    /// Its version (the number in its file name).
    pub version: i64,
    /// Its description.
    pub description: String,
    /// Applied in the schema.
    pub applied: bool,
}

/// The migrations of the status table (from [`MIGRATOR`]) and which of them the configured
/// schema has. A schema that does not exist has none.
pub async fn migration_status(idem: &Idem) -> Result<Vec<MigrationState>, AdminError> {
    let applied = idem
        .statements()
        .applied_migrations(idem.pool(), idem.config().schema())
        .await?;
    Ok(MIGRATOR
        .iter()
        .filter(|migration| !migration.migration_type.is_down_migration())
        .map(|migration| MigrationState {
            version: migration.version,
            description: migration.description.to_string(),
            applied: applied.contains(&migration.version),
        })
        .collect())
}

/// Fails with [`AdminError::NotMigrated`] unless every migration is applied in the
/// configured schema.
pub async fn ensure_migrated(idem: &Idem) -> Result<(), AdminError> {
    let pending = migration_status(idem)
        .await?
        .iter()
        .filter(|migration| !migration.applied)
        .count();
    if pending == 0 {
        Ok(())
    } else {
        Err(AdminError::NotMigrated {
            schema: idem.config().schema().to_string(),
            pending,
        })
    }
}
