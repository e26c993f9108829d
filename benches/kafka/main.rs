//! idem-kafka against the consumer a user writes instead, with rdkafka and sqlx alone and
//! the same guarantee, on the same topic, broker and database, side by side in one run;
//! at 0, 0.5 and 2 ms of round trip between the consumers and PostgreSQL.
//!
//! ```text
//! cargo bench --bench kafka                  # full run, 5 to 15 minutes
//! cargo bench --bench kafka -- --quick       # smoke run, about a minute
//! cargo bench --bench kafka -- --help        # the settings below
//! ```
//!
//! The topic: `--facts` order events (3 per order), 30 % of them sent twice, 6
//! partitions, on a `tansu` broker of the bench's own (or `KAFKA_BENCH_BROKERS`). The
//! contenders, each consuming the whole topic in a fresh database and a fresh consumer
//! group, in a child process of the bench (so that its CPU is its own):
//!
//! | contender | what |
//! |---|---|
//! | `hand-pg-1` | rdkafka and sqlx: per message one transaction, the key claimed with `INSERT ... ON CONFLICT DO NOTHING`, the business row of a new key, the offset upserted into a table, commit; the stored offsets read at assignment |
//! | `hand-kafka-1` | the same without the offset upsert: the offset stored in the client after the commit, committed to Kafka every second |
//! | `hand-pg-500`, `hand-kafka-500` | batches of up to 500 (what arrives within 20 ms of the first), set-based in one transaction: the keys claimed by one statement returning the new ones, their rows by one statement, the offsets by one, commit |
//! | `idem-pg-1`, `idem-kafka-1` | idem-kafka with the `#[idempotent]` handler of `examples/order_consumer.rs` (key, fingerprint, the position stored in the transaction) |
//! | `idem-pg-500`, `idem-kafka-500` | idem-kafka, batch size 500, a batch handler (one body per batch, one statement for the rows; the positions stored in the transaction by `BatchPositions`) |
//!
//! After every run, SQL checks that every fact has exactly one business row (the bench
//! fails otherwise). Per contender: the rate over the whole run (from the child's start)
//! and in steady state (from the first fact applied to the last record consumed), the
//! startup (child start to first fact), and per fact in steady state: the consumer's CPU
//! (its threads' `/proc/<child>/task/*/schedstat`), PostgreSQL's (the CPU of the bench database's backends, from
//! `/proc`) and the round trips to PostgreSQL (counted by the proxy that the consumers
//! reach the database through, `benches/common/proxy.rs`). The proxy holds every chunk
//! for half the round trip in each direction; at 0 ms it forwards at once (it is there to
//! count).
//!
//! Settings (environment variable, or `--name=value` after `--`):
//!
//! | variable | flag | default | quick |
//! |---|---|---|---|
//! | `KAFKA_BENCH_FACTS` | `--facts` | 60000 facts for the batch contenders | 6000 |
//! | `KAFKA_BENCH_SINGLE_FACTS` | `--single-facts` | 9000,3000,900: facts for one message per transaction, per round trip | 900,300 |
//! | `KAFKA_BENCH_ROUND_TRIPS` | `--round-trips` | 0,0.5,2 ms added between the consumers and PostgreSQL | 0,2 |
//! | `KAFKA_BENCH_ROUNDS` | `--rounds` | 1 (the order of the contenders alternates) | 1 |
//! | `KAFKA_BENCH_CONTENDERS` | `--contenders` | all eight | all eight |
//! | `KAFKA_BENCH_BROKERS` | `--brokers` | a `tansu` of the bench's own | |
//! | `KAFKA_BENCH_DATABASE` | `--database` | `idem_bench_kafka` (made again for every run, on `DATABASE_URL`'s server) | |

#[path = "../common/proxy.rs"]
mod proxy;

mod contenders;
mod measure;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use clap::Parser;
use clap::builder::FalseyValueParser;
use idem_demo::kafka::admin;
use idem_demo::kafka::broker::LocalBroker;
use idem_demo::kafka::producer::{Plan, PlanConfig, create_producer, produce};
use idem_demo::orders::OrderEvent;
use idem_runtime::Idem;
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection, PgConnection};

