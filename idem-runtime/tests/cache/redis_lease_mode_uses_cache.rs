//! Lease-mode handlers use the cache too: a duplicate of a completed lease-mode key is answered from Redis without PostgreSQL (its pool is closed) and without running the effect again.

use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicU32, Ordering};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::lease::Lease;
use idem_runtime::{Outcome, idempotent};
use sqlx::PgPool;

static SENT: AtomicU32 = AtomicU32::new(0);

#[idempotent(
    key = "order_id",
    scope = "send_receipt",
    mode = "lease",
    lease = "30s"
)]
async fn send_receipt(lease: &Lease, event: &OrderEvent) -> Result<String, std::io::Error> {
    SENT.fetch_add(1, Ordering::SeqCst);
    Ok(format!(
        "receipt for {} sent with token {}",
        event.order_id,
        lease.token()
    ))
}

#[sqlx::test(migrations = false)]
async fn lease_mode_duplicate_is_answered_from_redis(pool: PgPool) {
    let (idem, _prefix) = redis_support::setup(&pool).await;
    let event = testing::paid("o-lease", 100);

    let Outcome::Executed(sent) = send_receipt(&idem, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };
    redis_support::written(&idem, 1).await;

    pool.close().await;
    assert_eq!(
        send_receipt(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(sent))
    );
    assert_eq!(redis_support::stats(&idem).hits, 1);
    assert_eq!(SENT.load(Ordering::SeqCst), 1);
}
