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
    /// Whether this release has it. A migration applied by a later release is not known
    /// (`applied` and not `known`): this release keeps working on the later schema, which
    /// only adds to what it uses (a rolling upgrade, a rollback).
    pub known: bool,
}

/// The migrations of the status table (from [`MIGRATOR`]) and which of them the configured
/// schema has, by version, followed by those that a later release applied and this one
/// does not know. A schema that does not exist has none.
pub async fn migration_status(idem: &Idem) -> Result<Vec<MigrationState>, AdminError> {
    let applied = idem
        .statements()
        .applied_migrations(idem.pool(), idem.config().schema())
        .await?;
    let known: Vec<_> = MIGRATOR
        .iter()
        .filter(|migration| !migration.migration_type.is_down_migration())
        .collect();
    let ours = known.iter().map(|migration| MigrationState {
        version: migration.version,
        description: migration.description.to_string(),
        applied: applied
            .iter()
            .any(|(version, _)| *version == migration.version),
        known: true,
    });
    let newer = applied
        .iter()
        .filter(|(version, _)| !known.iter().any(|m| m.version == *version))
        .map(|(version, description)| MigrationState {
            version: *version,
            description: description.clone(),
            applied: true,
            known: false,
        });
    let mut states: Vec<_> = ours.chain(newer).collect();
    states.sort_by_key(|state| state.version);
    Ok(states)
}

/// Fails with [`AdminError::NotMigrated`] unless every migration of this release is
/// applied in the configured schema (migrations of a later release may be applied too).
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
