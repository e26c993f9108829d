//! Why a record could not be written into the outbox.

/// Why [`send`](super::send) wrote nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// Called outside a transactional handler's body, for a record without a key of its
    /// own: there is no fact to derive its key from.
    #[error(
        "outbox::send is called outside the body of a transactional #[idempotent] handler (a lease-mode body has no transaction to write it in): give the record a key with Record::idempotency_key"
    )]
    NoDelivery,
    /// The record cannot be published as described.
    #[error("the record cannot be sent: {0}")]
    Invalid(String),
    /// The payload could not be encoded as JSON.
    #[error("the record's payload cannot be encoded as JSON")]
    Json(#[source] serde_json::Error),
    /// The outbox table could not be written: the transaction's failure, handled as any
    /// database error of the body (an outage is retried and counts no attempt).
    #[error("the record could not be written into the outbox")]
    Database(#[source] sqlx::Error),
}

/// A body returning `sqlx::Error` can send with `?`: the database's error stays itself, so
/// that an outage counts no attempt; the others count as the body's failure.
impl From<OutboxError> for sqlx::Error {
    fn from(error: OutboxError) -> Self {
        match error {
            OutboxError::Database(error) => error,
            other => sqlx::Error::Encode(Box::new(other)),
        }
    }
}
