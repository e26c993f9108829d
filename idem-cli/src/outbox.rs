//! `idem outbox`: idem-kafka's transactional outbox, what waits in it and what was set
//! aside.

use clap::{Args, Subcommand};
use idem_kafka::Schema;
use idem_kafka::outbox::admin;
use idem_runtime::Idem;

use crate::failure::Failure;
use crate::output::{Output, table};

/// The arguments of `idem outbox`.
#[derive(Debug, Args)]
pub struct OutboxArgs {
    /// The schema of idem-kafka's tables (default: the status table's schema followed by
    /// `_kafka`).
    #[arg(long, global = true)]
    outbox_schema: Option<String>,
    #[command(subcommand)]
    action: Option<OutboxAction>,
}

#[derive(Debug, Subcommand)]
enum OutboxAction {
    /// Records waiting, parked and kept after sending, the oldest waiting record's age
    /// (the lag), and which relay holds which shard (the default).
    Status,
    /// The parked records, oldest first, with their errors.
    Parked {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Put a parked record back in line for the relays (its attempts counted from zero).
    Retry {
        /// The record's id (`idem outbox parked` lists them).
        id: Option<i64>,
        /// Every parked record.
        #[arg(long, conflicts_with = "id")]
        all: bool,
    },
}

pub async fn run(idem: &Idem, out: &Output, args: OutboxArgs) -> Result<(), Failure> {
    let schema = match &args.outbox_schema {
        Some(name) => Schema::named(name).map_err(|error| Failure::usage(error.to_string()))?,
        None => Schema::for_idem(idem),
    };
    act(idem, out, &schema, args.action).await.map_err(|failure| match failure {
        Failed::Database(error) if is_missing_table(&error) => Failure::new(
            5,
            "not_migrated",
            format!(
                "schema `{}` has no outbox: the consumers' `migrate` (idem_kafka::migrate) creates it, or pass --outbox-schema",
                schema.as_str()
            ),
        ),
        Failed::Database(error) => Failure::from(error),
        Failed::Other(failure) => failure,
    })
}

/// Why a subcommand failed: the database (which may be an outbox not migrated yet), or
/// anything else.
enum Failed {
    Database(sqlx::Error),
    Other(Failure),
}

impl From<sqlx::Error> for Failed {
    fn from(error: sqlx::Error) -> Self {
        Failed::Database(error)
    }
}

impl From<Failure> for Failed {
    fn from(failure: Failure) -> Self {
        Failed::Other(failure)
    }
}

fn is_missing_table(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01"))
}

async fn act(
    idem: &Idem,
    out: &Output,
    schema: &Schema,
    action: Option<OutboxAction>,
) -> Result<(), Failed> {
    let schema = schema.clone();
    match action.unwrap_or(OutboxAction::Status) {
        OutboxAction::Status => {
            let summary = admin::summary(idem, &schema).await?;
            let oldest = summary.oldest_unsent.map(|age| age.as_secs_f64());
            if out.json {
                out.json(&serde_json::json!({
                    "schema": schema.as_str(),
                    "unsent": summary.unsent,
                    "parked": summary.parked,
                    "sent": summary.sent,
                    "oldest_unsent_seconds": oldest,
                    "relays": summary.relays.iter().map(|(shard, owner, left)| serde_json::json!({
                        "shard": shard, "relay": owner.to_string(), "lease_left_seconds": left.as_secs_f64(),
                    })).collect::<Vec<_>>(),
                }));
                return Ok(());
            }
            let lag = oldest.map_or("none".to_owned(), |seconds| format!("{seconds:.1} s"));
            println!(
                "outbox {}: {} unsent (oldest waiting {lag}), {} parked, {} sent and kept",
                schema.as_str(),
                summary.unsent,
                summary.parked,
                summary.sent
            );
            // A relay whose lease ran out holds nothing: the next relay takes its shards.
            let mut relays: Vec<(uuid::Uuid, bool, Vec<i16>)> = Vec::new();
            for (shard, owner, left) in &summary.relays {
                let live = !left.is_zero();
                match relays
                    .iter_mut()
                    .find(|(relay, alive, _)| relay == owner && *alive == live)
                {
                    Some((_, _, shards)) => shards.push(*shard),
                    None => relays.push((*owner, live, vec![*shard])),
                }
            }
            let rows: Vec<Vec<String>> = relays
                .iter()
                .map(|(relay, live, shards)| {
                    let shards: Vec<String> = shards.iter().map(i16::to_string).collect();
                    let lease = if *live {
                        "held"
                    } else {
                        "expired: free for the next relay"
                    };
                    vec![relay.to_string(), shards.join(","), lease.to_owned()]
                })
                .collect();
            if rows.is_empty() {
                println!("no relay holds a shard");
            } else {
                print!("{}", table(&["relay", "shards", "lease"], &rows));
            }
            if summary.parked > 0 {
                println!(
                    "`idem outbox parked` lists the parked records; `idem outbox retry ID` puts one back"
                );
            }
        }
        OutboxAction::Parked { limit } => {
            let parked = admin::parked(idem, &schema, limit).await?;
            if out.json {
                out.json(
                    &serde_json::json!({ "parked": parked.iter().map(|record| serde_json::json!({
                    "id": record.id, "topic": record.topic,
                    "key": record.key.as_deref().map(String::from_utf8_lossy),
                    "partition": record.partition, "parked_at": record.parked_at.to_rfc3339(),
                    "idem_key": record.idem_key.to_string(),
                    "attempts": record.attempts, "error": record.error,
                })).collect::<Vec<_>>() }),
                );
                return Ok(());
            }
            if parked.is_empty() {
                println!("no parked record");
                return Ok(());
            }
            let rows: Vec<Vec<String>> = parked
                .iter()
                .map(|record| {
                    vec![
                        record.id.to_string(),
                        record.topic.clone(),
                        record.key.as_deref().map_or_else(
                            || "-".to_owned(),
                            |key| String::from_utf8_lossy(key).into_owned(),
                        ),
                        record
                            .partition
                            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
                        record.parked_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                        record.idem_key.to_string(),
                        record.attempts.to_string(),
                        record.error.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        "id",
                        "topic",
                        "key",
                        "partition",
                        "parked",
                        "idem-key",
                        "attempts",
                        "error"
                    ],
                    &rows
                )
            );
        }
        OutboxAction::Retry { id, all } => {
            if id.is_none() && !all {
                return Err(Failed::Other(Failure::usage(
                    "name the record (`idem outbox retry ID`) or pass --all",
                )));
            }
            let retried = admin::retry(idem, &schema, id).await?;
            if let (Some(id), 0) = (id, retried) {
                return Err(Failed::Other(Failure::new(
                    6,
                    "unknown_record",
                    format!(
                        "no parked record {id} in {}; `idem outbox parked` lists them",
                        schema.as_str()
                    ),
                )));
            }
            if out.json {
                out.json(&serde_json::json!({ "retried": retried }));
            } else {
                println!("{retried} record(s) back in line for the relays");
            }
        }
    }
    Ok(())
}
