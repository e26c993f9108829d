//! `idem lag`: the lag of a consumer group on every partition of its topic, the broker's
//! watermarks beside the group's positions (stored in PostgreSQL or committed to Kafka),
//! and the partitions that stalled: lag, and a stored position that has not moved for
//! longer than `--stalled-after`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use idem_kafka::{ConsumerError, OffsetStore, PartitionLag, Schema};
use idem_runtime::Idem;

use crate::duration::parse_duration;
use crate::failure::Failure;
use crate::output::{Output, table};

/// The exit code when a partition stalled (the table in the crate docs).
pub const STALLED: u8 = 8;

/// The arguments of `idem lag`.
#[derive(Debug, Args)]
pub struct LagArgs {
    /// The Kafka brokers to ask (`host:port`, comma-separated).
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// The consumer group.
    #[arg(long)]
    group: String,
    /// The topic the group consumes.
    #[arg(long)]
    topic: String,
    /// Where the group keeps its positions, as its consumers are built: `kafka` (committed
    /// to the broker, the consumers' default) or `postgres` (stored by the handlers'
    /// transactions in idem-kafka's `kafka_offsets` table, which also says when each last
    /// moved).
    #[arg(long, value_name = "kafka|postgres", default_value_t = OffsetStore::Kafka)]
    offsets: OffsetStore,
    /// The schema of idem-kafka's tables, with `--offsets postgres` (default: the status
    /// table's schema followed by `_kafka`).
    #[arg(long)]
    kafka_schema: Option<String>,
    /// A partition with lag whose stored position has not moved for longer than this, and
    /// whose oldest waiting record has waited that long too, is stalled (`90s`, `15m`,
    /// `2h`).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    stalled_after: Duration,
}

/// One partition as `idem lag` reports it.
struct Row {
    lag: PartitionLag,
    /// How long ago the stored position last moved, by the database's clock.
    moved_ago: Option<Duration>,
    stalled: bool,
}

/// Shows the group's lag; a stalled partition ends with exit code [`STALLED`], after the
/// table.
pub async fn run(idem: &Idem, out: &Output, args: LagArgs) -> Result<(), Failure> {
    let schema = match &args.kafka_schema {
        Some(name) => Schema::named(name).map_err(|error| Failure::usage(error.to_string()))?,
        None => Schema::for_idem(idem),
    };
    if args.offsets == OffsetStore::Postgres {
        idem_runtime::config::Identifier::new(schema.as_str()).map_err(|error| {
            Failure::usage(format!(
                "idem-kafka's schema would be `{}`: {error}; name it with --kafka-schema",
                schema.as_str()
            ))
        })?;
    }
    let partitions = idem_kafka::group_lag(
        idem,
        &schema,
        &args.brokers,
        &args.group,
        &args.topic,
        args.offsets,
    )
    .await
    .map_err(|error| failure(error, &args, &schema))?;
    if partitions.is_empty() {
        return Err(Failure::new(
            6,
            "unknown_topic",
            format!(
                "the broker at {} knows no topic `{}` (or it has no partitions)",
                args.brokers, args.topic
            ),
        ));
    }
    // Ages by the clock that wrote the positions.
    let now: DateTime<Utc> = match args.offsets {
        OffsetStore::Postgres => sqlx::query_scalar("SELECT now()")
            .persistent(false)
            .fetch_one(idem.pool())
            .await
            .map_err(Failure::from)?,
        _ => Utc::now(),
    };
    let rows: Vec<Row> = partitions
        .into_iter()
        .map(|lag| {
            let moved_ago = lag
                .moved_at
                .map(|at| (now - at).to_std().unwrap_or(Duration::ZERO));
            // Stalled: the position has not moved for longer than the bound, and the
            // oldest record waiting has waited that long too (a record that just reached
            // an idle partition has not).
            let waited = |at: DateTime<Utc>| (now - at).to_std().unwrap_or(Duration::ZERO);
            let stalled = lag.lag > 0
                && moved_ago.is_some_and(|ago| ago > args.stalled_after)
                && lag
                    .waiting_since
                    .is_none_or(|at| waited(at) > args.stalled_after);
            Row {
                lag,
                moved_ago,
                stalled,
            }
        })
        .collect();
    show(out, &args, &schema, &rows);
    let stalled: Vec<&Row> = rows.iter().filter(|row| row.stalled).collect();
    if stalled.is_empty() {
        return Ok(());
    }
    let which: Vec<String> = stalled
        .iter()
        .map(|row| {
            format!(
                "{} (lag {}, no move for {})",
                row.lag.partition,
                row.lag.lag,
                row.moved_ago.map_or_else(|| "-".to_owned(), age)
            )
        })
        .collect();
    Err(Failure::new(
        STALLED,
        "stalled",
        format!(
            "group `{}` stalled on topic `{}`: partition(s) {}; the bound is {}",
            args.group,
            args.topic,
            which.join(", "),
            bound(args.stalled_after)
        ),
    ))
}

