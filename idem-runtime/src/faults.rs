//! The points of the runtime where a fault that a test armed fires
//! ([`testing::inject`](crate::testing::inject), feature `testing`), as functions that the
//! protocols call in every build.
//!
//! Without the feature the fault slot is empty and every point is a function that does
//! nothing (the compiler removes it): the protocols read the same in both builds, and a
//! build without `testing` (the benches, the examples, every application) carries no
//! fault hook. With it, each point fires the fault armed on the delivery's handle, once.

use std::future::Future;
#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "testing")]
use std::sync::{Arc, Mutex, PoisonError};

#[cfg(feature = "testing")]
use sqlx::Connection;
use sqlx::{PgConnection, PgPool};

#[cfg(feature = "testing")]
/// A fault that [`inject`](crate::testing::inject) arms on a runtime handle, fired by the next delivery of the
/// handle that reaches its point.
///
/// Each fault is what a crash, a failover or a network failure does to a delivery, at a
/// point chosen so that the delivery cannot both apply its effects and report
/// `Executed` correctly by luck. [`assert_survives`](crate::testing::assert_survives) checks that
/// the handler's effects are still applied exactly once.
///
/// ```
/// use idem_runtime::testing::Fault;
///
/// let transaction_mode: Vec<Fault> =
///     Fault::ALL.into_iter().filter(|fault| !fault.is_lease_mode()).collect();
/// assert_eq!(transaction_mode.len(), 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// Transaction mode: the body returned `Ok`, then the connection is lost before
    /// `COMMIT`. The transaction rolls back and the delivery returns
    /// [`Error::Database`](crate::Error::Database) with an I/O error, as a lost
    /// connection does; no attempt is counted. In a batch, the batch's commit is lost and
    /// its messages are processed one by one.
    FailBeforeCommit,
    /// Transaction mode: the body's own backend is terminated (`pg_terminate_backend`,
    /// from a connection of its own) while the body runs. The statement of the body that
    /// meets the termination fails, or, if the body ends first, its commit: the runtime
    /// waits for the termination before it commits.
    KillBackendInBody,
    /// Transaction mode: the body's backend is terminated while its `COMMIT` is in
    /// flight. Either may win: the delivery returns `Executed` with its effects
    /// committed, or an error, its effects committed or not (the next delivery finds out
    /// from the status table).
    KillBackendDuringCommit,
    /// Lease mode: the worker vanishes right after it claimed the key, before the body
    /// runs, and holds the lease until it expires on the database's clock. The delivery
    /// returns [`Error::Database`](crate::Error::Database) with an I/O error.
    AbandonLease,
    /// Lease mode: the worker vanishes after the body returned `Ok` and before its
    /// `success` is recorded. Its effect happened; the lease expires, and the next
    /// delivery runs the body again: the external system must absorb the repeat (pass it
    /// [`Lease::key`](crate::lease::Lease::key) as its idempotency key).
    AbandonLeaseAfterBody,
}

#[cfg(feature = "testing")]
impl Fault {
    /// Every fault, in the order of the variants.
    pub const ALL: [Fault; 5] = [
        Fault::FailBeforeCommit,
        Fault::KillBackendInBody,
        Fault::KillBackendDuringCommit,
        Fault::AbandonLease,
        Fault::AbandonLeaseAfterBody,
    ];

    /// Whether the fault fires in lease mode (otherwise in transaction mode).
    pub fn is_lease_mode(self) -> bool {
        matches!(self, Fault::AbandonLease | Fault::AbandonLeaseAfterBody)
    }

    /// Where the fault fires, for messages.
    pub(crate) fn point(self) -> &'static str {
        match self {
            Fault::FailBeforeCommit => {
                "a commit after a body that returned Ok (transaction mode or a batch)"
            }
            Fault::KillBackendInBody => "a body that runs (transaction mode)",
            Fault::KillBackendDuringCommit => {
                "a commit after a body that returned Ok (transaction mode)"
            }
            Fault::AbandonLease => "a lease claim (lease mode)",
            Fault::AbandonLeaseAfterBody => "a lease body that returned Ok (lease mode)",
        }
    }
}

