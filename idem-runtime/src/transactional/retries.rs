//! The bounded retries of a transaction that hit a serialization failure or a deadlock.

use std::time::Duration;

use crate::error_text::is_transient;

/// The bounded retries of transactions that hit a serialization failure or a deadlock.
pub(super) struct Retries {
    left: u32,
    backoff: Duration,
}

impl Retries {
    pub(super) fn new(limit: u32) -> Self {
        Retries {
            left: limit,
            backoff: Duration::from_millis(5),
        }
    }

    /// Whether `error` is transient and a retry is left (after a short back-off).
    pub(super) async fn take(&mut self, error: &sqlx::Error) -> bool {
        is_transient(error) && self.wait().await
    }

    pub(super) async fn wait(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        tokio::time::sleep(self.backoff).await;
        self.backoff *= 2;
        true
    }
}