/// What `group_lag`'s error means to the operator.
fn failure(error: ConsumerError, args: &LagArgs, schema: &Schema) -> Failure {
    match error {
        ConsumerError::Kafka(error) => Failure::new(
            4,
            "broker",
            format!(
                "cannot read topic `{}` and group `{}` from the Kafka broker at {}: {error}",
                args.topic, args.group, args.brokers
            ),
        ),
        ConsumerError::Database(sqlx::Error::Database(db))
            if matches!(db.code().as_deref(), Some("42P01" | "3F000")) =>
        {
            Failure::new(
                5,
                "not_migrated",
                format!(
                    "schema `{}` has no kafka_offsets table: the consumers' `migrate` \
                     (idem_kafka::migrate) creates it; or pass --kafka-schema, or \
                     --offsets kafka for a group that commits its positions to Kafka",
                    schema.as_str()
                ),
            )
        }
        ConsumerError::Database(error) => Failure::from(error),
        ConsumerError::Config(message) => Failure::usage(message),
        other => Failure::new(1, "kafka", other.to_string()),
    }
}

/// A duration as a person reads an age: `45s`, `5m 07s`, `3h 12m`, `2d 04h`.
fn age(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..120 => format!("{seconds}s"),
        120..7_200 => format!("{}m {:02}s", seconds / 60, seconds % 60),
        7_200..172_800 => format!("{}h {:02}m", seconds / 3_600, seconds % 3_600 / 60),
        _ => format!("{}d {:02}h", seconds / 86_400, seconds % 86_400 / 3_600),
    }
}

/// `--stalled-after` as the duration grammar writes it: `30s`, `1h`.
fn bound(bound: Duration) -> String {
    crate::output::duration(i64::try_from(bound.as_millis()).unwrap_or(i64::MAX))
}

fn where_kept(args: &LagArgs, schema: &Schema) -> String {
    match args.offsets {
        OffsetStore::Postgres => format!(
            "positions stored in PostgreSQL ({}.kafka_offsets)",
            schema.as_str()
        ),
        _ => "positions committed to Kafka".to_owned(),
    }
}

fn show(out: &Output, args: &LagArgs, schema: &Schema, rows: &[Row]) {
    let total: i64 = rows.iter().map(|row| row.lag.lag).sum();
    let stalled = rows.iter().filter(|row| row.stalled).count();
    let positions = rows.iter().filter(|row| row.lag.position.is_some()).count();
    if out.json {
        out.json(&serde_json::json!({
            "group": args.group,
            "topic": args.topic,
            "offsets": args.offsets.to_string(),
            "schema": (args.offsets == OffsetStore::Postgres).then(|| schema.as_str()),
            "stalled_after_seconds": args.stalled_after.as_secs_f64(),
            "partitions": rows.iter().map(|row| serde_json::json!({
                "partition": row.lag.partition,
                "position": row.lag.position,
                "low_watermark": row.lag.low_watermark,
                "high_watermark": row.lag.high_watermark,
                "lag": row.lag.lag,
                "moved_at": row.lag.moved_at.map(|at| at.to_rfc3339()),
                "moved_seconds_ago": row.moved_ago.map(|ago| ago.as_secs_f64()),
                "waiting_since": row.lag.waiting_since.map(|at| at.to_rfc3339()),
                "stalled": row.stalled,
            })).collect::<Vec<_>>(),
            "total_lag": total,
            "stalled": stalled,
            "partitions_with_position": positions,
        }));
        return;
    }
    let mut text = format!(
        "group {} on topic {}, {}\n",
        args.group,
        args.topic,
        where_kept(args, schema)
    );
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            vec![
                row.lag.partition.to_string(),
                row.lag
                    .position
                    .map_or_else(|| "-".to_owned(), |at| at.to_string()),
                row.lag.low_watermark.to_string(),
                row.lag.high_watermark.to_string(),
                row.lag.lag.to_string(),
                row.moved_ago
                    .map_or_else(|| "-".to_owned(), |ago| format!("{} ago", age(ago))),
                if row.stalled { "stalled" } else { "" }.to_owned(),
            ]
        })
        .collect();
    text.push_str(&table(
        &["PARTITION", "POSITION", "LOW", "HIGH", "LAG", "MOVED", ""],
        &cells,
    ));
    text.push_str(&format!(
        "total lag: {total} on {} partition(s); {stalled} stalled (lag, and no move for longer than {})\n",
        rows.len(),
        bound(args.stalled_after)
    ));
    if positions == 0 {
        text.push_str(&format!(
            "group {} has no position on topic {} ({}): it has processed nothing yet, or \
             another --group, --offsets or --kafka-schema is meant\n",
            args.group,
            args.topic,
            where_kept(args, schema)
        ));
    } else if args.offsets != OffsetStore::Postgres {
        text.push_str(
            "positions in Kafka do not say when they last moved: no partition is marked stalled\n",
        );
    }
    out.text(&text);
}
