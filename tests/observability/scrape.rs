//! A consumer and an outbox relay run against the broker and PostgreSQL, with the
//! Prometheus exporter the examples use; the traffic produces every outcome the dashboard
//! and the alerts show (executed, duplicates, a retried failure, a parked key, dead
//! letters, outbox records published and parked, a position rewind, retention runs, a
//! scope whose keys are kept by the fact's time: a fact applied, one refused outside its
//! window, the time buckets kept by the retention run). A
//! private Prometheus scrapes the exporter every second, with the alerting rules loaded;
//! then every query of the dashboard, every template variable and the underlying query of
//! every rule returns data. A query that returns nothing fails the test by its text.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use idem_demo::kafka::admin;
use idem_demo::kafka::producer::create_producer;
use idem_kafka::outbox::{self, OutboxError, Record, Relay};
use idem_kafka::{Fate, Handler, OffsetStore, Position};
use idem_runtime::retention::Retention;
use idem_runtime::{Idem, idempotent};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use rdkafka::producer::FutureRecord;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use tokio::sync::watch;

use crate::prometheus::{Prometheus, repository};
use crate::queries::{dashboard_queries, underlying_queries, variable_label_values};
use crate::support::{Harness, wait_until, wait_while_progressing};

/// The buckets of the `_seconds` histograms (claim and handler times), as a service
/// exports them for the dashboard's quantiles.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// How long the queries may take to return data once the traffic is over: the scrapes
/// (every second) and the rules' evaluations (every second) after it.
const QUERIES_WITHIN: Duration = Duration::from_secs(120);

/// The exporter's address: one recorder per process, installed once.
fn exporter() -> SocketAddr {
    static ADDRESS: OnceLock<SocketAddr> = OnceLock::new();
    *ADDRESS.get_or_init(|| {
        let address = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port");
        // From a thread of its own: out of a Tokio runtime, the exporter runs its HTTP
        // listener on a runtime of its own, whatever the test's runtime does.
        std::thread::spawn(move || {
            PrometheusBuilder::new()
                .with_http_listener(address)
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &BUCKETS)
                .expect("buckets")
                .install()
                .expect("the Prometheus exporter")
        })
        .join()
        .expect("the exporter's thread");
        address
    })
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Fact {
    fact_id: String,
    /// `apply`, or `fail` (the handler fails every time: retried, then parked).
    kind: String,
    /// The topic of the outbox record the handler sends, if any.
    send_to: Option<String>,
}

#[derive(Debug, thiserror::Error)]
enum FactError {
    #[error("the fact cannot be applied")]
    Refused,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Outbox(#[from] OutboxError),
}

#[idempotent(key = "fact_id", scope = "observability.apply", max_attempts = 2)]
async fn apply(tx: &mut PgConnection, fact: &Fact) -> Result<(), FactError> {
    if fact.kind == "fail" {
        return Err(FactError::Refused);
    }
    if let Some(topic) = &fact.send_to {
        outbox::send(
            tx,
            Record::to(topic)
                .key(&fact.fact_id)
                .payload(fact.fact_id.as_bytes()),
        )
        .await?;
    }
    Ok(())
}

/// A reading whose key is kept by its time (`event_time`), in the time buckets.
#[derive(Debug, Clone)]
struct Reading {
    meter: String,
    taken_at: chrono::DateTime<chrono::Utc>,
}

#[idempotent(
    key = "meter, taken_at",
    event_time = "taken_at",
    scope = "observability.readings"
)]
async fn record_reading(tx: &mut PgConnection, reading: &Reading) -> Result<(), sqlx::Error> {
    let _ = (tx, reading);
    Ok(())
}

struct Facts;

impl Handler for Facts {
    type Message = Fact;

    fn decode(&self, payload: &[u8]) -> Result<Fact, String> {
        idem_kafka::decode_json(payload)
    }

    async fn handle(&self, idem: &Idem, fact: &Fact, _: Option<&Position>) -> Fate {
        Fate::of(apply(idem, fact).await)
    }
}