use crate::contenders::{ChildSpec, Contender, Side};
use crate::measure::{Sample, backends, process_threads};
use crate::proxy::Proxy;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The environment variable that makes the bench binary a contender's child process.
const CHILD: &str = "IDEM_KAFKA_BENCH_CHILD";
const PARTITIONS: i32 = 6;
const DUPLICATE_RATE: f64 = 0.3;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "kafka",
    about = "idem-kafka against a hand-written rdkafka + sqlx consumer with the same guarantee",
    after_help = "Run through cargo: cargo bench --bench kafka -- [FLAGS]"
)]
struct Cli {
    /// Smoke run: fewer facts, 0 and 2 ms.
    #[arg(
        long,
        env = "KAFKA_BENCH_QUICK",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = FalseyValueParser::new()
    )]
    quick: bool,
    /// Facts of the batch contenders' topic [default: 60000; quick: 6000].
    #[arg(long, env = "KAFKA_BENCH_FACTS")]
    facts: Option<usize>,
    /// Facts of the one-message-per-transaction contenders' topic, one per round trip
    /// [default: 9000,3000,900; quick: 900,300].
    #[arg(long, env = "KAFKA_BENCH_SINGLE_FACTS", value_delimiter = ',')]
    single_facts: Option<Vec<usize>>,
    /// Round trips added between the consumers and PostgreSQL, in ms [default: 0,0.5,2;
    /// quick: 0,2].
    #[arg(long, env = "KAFKA_BENCH_ROUND_TRIPS", value_delimiter = ',')]
    round_trips: Option<Vec<f64>>,
    /// Rounds; the order of the contenders alternates.
    #[arg(long, env = "KAFKA_BENCH_ROUNDS", default_value_t = 1)]
    rounds: usize,
    /// The contenders, by name [default: all].
    #[arg(long, env = "KAFKA_BENCH_CONTENDERS", value_delimiter = ',')]
    contenders: Option<Vec<String>>,
    /// The hand-written consumer works each partition in a task of its own, as idem-kafka's
    /// member does (`false`: one loop, a message or batch at a time whatever its partition).
    #[arg(
        long,
        env = "KAFKA_BENCH_HAND_LANES",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "true",
        value_parser = FalseyValueParser::new()
    )]
    hand_lanes: bool,
    /// A broker to use instead of a `tansu` of the bench's own.
    #[arg(long, env = "KAFKA_BENCH_BROKERS")]
    brokers: Option<String>,
    /// The bench database, made again for every run on DATABASE_URL's server.
    #[arg(long, env = "KAFKA_BENCH_DATABASE", default_value = "idem_bench_kafka")]
    database: String,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn all_contenders() -> Vec<Contender> {
    let mut all = Vec::new();
    for batch in [1, 500] {
        for offsets_in_postgres in [true, false] {
            for side in [Side::Hand, Side::Idem] {
                all.push(Contender {
                    side,
                    offsets_in_postgres,
                    batch,
                });
            }
        }
    }
    all
}

/// A topic produced once, consumed by every contender of its size.
struct Topic {
    name: String,
    facts: Vec<OrderEvent>,
    records: usize,
    end_offsets: HashMap<i32, i64>,
}

/// One contender's run.
#[derive(Debug, Clone, Serialize)]
struct Run {
    contender: String,
    round_trip_ms: f64,
    round: usize,
    facts: usize,
    records: usize,
    /// Child start to the first fact applied.
    startup_secs: f64,
    /// Child start to the last record consumed.
    whole_secs: f64,
    /// Facts applied when the first was reported (a batch's).
    facts_at_first: u64,
    whole_facts_per_sec: f64,
    steady_facts_per_sec: f64,
    /// Per fact, steady state.
    consumer_cpu_us: f64,
    postgres_cpu_us: f64,
    round_trips: f64,
    /// Per fact, whole run.
    whole_consumer_cpu_us: f64,
    whole_round_trips: f64,
}

