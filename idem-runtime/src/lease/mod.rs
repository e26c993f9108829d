//! Lease mode: idempotent handlers whose effect is outside the database.
//!
//! A handler that calls a payment provider or sends an e-mail cannot run inside the
//! database transaction that marks its key: the effect cannot be rolled back. In lease
//! mode the key is claimed on its own, with a lease:
//!
//! 1. claim: the key becomes `processing` with an owner token and an expiry computed by
//!    PostgreSQL (`now() + lease`), committed at once. A `failed` key, or a `processing`
//!    key whose lease expired (its worker crashed), can be claimed again;
//! 2. the body runs with a [`Lease`]: it carries the owner token (a fencing token to
//!    hand to the external system) and can [`extend`](Lease::extend) the lease;
//! 3. mark: `success` (with the result), or `failed` (with the error text), only where
//!    the lease is still this worker's. A worker whose lease was taken over gets
//!    [`Error::LeaseLost`](crate::Error::LeaseLost) and its outcome is not recorded.
//!
//! A duplicate that arrives during a live lease gets [`Error::InProgress`](crate::Error::InProgress); after
//! `success` it is a duplicate and the body does not run.
//!
//! **The guarantee is at-least-once, deduplicated.** A worker that crashes after the
//! effect but before the mark leaves a lease that expires; the next delivery then runs
//! the effect again. So does a stalled worker whose lease ran out and was taken over: its
//! mark is refused with [`Error::LeaseLost`](crate::Error::LeaseLost), but its effect has happened. Let the
//! external system absorb the repeat: pass it [`Lease::key`], the same for every attempt,
//! as its idempotency key, and [`Lease::token`], new for each claim, to tell the claims
//! apart (where it needs an ordered fencing token, [`Lease::attempt`] grows with each
//! claim of the key, until the key is reset).
//!
//! Expiries are computed and compared on the database's clock only: every lease statement
//! uses PostgreSQL's `now()` and none binds an expiry, so the workers' clocks may drift.
//! Choose a lease longer than the body usually takes (`#[idempotent(mode = "lease", lease =
//! "2m")]`; without `lease`, [`DEFAULT_LEASE`], 30 s), and [`extend`](Lease::extend) it
//! from long bodies: once a lease runs out, another worker may run the effect as well.
//!
//! A handler that keeps its keys by the fact's time (`event_time = "..."`, see
//! [`time_buckets`](crate::time_buckets)) holds its lease in the fact's bucket: each
//! statement names the fact's time, and a fact outside its window is refused with
//! [`Error::OutsideWindow`](crate::Error::OutsideWindow) and never run (nor is a `failed`
//! key or an expired lease whose fact has left the window).
//!
//! # Choosing a mode
//!
//! - **Transaction mode** (the default) when the handler's effects are writes to the
//!   PostgreSQL database that holds the status table: the effects and the key's `success`
//!   commit together, so they happen exactly once, and a crash leaves nothing behind.
//! - **Lease mode** (`mode = "lease"`) when the effect is elsewhere: an HTTP call, an
//!   e-mail, a message to a broker, a write to another database. No transaction covers it;
//!   the lease lets one worker at a time run the body, and none after a success, and the
//!   effect is at-least-once, deduplicated by the key and the fencing token.
//! - Both: split the work into two handlers, or write the external call as an outbox row
//!   in transaction mode and make the call from a lease-mode handler of the outbox.

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::Idem;
use crate::key::IdempotencyKey;
use crate::store::{FactWindow, LeaseKey};

pub(crate) mod protocol;

pub use crate::handler::DEFAULT_LEASE;

/// The lease that a lease-mode handler holds on its key while its body runs.
#[derive(Clone, Debug)]
pub struct Lease {
    inner: Arc<LeaseInner>,
}

#[derive(Debug)]
struct LeaseInner {
    idem: Idem,
    scope: &'static str,
    key: IdempotencyKey,
    /// The fact's time and its window, where the handler keeps its keys by it.
    time: Option<FactWindow>,
    token: Uuid,
    attempt: u32,
}

/// The lease is no longer held by this worker: it expired and another worker claimed
/// the key, or the key was reset.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another worker holds the key now.
    #[error("the lease on key {key} was lost: it expired and another worker claimed the key")]
    Lost {
        /// The key.
        key: IdempotencyKey,
    },
    /// PostgreSQL failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl Lease {
    /// The guard of a claim that this worker won.
    pub(crate) fn new(
        idem: Idem,
        scope: &'static str,
        key: IdempotencyKey,
        time: Option<FactWindow>,
        token: Uuid,
        attempt: u32,
    ) -> Self {
        Lease {
            inner: Arc::new(LeaseInner {
                idem,
                scope,
                key,
                time,
                token,
                attempt,
            }),
        }
    }

    /// The owner token of this claim: a random UUID, new for each claim of the key. An
    /// external system that records the token of the call it executed can tell a stale
    /// worker's call from the current one; the tokens are not ordered (see
    /// [`attempt`](Self::attempt) for a number that grows with each claim).
    pub fn token(&self) -> Uuid {
        self.inner.token
    }

    /// The key the lease is on.
    pub fn key(&self) -> IdempotencyKey {
        self.inner.key
    }

    /// Which attempt this is (1 for the first execution). It grows with each claim of
    /// the key, after a failure or an expired lease alike, until [`Idem::reset`].
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// Extends the lease to `duration` from now (the database's now). Call it before the
    /// lease runs out in long work; fails with [`LeaseError::Lost`] if the lease is gone.
    pub async fn extend(&self, duration: Duration) -> Result<(), LeaseError> {
        let inner = &self.inner;
        let mut tx = inner.idem.bounded_transaction().await?;
        let extended = inner
            .idem
            .statements()
            .extend_lease(
                &mut tx,
                LeaseKey {
                    scope: inner.scope,
                    key: inner.key.as_uuid(),
                    time: inner.time,
                },
                inner.token,
                duration,
            )
            .await?;
        tx.commit().await?;
        if extended {
            Ok(())
        } else {
            Err(LeaseError::Lost { key: inner.key })
        }
    }
}
