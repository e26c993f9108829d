//! A side-effect consumer: for every paid order event, a "payment received" notification
//! goes to an external notification service through a lease-mode `#[idempotent]` handler
//! (`notify_payment`). The effect cannot be rolled back, so it is at-least-once and the
//! service deduplicates on the idempotency key it is handed (`lease.key()`) and records
//! the fencing token of each attempt (`lease.token()`).
//!
//! The service is a stand-in that is honest about what it does: it writes to its own
//! table, `notifications_sent`, through its own connections, outside any transaction of
//! idem. `--crash-after N` aborts this process right after its N-th notification went out,
//! before the key was marked: run a second instance of the group and watch it wait for
//! the lease, then repeat the notification, which the service absorbs.
//!
//! ```text
//! cargo run --example notification_consumer -- --topic orders --group order-notifiers
//! cargo run --example notification_consumer -- --topic orders --group order-notifiers --crash-after 50
//! ```

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use idem_runtime::Idem;
use idem_suite::kafka::consumer::{ConsumerConfig, Stats};
use idem_suite::kafka::notifications::{
    self, Crash, LEASE, NotificationConsumer, NotificationService, PaymentNotifications,
    ServiceSettings,
};
use idem_suite::kafka::{self, DEFAULT_BROKERS};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Sends a notification for every paid order event, once per fact on the service's side.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = DEFAULT_BROKERS)]
    brokers: String,
    /// PostgreSQL, where idem's status table, the offsets and the dead letters live.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// The notification service's database (its table `notifications_sent`); by default
    /// the same server and database, reached through connections of its own.
    #[arg(long, env = "NOTIFICATION_SERVICE_URL")]
    service_url: Option<String>,
    /// The topic of order events.
    #[arg(long, default_value = "orders")]
    topic: String,
    /// The consumer group: every process started with the same group shares the partitions.
    #[arg(long, default_value = "order-notifiers")]
    group: String,
    /// How long a call of the notification service takes, in milliseconds.
    #[arg(long, default_value_t = 20)]
    latency_ms: u64,
    /// Abort this process right after its N-th notification went out, before its key is
    /// marked: a crash mid-effect.
    #[arg(long)]
    crash_after: Option<u64>,
    /// A static group membership id (`group.instance.id`): a restarted process with the
    /// same id takes its predecessor's place and partitions in the group.
    #[arg(long)]
    instance_id: Option<String>,
    /// Seconds between two progress lines.
    #[arg(long, default_value_t = 5)]
    report_every: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    kafka::init_tracing("info,sqlx=warn");
    let args = Args::parse();
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&args.database_url)
        .await?;
    kafka::create_tables(&pool).await?;
    let idem = Idem::new(pool);
    idem.migrate().await?;
    let service_options: PgConnectOptions = args
        .service_url
        .as_deref()
        .unwrap_or(&args.database_url)
        .parse()?;
    let service = NotificationService::connect(
        service_options,
        ServiceSettings {
            latency: Duration::from_millis(args.latency_ms),
            crash_after: args.crash_after.map(|n| (n, Crash::Abort)),
        },
    )
    .await?;
    tracing::info!(
        lease = ?LEASE, crash_after = ?args.crash_after,
        "notifying paid orders; a crashed worker's notification is repeated after its lease expires"
    );

    let stats = Arc::new(Stats::default());
    let mut config = ConsumerConfig::new(&args.brokers, &args.group, &args.topic);
    config.client_id = format!("{}-{}", args.group, std::process::id());
    if let Some(instance) = &args.instance_id {
        config
            .extra
            .push(("group.instance.id".to_owned(), instance.clone()));
    }
    let consumer = NotificationConsumer::with_handler(
        idem,
        config,
        stats.clone(),
        PaymentNotifications::new(service.clone()),
    )?;
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let member = tokio::spawn(consumer.run(async move {
        stopped.wait_for(|stop| *stop).await.ok();
    }));

    let mut report = tokio::time::interval(Duration::from_secs(args.report_every.max(1)));
    let shutdown = kafka::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = report.tick() => {
                let now = stats.snapshot();
                let service_side = notifications::summary(service.pool()).await.unwrap_or_default();
                tracing::info!(
                    deliveries = now.deliveries, notified = now.executed, duplicates = now.duplicates,
                    not_paid = now.skipped, in_progress = now.in_progress, retries = now.retries,
                    dead_letters = now.dead_letters,
                    service_delivered = service_side.delivered, service_calls = service_side.calls,
                    service_repeated_keys = service_side.repeated_keys, "progress"
                );
            }
        }
    }
    tracing::info!(
        "shutting down: finishing the current notification, committing offsets, leaving the group"
    );
    stop.send(true).ok();
    member.await??;
    let now = stats.snapshot();
    let service_side = notifications::summary(service.pool()).await?;
    tracing::info!(
        deliveries = now.deliveries,
        notified = now.executed,
        duplicates = now.duplicates,
        in_progress = now.in_progress,
        service_delivered = service_side.delivered,
        service_calls = service_side.calls,
        "stopped"
    );
    Ok(())
}