impl Run {
    fn cpu_us(&self) -> f64 {
        self.consumer_cpu_us + self.postgres_cpu_us
    }
}

fn main() -> Result<(), BoxError> {
    if let Ok(spec) = std::env::var(CHILD) {
        return contenders::child_main(serde_json::from_str(&spec)?);
    }
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> Result<(), BoxError> {
    let started = Instant::now();
    let load_before = measure::load_average();
    let quick = cli.quick;
    let facts = cli.facts.unwrap_or(if quick { 6000 } else { 60_000 });
    let round_trips = cli.round_trips.clone().unwrap_or(if quick {
        vec![0.0, 2.0]
    } else {
        vec![0.0, 0.5, 2.0]
    });
    let single_facts = cli.single_facts.clone().unwrap_or(if quick {
        vec![900, 300]
    } else {
        vec![9000, 3000, 900]
    });
    if single_facts.len() != round_trips.len() {
        return Err("--single-facts needs one count per round trip".into());
    }
    let contenders: Vec<Contender> = match &cli.contenders {
        None => all_contenders(),
        Some(names) => names
            .iter()
            .map(|name| {
                all_contenders()
                    .into_iter()
                    .find(|c| c.name() == name.trim())
                    .ok_or_else(|| format!("unknown contender {name}"))
            })
            .collect::<Result<_, _>>()?,
    };

    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let server = PgConnectOptions::from_str(&url)?;
    let bench = server.clone().database(&cli.database);
    let mut admin_conn = server.connect().await?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut admin_conn)
        .await?;

    let (_broker, brokers) = match &cli.brokers {
        Some(brokers) => (None, brokers.clone()),
        None => {
            let broker = LocalBroker::private().map_err(|error| error.to_string())?;
            let brokers = broker.brokers().to_owned();
            (Some(broker), brokers)
        }
    };
    admin::wait_for_broker(&brokers, Duration::from_secs(30)).await?;

    // One topic per size.
    let mut sizes: Vec<usize> = single_facts.clone();
    if contenders.iter().any(|c| c.batch > 1) {
        sizes.push(facts);
    }
    sizes.sort_unstable();
    sizes.dedup();
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let producer = create_producer(&brokers)?;
    let mut topics: HashMap<usize, Topic> = HashMap::new();
    for &size in &sizes {
        let name = format!("kafka-bench-{run_id}-{size}");
        admin::create_topic(&brokers, &name, PARTITIONS).await?;
        let mut config = PlanConfig::new(size, DUPLICATE_RATE);
        config.order_prefix = format!("order-{run_id}-{size}");
        let plan = Plan::new(&config);
        let report = produce(&producer, &name, &plan, 5000, |_, _| {}).await?;
        println!(
            "produced {} records ({size} facts) to {name} in {:.1} s",
            report.records,
            report.elapsed.as_secs_f64()
        );
        topics.insert(
            size,
            Topic {
                name,
                facts: plan.events,
                records: report.records,
                end_offsets: report.end_offsets,
            },
        );
    }
    drop(producer);

    let upstream = format!("{}:{}", bench.get_host(), bench.get_port());
    let proxy = Proxy::start_delayed(upstream)?;
    println!(
        "kafka bench: PostgreSQL {version}, broker {brokers}, {facts} facts for batches, {single_facts:?} for one message per transaction at {round_trips:?} ms, {} round(s), hand-written partitions {}, load average {load_before}",
        cli.rounds,
        if cli.hand_lanes {
            "in parallel"
        } else {
            "in one loop"
        }
    );

    let mut runs: Vec<Run> = Vec::new();
    let mut measured_round_trips: Vec<(f64, f64)> = Vec::new();
    for (index, &round_trip) in round_trips.iter().enumerate() {
        recreate(&mut admin_conn, &cli.database).await?;
        let measured = set_round_trip(&proxy, &bench, round_trip).await?;
        measured_round_trips.push((round_trip, measured));
        println!(
            "== {round_trip} ms asked, {measured:.3} ms added (SELECT 1 through the proxy against direct)"
        );
        for round in 0..cli.rounds {
            let mut order = contenders.clone();
            if (round + index) % 2 == 1 {
                order.reverse();
            }
            for contender in order {
                let size = if contender.batch > 1 {
                    facts
                } else {
                    single_facts[index]
                };
                let topic = &topics[&size];
                recreate(&mut admin_conn, &cli.database).await?;
                setup(&bench).await?;
                let run = run_one(
                    contender,
                    topic,
                    &brokers,
                    &bench,
                    &proxy,
                    &cli.database,
                    cli.hand_lanes,
                )
                .await?;
                let run = Run {
                    round_trip_ms: round_trip,
                    round,
                    ..run
                };
                verify(&bench, topic, &contender).await?;
                println!(
                    "{:<15} {:>6} facts {:>8.0} facts/s steady {:>8.0} whole, startup {:>5.2} s, CPU/fact consumer {:>6.1} µs PostgreSQL {:>6.1} µs, round trips/fact {:>5.2}",
                    run.contender,
                    run.facts,
                    run.steady_facts_per_sec,
                    run.whole_facts_per_sec,
                    run.startup_secs,
                    run.consumer_cpu_us,
                    run.postgres_cpu_us,
                    run.round_trips
                );
                runs.push(run);
            }
        }
    }
    sqlx::raw_sql(&format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        cli.database
    ))
    .execute(&mut admin_conn)
    .await?;
    admin_conn.close().await?;

    let load_after = measure::load_average();
    let report = report(&runs, &measured_round_trips);
    println!("{report}");
    println!(
        "kafka bench: {:.0} s, load average before {load_before}, after {load_after}",
        started.elapsed().as_secs_f64()
    );
    let out = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench");
    std::fs::create_dir_all(&out)?;
    let path = out.join("kafka.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::json!({
            "postgres": version,
            "load_average": [load_before, load_after],
            "hand_lanes": cli.hand_lanes,
            "round_trips_ms": measured_round_trips,
            "runs": runs,
        }))?,
    )?;
    println!("wrote {}", path.display());
    Ok(())
}

