//! Publishes order events, each stamped with its idempotency key, with a share of them sent
//! twice or more as a retrying producer does, and optionally some malformed messages.
//!
//! ```text
//! cargo run -p idem-demo --bin order_producer -- --topic orders --events 1000 --duplicate-rate 0.2
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use idem_demo::kafka::producer::{self, Plan, PlanConfig, RecordKind};
use idem_demo::kafka::{self, DEFAULT_BROKERS, admin};

/// Publishes order events with duplicate sends.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = DEFAULT_BROKERS)]
    brokers: String,
    /// The topic (created if missing).
    #[arg(long, default_value = "orders")]
    topic: String,
    /// Partitions of the topic, if it is created.
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Business facts to publish (three per order: placed, paid, shipped).
    #[arg(long, default_value_t = 1_000)]
    events: usize,
    /// Duplicate sends, as a fraction of the events (0.2: 20 extra sends per 100 events).
    #[arg(long, default_value_t = 0.2)]
    duplicate_rate: f64,
    /// Malformed messages to add (undecodable, missing key, payload mismatch, refused).
    #[arg(long, default_value_t = 0)]
    malformed: usize,
    /// Seed of the generated events: the same seed publishes the same orders and amounts
    /// again, stamped with this run's time (new facts to a handler keyed on the time).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Prefix of the order ids.
    #[arg(long, default_value = "order")]
    order_prefix: String,
    /// Send duplicates with another Kafka key than their original, so that they land on
    /// other partitions and two consumers may hold the same fact at once.
    #[arg(long)]
    scatter_duplicates: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    kafka::init_tracing("warn");
    let args = Args::parse();
    admin::wait_for_broker(&args.brokers, Duration::from_secs(30)).await?;
    admin::create_topic(&args.brokers, &args.topic, args.partitions).await?;
    let plan = Plan::new(&PlanConfig {
        events: args.events,
        duplicate_rate: args.duplicate_rate,
        malformed: args.malformed,
        seed: args.seed,
        order_prefix: args.order_prefix,
        scatter_duplicates: args.scatter_duplicates,
    });
    if let Some(first) = plan.events.first() {
        println!("a record: {}", serde_json::to_string(first)?);
    }
    let producer = producer::create_producer(&args.brokers)?;
    let mut last = Instant::now();
    let report = producer::produce(&producer, &args.topic, &plan, 500, |sent, total| {
        if last.elapsed() >= Duration::from_secs(1) {
            println!("sent {sent}/{total}");
            last = Instant::now();
        }
    })
    .await?;
    println!(
        "published to `{}`: {} records = {} events + {} duplicate sends + {} malformed, in {:.1} s",
        args.topic,
        report.records,
        report.events,
        report.duplicates,
        report.malformed.len(),
        report.elapsed.as_secs_f64()
    );
    debug_assert_eq!(
        report.duplicates,
        plan.count(|kind| kind == RecordKind::Duplicate)
    );
    Ok(())
}
