//! Failures that are the connection's, the pooler's or the server's count no attempt,
//! whatever the handler's error type makes of them: a good message whose first
//! deliveries meet a missing prepared statement (26000), a duplicate one (42P05), and its
//! own backend killed (57P01, or the pooler's report of its lost server connection), a
//! server that takes no writes (25006: a standby or a demoted primary during a failover)
//! executes at the next delivery, with no attempt recorded before it; with
//! `max_attempts = 2` it would be parked at the second failure if they counted.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::Status;
use idem_runtime::key::KeyBuilder;
use idem_runtime::{Error, Outcome, idempotent};
use sqlx::PgConnection;

use crate::route::{Database, Route};

/// The statements the body runs before its effect, one per delivery: each fails for a
/// reason that is not the message's.
const FAULTS: [&str; 5] = [
    "EXECUTE idem_test_no_such_statement",
    "PREPARE idem_test_twice AS SELECT 1; PREPARE idem_test_twice AS SELECT 1",
    "SELECT pg_terminate_backend(pg_backend_pid())",
    "SET LOCAL transaction_read_only = on; INSERT INTO infra_payments (payment_id) VALUES ('read-only')",
    "EXECUTE idem_test_no_such_statement",
];

pub struct Payment {
    pub payment_id: String,
    pub deliveries: AtomicUsize,
}

/// The handler's own error type, which keeps the database error as its source.
#[derive(Debug, thiserror::Error)]
pub enum PaymentError {
    #[error("the payment could not be stored")]
    Store(#[source] sqlx::Error),
}

#[idempotent(key = "payment_id", scope = "infra_pay", max_attempts = 2)]
async fn pay(tx: &mut PgConnection, payment: &Payment) -> Result<(), PaymentError> {
    let delivery = payment.deliveries.fetch_add(1, Ordering::SeqCst);
    if let Some(fault) = FAULTS.get(delivery) {
        sqlx::raw_sql(fault)
            .execute(&mut *tx)
            .await
            .map_err(PaymentError::Store)?;
    }
    sqlx::query("INSERT INTO infra_payments (payment_id) VALUES ($1)")
        .bind(&payment.payment_id)
        .persistent(false)
        .execute(&mut *tx)
        .await
        .map_err(PaymentError::Store)?;
    Ok(())
}

/// A lease-mode body that writes through the pool, outside idem's transaction.
pub struct Notice {
    pub notice_id: String,
    pub pool: sqlx::PgPool,
    pub deliveries: AtomicUsize,
}

#[idempotent(
    key = "notice_id",
    scope = "infra_notify",
    mode = "lease",
    lease = "30s",
    max_attempts = 2
)]
async fn notify(_lease: &idem_runtime::lease::Lease, notice: &Notice) -> Result<(), PaymentError> {
    let delivery = notice.deliveries.fetch_add(1, Ordering::SeqCst);
    let mut tx = notice.pool.begin().await.map_err(PaymentError::Store)?;
    if let Some(fault) = FAULTS.get(delivery) {
        sqlx::raw_sql(fault)
            .execute(&mut *tx)
            .await
            .map_err(PaymentError::Store)?;
    }
    sqlx::raw_sql("INSERT INTO infra_payments (payment_id) VALUES ('notice')")
        .execute(&mut *tx)
        .await
        .map_err(PaymentError::Store)?;
    tx.commit().await.map_err(PaymentError::Store)
}

/// A lease-mode body whose completion's backend is killed once: after its effect it locks
/// the key's row from a direct session, and a task of its own ends the backend that then
/// waits for that lock (the completion's), then lets the lock go.
pub struct Receipt {
    pub receipt_id: String,
    pub direct: sqlx::PgPool,
    pub effects: AtomicUsize,
}

