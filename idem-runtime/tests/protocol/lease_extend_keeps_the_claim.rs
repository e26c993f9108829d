//! Lease mode: a long handler that extends its lease keeps the key past the original expiry.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::testing::{self, Checkpoint};
use chrono::{DateTime, Utc};
use idem_runtime::Status;
use idem_runtime::key::{IdempotencyKey, KeyBuilder};
use idem_runtime::lease::{Lease, LeaseError};
use idem_runtime::{Error, Outcome, idempotent};
use sqlx::PgPool;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error(transparent)]
    Lease(#[from] LeaseError),
}

/// A long export to an external system; `exported` counts the exports it received.
#[derive(Clone)]
struct Job {
    order_id: String,
    exported: Arc<AtomicUsize>,
    claimed: Checkpoint,
    extended: Checkpoint,
}

#[idempotent(key = "order_id", scope = "export", mode = "lease", lease = "1s")]
async fn export(lease: &Lease, job: &Job) -> Result<u32, ExportError> {
    job.claimed.reach().await;
    lease.extend(Duration::from_secs(5)).await?;
    job.extended.reach().await;
    job.exported.fetch_add(1, Ordering::SeqCst);
    Ok(lease.attempt())
}

fn key() -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", "o-long")
        .unwrap()
        .finish()
}

async fn lease_expires_at(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar(
        "SELECT lease_expires_at FROM idem.idem_keys WHERE scope = 'export' AND key = $1",
    )
    .bind(key().as_uuid())
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits until the database's clock has passed `instant` (itself read from the database).
async fn wait_for_database_time(pool: &PgPool, instant: DateTime<Utc>) {
    loop {
        let passed: bool = sqlx::query_scalar("SELECT now() > $1")
            .bind(instant)
            .fetch_one(pool)
            .await
            .unwrap();
        if passed {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn an_extended_lease_keeps_duplicates_out_after_the_original_expiry(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let job = Job {
        order_id: "o-long".into(),
        exported: Arc::new(AtomicUsize::new(0)),
        claimed: Checkpoint::new(),
        extended: Checkpoint::new(),
    };

    let long = tokio::spawn({
        let (idem, job) = (idem.clone(), job.clone());
        async move { export(&idem, &job).await }
    });
    timeout(PATIENCE, job.claimed.reached()).await.unwrap();
    let original_expiry = lease_expires_at(&pool).await;
    job.claimed.release();
    timeout(PATIENCE, job.extended.reached()).await.unwrap();
    let extended_expiry = lease_expires_at(&pool).await;
    assert!(
        extended_expiry - original_expiry >= chrono::Duration::seconds(4),
        "{original_expiry} -> {extended_expiry}"
    );

    // Past the original expiry, a second delivery is still refused: the claim holds.
    wait_for_database_time(&pool, original_expiry).await;
    let refused = export(&idem, &job).await.unwrap_err();
    assert!(matches!(refused, Error::InProgress { .. }), "{refused:?}");
    let record = idem.record("export", key()).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Processing, 1));
    assert_eq!(job.exported.load(Ordering::SeqCst), 0);

    job.extended.release();
    assert_eq!(long.await.unwrap().unwrap(), Outcome::Executed(1));
    assert_eq!(
        export(&idem, &job).await.unwrap(),
        Outcome::Duplicate(Some(1))
    );
    assert_eq!(job.exported.load(Ordering::SeqCst), 1);
    let record = idem.record("export", key()).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 1));
}
