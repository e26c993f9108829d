//! A consumer-group member applying order events to PostgreSQL through `#[idempotent]`
//! handlers: offsets committed only after the handler's transaction, bad messages to the
//! dead-letter table, retries through database outages, graceful shutdown on Ctrl-C or
//! SIGTERM. Start it several times (here or on other machines) to scale out.
//!
//! ```text
//! cargo run --example order_consumer -- --topic orders --group order-appliers
//! cargo run --example order_consumer -- --topic orders --group order-appliers --offsets postgres
//! cargo run --example order_consumer -- --topic orders --group order-appliers --batch-size 500
//! ```

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use idem_runtime::Idem;
use idem_suite::kafka::consumer::{ConsumerConfig, OffsetStore, OrderConsumer, Stats};
use idem_suite::kafka::{self, DEFAULT_BROKERS};
use sqlx::postgres::PgPoolOptions;

/// Applies order events from Kafka to PostgreSQL, exactly once per event.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = DEFAULT_BROKERS)]
    brokers: String,
    /// PostgreSQL, where the business tables, idem's status table, the offsets and the
    /// dead letters live.
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
    /// Where processed offsets are kept: `kafka` (committed after each transaction) or
    /// `postgres` (written by the handler's transaction itself).
    #[arg(long, default_value_t = OffsetStore::Kafka)]
    offsets: OffsetStore,
    /// Messages per transaction: 1 applies each message in its own transaction; N > 1
    /// takes up to N messages (what arrives within 20 ms) and applies them with one
    /// claim statement and one commit (`apply_order_event_batch`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    batch_size: u16,
    /// A static group membership id (`group.instance.id`; with `--members`, suffixed by the
    /// member's number): a restarted process with the same id takes its predecessor's
    /// place and partitions in the group, without waiting for the broker to expire it.
    #[arg(long)]
    instance_id: Option<String>,
    /// Consumers to run in this process (each its own group member).
    #[arg(long, default_value_t = 1)]
    members: usize,
    /// Seconds between two progress lines.
    #[arg(long, default_value_t = 5)]
    report_every: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    kafka::init_tracing("info,sqlx=warn");
    let args = Args::parse();
    let pool = PgPoolOptions::new()
        .max_connections(args.members as u32 + 2)
        // A database outage shows up as errors, and messages are retried, within seconds.
        .acquire_timeout(Duration::from_secs(5))
        .connect(&args.database_url)
        .await?;
    kafka::create_tables(&pool).await?;
    let idem = Idem::new(pool);
    idem.migrate().await?;

    let stats = Arc::new(Stats::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut members = Vec::new();
    for member in 0..args.members {
        let mut config = ConsumerConfig::new(&args.brokers, &args.group, &args.topic);
        config.client_id = format!("{}-{}-{member}", args.group, std::process::id());
        config.offsets = args.offsets;
        config.batch_size = usize::from(args.batch_size);
        if let Some(instance) = &args.instance_id {
            let instance = if args.members > 1 {
                format!("{instance}-{member}")
            } else {
                instance.clone()
            };
            config
                .extra
                .push(("group.instance.id".to_owned(), instance));
        }
        let consumer = OrderConsumer::new(idem.clone(), config, stats.clone())?;
        let mut stopped = stopped.clone();
        members.push(tokio::spawn(consumer.run(async move {
            stopped.wait_for(|stop| *stop).await.ok();
        })));
    }

    let mut report = tokio::time::interval(Duration::from_secs(args.report_every.max(1)));
    let shutdown = kafka::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = report.tick() => {
                let now = stats.snapshot();
                tracing::info!(
                    deliveries = now.deliveries, applied = now.executed, duplicates = now.duplicates,
                    dead_letters = now.dead_letters, retries = now.retries, batches = now.batches, "progress"
                );
            }
        }
    }
    tracing::info!(
        "shutting down: finishing the current message (or batch), committing offsets, leaving the group"
    );
    stop.send(true).ok();
    for member in members {
        member.await??;
    }
    let now = stats.snapshot();
    tracing::info!(
        deliveries = now.deliveries,
        applied = now.executed,
        duplicates = now.duplicates,
        dead_letters = now.dead_letters,
        "stopped"
    );
    Ok(())
}
