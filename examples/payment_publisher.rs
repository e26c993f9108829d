//! Exactly once downstream: a consumer that applies payments and publishes a receipt for
//! each through the transactional outbox, the relay that publishes the outbox, and the
//! receipt consumer on the next topic, deduplicating on the key the outbox stamped.
//!
//! The payment's row, its key's `success` and the receipt's outbox row commit in one
//! transaction: the receipt is published if and only if the payment was applied. The
//! relay (one per process; each shard of the outbox is published by one relay at a time)
//! publishes it with an idempotent producer and marks it sent after the broker's
//! acknowledgement. A relay that dies in between publishes it again, with the same
//! `idem-key` header, and the receipt consumer answers that as a duplicate.
//!
//! ```text
//! cargo run --example payment_publisher -- --payments payments --receipts receipts
//! cargo run --example payment_publisher -- --payments payments --receipts receipts --receipts-only
//! ```

use std::time::Duration;

use clap::Parser;
use idem_kafka::outbox::{self, Record, Relay};
use idem_kafka::{Consumer, Fate, Handler, Keyed, Position, Received};
use idem_runtime::{Idem, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

/// A payment, as the producer publishes it (JSON).
#[derive(Debug, Deserialize)]
struct Payment {
    payment_id: String,
    account: String,
    amount_cents: i64,
}

/// The receipt published for a payment.
#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    payment_id: String,
    account: String,
    amount_cents: i64,
}

/// Applies a payment and writes its receipt into the outbox, in one transaction. The
/// receipt's key (`idem-key`) is derived from the payment's key, the handler's scope and
/// the name "receipt": the same at every run of the same payment.
#[idempotent(key = "payment_id", fingerprint = "account, amount_cents")]
async fn apply_payment(
    tx: &mut PgConnection,
    payment: &Payment,
    receipts: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO payments_applied (payment_id, account, amount_cents) VALUES ($1, $2, $3)",
    )
    .bind(&payment.payment_id)
    .bind(&payment.account)
    .bind(payment.amount_cents)
    .execute(&mut *tx)
    .await?;
    let receipt = Receipt {
        payment_id: payment.payment_id.clone(),
        account: payment.account.clone(),
        amount_cents: payment.amount_cents,
    };
    // Kafka key: the account, so that an account's receipts stay in order.
    outbox::send(
        tx,
        Record::to(receipts)
            .name("receipt")
            .key(&payment.account)
            .header("content-type", "application/json")
            .json(&receipt)?,
    )
    .await?;
    Ok(())
}

/// Records a receipt once per `idem-key`, however often the relay published it.
#[idempotent(key = "idem_key")]
async fn record_receipt(
    tx: &mut PgConnection,
    receipt: &Keyed<Receipt>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO receipts_sent (idem_key, payment_id, amount_cents) VALUES ($1, $2, $3)",
    )
    .bind(receipt.idem_key)
    .bind(&receipt.message.payment_id)
    .bind(receipt.message.amount_cents)
    .execute(&mut *tx)
    .await
    .map(|_| ())
}

struct Payments {
    receipts: String,
}

impl Handler for Payments {
    type Message = Payment;

    fn decode(&self, payload: &[u8]) -> Result<Payment, String> {
        idem_kafka::decode_json(payload)
    }

    async fn handle(&self, idem: &Idem, payment: &Payment, _: Option<&Position>) -> Fate {
        Fate::of(apply_payment(idem, payment, &self.receipts).await)
    }
}

struct Receipts;

impl Handler for Receipts {
    type Message = Keyed<Receipt>;

    fn decode(&self, _: &[u8]) -> Result<Keyed<Receipt>, String> {
        Err("a receipt is decoded with its headers".to_owned())
    }

    /// The payload, and the key from the `idem-key` header: a record without one is
    /// dead-lettered as undecodable.
    fn decode_received(&self, received: &Received<'_>) -> Result<Keyed<Receipt>, String> {
        Keyed::decode_json(received)
    }

    async fn handle(&self, idem: &Idem, receipt: &Keyed<Receipt>, _: Option<&Position>) -> Fate {
        Fate::of(record_receipt(idem, receipt).await)
    }
}

/// Applies payments and publishes their receipts, exactly once on both topics.
#[derive(Debug, Parser)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// PostgreSQL: the business tables, idem's status table, the outbox.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// The topic of payments.
    #[arg(long, default_value = "payments")]
    payments: String,
    /// The topic receipts are published to.
    #[arg(long, default_value = "receipts")]
    receipts: String,
    /// Run only the receipt consumer (another service, in a real deployment).
    #[arg(long)]
    receipts_only: bool,
}

/// Creates the business tables, one process at a time (see `order_consumer.rs`).
async fn create_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::raw_sql("SELECT pg_advisory_xact_lock(hashtext('idem examples: business tables'))")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS payments_applied (
            payment_id text PRIMARY KEY, account text NOT NULL, amount_cents bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS receipts_sent (
            idem_key uuid PRIMARY KEY, payment_id text NOT NULL, amount_cents bigint NOT NULL);",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .init();
    let args = Args::parse();
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect(&args.database_url)
        .await?;
    create_tables(&pool).await?;
    let idem = Idem::new(pool);
    idem.migrate().await?;

    let receipts = Consumer::builder(&args.brokers, "receipt-recorders", &args.receipts)
        .build(idem.clone(), Receipts)?;
    // Creates idem-kafka's tables, the outbox among them.
    receipts.migrate().await?;
    if args.receipts_only {
        receipts.run(idem_kafka::shutdown_signal()).await?;
        return Ok(());
    }
    let payments = Consumer::builder(&args.brokers, "payment-appliers", &args.payments).build(
        idem.clone(),
        Payments {
            receipts: args.receipts.clone(),
        },
    )?;
    let relay = Relay::builder(&args.brokers).build(&idem)?;
    let (payments, relay, receipts) = tokio::join!(
        payments.run(idem_kafka::shutdown_signal()),
        relay.run(idem_kafka::shutdown_signal()),
        receipts.run(idem_kafka::shutdown_signal()),
    );
    payments?;
    relay?;
    receipts?;
    Ok(())
}
