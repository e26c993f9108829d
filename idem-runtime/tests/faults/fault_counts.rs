//! How many faults of each kind the run injected (or, for the faults PostgreSQL decides,
//! observed), counted where they happen.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter per kind of fault.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Bodies that failed the first attempt of their event on purpose.
    pub transient_handler_errors: AtomicU64,
    /// Bodies that failed on purpose, every attempt (their events end parked).
    pub permanent_handler_errors: AtomicU64,
    /// Deliveries whose task was aborted (`JoinHandle::abort`) before it finished.
    pub aborted_tasks: AtomicU64,
    /// Deliveries whose future was dropped (a timeout) before it finished.
    pub dropped_futures: AtomicU64,
    /// Backends ended with `pg_terminate_backend` at random.
    pub backends_killed: AtomicU64,
    /// Backends ended with `pg_terminate_backend` while running the commit statement.
    pub commits_killed: AtomicU64,
    /// `pg_ctl restart -m immediate` of the cluster.
    pub postgres_restarts: AtomicU64,
    /// `FLUSHALL` of the cache.
    pub redis_flushes: AtomicU64,
    /// `SHUTDOWN NOSAVE` of the cache, started again after a pause.
    pub redis_shutdowns: AtomicU64,
    /// SIGKILL of the cache, started again after a pause.
    pub redis_kills: AtomicU64,
    /// Lease-mode bodies that outlived their lease on purpose.
    pub leases_outlived: AtomicU64,
    /// Of those, the ones whose completion was refused because another worker had taken
    /// the key over (`Error::LeaseLost`).
    pub leases_lost: AtomicU64,
    /// Bodies that held their key longer than the lock timeout on purpose.
    pub slow_bodies: AtomicU64,
    /// Duplicates of such a key that gave up with `Error::InProgress`.
    pub lock_timeouts: AtomicU64,
    /// Pairs of bodies started together that lock two accounts in opposite order.
    pub lock_order_pairs: AtomicU64,
    /// Deadlocks PostgreSQL reported to a body.
    pub deadlocks: AtomicU64,
    /// Serialization failures PostgreSQL reported to a body.
    pub serialization_failures: AtomicU64,
    /// Runs of the retention cleanup with a window of 1 ms on the receipts' scope.
    pub purges: AtomicU64,
    /// Keys those runs deleted.
    pub keys_purged: AtomicU64,
}

impl FaultCounts {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Every kind with its count, in the order of the summary.
    pub fn rows(&self) -> Vec<(&'static str, u64)> {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        vec![
            (
                "handler errors, transient",
                read(&self.transient_handler_errors),
            ),
            (
                "handler errors, permanent",
                read(&self.permanent_handler_errors),
            ),
            ("tasks aborted mid-delivery", read(&self.aborted_tasks)),
            ("futures dropped mid-delivery", read(&self.dropped_futures)),
            ("backends killed at random", read(&self.backends_killed)),
            ("backends killed in COMMIT", read(&self.commits_killed)),
            (
                "PostgreSQL restarts (immediate)",
                read(&self.postgres_restarts),
            ),
            ("Redis FLUSHALL", read(&self.redis_flushes)),
            ("Redis SHUTDOWN NOSAVE", read(&self.redis_shutdowns)),
            ("Redis killed (SIGKILL)", read(&self.redis_kills)),
            (
                "lease bodies outliving their lease",
                read(&self.leases_outlived),
            ),
            ("  of which completions refused", read(&self.leases_lost)),
            (
                "bodies holding a key past the lock timeout",
                read(&self.slow_bodies),
            ),
            (
                "  duplicates timed out behind them",
                read(&self.lock_timeouts),
            ),
            (
                "lock-order pairs started together",
                read(&self.lock_order_pairs),
            ),
            ("  deadlocks reported to bodies", read(&self.deadlocks)),
            (
                "serialization failures reported to bodies",
                read(&self.serialization_failures),
            ),
            ("retention cleanups racing duplicates", read(&self.purges)),
            ("  keys they purged", read(&self.keys_purged)),
        ]
    }
}
