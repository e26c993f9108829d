//! Where idem-kafka keeps its tables, and their migrations.

use std::sync::Arc;

use idem_runtime::Idem;
use idem_runtime::config::Identifier;
use sqlx::migrate::Migrator;

use crate::error::ConsumerError;

/// The migrations of idem-kafka's tables (`migrations/` of the crate): the offset table
/// `kafka_offsets`, the dead-letter table `kafka_dead_letters` and the outbox
/// (`kafka_outbox`, `kafka_outbox_relays`), created in the current `search_path`. [`migrate`] applies them in the adapter's schema. Like idem-runtime's,
/// they tolerate migrations newer than this release (a rolling upgrade, a rollback).
pub static MIGRATOR: Migrator = Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("./migrations")
};

/// The adapter's schema for idem's default schema (`idem`).
pub(crate) const DEFAULT: &str = "idem_kafka";

/// The schema of idem-kafka's tables: `<idem's schema>_kafka` (`idem_kafka` by default),
/// or the one given to [`ConsumerBuilder::schema`](crate::ConsumerBuilder::schema).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    name: Arc<str>,
    /// Whether statements on the tables are prepared for reuse: not behind a transaction
    /// pooler, where a prepared statement stays on the server connection that parsed it.
    prepared: bool,
}

impl Schema {
    /// The default schema for `idem`'s status table: its schema followed by `_kafka`.
    ///
    /// A schema name has at most 48 characters: when idem's has more than 42, this one
    /// is too long, and the builders that default to it ([`ConsumerBuilder::build`] and
    /// the outbox relay's) refuse it with [`ConsumerError::Config`]; name one with
    /// [`Schema::named`].
    ///
    /// [`ConsumerBuilder::build`]: crate::ConsumerBuilder::build
    pub fn for_idem(idem: &Idem) -> Self {
        Schema {
            name: format!("{}_kafka", idem.config().schema()).into(),
            prepared: true,
        }
        .behind(idem)
    }

    /// A schema of this name: 1 to 48 characters of `[a-z0-9_]`, not starting with a
    /// digit.
    pub fn named(name: &str) -> Result<Self, ConsumerError> {
        let name =
            Identifier::new(name).map_err(|error| ConsumerError::Config(error.to_string()))?;
        Ok(Schema {
            name: name.as_str().into(),
            prepared: true,
        })
    }

    /// The schema, if its name is a valid one (see [`Schema::for_idem`] for the one case
    /// where it is not).
    pub(crate) fn checked(self) -> Result<Self, ConsumerError> {
        match Identifier::new(&self.name) {
            Ok(_) => Ok(self),
            Err(_) => Err(ConsumerError::Config(format!(
                "idem-kafka's schema would be {:?}, longer than a schema name's 48 characters \
                 (idem's schema followed by `_kafka`): name one with Schema::named",
                self.name
            ))),
        }
    }

    /// The schema as `idem`'s pool reaches it: behind a transaction pooler
    /// ([`Pooler::Transaction`](idem_runtime::Pooler::Transaction)) no statement is
    /// prepared for reuse.
    pub(crate) fn behind(mut self, idem: &Idem) -> Self {
        self.prepared = idem.config().pooler() != idem_runtime::Pooler::Transaction;
        self
    }

    /// Whether statements on the tables are prepared for reuse (sqlx's `persistent`).
    pub(crate) fn prepared(&self) -> bool {
        self.prepared
    }

    /// The schema's name.
    pub fn as_str(&self) -> &str {
        &self.name
    }
}

/// Creates the schema if needed and applies idem-kafka's migrations in it, as
/// [`Idem::migrate`] does for the status table. Safe to call from every consumer at
/// start-up (the migrations take an advisory lock and are tracked in the schema's own
/// `_sqlx_migrations` table).
pub async fn migrate(idem: &Idem, schema: &Schema) -> Result<(), ConsumerError> {
    let name = Identifier::new(schema.as_str())
        .map_err(|error| ConsumerError::Config(error.to_string()))?;
    Ok(idem_runtime::migrations::migrate_schema(idem.pool(), &name, &MIGRATOR).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idem_in(schema: &str) -> Idem {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://localhost/none")
            .unwrap();
        Idem::builder(pool).schema(schema).build().unwrap()
    }

    #[tokio::test]
    async fn the_default_schema_of_a_long_idem_schema_is_refused_by_name() {
        let fits = "s".repeat(42);
        assert_eq!(
            Schema::for_idem(&idem_in(&fits))
                .checked()
                .unwrap()
                .as_str(),
            format!("{fits}_kafka")
        );
        let long = "s".repeat(43);
        let error = Schema::for_idem(&idem_in(&long)).checked().unwrap_err();
        assert!(error.to_string().contains("Schema::named"), "{error}");
    }
}