async fn recreate(admin_conn: &mut PgConnection, database: &str) -> Result<(), BoxError> {
    for statement in [
        format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
        format!("CREATE DATABASE {database}"),
    ] {
        sqlx::raw_sql(&statement).execute(&mut *admin_conn).await?;
    }
    Ok(())
}

/// The tables of both contenders, on a connection of the bench (not through the proxy).
async fn setup(bench: &PgConnectOptions) -> Result<(), BoxError> {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(bench.clone())
        .await?;
    sqlx::raw_sql(contenders::CREATE_TABLES)
        .execute(&pool)
        .await?;
    let idem = Idem::new(pool.clone());
    idem.migrate().await?;
    idem_kafka::migrate(&idem, &idem_kafka::Schema::for_idem(&idem)).await?;
    pool.close().await;
    Ok(())
}

/// Sets the proxy's round trip to `asked` ms, measures what a `SELECT 1` takes through it
/// against directly, and corrects once for the sleeps' overshoot: the round trip added,
/// in ms.
async fn set_round_trip(
    proxy: &Proxy,
    bench: &PgConnectOptions,
    asked: f64,
) -> Result<f64, BoxError> {
    let direct = bench.clone().ssl_mode(PgSslMode::Disable);
    let through = direct.clone().host("127.0.0.1").port(proxy.port);
    let mut hold = asked;
    let mut added = 0.0;
    for _ in 0..3 {
        proxy.set_round_trip(Duration::from_secs_f64(hold.max(0.0) / 1000.0));
        added = select_one_ms(&through).await? - select_one_ms(&direct).await?;
        if asked == 0.0 || (added - asked).abs() < asked * 0.05 {
            break;
        }
        hold = (hold - (added - asked)).max(0.0);
    }
    Ok(added)
}

