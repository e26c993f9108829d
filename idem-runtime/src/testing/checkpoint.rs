//! Checkpoints: a point in a handler body where the body announces itself and waits.

use std::sync::Arc;

use tokio::sync::Notify;

/// A point in a handler body where the body announces itself and waits to be released.
///
/// The body calls [`Checkpoint::reach`]; the test awaits [`Checkpoint::reached`], looks
/// at the database while the body's transaction is open, and calls
/// [`Checkpoint::release`]. Either side may come first: nothing is lost.
///
/// ```no_run
/// # async fn test(idem: idem_runtime::Idem) {
/// use idem_runtime::testing::{self, Checkpoint};
///
/// let in_body = Checkpoint::new();
/// // A handler body calls `in_body.reach().await`; meanwhile the test looks at the
/// // database with the body's transaction open, then lets the body go on.
/// in_body.reached().await;
/// assert_eq!(testing::count_rows(idem.pool(), "idem.idem_keys").await, 0);
/// in_body.release();
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    inner: Arc<Signals>,
}

#[derive(Debug, Default)]
struct Signals {
    reached: Notify,
    released: Notify,
}

impl Checkpoint {
    /// A checkpoint that no body has reached yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// In the body: announces that the body got here, then waits for [`release`](Self::release).
    pub async fn reach(&self) {
        self.inner.reached.notify_one();
        self.inner.released.notified().await;
    }

    /// In the body: announces that the body got here, and goes on.
    pub fn announce(&self) {
        self.inner.reached.notify_one();
    }

    /// In the body: announces that the body got here and never returns, so that the
    /// delivery only ends when its future is dropped.
    pub async fn reach_and_hang(&self) -> std::convert::Infallible {
        self.announce();
        std::future::pending().await
    }

    /// In the test: waits until a body has called [`reach`](Self::reach).
    pub async fn reached(&self) {
        self.inner.reached.notified().await;
    }

    /// In the test: lets a body waiting in [`reach`](Self::reach) go on.
    pub fn release(&self) {
        self.inner.released.notify_one();
    }
}
