//! The outbox for operators: what waits, what was set aside, and putting it back
//! (`idem outbox` in the command line).

use std::time::Duration;

use idem_runtime::Idem;

use crate::schema::Schema;
use crate::store::{alone, outbox as store};

pub use crate::store::outbox::{OutboxSummary, ParkedRecord};

/// Records waiting, parked and kept after sending, the oldest waiting record's age, and
/// which relay holds which shard.
pub async fn summary(idem: &Idem, schema: &Schema) -> Result<OutboxSummary, sqlx::Error> {
    let schema = schema.clone().behind(idem);
    let mut conn = idem.pool().acquire().await?;
    alone(&mut conn, &schema, async |conn| {
        store::summary(conn, &schema).await
    })
    .await
}

/// The parked records (oldest first, at most `limit`), with their errors.
pub async fn parked(
    idem: &Idem,
    schema: &Schema,
    limit: i64,
) -> Result<Vec<ParkedRecord>, sqlx::Error> {
    let schema = schema.clone().behind(idem);
    let mut conn = idem.pool().acquire().await?;
    alone(&mut conn, &schema, async |conn| {
        store::parked(conn, &schema, limit).await
    })
    .await
}

/// Puts the parked record `id` (or every parked record, with `None`) back in line for the
/// relays, its attempts counted from zero; returns how many.
pub async fn retry(idem: &Idem, schema: &Schema, id: Option<i64>) -> Result<u64, sqlx::Error> {
    let schema = schema.clone().behind(idem);
    let mut conn = idem.pool().acquire().await?;
    alone(&mut conn, &schema, async |conn| {
        store::retry(conn, &schema, id).await
    })
    .await
}

/// Deletes the records sent more than `older_than` ago, a thousand at a time; returns how
/// many. Unsent and parked records stay. The relay holding shard 0 does it every minute
/// with its [`retention`](super::RelayBuilder::retention).
pub async fn purge(idem: &Idem, schema: &Schema, older_than: Duration) -> Result<u64, sqlx::Error> {
    let schema = schema.clone().behind(idem);
    let mut conn = idem.pool().acquire().await?;
    store::purge_sent(&mut conn, &schema, older_than, 1000).await
}
