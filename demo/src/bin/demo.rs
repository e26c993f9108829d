//! The end-to-end demo: order events with duplicate sends and malformed messages go
//! through Kafka to several consumers of one group, which apply them to PostgreSQL through
//! `#[idempotent]` handlers; a summary then checks by SQL that every business fact was
//! applied exactly once.
//!
//! Run it with `scripts/demo.sh`, which first starts what is missing (PostgreSQL, the
//! `tansu` broker). Directly: `cargo run --release -p idem-demo --bin demo -- --help`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use idem_demo::kafka::handlers::OrderEvents;
use idem_demo::kafka::producer::{self, MalformedKind, Plan, PlanConfig};
use idem_demo::kafka::{self, DEFAULT_BROKERS, admin, verify};
use idem_kafka::{Consumer, OffsetStore, Snapshot, Stats};
use idem_runtime::Idem;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, PgConnection};

/// Publishes order events with duplicates, consumes them with a consumer group, and
/// checks that every fact was applied exactly once.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = DEFAULT_BROKERS)]
    brokers: String,
    /// PostgreSQL server to use (the demo creates its own database there).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// The database the demo (re)creates and leaves behind for inspection.
    #[arg(long, default_value = "idem_demo")]
    database: String,
    /// Business facts (order events) to publish.
    #[arg(long, default_value_t = 10_000)]
    events: usize,
    /// Duplicate sends, as a fraction of the events.
    #[arg(long, default_value_t = 0.25)]
    duplicate_rate: f64,
    /// Malformed messages to inject (undecodable, missing key, payload mismatch, refused).
    #[arg(long, default_value_t = 12)]
    malformed: usize,
    /// Consumers in the group.
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Where consumers keep their offsets: `kafka` or `postgres`.
    #[arg(long, default_value_t = OffsetStore::Kafka)]
    offsets: OffsetStore,
    /// Messages per transaction: 1 (each message on its own) or up to N together, with
    /// one claim statement and one commit per batch.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    batch_size: u16,
    /// Publish everything before the consumers start (to time consumption alone).
    #[arg(long)]
    produce_first: bool,
    /// Seed of the generated events.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

#[tokio::main]
async fn main() {
    kafka::init_tracing("error");
    let args = Args::parse();
    match run(args).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(error) => {
            eprintln!("demo failed: {error}");
            std::process::exit(2);
        }
    }
}

type DemoError = Box<dyn std::error::Error + Send + Sync>;