/// The fault armed on a runtime handle, if any (none, ever, without the feature `testing`).
#[derive(Debug, Default)]
pub(crate) struct FaultSlot {
    /// Whether a fault may be armed: the deliveries of a handle without one read only this.
    #[cfg(feature = "testing")]
    maybe_armed: AtomicBool,
    #[cfg(feature = "testing")]
    armed: Mutex<Option<Armed>>,
}

#[cfg(feature = "testing")]
#[derive(Debug)]
struct Armed {
    fault: Fault,
    fired: Arc<AtomicBool>,
}

#[cfg(feature = "testing")]
impl FaultSlot {
    pub(crate) fn arm(&self, fault: Fault, fired: Arc<AtomicBool>) {
        *self.lock() = Some(Armed { fault, fired });
        self.maybe_armed.store(true, Ordering::SeqCst);
    }

    /// Takes the armed fault back, if it is the injection's.
    pub(crate) fn disarm(&self, fired: &Arc<AtomicBool>) {
        let mut armed = self.lock();
        if armed
            .as_ref()
            .is_some_and(|armed| Arc::ptr_eq(&armed.fired, fired))
        {
            *armed = None;
        }
    }

    /// Takes the armed fault if it is one of `faults`: the delivery fires it.
    fn take(&self, faults: &[Fault]) -> Option<(Fault, Arc<AtomicBool>)> {
        if !self.maybe_armed.load(Ordering::SeqCst) {
            return None;
        }
        let mut armed = self.lock();
        if armed
            .as_ref()
            .is_some_and(|armed| faults.contains(&armed.fault))
        {
            armed.take().map(|armed| (armed.fault, armed.fired))
        } else {
            None
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Armed>> {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(feature = "testing")]
/// The error of a connection lost at `point`.
fn lost_connection(point: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        format!("connection lost {point} (fault injected by idem_runtime::testing)"),
    ))
}

/// Transaction mode and batches: the lost connection of [`Fault::FailBeforeCommit`],
/// if it is armed, for a transaction about to commit.
pub(crate) fn before_commit(slot: &FaultSlot) -> Option<sqlx::Error> {
    #[cfg(feature = "testing")]
    {
        let (_, fired) = slot.take(&[Fault::FailBeforeCommit])?;
        fired.store(true, Ordering::SeqCst);
        Some(lost_connection("before COMMIT"))
    }
    #[cfg(not(feature = "testing"))]
    {
        let _ = slot;
        None
    }
}

/// Lease mode: the vanished worker of [`Fault::AbandonLease`], if it is armed, right
/// after a claim.
pub(crate) fn after_lease_claim(slot: &FaultSlot) -> Option<sqlx::Error> {
    #[cfg(feature = "testing")]
    {
        let (_, fired) = slot.take(&[Fault::AbandonLease])?;
        fired.store(true, Ordering::SeqCst);
        Some(lost_connection("after the lease was claimed"))
    }
    #[cfg(not(feature = "testing"))]
    {
        let _ = slot;
        None
    }
}

/// Lease mode: the vanished worker of [`Fault::AbandonLeaseAfterBody`], if it is armed,
/// after a body that returned `Ok`.
pub(crate) fn before_lease_completion(slot: &FaultSlot) -> Option<sqlx::Error> {
    #[cfg(feature = "testing")]
    {
        let (_, fired) = slot.take(&[Fault::AbandonLeaseAfterBody])?;
        fired.store(true, Ordering::SeqCst);
        Some(lost_connection("before the lease's success was recorded"))
    }
    #[cfg(not(feature = "testing"))]
    {
        let _ = slot;
        None
    }
}

/// The termination of the backend of one transaction-mode delivery, when a kill fault
/// was armed as it claimed its key.
#[derive(Debug, Default)]
pub(crate) struct BackendKill {
    #[cfg(feature = "testing")]
    armed: Option<Kill>,
}

#[cfg(feature = "testing")]
#[derive(Debug)]
struct Kill {
    during_commit: bool,
    pid: i32,
    killer: PgConnection,
    fired: Arc<AtomicBool>,
}

impl BackendKill {
    /// After a claim on `conn`: takes a kill fault armed in `slot`, reads the backend's
    /// pid and opens the connection (from `pool`'s options) that will terminate it.
    pub(crate) async fn at_claim(slot: &FaultSlot, pool: &PgPool, conn: &mut PgConnection) -> Self {
        #[cfg(feature = "testing")]
        {
            let Some((fault, fired)) =
                slot.take(&[Fault::KillBackendInBody, Fault::KillBackendDuringCommit])
            else {
                return BackendKill::default();
            };
            let pid = sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()")
                .fetch_one(&mut *conn)
                .await;
            let killer = PgConnection::connect_with(&pool.connect_options()).await;
            match (pid, killer) {
                (Ok(pid), Ok(killer)) => BackendKill {
                    armed: Some(Kill {
                        during_commit: fault == Fault::KillBackendDuringCommit,
                        pid,
                        killer,
                        fired,
                    }),
                },
                (Err(error), _) | (_, Err(error)) => {
                    tracing::warn!(%error, ?fault, "could not prepare the fault; it did not fire");
                    BackendKill::default()
                }
            }
        }
        #[cfg(not(feature = "testing"))]
        {
            let _ = (slot, pool, conn);
            BackendKill::default()
        }
    }