/// What the scenario produced: the end offset of the topic's partition.
async fn produce(harness: &Harness, payloads: &[Vec<u8>]) -> HashMap<i32, i64> {
    let producer = create_producer(&harness.brokers).unwrap();
    let mut end = HashMap::new();
    for payload in payloads {
        let delivery = producer
            .send(
                FutureRecord::to(&harness.topic)
                    .key("k")
                    .payload(payload.as_slice()),
                Duration::from_secs(30),
            )
            .await
            .unwrap_or_else(|(error, _)| panic!("produce to {}: {error}", harness.topic));
        end.insert(delivery.partition, delivery.offset + 1);
    }
    end
}

fn fact(id: &str, kind: &str, send_to: Option<&str>) -> Vec<u8> {
    serde_json::to_vec(&Fact {
        fact_id: id.to_owned(),
        kind: kind.to_owned(),
        send_to: send_to.map(str::to_owned),
    })
    .unwrap()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn every_dashboard_query_and_alert_query_returns_data_from_a_running_consumer(pool: PgPool) {
    let started = Instant::now();
    let exporter = exporter();
    let harness = Harness::new(&pool, "observability", 1).await;
    let out_topic = format!("{}-out", harness.topic);
    admin::create_topic(&harness.brokers, &out_topic, 1)
        .await
        .unwrap();

    // Prometheus scrapes from before the first message on, so that the counters'
    // increases are seen.
    let rules = repository().join("ops/prometheus/idem-alerts.yml");
    let prometheus = Prometheus::start(
        "scrape",
        19090,
        &[exporter.to_string()],
        std::slice::from_ref(&rules),
    );
    println!(
        "prometheus at {} scraping {exporter} ({:.1?})",
        prometheus.address,
        started.elapsed()
    );

    let member = harness.member("c0", Facts, |builder| {
        builder
            .offsets(OffsetStore::Postgres)
            .retry_backoff(Duration::from_millis(50), Duration::from_millis(200))
            .commit_interval(Duration::from_millis(500))
    });
    let stats = member.stats.clone();
    let relay = Relay::builder(&harness.brokers)
        .poll(Duration::from_millis(200))
        .max_attempts(1)
        .retention(Duration::ZERO)
        .build(&harness.idem)
        .unwrap();
    let relay = std::sync::Arc::new(relay);
    let (stop_relay, mut relay_stopped) = watch::channel(false);
    let relay_task = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async move {
                    relay_stopped.wait_for(|stop| *stop).await.ok();
                })
                .await
        }
    });

    // Executed (each sending an outbox record), duplicates, a fact that fails twice (a
    // retry, then parked: a dead letter), a payload that is no fact (a dead letter), and
    // a record for a topic that does not exist (parked by the relay).
    let missing_topic = format!("{}-missing", harness.topic);
    let mut payloads = Vec::new();
    for i in 0..5 {
        payloads.push(fact(&format!("f-{i}"), "apply", Some(&out_topic)));
    }
    payloads.push(fact("f-0", "apply", Some(&out_topic)));
    payloads.push(fact("f-1", "apply", Some(&out_topic)));
    payloads.push(fact("f-bad", "fail", None));
    payloads.push(b"not a fact".to_vec());
    payloads.push(fact("f-orphan", "apply", Some(&missing_topic)));
    let end = produce(&harness, &payloads).await;
    wait_while_progressing(
        Duration::from_secs(90),
        || stats.caught_up(&harness.topic, &end),
        || stats.snapshot().deliveries,
        || format!("consumed to the end: {:?}", stats.snapshot()),
    )
    .await;
    let consumed = stats.snapshot();
    println!("consumed: {consumed:?} ({:.1?})", started.elapsed());
    assert_eq!(consumed.executed, 6, "{consumed:?}");
    assert_eq!(consumed.duplicates, 2, "{consumed:?}");
    assert_eq!(consumed.dead_letters, 2, "{consumed:?}");
    assert!(consumed.retries >= 1, "{consumed:?}");

    // The relay publishes five records and parks the sixth.
    wait_until(
        Duration::from_secs(120),
        || relay.stats().published() >= 5 && relay.stats().parked() >= 1,
        || {
            format!(
                "the relay published 5 records and parked 1: {} published, {} parked",
                relay.stats().published(),
                relay.stats().parked()
            )
        },
    )
    .await;

    // The database goes back: the stored position moves to the start of the partition,
    // as a restore would leave it. The member, idle, finds it at its next flush and reads
    // the partition again (duplicates, the parked key again).
    sqlx::query("UPDATE idem_kafka.kafka_offsets SET next_offset = 0 WHERE consumer_group = $1")
        .bind(&harness.group)
        .execute(&harness.pool)
        .await
        .unwrap();
    wait_while_progressing(
        Duration::from_secs(90),
        || stats.snapshot().rewinds >= 1 && stats.caught_up(&harness.topic, &end),
        || stats.snapshot().deliveries,
        || {
            format!(
                "a rewind, consumed to the end again: {:?}",
                stats.snapshot()
            )
        },
    )
    .await;
    println!(
        "rewound and consumed again: {:?} ({:.1?})",
        stats.snapshot(),
        started.elapsed()
    );

    // A scope whose keys are kept by the fact's time: a fact applied (its bucket made by
    // the claim), and one older than the window (a week), refused and never run.
    let now = chrono::Utc::now();
    let fresh = Reading {
        meter: "m-1".to_owned(),
        taken_at: now,
    };
    assert!(
        record_reading(&harness.idem, &fresh)
            .await
            .unwrap()
            .is_executed()
    );
    let stale = Reading {
        meter: "m-1".to_owned(),
        taken_at: now - chrono::TimeDelta::days(8),
    };
    let refused = record_reading(&harness.idem, &stale).await;
    assert!(
        matches!(refused, Err(idem_runtime::Error::OutsideWindow { .. })),
        "{refused:?}"
    );

    // Retention runs: the status table's `success` keys, the time buckets (made ahead,
    // the expired ones dropped: the gauges of the buckets), and the relay's sent records.
    let purged = harness
        .idem
        .purge_with(&Retention::new(Duration::ZERO))
        .await
        .unwrap();
    assert!(purged.deleted >= 6, "the retention run deleted: {purged:?}");
    // A run with the default window (a week) keeps the time buckets: made ahead, none
    // expired, and their gauges set.
    harness.idem.purge().await.unwrap();
    let sent_purged = relay.purge().await.unwrap();
    assert!(
        sent_purged >= 5,
        "the relay purged {sent_purged} sent records"
    );
    let left = count(
        &harness.pool,
        "SELECT count(*) FROM idem.idem_keys WHERE status = 'success'",
    )
    .await;
    assert_eq!(left, 0, "every success key deleted");

    // The dashboard's queries and variables, the rules' queries: each returns data.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repository().join("ops/grafana/idem.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut checks: Vec<(String, Check)> = Vec::new();
    for query in dashboard_queries(&dashboard) {
        checks.push((
            format!("dashboard panel \"{}\": {}", query.panel, query.expr),
            Check::Query(query.expr),
        ));
    }
    for (name, metric, label) in variable_label_values(&dashboard) {
        checks.push((
            format!("dashboard variable ${name}: label_values({metric}, {label})"),
            Check::LabelValues { metric, label },
        ));
    }
    let rules = wait_for_rules(&prometheus).await;
    for (alert, expr) in &rules {
        for query in underlying_queries(expr) {
            checks.push((format!("alert {alert}: {query}"), Check::Query(query)));
        }
    }
    println!(
        "{} dashboard queries and variables, {} alerts ({:.1?})",
        checks.len() - rules.len(),
        rules.len(),
        started.elapsed()
    );

    let waited = Instant::now();
    let mut empty: Vec<String> = Vec::new();
    loop {
        empty.clear();
        for (name, check) in &checks {
            match check.run(&prometheus).await {
                Ok(0) => empty.push(format!("{name}\n    returned no data")),
                Ok(_) => {}
                Err(error) => empty.push(format!("{name}\n    failed: {error}")),
            }
        }
        if empty.is_empty() || waited.elapsed() > QUERIES_WITHIN {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        empty.is_empty(),
        "after {QUERIES_WITHIN:?} of scrapes, {} of {} queries return no data:\n{}",
        empty.len(),
        checks.len(),
        empty.join("\n")
    );
    println!(
        "every one of the {} queries returns data, {:.1?} after the traffic ({:.1?} in all)",
        checks.len(),
        waited.elapsed(),
        started.elapsed()
    );

    // The traffic parked a key, dead-lettered messages and parked an outbox record: the
    // server's rules see it (pending for their `for:`, or firing already).
    let expected = [
        "IdemKeysParked",
        "IdemDeadLetters",
        "IdemOutboxRecordsParked",
    ];
    let active = wait_for_alerts(&prometheus, &expected).await;
    println!(
        "alerts active: {active:?} ({:.1?} in all)",
        started.elapsed()
    );

    stop_relay.send(true).ok();
    relay_task.await.unwrap().unwrap();
    harness.stop(vec![member]).await;
    harness.finish().await;
    drop(prometheus);
}

