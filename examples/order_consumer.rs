//! A consumer-group member applying order events to PostgreSQL, exactly once per event.
//!
//! The whole pattern in one file: the event, its `#[idempotent]` handler, and the
//! `idem-kafka` consumer that hands it every message. Offsets are committed only after
//! the handler's transaction; bad messages go to the dead-letter table; database outages
//! are waited out; Ctrl-C or SIGTERM finishes the current message and leaves the group.
//! Start it several times (here or on other machines) to scale out.
//!
//! The keys are kept by the fact's own time (`event_time`): each event carries the time
//! its producer stamped once for the fact (and sends again unchanged with every re-send),
//! and its key lives in that time's bucket, which expires whole once the retention window
//! has passed. A fact older than the window is dead-lettered (its error says it is outside
//! its window) instead of running again.
//!
//! ```text
//! cargo run --example order_consumer -- --topic orders --group order-appliers
//! cargo run --example order_consumer -- --topic orders --group order-appliers --offsets postgres
//! cargo run --example order_consumer -- --topic orders --group order-appliers --batch-size 500
//! cargo run --example order_consumer -- --topic orders --metrics 127.0.0.1:9898
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Parser;
use idem_kafka::{BatchPositions, Consumer, Fate, Handler, OffsetStore, Position};
use idem_runtime::{Idem, idempotent};
use serde::Deserialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// An order event, as the producer publishes it (JSON).
#[derive(Debug, Deserialize)]
struct OrderEvent {
    order_id: String,
    event_type: String,
    amount_cents: i64,
    /// The producer's idempotency key: the same for every send of the same fact.
    event_key: Option<Uuid>,
    /// When the fact happened: stamped once by the producer (to the microsecond, which
    /// JSON and PostgreSQL both keep) and sent unchanged with every re-send.
    occurred_at: DateTime<Utc>,
}

/// The business write, once per `event_key` however often the event arrives. The row and
/// the key's `success` (and, with `--offsets postgres`, the partition's position) commit in
/// one transaction. The key is kept in the bucket of the fact's time (`event_time`).
#[idempotent(
    key = "event_key, occurred_at",
    event_time = "occurred_at",
    fingerprint = "order_id, event_type, amount_cents",
    scope = "order_consumer::apply_order_event",
    shared_scope = true,
    max_attempts = 3
)]
async fn apply_order_event(
    tx: &mut PgConnection,
    event: &OrderEvent,
    position: Option<&Position>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO order_events_applied (order_id, event_type, amount_cents) VALUES ($1, $2, $3)",
    )
    .bind(&event.order_id)
    .bind(&event.event_type)
    .bind(event.amount_cents)
    .execute(&mut *tx)
    .await?;
    if let Some(position) = position {
        position.store(tx).await?;
    }
    Ok(())
}