    /// Runs the body, and the kill of [`Fault::KillBackendInBody`] at the same time.
    pub(crate) async fn during_body<F: Future>(&mut self, body: F) -> F::Output {
        #[cfg(feature = "testing")]
        if let Some(kill) = self.armed.take_if(|kill| !kill.during_commit) {
            return tokio::join!(body, kill.run()).0;
        }
        body.await
    }

    /// Runs the commit, and the kill of [`Fault::KillBackendDuringCommit`] at the same
    /// time.
    pub(crate) async fn during_commit<F: Future>(&mut self, commit: F) -> F::Output {
        #[cfg(feature = "testing")]
        if let Some(kill) = self.armed.take() {
            return tokio::join!(commit, kill.run()).0;
        }
        commit.await
    }
}

#[cfg(feature = "testing")]
impl Kill {
    /// Terminates the backend and waits until it is gone.
    async fn run(mut self) {
        let terminated = sqlx::query_scalar::<_, bool>("SELECT pg_terminate_backend($1, 5000)")
            .bind(self.pid)
            .fetch_one(&mut self.killer)
            .await;
        match terminated {
            Ok(true) => self.fired.store(true, Ordering::SeqCst),
            Ok(false) => tracing::warn!(pid = self.pid, "the backend did not terminate"),
            Err(error) => tracing::warn!(pid = self.pid, %error, "could not terminate the backend"),
        }
        let _ = self.killer.close().await;
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;

    #[test]
    fn a_fault_is_taken_once_and_only_at_its_own_point() {
        let slot = FaultSlot::default();
        assert!(slot.take(&[Fault::FailBeforeCommit]).is_none());
        let fired = Arc::new(AtomicBool::new(false));
        slot.arm(Fault::AbandonLease, fired.clone());
        assert!(slot.take(&[Fault::FailBeforeCommit]).is_none());
        let (fault, taken) = slot.take(&[Fault::AbandonLease]).expect("armed");
        assert_eq!(fault, Fault::AbandonLease);
        assert!(Arc::ptr_eq(&taken, &fired));
        assert!(slot.take(&[Fault::AbandonLease]).is_none());
    }

    #[test]
    fn disarming_takes_back_only_the_same_injection() {
        let slot = FaultSlot::default();
        let first = Arc::new(AtomicBool::new(false));
        slot.arm(Fault::FailBeforeCommit, first.clone());
        let second = Arc::new(AtomicBool::new(false));
        slot.arm(Fault::KillBackendInBody, second.clone());
        slot.disarm(&first);
        assert!(slot.take(&[Fault::KillBackendInBody]).is_some());
        slot.arm(Fault::KillBackendInBody, second.clone());
        slot.disarm(&second);
        assert!(slot.take(&[Fault::KillBackendInBody]).is_none());
    }
}