enum Check {
    Query(String),
    LabelValues { metric: String, label: String },
}

impl Check {
    /// How many series (or label values) the check returns.
    async fn run(&self, prometheus: &Prometheus) -> Result<usize, String> {
        match self {
            Check::Query(query) => Ok(prometheus.query(query).await?.len()),
            Check::LabelValues { metric, label } => {
                let values = prometheus
                    .get(format!(
                        "/api/v1/label/{label}/values?match[]={}",
                        crate::prometheus::encode(metric)
                    ))
                    .await?;
                Ok(values.as_array().map_or(0, Vec::len))
            }
        }
    }
}

/// The alerting rules the server loaded, `(name, query)`, once each has been evaluated
/// without an error.
async fn wait_for_rules(prometheus: &Prometheus) -> Vec<(String, String)> {
    let started = Instant::now();
    loop {
        let data = prometheus.get("/api/v1/rules".to_owned()).await;
        let mut rules = Vec::new();
        let mut waiting = Vec::new();
        if let Ok(data) = &data {
            for group in data["groups"].as_array().into_iter().flatten() {
                for rule in group["rules"].as_array().into_iter().flatten() {
                    let name = rule["name"].as_str().unwrap_or("?").to_owned();
                    assert_ne!(
                        rule["health"], "err",
                        "the rule {name} fails in Prometheus: {}",
                        rule["lastError"]
                    );
                    if rule["health"] != "ok" {
                        waiting.push(name.clone());
                    }
                    rules.push((name, rule["query"].as_str().unwrap_or("").to_owned()));
                }
            }
        }
        if !rules.is_empty() && waiting.is_empty() {
            return rules;
        }
        assert!(
            started.elapsed() < QUERIES_WITHIN,
            "the server evaluates the rules: {data:?}, not yet: {waiting:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The alerts pending or firing once each of `expected` is: `(name, state)`.
async fn wait_for_alerts(prometheus: &Prometheus, expected: &[&str]) -> Vec<(String, String)> {
    let started = Instant::now();
    loop {
        let data = prometheus.get("/api/v1/alerts".to_owned()).await;
        let active: Vec<(String, String)> = data
            .as_ref()
            .ok()
            .and_then(|data| data["alerts"].as_array())
            .into_iter()
            .flatten()
            .map(|alert| {
                (
                    alert["labels"]["alertname"]
                        .as_str()
                        .unwrap_or("?")
                        .to_owned(),
                    alert["state"].as_str().unwrap_or("?").to_owned(),
                )
            })
            .collect();
        if expected
            .iter()
            .all(|name| active.iter().any(|(active, _)| active == name))
        {
            return active;
        }
        assert!(
            started.elapsed() < QUERIES_WITHIN,
            "the alerts {expected:?} are pending or firing; active: {active:?} ({data:?})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