/// The mean time of a `SELECT 1` on one connection, in ms.
async fn select_one_ms(options: &PgConnectOptions) -> Result<f64, BoxError> {
    let mut conn = PgConnection::connect_with(options).await?;
    for _ in 0..20 {
        sqlx::raw_sql("SELECT 1").execute(&mut conn).await?;
    }
    let n = 300;
    let started = Instant::now();
    for _ in 0..n {
        sqlx::raw_sql("SELECT 1").execute(&mut conn).await?;
    }
    let ms = started.elapsed().as_secs_f64() * 1000.0 / f64::from(n);
    conn.close().await?;
    Ok(ms)
}

/// Runs `contender` in a child process until it consumed `topic`, sampling the clocks,
/// CPU and round trips at its start, at its first fact and at its end.
#[allow(clippy::too_many_arguments)]
async fn run_one(
    contender: Contender,
    topic: &Topic,
    brokers: &str,
    bench: &PgConnectOptions,
    proxy: &Proxy,
    database: &str,
    lanes: bool,
) -> Result<Run, BoxError> {
    // Without TLS, which the proxy could not read (as the suite's round-trip probe).
    let through = bench
        .clone()
        .host("127.0.0.1")
        .port(proxy.port)
        .ssl_mode(PgSslMode::Disable);
    let spec = ChildSpec {
        contender,
        brokers: brokers.to_owned(),
        topic: topic.name.clone(),
        group: format!(
            "kafka-bench-{}-{}",
            contender.name(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ),
        database_url: through.to_url_lossy().to_string(),
        end_offsets: topic.end_offsets.clone(),
        lanes,
    };
    let spec = serde_json::to_string(&spec)?;
    let counters = proxy.counters.clone();
    let database = database.to_owned();
    let facts = topic.facts.len();
    let records = topic.records;
    let name = contender.name();
    tokio::task::spawn_blocking(move || -> Result<Run, BoxError> {
        let sample = |pid: u32| Sample {
            at: Instant::now(),
            consumer: process_threads(pid),
            postgres: backends(&database),
            round_trips: counters.snapshot().round_trips,
        };
        let mut child = Command::new(std::env::current_exe()?)
            .env(CHILD, &spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let pid = child.id();
        let start = sample(pid);
        let stdout = child.stdout.take().ok_or("the child's stdout")?;
        let mut first: Option<(Sample, u64)> = None;
        let mut done: Option<Sample> = None;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            if let Some(applied) = line.strip_prefix("first ") {
                first = Some((sample(pid), applied.trim().parse()?));
            } else if line == "done" {
                done = Some(sample(pid));
                break;
            }
        }
        if let Some(mut stdin) = child.stdin.take() {
            writeln!(stdin, "bye").ok();
        }
        let status = child.wait()?;
        let (Some((first, applied)), Some(done)) = (first, done) else {
            return Err(format!("{name} ended before consuming the topic ({status})").into());
        };
        if !status.success() {
            return Err(format!("{name} failed: {status}").into());
        }
        let steady_facts = (facts as u64).saturating_sub(applied).max(1) as f64;
        let secs = |from: &Sample, to: &Sample| to.at.duration_since(from.at).as_secs_f64();
        Ok(Run {
            contender: name,
            round_trip_ms: 0.0,
            round: 0,
            facts,
            records,
            startup_secs: secs(&start, &first),
            whole_secs: secs(&start, &done),
            facts_at_first: applied,
            whole_facts_per_sec: facts as f64 / secs(&start, &done),
            steady_facts_per_sec: steady_facts / secs(&first, &done),
            consumer_cpu_us: done.consumer.since(&first.consumer) * 1e6 / steady_facts,
            postgres_cpu_us: done.postgres.since(&first.postgres) * 1e6 / steady_facts,
            round_trips: (done.round_trips - first.round_trips) as f64 / steady_facts,
            whole_consumer_cpu_us: done.consumer.since(&start.consumer) * 1e6 / facts as f64,
            whole_round_trips: (done.round_trips - start.round_trips) as f64 / facts as f64,
        })
    })
    .await?
}

/// Every fact has exactly one business row, and its key is recorded once.
async fn verify(
    bench: &PgConnectOptions,
    topic: &Topic,
    contender: &Contender,
) -> Result<(), BoxError> {
    let mut conn = PgConnection::connect_with(bench).await?;
    let ids: Vec<&str> = topic.facts.iter().map(|e| e.order_id.as_str()).collect();
    let types: Vec<&str> = topic
        .facts
        .iter()
        .map(|e| idem_demo::kafka::handlers::event_type_name(e.event_type))
        .collect();
    let amounts: Vec<i64> = topic.facts.iter().map(|e| e.amount_cents).collect();
    let (rows, matching, keys): (i64, i64, i64) = sqlx::query_as(&format!(
        "WITH expected AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS e(order_id, event_type, amount_cents)
        ), applied AS (
            SELECT order_id, event_type, amount_cents, count(*) AS n
            FROM order_effects GROUP BY order_id, event_type, amount_cents
        )
        SELECT (SELECT count(*) FROM order_effects),
               (SELECT count(*) FROM expected JOIN applied USING (order_id, event_type, amount_cents)
                WHERE applied.n = 1),
               (SELECT count(*) FROM {})",
        match contender.side {
            Side::Hand => "processed_keys",
            Side::Idem => "idem.idem_keys WHERE status = 'success'",
        }
    ))
    .bind(&ids)
    .bind(&types)
    .bind(&amounts)
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    let facts = topic.facts.len() as i64;
    if rows != facts || matching != facts || keys != facts {
        return Err(format!(
            "{}: not exactly once: {facts} facts, {rows} business rows, {matching} facts with exactly one row, {keys} keys",
            contender.name()
        )
        .into());
    }
    Ok(())
}

