//! Lease mode: e-mail receipts for paid orders, each sent once however often the
//! "order paid" message is delivered.
//!
//! The mail provider stands in for any external system: it cannot take part in our
//! database transaction, but it deduplicates on the idempotency key we hand it (as real
//! payment and mail APIs do), and it records the fencing token of the claim that sent it.
//! Every order is delivered three times at once; duplicates during the live lease get
//! `InProgress` and come back later, as a consumer's retry would.
//!
//! Run: `cargo run --example lease_receipts` (PostgreSQL from `DATABASE_URL`).

use std::time::Duration;

use idem_runtime::lease::Lease;
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::PgPool;
use uuid::Uuid;

/// The message: an order was paid.
#[derive(Clone)]
struct OrderPaid {
    order_id: String,
    email: String,
}

/// The external mail provider (a table of its own, written outside our transactions).
struct MailProvider {
    pool: PgPool,
}

impl MailProvider {
    /// Sends a receipt unless one was already sent with this idempotency key.
    async fn send(&self, key: Uuid, token: Uuid, to: &str) -> Result<bool, sqlx::Error> {
        let sent = sqlx::query(
            "INSERT INTO mail_provider_outbox (idempotency_key, fencing_token, recipient) \
             VALUES ($1, $2, $3) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(key)
        .bind(token)
        .bind(to)
        .execute(&self.pool)
        .await?;
        Ok(sent.rows_affected() == 1)
    }
}

#[idempotent(key = "order_id", mode = "lease", lease = "10s")]
async fn send_receipt(
    lease: &Lease,
    order: &OrderPaid,
    mail: &MailProvider,
) -> Result<String, sqlx::Error> {
    // Slow enough for the concurrent duplicates to find the lease live.
    tokio::time::sleep(Duration::from_millis(50)).await;
    mail.send(lease.key().as_uuid(), lease.token(), &order.email)
        .await?;
    Ok(format!(
        "receipt for {} sent to {}",
        order.order_id, order.email
    ))
}

/// Creates the mail provider's table, once however many processes start at the same
/// moment: `CREATE TABLE IF NOT EXISTS` alone is not safe under concurrency (the second of
/// two can fail on the catalog's unique index), so the processes take turns on an
/// advisory lock that the transaction holds until its commit.
async fn create_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::raw_sql("SELECT pg_advisory_xact_lock(hashtext('idem examples: business tables'))")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS mail_provider_outbox ( \
            idempotency_key uuid PRIMARY KEY, fencing_token uuid NOT NULL, \
            recipient text NOT NULL, sent_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let pool = PgPool::connect(&url).await?;
    let idem = Idem::builder(pool.clone())
        .schema("idem_lease_example")
        .build()?;
    idem.migrate().await?;
    create_tables(&pool).await?;
    let mail = std::sync::Arc::new(MailProvider { pool: pool.clone() });

    let run = Uuid::new_v4().simple().to_string();
    let orders: Vec<OrderPaid> = (0..20)
        .map(|i| OrderPaid {
            order_id: format!("{run}-order-{i}"),
            email: format!("customer{i}+{run}@example.com"),
        })
        .collect();

    let mut deliveries = Vec::new();
    for order in &orders {
        for _ in 0..3 {
            let (idem, mail, order) = (idem.clone(), mail.clone(), order.clone());
            deliveries.push(tokio::spawn(async move {
                // A consumer retries "in progress" later; here, after a short pause.
                loop {
                    match send_receipt(&idem, &order, &mail).await {
                        Err(Error::InProgress { .. }) => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        other => return other,
                    }
                }
            }));
        }
    }
    let (mut executed, mut duplicates) = (0, 0);
    for delivery in deliveries {
        match delivery.await?? {
            Outcome::Executed(_) => executed += 1,
            Outcome::Duplicate(_) => duplicates += 1,
        }
    }
    let sent: i64 =
        sqlx::query_scalar("SELECT count(*) FROM mail_provider_outbox WHERE recipient LIKE $1")
            .bind(format!("%+{run}@%"))
            .fetch_one(&pool)
            .await?;
    println!("orders                 {}", orders.len());
    println!("deliveries             {}", orders.len() * 3);
    println!("executed               {executed}");
    println!("duplicates (replayed)  {duplicates}");
    println!("receipts sent          {sent}");
    assert_eq!(
        executed,
        orders.len(),
        "every order's receipt is sent by one delivery"
    );
    assert_eq!(
        sent,
        orders.len() as i64,
        "the provider received one receipt per order"
    );
    Ok(())
}
