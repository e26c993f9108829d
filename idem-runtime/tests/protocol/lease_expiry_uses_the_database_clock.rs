//! Lease mode: lease expiries are computed and compared on PostgreSQL's clock; no client timestamp takes part in the protocol.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::testing::{self, Checkpoint};
use idem_runtime::key::{IdempotencyKey, KeyBuilder};
use idem_runtime::lease::{Lease, LeaseError};
use idem_runtime::{Error, Idem, idempotent};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("the partner system is down")]
    Down,
    #[error(transparent)]
    Lease(#[from] LeaseError),
}

/// What a delivery's body does, in this order; each step is optional.
#[derive(Default)]
struct Job<'a> {
    order_id: &'a str,
    claimed: Option<Checkpoint>,
    extend_to: Option<Duration>,
    extended: Option<Checkpoint>,
    dies_at: Option<Checkpoint>,
    fails: bool,
    runs: Option<&'a AtomicUsize>,
}

#[idempotent(
    key = "order_id",
    scope = "sync_order",
    mode = "lease",
    lease = "1500ms",
    max_attempts = 2
)]
async fn sync_order(lease: &Lease, job: &Job<'_>) -> Result<u32, SyncError> {
    if let Some(runs) = job.runs {
        runs.fetch_add(1, Ordering::SeqCst);
    }
    if let Some(checkpoint) = &job.claimed {
        checkpoint.reach().await;
    }
    if let Some(duration) = job.extend_to {
        lease.extend(duration).await?;
    }
    if let Some(checkpoint) = &job.extended {
        checkpoint.reach().await;
    }
    if let Some(checkpoint) = &job.dies_at {
        match checkpoint.reach_and_hang().await {}
    }
    if job.fails {
        return Err(SyncError::Down);
    }
    Ok(lease.attempt())
}

fn key(order_id: &str) -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

/// Checks a condition on the key's row, written in SQL, on the database.
async fn row_satisfies(pool: &PgPool, order_id: &str, condition: &str) -> bool {
    sqlx::query_scalar(&format!(
        "SELECT coalesce({condition}, false) FROM idem.idem_keys WHERE scope = 'sync_order' AND key = $1"
    ))
    .bind(key(order_id).as_uuid())
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn assert_row(pool: &PgPool, order_id: &str, condition: &str) {
    assert!(
        row_satisfies(pool, order_id, condition).await,
        "not true of {order_id}: {condition}"
    );
}

/// Runs `delivery` until its worker dies mid-body, and drops it.
async fn die_mid_body<F: std::future::Future>(delivery: F, checkpoint: &Checkpoint) {
    let mut delivery = Box::pin(delivery);
    tokio::select! {
        () = checkpoint.reached() => {}
        _ = &mut delivery => panic!("the dying delivery returned"),
        () = tokio::time::sleep(PATIENCE) => panic!("the dying delivery never ran its body"),
    }
}

/// Expiries equal, to the microsecond, the database's transaction time of the statement
/// that wrote them (`updated_at`, `created_at` default to `now()`) plus the lease: a
/// client-side clock could not produce them.
#[sqlx::test(migrations = false)]
async fn expiries_are_the_database_time_of_the_claim_plus_the_lease(pool: PgPool) {
    let idem = testing::setup(&pool).await;

    // A first claim, then an extension.
    let (claimed, extended) = (Checkpoint::new(), Checkpoint::new());
    let job = Job {
        order_id: "o-clock",
        claimed: Some(claimed.clone()),
        extend_to: Some(Duration::from_secs(4)),
        extended: Some(extended.clone()),
        ..Job::default()
    };
    let mut delivery = Box::pin(sync_order(&idem, &job));
    tokio::select! {
        () = claimed.reached() => {}
        outcome = &mut delivery => panic!("the delivery returned: {outcome:?}"),
    }
    assert_row(
        &pool,
        "o-clock",
        "lease_expires_at = created_at + interval '1500 milliseconds'",
    )
    .await;
    assert_row(
        &pool,
        "o-clock",
        "lease_expires_at = updated_at + interval '1500 milliseconds'",
    )
    .await;
    assert_row(
        &pool,
        "o-clock",
        "lease_expires_at - now() BETWEEN interval '0' AND interval '1500 milliseconds'",
    )
    .await;

    claimed.release();
    tokio::select! {
        () = extended.reached() => {}
        outcome = &mut delivery => panic!("the delivery returned: {outcome:?}"),
    }
    assert_row(
        &pool,
        "o-clock",
        "lease_expires_at = updated_at + interval '4 seconds'",
    )
    .await;
    assert_row(&pool, "o-clock", "updated_at > created_at").await;
    assert_row(
        &pool,
        "o-clock",
        "lease_expires_at - now() BETWEEN interval '3 seconds' AND interval '4 seconds'",
    )
    .await;
    extended.release();
    assert!(
        timeout(PATIENCE, delivery)
            .await
            .unwrap()
            .unwrap()
            .is_executed()
    );
    assert_row(&pool, "o-clock", "lease_expires_at IS NULL").await;

    // A takeover of an expired lease.
    let dies_at = Checkpoint::new();
    let dying = Job {
        order_id: "o-takeover",
        dies_at: Some(dies_at.clone()),
        ..Job::default()
    };
    die_mid_body(sync_order(&idem, &dying), &dies_at).await;
    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "sync_order", key("o-takeover")).await;
    let claimed = Checkpoint::new();
    let job = Job {
        order_id: "o-takeover",
        claimed: Some(claimed.clone()),
        ..Job::default()
    };
    let mut delivery = Box::pin(sync_order(&idem, &job));
    tokio::select! {
        () = claimed.reached() => {}
        outcome = &mut delivery => panic!("the delivery returned: {outcome:?}"),
    }
    assert_row(&pool, "o-takeover", "attempts = 2").await;
    assert_row(
        &pool,
        "o-takeover",
        "updated_at >= created_at + interval '1500 milliseconds'",
    )
    .await;
    assert_row(
        &pool,
        "o-takeover",
        "lease_expires_at = updated_at + interval '1500 milliseconds'",
    )
    .await;
    claimed.release();
    assert!(
        timeout(PATIENCE, delivery)
            .await
            .unwrap()
            .unwrap()
            .is_executed()
    );
}