/// The batch path (`--batch-size` above 1): the same keys in the same scope, and one
/// statement for the business rows of a whole batch. `events` are the messages whose keys
/// this transaction claimed (duplicates and parked keys are decided before the body runs).
/// With `--offsets postgres`, `positions` stores each partition's position in the same
/// transaction, first, up to the first message that is not done. Each key is claimed in
/// its fact's bucket, and a batch may span several.
#[idempotent(
    key = "event_key, occurred_at",
    event_time = "occurred_at",
    fingerprint = "order_id, event_type, amount_cents",
    scope = "order_consumer::apply_order_event",
    shared_scope = true,
    max_attempts = 3
)]
async fn apply_order_events(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    positions: &BatchPositions,
) -> Result<(), sqlx::Error> {
    let written = async {
        positions.store_once(&mut *tx).await?;
        sqlx::query(
            "INSERT INTO order_events_applied (order_id, event_type, amount_cents) \
             SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
        )
        .bind(
            events
                .iter()
                .map(|e| e.order_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.event_type.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.amount_cents).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await
        .map(|_| ())
    };
    let result = written.await;
    if result.is_err() {
        // The batch rolls back, positions included, and runs again one message per
        // transaction: the first of those stores the positions.
        positions.forget();
    }
    result
}

/// What the consumer does with a message: decode it, apply it, tell the consumer its fate.
struct OrderEvents;

impl Handler for OrderEvents {
    type Message = OrderEvent;

    fn decode(&self, payload: &[u8]) -> Result<OrderEvent, String> {
        idem_kafka::decode_json(payload)
    }

    async fn handle(&self, idem: &Idem, event: &OrderEvent, position: Option<&Position>) -> Fate {
        Fate::of(apply_order_event(idem, event, position).await)
    }

    fn stores_position(&self) -> bool {
        true
    }

    async fn handle_batch(
        &self,
        idem: &Idem,
        events: &[OrderEvent],
        positions: Option<&[Position]>,
    ) -> Vec<Fate> {
        // With offsets in PostgreSQL, the batch's positions and each message's key as the
        // handler derives it (its generated `<handler>_key` function), which is looked up
        // in its fact's bucket.
        let positions = match positions {
            Some(positions) => {
                let keys = events
                    .iter()
                    .map(|event| apply_order_events_key(event).ok());
                BatchPositions::of_handler_keys(idem, positions, keys)
            }
            None => BatchPositions::of_handler_keys(idem, &[], []),
        };
        // One claim statement, one body and one commit for the batch.
        let outcomes = apply_order_events(idem, events, &positions).await;
        outcomes.into_iter().map(Fate::of).collect()
    }
}

/// Applies order events from Kafka to PostgreSQL, exactly once per event.
#[derive(Debug, Parser)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// PostgreSQL: the business table, idem's status table, the offsets, the dead letters.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// The topic.
    #[arg(long, default_value = "orders")]
    topic: String,
    /// The consumer group: every process started with the same group shares the partitions.
    #[arg(long, default_value = "order-appliers")]
    group: String,
    /// Where processed offsets are kept: `kafka` or `postgres` (by the handler's transaction).
    #[arg(long, default_value_t = OffsetStore::Kafka)]
    offsets: OffsetStore,
    /// Messages per transaction (above 1: the batch path).
    #[arg(long, default_value_t = 1)]
    batch_size: usize,
    /// A static group membership id (`group.instance.id`): a restarted process with the
    /// same id takes its predecessor's place and partitions.
    #[arg(long)]
    instance_id: Option<String>,
    /// Serve idem's metrics for Prometheus at `http://<address>/metrics`.
    #[arg(long)]
    metrics: Option<SocketAddr>,
}

/// Creates the business table, once however many processes start at the same moment (the
/// replicas of a deployment do): `CREATE TABLE IF NOT EXISTS` alone is not safe under
/// concurrency (the second of two can fail on the catalog's unique index,
/// `pg_type_typname_nsp_index`), so the processes take turns on an advisory lock that the
/// transaction holds until its commit. A team's migration tool does the same.
async fn create_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    // Simple queries (`raw_sql`): nothing prepared stays on a transaction pooler's connection.
    sqlx::raw_sql("SELECT pg_advisory_xact_lock(hashtext('idem examples: business tables'))")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS order_events_applied (
            order_id text NOT NULL, event_type text NOT NULL, amount_cents bigint NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT now())",
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
    if let Some(address) = args.metrics {
        // Histograms with buckets: the dashboard in ops/ adds them up across instances.
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(address)
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ],
            )?
            .install()?;
        tracing::info!("metrics at http://{address}/metrics");
    }

    // A database outage shows as errors within seconds, and messages are retried.
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect(&args.database_url)
        .await?;
    create_tables(&pool).await?;
    let idem = Idem::new(pool);
    idem.migrate().await?;

    let mut builder = Consumer::builder(&args.brokers, &args.group, &args.topic)
        .offsets(args.offsets)
        .batch_size(args.batch_size);
    if let Some(instance) = &args.instance_id {
        builder = builder.set("group.instance.id", instance);
    }
    let consumer = builder.build(idem, OrderEvents)?;
    consumer.migrate().await?;
    let stats = consumer.stats();
    consumer.run(idem_kafka::shutdown_signal()).await?;
    tracing::info!(totals = ?stats.snapshot(), "stopped");
    Ok(())
}
