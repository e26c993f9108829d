//! Where a consumer keeps the offsets it has processed.

use std::fmt;
use std::str::FromStr;

/// Where a consumer keeps the offsets it has processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OffsetStore {
    /// Committed to Kafka after the handler's transaction committed. After a crash, the
    /// messages processed since the last commit are delivered again (and skipped as
    /// duplicates).
    #[default]
    Kafka,
    /// Written to PostgreSQL (`kafka_offsets`) by the handler's transaction, and committed
    /// to Kafka as well, for lag monitoring only. After a crash, at most the in-flight
    /// message (or batch) and the duplicates read since the last flush are delivered
    /// again.
    Postgres,
}

impl fmt::Display for OffsetStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OffsetStore::Kafka => "kafka",
            OffsetStore::Postgres => "postgres",
        })
    }
}

impl FromStr for OffsetStore {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "kafka" => Ok(OffsetStore::Kafka),
            "postgres" => Ok(OffsetStore::Postgres),
            other => Err(format!(
                "unknown offset store `{other}`; expected `kafka` or `postgres`"
            )),
        }
    }
}