/// Every statement of the protocol, prepared on one worker connection, is read back from
/// `pg_prepared_statements`: none takes a date or time parameter, so only the database's
/// `now()` can set or compare an expiry.
#[sqlx::test(migrations = false)]
async fn no_statement_of_the_protocol_takes_a_client_timestamp(pool: PgPool) {
    testing::setup(&pool).await;
    // One connection: every statement the worker runs is prepared in one session.
    let options = pool.connect_options().as_ref().clone();
    let worker_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let worker = Idem::new(worker_pool.clone());
    let runs = AtomicUsize::new(0);

    // Claim (insert), extend, complete.
    let job = Job {
        order_id: "o-ok",
        extend_to: Some(Duration::from_secs(5)),
        runs: Some(&runs),
        ..Job::default()
    };
    assert!(sync_order(&worker, &job).await.unwrap().is_executed());
    // Failure, then a claim of the failed key.
    let failing = Job {
        order_id: "o-retry",
        fails: true,
        ..Job::default()
    };
    assert!(matches!(
        sync_order(&worker, &failing).await,
        Err(Error::Handler { .. })
    ));
    assert!(
        sync_order(
            &worker,
            &Job {
                order_id: "o-retry",
                ..Job::default()
            }
        )
        .await
        .unwrap()
        .is_executed()
    );
    // A live lease (in progress), its takeover after expiry, and parking after the
    // second expiry (max_attempts = 2).
    for attempt in 1..=2 {
        let dies_at = Checkpoint::new();
        let dying = Job {
            order_id: "o-dies",
            dies_at: Some(dies_at.clone()),
            ..Job::default()
        };
        die_mid_body(sync_order(&worker, &dying), &dies_at).await;
        if attempt == 1 {
            let refused = sync_order(
                &worker,
                &Job {
                    order_id: "o-dies",
                    ..Job::default()
                },
            )
            .await;
            assert!(
                matches!(refused, Err(Error::InProgress { .. })),
                "{refused:?}"
            );
        }
        testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "sync_order", key("o-dies")).await;
    }
    let parked = sync_order(
        &worker,
        &Job {
            order_id: "o-dies",
            ..Job::default()
        },
    )
    .await;
    assert!(matches!(parked, Err(Error::Parked { .. })), "{parked:?}");

    let statements: Vec<(String, Vec<String>)> = sqlx::query_as(
        "SELECT statement, parameter_types::text[] FROM pg_prepared_statements \
         WHERE statement LIKE '%idem_keys%' AND statement NOT LIKE '%pg_prepared_statements%'",
    )
    .persistent(false)
    .fetch_all(&worker_pool)
    .await
    .unwrap();

    // The protocol's statements are all there: claim, read, park, extend, complete, fail.
    for needle in [
        "'processing', 1, $3, $4, now() + $5 * interval",
        "coalesce(lease_expires_at <= now(), false) AS expired",
        "SET status = 'parked', lease_expires_at = NULL",
        "SET lease_expires_at = now() + $4 * interval",
        "SET status = 'success', result = $4::text::json, lease_expires_at = NULL",
        "WHEN attempts >= $5 THEN 'parked' ELSE 'failed' END",
    ] {
        assert!(
            statements
                .iter()
                .any(|(statement, _)| statement.contains(needle)),
            "no prepared statement contains {needle:?}: {statements:#?}"
        );
    }
    let time_types = ["timestamp", "date", "time", "interval"];
    for (statement, parameters) in &statements {
        assert!(
            !parameters
                .iter()
                .any(|parameter| time_types.iter().any(|time| parameter.contains(time))),
            "a statement binds a date or time: {parameters:?} in {statement}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
