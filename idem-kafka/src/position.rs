//! A consumer group's position in a partition: the one vocabulary of offsets.

use sqlx::PgConnection;

use crate::schema::Schema;

/// The position of a consumer group in a partition after a message: the offset to read
/// next. With offsets in PostgreSQL, the consumer hands each message's position to the
/// handler, which stores it in the transaction of its effects
/// ([`Position::store`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Position {
    /// The consumer group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset to read next (the message's offset + 1).
    pub next_offset: i64,
    pub(crate) schema: Schema,
}

impl Position {
    /// The position of `group` in `topic`/`partition` before `next_offset`, kept in the
    /// tables of `schema`.
    pub fn new(
        schema: &Schema,
        group: impl Into<String>,
        topic: impl Into<String>,
        partition: i32,
        next_offset: i64,
    ) -> Self {
        Position {
            group: group.into(),
            topic: topic.into(),
            partition,
            next_offset,
            schema: schema.clone(),
        }
    }

    /// Records the position on `conn`, typically inside the handler's transaction.
    ///
    /// Positions only move forward: a late write of an older position (a consumer that
    /// lost the partition finishing its last message) leaves a newer one in place.
    pub async fn store(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        crate::store::store_positions(
            conn,
            &self.schema,
            &self.group,
            &[(self.topic.clone(), self.partition, self.next_offset)],
        )
        .await
    }
}
