//! Lease mode: a success releases the lease and is final; duplicates get the stored result without running the body.
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::Status;
use idem_runtime::key::{IdempotencyKey, KeyBuilder};
use idem_runtime::lease::Lease;
use idem_runtime::{Idem, Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

/// What the external system answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    message_id: String,
    token: Uuid,
}

/// A notification to send; `sent` counts the calls the external system received.
struct Job<'a> {
    order_id: &'a str,
    sent: &'a AtomicUsize,
}

#[idempotent(key = "order_id", scope = "notify", mode = "lease", lease = "30s")]
async fn notify(lease: &Lease, job: &Job<'_>) -> Result<Receipt, std::io::Error> {
    job.sent.fetch_add(1, Ordering::SeqCst);
    Ok(Receipt {
        message_id: format!("msg-{}", job.order_id),
        token: lease.token(),
    })
}

#[idempotent(
    key = "order_id",
    scope = "notify_unstored",
    mode = "lease",
    store_result = false
)]
async fn notify_unstored(job: &Job<'_>) -> Result<String, std::io::Error> {
    job.sent.fetch_add(1, Ordering::SeqCst);
    Ok(format!("msg-{}", job.order_id))
}

/// Body runs of `notify_owned`.
static OWNED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Without a lease guard, with an owned message.
#[idempotent(key = "order_id", scope = "notify_owned", mode = "lease")]
async fn notify_owned(event: OrderEvent) -> Result<i64, std::io::Error> {
    OWNED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(event.amount_cents)
}

fn key(order_id: &str) -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

async fn lease_columns(pool: &PgPool, scope: &str, order_id: &str) -> (Option<Uuid>, bool) {
    sqlx::query_as(
        "SELECT lease_owner, lease_expires_at IS NULL FROM idem.idem_keys WHERE scope = $1 AND key = $2",
    )
    .bind(scope)
    .bind(key(order_id).as_uuid())
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_success_is_final_and_replayed_to_duplicates(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let sent = AtomicUsize::new(0);
    let job = Job {
        order_id: "o-ok",
        sent: &sent,
    };

    let Outcome::Executed(receipt) = notify(&idem, &job).await.unwrap() else {
        panic!("the first delivery did not execute");
    };
    assert_eq!(receipt.message_id, "msg-o-ok");
    let record = idem.record("notify", key("o-ok")).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 1));
    assert_eq!(record.result, Some(serde_json::to_value(&receipt).unwrap()));
    assert_eq!(record.last_error, None);
    // The lease ends with the success: the owner's token stays, the expiry is cleared.
    assert_eq!(
        lease_columns(&pool, "notify", "o-ok").await,
        (Some(receipt.token), true)
    );

    // Duplicates, from this worker and from a fresh one, replay the stored receipt.
    let other = Idem::new(pool.clone());
    for worker in [&idem, &other, &idem] {
        assert_eq!(
            notify(worker, &job).await.unwrap(),
            Outcome::Duplicate(Some(receipt.clone()))
        );
    }
    assert_eq!(sent.load(Ordering::SeqCst), 1);

    // Another key is independent.
    let second = Job {
        order_id: "o-ok-2",
        sent: &sent,
    };
    assert!(notify(&idem, &second).await.unwrap().is_executed());
    assert_eq!(sent.load(Ordering::SeqCst), 2);
}

#[sqlx::test(migrations = false)]
async fn without_a_stored_result_duplicates_get_none(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let sent = AtomicUsize::new(0);
    let job = Job {
        order_id: "o-unstored",
        sent: &sent,
    };

    assert_eq!(
        notify_unstored(&idem, &job).await.unwrap(),
        Outcome::Executed("msg-o-unstored".into())
    );
    assert_eq!(
        notify_unstored(&idem, &job).await.unwrap(),
        Outcome::Duplicate(None)
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    let record = idem
        .record("notify_unstored", key("o-unstored"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.status, record.result), (Status::Success, None));
}

#[sqlx::test(migrations = false)]
async fn a_handler_without_a_lease_guard_runs_in_a_spawned_task(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-owned", 700);

    for expected in [Outcome::Executed(700), Outcome::Duplicate(Some(700))] {
        let task = tokio::spawn({
            let (idem, event) = (idem.clone(), event.clone());
            async move { notify_owned(&idem, event).await }
        });
        assert_eq!(task.await.unwrap().unwrap(), expected);
    }
    assert_eq!(OWNED_RUNS.load(Ordering::SeqCst), 1);
    let record = idem
        .record("notify_owned", key("o-owned"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 1));
}