#[idempotent(
    key = "receipt_id",
    scope = "infra_receipt",
    mode = "lease",
    lease = "30s",
    max_attempts = 2
)]
async fn send_receipt(
    _lease: &idem_runtime::lease::Lease,
    receipt: &Receipt,
) -> Result<(), PaymentError> {
    let first = receipt.effects.fetch_add(1, Ordering::SeqCst) == 0;
    if first {
        let mut locker = receipt.direct.begin().await.map_err(PaymentError::Store)?;
        sqlx::raw_sql("SELECT 1 FROM idem.idem_keys WHERE scope = 'infra_receipt' FOR UPDATE")
            .execute(&mut *locker)
            .await
            .map_err(PaymentError::Store)?;
        let direct = receipt.direct.clone();
        tokio::spawn(async move {
            let locker_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *locker)
                .await
                .unwrap();
            loop {
                let ended: Option<bool> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE $1 = ANY(pg_blocking_pids(pid)) LIMIT 1",
                )
                .bind(locker_pid)
                .fetch_optional(&direct)
                .await
                .unwrap();
                if ended == Some(true) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            locker.rollback().await.unwrap();
        });
    }
    Ok(())
}

pub async fn run(route: Route) {
    let database = Database::create(route, "infra").await;
    sqlx::query("CREATE TABLE infra_payments (payment_id text NOT NULL)")
        .execute(&database.direct)
        .await
        .unwrap();
    let idem = route.idem(&database.name, 4).await;
    idem.migrate().await.unwrap();
    let payment = Payment {
        payment_id: "p-1".into(),
        deliveries: AtomicUsize::new(0),
    };
    let key = KeyBuilder::new()
        .part("payment_id", "p-1")
        .unwrap()
        .finish();
    for fault in FAULTS {
        match pay(&idem, &payment).await {
            Err(Error::Handler {
                attempts: 0,
                parked: false,
                source,
            }) => {
                // The handler's error, as it wrote it, keeps the database's.
                let PaymentError::Store(cause) = source;
                eprintln!("{}: {fault}: {cause}", route.name());
            }
            // A lost connection met by idem's own statements rather than the body's.
            Err(Error::Database(cause)) => eprintln!("{}: {fault}: {cause}", route.name()),
            other => panic!("{fault} through {}: {other:?}", route.name()),
        }
        let record = idem.record("infra_pay", key).await.unwrap();
        assert!(
            record
                .as_ref()
                .is_none_or(|record| record.attempts == 0 && record.status != Status::Parked),
            "{fault} through {} counted against the message: {record:?}",
            route.name()
        );
    }
    assert!(matches!(
        pay(&idem, &payment).await,
        Ok(Outcome::Executed(()))
    ));
    let record = idem.record("infra_pay", key).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 1));
    assert_eq!(
        database.count("SELECT count(*) FROM infra_payments").await,
        1
    );

    // The same in lease mode: the lease goes back without the attempt its claim counted.
    let notice = Notice {
        notice_id: "n-1".into(),
        pool: idem.pool().clone(),
        deliveries: AtomicUsize::new(0),
    };
    let key = KeyBuilder::new().part("notice_id", "n-1").unwrap().finish();
    for fault in FAULTS {
        match notify(&idem, &notice).await {
            Err(
                Error::Handler {
                    attempts: 0,
                    parked: false,
                    ..
                }
                | Error::Database(_),
            ) => {}
            other => panic!("lease: {fault} through {}: {other:?}", route.name()),
        }
        let record = idem.record("infra_notify", key).await.unwrap().unwrap();
        assert_eq!(
            (record.status, record.attempts),
            (Status::Failed, 0),
            "lease: {fault} through {} counted against the message",
            route.name()
        );
    }
    assert!(matches!(
        notify(&idem, &notice).await,
        Ok(Outcome::Executed(()))
    ));
    let record = idem.record("infra_notify", key).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 1));
    assert_eq!(
        database.count("SELECT count(*) FROM infra_payments").await,
        2
    );

    // A lease's completion cut short by a killed backend is sent again: the effect once.
    let receipt = Receipt {
        receipt_id: "r-1".into(),
        direct: database.direct.clone(),
        effects: AtomicUsize::new(0),
    };
    let sent = send_receipt(&idem, &receipt).await;
    assert!(
        matches!(sent, Ok(Outcome::Executed(()))),
        "through {}: {sent:?}",
        route.name()
    );
    assert_eq!(receipt.effects.load(Ordering::SeqCst), 1);
    let key = KeyBuilder::new()
        .part("receipt_id", "r-1")
        .unwrap()
        .finish();
    let record = idem.record("infra_receipt", key).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 1));
    database.drop().await;
}