async fn run(args: Args) -> Result<bool, DemoError> {
    let started = Instant::now();
    let run_id = chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string();
    let topic = format!("idem-demo-{run_id}");
    let group = format!("idem-demo-{run_id}");

    step(1, &format!("fresh database `{}`", args.database));
    let options = fresh_database(&args.database_url, &args.database).await?;
    let pool = PgPoolOptions::new()
        .max_connections(args.consumers as u32 + 2)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await?;
    let idem = Idem::new(pool.clone());
    kafka::prepare(&idem).await?;

    step(
        2,
        &format!(
            "topic `{topic}` with {} partitions on {}",
            args.partitions, args.brokers
        ),
    );
    admin::wait_for_broker(&args.brokers, Duration::from_secs(30))
        .await
        .map_err(|error| {
            format!(
                "no Kafka broker at {} ({error}); start one with `scripts/services.sh kafka`",
                args.brokers
            )
        })?;
    admin::create_topic(&args.brokers, &topic, args.partitions).await?;

    let plan = Plan::new(&PlanConfig {
        events: args.events,
        duplicate_rate: args.duplicate_rate,
        malformed: args.malformed,
        seed: args.seed,
        order_prefix: format!("order-{run_id}"),
        scatter_duplicates: false,
    });
    let total = plan.records.len() + plan.tail.len();

    let producing = {
        let brokers = args.brokers.clone();
        let topic = topic.clone();
        let plan = plan.clone();
        async move {
            let producer = producer::create_producer(&brokers)?;
            let mut last = Instant::now();
            producer::produce(&producer, &topic, &plan, 500, |sent, total| {
                if last.elapsed() >= Duration::from_secs(1) || sent == total {
                    println!("      produced {sent:>6}/{total}");
                    last = Instant::now();
                }
            })
            .await
        }
    };
    step(
        3,
        &format!(
            "producing {} events + {} duplicate sends + {} malformed = {total} records",
            plan.events.len(),
            plan.count(|kind| kind == producer::RecordKind::Duplicate),
            plan.count(|kind| matches!(kind, producer::RecordKind::Malformed(_))),
        ),
    );
    let mut producing = Some(tokio::spawn(async move {
        producing.await.map_err(|error| error.to_string())
    }));
    let mut produced = None;
    if args.produce_first
        && let Some(task) = producing.take()
    {
        produced = Some(task.await??);
    }

    step(
        4,
        &format!(
            "consuming with {} consumers in group `{group}` (offsets in {}, {})",
            args.consumers,
            args.offsets,
            batching(args.batch_size)
        ),
    );
    let stats = Arc::new(Stats::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut consumers = Vec::new();
    for member in 0..args.consumers {
        let consumer = Consumer::builder(&args.brokers, &group, &topic)
            .client_id(format!("demo-consumer-{member}"))
            .offsets(args.offsets)
            .batch_size(usize::from(args.batch_size))
            .stats(stats.clone())
            .build(idem.clone(), OrderEvents)?;
        let mut stopped = stopped.clone();
        consumers.push(tokio::spawn(consumer.run(async move {
            stopped.wait_for(|stop| *stop).await.ok();
        })));
    }

    let consume_started = Instant::now();
    let mut last_line = Instant::now();
    // The rate between 10% and 90% of the records: without the group's start-up (members
    // joining one after the other) and the tail. Counted when processed (applied, skipped
    // or dead-lettered), not when received: a batch is received all at once.
    let mut steady: [Option<(Instant, u64)>; 2] = [None, None];
    let mut interrupted = false;
    let shutdown = kafka::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        if let Some(task) = producing.take_if(|task| task.is_finished()) {
            produced = Some(task.await??);
        }
        let caught_up = produced
            .as_ref()
            .is_some_and(|report| stats.caught_up(&topic, &report.end_offsets));
        let processed = processed(&stats.snapshot());
        if steady[0].is_none() && processed * 10 >= total as u64 {
            steady[0] = Some((Instant::now(), processed));
        }
        if steady[1].is_none() && processed * 10 >= total as u64 * 9 {
            steady[1] = Some((Instant::now(), processed));
        }
        if caught_up || last_line.elapsed() >= Duration::from_secs(1) {
            let now = stats.snapshot();
            let rate = processed as f64 / consume_started.elapsed().as_secs_f64().max(0.001);
            println!(
                "      consumed {processed:>6}/{total} deliveries | applied {:>6} | duplicates skipped {:>5} | dead letters {:>3} | {:>5.0}/s",
                now.executed, now.duplicates, now.dead_letters, rate
            );
            last_line = Instant::now();
        }
        if caught_up {
            break;
        }
        tokio::select! {
            () = &mut shutdown => {
                interrupted = true;
                break;
            }
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    let consume_time = consume_started.elapsed();
    stop.send(true).ok();
    for consumer in consumers {
        consumer.await??;
    }
    if interrupted {
        println!("interrupted; the consumers committed what they processed");
        return Ok(false);
    }
    let produced = produced.expect("caught up after producing");

    step(5, "checking the business tables by SQL");
    let verification = verify::verify(&pool, &plan.events).await?;
    let dead_letters = verify::dead_letters(&pool, &group).await?;
    let injected = produced.malformed.len();
    let dead_letters_match = dead_letters.len() == injected
        && produced.malformed.iter().all(|sent| {
            dead_letters.iter().any(|dead| {
                dead.kafka_partition == sent.partition
                    && dead.kafka_offset == sent.offset
                    && dead.reason == sent.kind.reason().as_str()
            })
        });
    let snapshot = stats.snapshot();
    let ok = verification.exactly_once() && dead_letters_match;

    let by_kind = |kind: MalformedKind| {
        produced
            .malformed
            .iter()
            .filter(|sent| sent.kind == kind)
            .count()
    };
    println!();
    println!(
        "idem demo summary ({} consumers, {} partitions, offsets in {}, {})",
        args.consumers,
        args.partitions,
        args.offsets,
        batching(args.batch_size)
    );
    println!("  events produced (business facts)  {:>7}", produced.events);
    println!(
        "  duplicate sends                   {:>7}",
        produced.duplicates
    );
    println!(
        "  malformed messages injected       {:>7}   ({} undecodable, {} missing key, {} payload mismatch, {} refused -> parked)",
        injected,
        by_kind(MalformedKind::Undecodable),
        by_kind(MalformedKind::MissingKey),
        by_kind(MalformedKind::PayloadMismatch),
        by_kind(MalformedKind::Parked),
    );
    println!(
        "  deliveries (incl. duplicates)     {:>7}",
        snapshot.deliveries
    );
    println!(
        "  effects applied                   {:>7}",
        snapshot.executed
    );
    println!(
        "  duplicates skipped                {:>7}",
        snapshot.duplicates
    );
    if args.batch_size > 1 {
        println!(
            "  batch rounds                      {:>7}   ({:.0} deliveries per round)",
            snapshot.batches,
            snapshot.deliveries as f64 / snapshot.batches.max(1) as f64
        );
    }
    println!(
        "  dead letters                      {:>7}   ({})",
        dead_letters.len(),
        if dead_letters_match {
            "exactly the injected messages"
        } else {
            "NOT the injected messages"
        }
    );
    println!(
        "  every fact applied exactly once   {:>7}   (SQL: {verification})",
        if verification.exactly_once() {
            "yes"
        } else {
            "NO"
        }
    );
    let steady_rate = match steady {
        [Some((from, first)), Some((to, last))] if to > from => {
            format!("{:.0}/s", (last - first) as f64 / (to - from).as_secs_f64())
        }
        _ => "n/a".to_owned(),
    };
    println!(
        "  consume throughput                {:>7.0} deliveries/s ({:.1} s; {steady_rate} from 10% to 90%; whole demo {:.1} s)",
        snapshot.deliveries as f64 / consume_time.as_secs_f64(),
        consume_time.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    println!();
    let db = pool.connect_options();
    println!(
        "The database stays for a look: psql -h {} -p {} -U {} -d {} -c 'TABLE idem_kafka.kafka_dead_letters'",
        db.get_host(),
        db.get_port(),
        db.get_username(),
        args.database
    );
    Ok(ok)
}

/// Deliveries done with: applied, skipped as duplicates, or dead-lettered.
fn processed(snapshot: &Snapshot) -> u64 {
    snapshot.executed + snapshot.duplicates + snapshot.skipped + snapshot.dead_letters
}

fn batching(batch_size: u16) -> String {
    if batch_size <= 1 {
        "one message per transaction".to_owned()
    } else {
        format!("batches of up to {batch_size}")
    }
}

fn step(number: u32, text: &str) {
    println!("[{number}/5] {text}");
}

/// Drops and recreates `name` on the server of `url`; returns the options to reach it.
async fn fresh_database(url: &str, name: &str) -> Result<PgConnectOptions, DemoError> {
    let server: PgConnectOptions = url.parse()?;
    let mut admin = server.connect().await.map_err(|error| {
        format!("cannot reach PostgreSQL at {url} ({error}); start it with `scripts/services.sh postgres`")
    })?;
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    admin
        .execute(format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)").as_str())
        .await?;
    admin
        .execute(format!("CREATE DATABASE {quoted}").as_str())
        .await?;
    admin.close().await?;
    let options = server.database(name);
    PgConnection::connect_with(&options).await?.close().await?;
    Ok(options)
}