/// The tables of the report (Markdown).
fn report(runs: &[Run], round_trips: &[(f64, f64)]) -> String {
    let mut out = String::new();
    let median = |mut values: Vec<f64>| -> f64 {
        if values.is_empty() {
            return f64::NAN;
        }
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    out.push_str("\n| round trip | contender | facts | steady facts/s | whole-run facts/s | startup s | consumer CPU µs/fact | PostgreSQL CPU µs/fact | CPU µs/fact | round trips/fact |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for &(asked, measured) in round_trips {
        for run in runs.iter().filter(|run| run.round_trip_ms == asked) {
            out.push_str(&format!(
                "| {asked} ms ({measured:.2}) | {} | {} | {:.0} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} | {:.3} |\n",
                run.contender,
                run.facts,
                run.steady_facts_per_sec,
                run.whole_facts_per_sec,
                run.startup_secs,
                run.consumer_cpu_us,
                run.postgres_cpu_us,
                run.cpu_us(),
                run.round_trips
            ));
        }
    }
    out.push_str("\nidem-kafka against the hand-written consumer (steady state; medians over rounds): rate (goal >= 0.90), CPU per fact, consumer and PostgreSQL together (goal <= 1.15), round trips per fact\n\n| round trip | pair | rate | CPU/fact | consumer CPU/fact | PostgreSQL CPU/fact | round trips/fact |\n|---|---|---:|---:|---:|---:|---:|\n");
    for &(asked, _) in round_trips {
        for idem in all_contenders().iter().filter(|c| c.side == Side::Idem) {
            let of = |c: &Contender| -> Vec<&Run> {
                runs.iter()
                    .filter(|run| run.round_trip_ms == asked && run.contender == c.name())
                    .collect()
            };
            let (ours, theirs) = (of(idem), of(&idem.baseline()));
            if ours.is_empty() || theirs.is_empty() {
                continue;
            }
            let ratio = |value: fn(&Run) -> f64| -> f64 {
                median(ours.iter().map(|run| value(run)).collect())
                    / median(theirs.iter().map(|run| value(run)).collect())
            };
            out.push_str(&format!(
                "| {asked} ms | {} / {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
                idem.name(),
                idem.baseline().name(),
                ratio(|run| run.steady_facts_per_sec),
                ratio(Run::cpu_us),
                ratio(|run| run.consumer_cpu_us),
                ratio(|run| run.postgres_cpu_us),
                ratio(|run| run.round_trips),
            ));
        }
    }
    out
}
