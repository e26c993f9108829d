//! A side-effect consumer: for every paid order event, a "payment received" notification
//! goes to an external notification service through a lease-mode `#[idempotent]` handler.
//!
//! The effect cannot be rolled back, so it is at-least-once and the service deduplicates
//! on the idempotency key it is handed (`lease.key()`) and records the fencing token of
//! each attempt (`lease.token()`). The service below is a stand-in that is honest about
//! what it does: it writes to its own table, `notifications_sent`, through its own
//! connections, outside any transaction of idem. `--crash-after N` aborts this process
//! right after its N-th notification went out, before the key was marked: run a second
//! instance of the group and watch it wait for the lease, then repeat the notification,
//! which the service absorbs.
//!
//! ```text
//! cargo run --example notification_consumer -- --topic orders --group order-notifiers
//! cargo run --example notification_consumer -- --topic orders --group order-notifiers --crash-after 50
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use idem_kafka::{Consumer, Fate, Handler, Position};
use idem_runtime::lease::Lease;
use idem_runtime::{Idem, idempotent};
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

/// An order event, as the producer publishes it (JSON).
#[derive(Debug, Deserialize)]
struct OrderEvent {
    order_id: String,
    event_type: String,
    amount_cents: i64,
    /// The producer's idempotency key: the same for every send of the same fact.
    event_key: Option<Uuid>,
}

/// Sends "payment received", once to success per fact. Lease mode: the key is claimed
/// with a 10-second lease committed on its own, the body calls the service, and the key is
/// marked `success` only while the lease is still this worker's.
#[idempotent(
    key = "event_key",
    fingerprint = "order_id, event_type, amount_cents",
    mode = "lease",
    lease = "10s",
    max_attempts = 5
)]
async fn notify_payment(
    lease: &Lease,
    event: &OrderEvent,
    service: &NotificationService,
) -> Result<(), sqlx::Error> {
    service
        .send(lease.key().as_uuid(), lease.token(), event)
        .await
}

/// Paid events are notified; the others need nothing from this consumer.
struct PaymentNotifications {
    service: NotificationService,
}

impl Handler for PaymentNotifications {
    type Message = OrderEvent;

    fn decode(&self, payload: &[u8]) -> Result<OrderEvent, String> {
        idem_kafka::decode_json(payload)
    }

    async fn handle(&self, idem: &Idem, event: &OrderEvent, _: Option<&Position>) -> Fate {
        if event.event_type != "paid" {
            return Fate::Skipped;
        }
        Fate::of(notify_payment(idem, event, &self.service).await)
    }
}

/// The stand-in external service: one row per idempotency key in its own table, a second
/// call with a known key counted and absorbed, the first and last token kept.
struct NotificationService {
    pool: PgPool,
    sent: AtomicU64,
    crash_after: Option<u64>,
}

impl NotificationService {
    async fn send(&self, key: Uuid, token: Uuid, event: &OrderEvent) -> Result<(), sqlx::Error> {
        let first: bool = sqlx::query_scalar(
            "INSERT INTO notifications_sent (idempotency_key, order_id, amount_cents, first_token, last_token)
             VALUES ($1, $2, $3, $4, $4)
             ON CONFLICT (idempotency_key) DO UPDATE
             SET calls = notifications_sent.calls + 1, last_token = $4, last_call_at = now()
             RETURNING calls = 1",
        )
        .bind(key)
        .bind(&event.order_id)
        .bind(event.amount_cents)
        .bind(token)
        .fetch_one(&self.pool)
        .await?;
        if !first {
            tracing::info!(%key, %token, "notification already delivered; call absorbed");
        }
        let sent = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        if self.crash_after == Some(sent) {
            tracing::error!(%key, order_id = %event.order_id, "simulated crash: the notification went out, its key is not marked");
            std::process::abort();
        }
        Ok(())
    }
}

/// Sends a notification for every paid order event, once per fact on the service's side.
#[derive(Debug, Parser)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// PostgreSQL: idem's status table, the offsets, the dead letters.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// The notification service's database (its table `notifications_sent`); by default
    /// the same, through connections of its own.
    #[arg(long, env = "NOTIFICATION_SERVICE_URL")]
    service_url: Option<String>,
    /// The topic of order events.
    #[arg(long, default_value = "orders")]
    topic: String,
    /// The consumer group.
    #[arg(long, default_value = "order-notifiers")]
    group: String,
    /// Abort right after the N-th notification went out, before its key is marked.
    #[arg(long)]
    crash_after: Option<u64>,
    /// A static group membership id (`group.instance.id`).
    #[arg(long)]
    instance_id: Option<String>,
}

/// Creates the service's table, once however many processes start at the same moment
/// (the replicas of a deployment do): `CREATE TABLE IF NOT EXISTS` alone is not safe under
/// concurrency (the second of two can fail on the catalog's unique index), so the
/// processes take turns on an advisory lock that the transaction holds until its commit.
async fn create_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    // Simple queries (`raw_sql`): nothing prepared stays on a transaction pooler's connection.
    sqlx::raw_sql("SELECT pg_advisory_xact_lock(hashtext('idem examples: business tables'))")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS notifications_sent (
            idempotency_key uuid PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT NULL,
            calls integer NOT NULL DEFAULT 1, first_token uuid NOT NULL, last_token uuid NOT NULL,
            first_call_at timestamptz NOT NULL DEFAULT now(), last_call_at timestamptz NOT NULL DEFAULT now())",
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
    let service_pool =
        PgPool::connect(args.service_url.as_deref().unwrap_or(&args.database_url)).await?;
    create_tables(&service_pool).await?;
    let idem = Idem::new(pool);
    idem.migrate().await?;

    let service = NotificationService {
        pool: service_pool,
        sent: AtomicU64::new(0),
        crash_after: args.crash_after,
    };
    let mut builder = Consumer::builder(&args.brokers, &args.group, &args.topic);
    if let Some(instance) = &args.instance_id {
        builder = builder.set("group.instance.id", instance);
    }
    let consumer = builder.build(idem, PaymentNotifications { service })?;
    consumer.migrate().await?;
    let stats = consumer.stats();
    consumer.run(idem_kafka::shutdown_signal()).await?;
    tracing::info!(totals = ?stats.snapshot(), "stopped");
    Ok(())
}
