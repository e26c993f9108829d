//! A stored position that went back: the database lost commits.

use std::fmt;

/// The position PostgreSQL holds for a partition is behind one that a transaction of this
/// member saw committed: the database lost commits (a failover to a standby that had not
/// received them, a restore from a backup). The write of a position that finds this is
/// refused, its transaction rolls back, and the consumer goes back to the positions
/// PostgreSQL holds, so that the messages whose effects were lost are handled again.
///
/// [`Position::store`](crate::Position::store) returns it inside
/// [`sqlx::Error::Io`], as a lost connection: a failure of the infrastructure, which
/// idem never counts as an attempt of the message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PositionBehind {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The position PostgreSQL holds now (`None`: its row is gone).
    pub stored: Option<i64>,
    /// The position this member saw committed.
    pub known: i64,
}

impl PositionBehind {
    /// As the error of a statement: a failure of the infrastructure.
    pub(crate) fn into_sqlx(self) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::other(self))
    }

    /// The `PositionBehind` inside `error`, if that is what it is.
    pub fn of(error: &sqlx::Error) -> Option<&PositionBehind> {
        match error {
            sqlx::Error::Io(io) => io.get_ref()?.downcast_ref(),
            _ => None,
        }
    }
}

impl fmt::Display for PositionBehind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the position stored for {}/{} ",
            self.topic, self.partition
        )?;
        match self.stored {
            Some(stored) => write!(f, "is {stored}")?,
            None => f.write_str("is gone")?,
        }
        write!(
            f,
            ", behind {} that this member saw committed: the stored position went back (the \
             database lost commits, as in a failover to a standby that had not received them, \
             or it was rewritten); the consumer reads the partition again from the stored \
             position",
            self.known
        )
    }
}

impl std::error::Error for PositionBehind {}
