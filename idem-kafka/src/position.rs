//! A consumer group's position in a partition: the one vocabulary of offsets.

use sqlx::PgConnection;

use std::sync::Arc;

use crate::progress::{PositionRow, Receipts, ReceiptsHandle};
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
    ///
    /// The fields say where the position stands; a position that the consumer handed out
    /// and whose fields were changed is refused by [`store`](Self::store).
    pub partition: i32,
    /// The offset to read next (the message's offset + 1).
    pub next_offset: i64,
    pub(crate) schema: Schema,
    /// The stored position the consumer knew PostgreSQL held when it handed this one out
    /// (`-1`: none known): storing finds out whether the database went back.
    pub(crate) floor: i64,
    /// Where a batch handler's transaction notes what it stored, for the consumer.
    pub(crate) receipts: ReceiptsHandle,
    /// The topic, partition and offset the consumer handed out: a position whose fields
    /// were changed since is refused.
    pub(crate) handed: Option<(String, i32, i64)>,
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
            floor: -1,
            receipts: ReceiptsHandle::default(),
            handed: None,
        }
    }

    /// The same position, guarded by `floor` (see [`PositionBehind`](crate::PositionBehind)).
    pub(crate) fn with_floor(mut self, floor: i64, receipts: &Arc<Receipts>) -> Self {
        self.floor = floor;
        self.receipts = ReceiptsHandle(Some(receipts.clone()));
        self.handed = Some((self.topic.clone(), self.partition, self.next_offset));
        self
    }

    /// Records the position on `conn`, typically inside the handler's transaction.
    ///
    /// Positions only move forward: a late write of an older position (a consumer that
    /// lost the partition finishing its last message) leaves a newer one in place.
    ///
    /// A position handed out by the consumer fails with [`PositionBehind`](crate::PositionBehind) (inside
    /// [`sqlx::Error::Io`]) when the stored position is behind one this member saw
    /// committed: the database lost commits. Return the error from the handler's body
    /// (`?`), so that its transaction rolls back; the consumer then goes back to the
    /// stored positions, and no attempt of the message is counted.
    ///
    /// A position the consumer handed out whose topic, partition or offset was changed
    /// since is refused ([`sqlx::Error::InvalidArgument`]): it would store a position for
    /// messages that were not handled.
    pub async fn store(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        crate::store::store_positions(conn, &self.schema, &self.group, &[self.row()?]).await
    }

    /// As the store writes it; refused when changed since the consumer handed it out.
    pub(crate) fn row(&self) -> Result<PositionRow, sqlx::Error> {
        if let Some((topic, partition, next_offset)) = &self.handed
            && (*topic != self.topic
                || *partition != self.partition
                || *next_offset != self.next_offset)
        {
            return Err(sqlx::Error::InvalidArgument(format!(
                "the position handed out for {topic}/{partition} before offset {next_offset} was \
                 changed to {}/{} before offset {}: store the position the consumer handed to \
                 the handler, as it is",
                self.topic, self.partition, self.next_offset
            )));
        }
        Ok(PositionRow {
            topic: self.topic.clone(),
            partition: self.partition,
            next_offset: self.next_offset,
            floor: self.floor,
        })
    }
}
