//! Migrations in a schema of their own, safe to run from every process at once.
//!
//! [`Idem::migrate`](crate::Idem::migrate) applies the status table's migrations
//! ([`MIGRATOR`](crate::MIGRATOR)) this way; a crate built on idem that keeps tables of
//! its own (idem-kafka's dead letters) applies its migrations with the same function.

pub use crate::store::migrate_schema;
