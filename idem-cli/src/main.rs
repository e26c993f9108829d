//! `idem`: the operator's tool for the status table of idempotent handlers, and for the
//! time buckets that keep the keys of handlers with `event_time`.
//!
//! ```text
//! idem [-D URL] [--schema idem] [--pooler session|transaction] [--json] <command>
//!
//!   migrate [status]                      apply the status table's migrations / list them
//!   keys show --scope S (--key ID | --field F=V ...)
//!   keys list [--scope S] [--status ST]... [--older-than AGE] [--limit N] [--after CURSOR]
//!   keys retry|release [selection] [--dry-run]
//!   purge [--older-than AGE] [--scope-window S=AGE]... [--bucket-width W] [--future-bound B]
//!         [--dry-run]                     delete expired keys, keep the time buckets / say what it would do
//!   stats [--buckets]                     keys per scope and status, the time buckets
//!   scopes [list] | scopes release SCOPE  the scopes recorded (owner, key definition) / forget one
//!   outbox [status|parked|retry ID|retry --all] [--outbox-schema S]
//!                                         idem-kafka's outbox: its lag, the relays, parked records
//!   lag --group G --topic T [--brokers B] [--offsets kafka|postgres] [--kafka-schema S]
//!       [--stalled-after 30s]             a consumer group's lag on every partition of its topic
//! ```
//!
//! The connection comes from `-D/--database-url`, else `DATABASE_URL`, else the libpq
//! variables (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`).
//! `sslmode` in the URL turns TLS on (rustls, webpki roots). Passwords are never printed.
//!
//! `idem lag` asks the Kafka brokers of `--brokers`, else `KAFKA_BROKERS`, else
//! `127.0.0.1:9092`.
//!
//! Keys kept by their fact's time (`event_time`) are in the time buckets of
//! `idem_timed_keys`: `keys show`, `keys list`, `keys retry` and `keys release` find them
//! by scope and key as they find the status table's (with their fact time), `stats`
//! counts them and shows the buckets, and `purge --dry-run` lists the buckets the cleanup
//! would make and drop.
//!
//! Exit codes: 0 done; 1 another error; 2 bad arguments; 3 a bad database URL; 4 the
//! database cannot be reached, or (`idem lag`) the Kafka broker cannot be reached or
//! refuses the request; 5 the schema is missing or has pending migrations (also
//! `migrate status` with pending migrations, and idem-kafka's tables for `outbox` and
//! `lag --offsets postgres`); 6 an unknown key, scope, outbox record or topic; 7 a key
//! whose status does not allow the change; 8 (`idem lag`, after the table) a partition
//! stalled: it has lag and the group's stored position has not moved for longer than
//! `--stalled-after`. With `--json`, an error is one JSON object on stderr
//! (`{"error": "...", "kind": "unknown_key"}`).

mod connect;
mod duration;
mod failure;
mod lag;
mod outbox;
mod output;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idem_runtime::Idem;
use idem_runtime::admin::{self, AdminError, Cursor, KeyField, KeyFilter};
use idem_runtime::retention::Retention;
use uuid::Uuid;

use crate::duration::parse_duration;
use crate::failure::Failure;

/// The operator's tool for the status table of idem's idempotent handlers.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, long_about = None)]
struct Cli {
    /// The PostgreSQL URL (`postgres://user:password@host:5432/db?sslmode=require`); without
    /// it, `DATABASE_URL`, else the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD,
    /// PGDATABASE, PGSSLMODE).
    #[arg(
        short = 'D',
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        global = true
    )]
    database_url: Option<String>,
    /// The schema of the status table.
    #[arg(long, default_value = "idem", global = true)]
    schema: String,
    /// What stands between the tool and PostgreSQL: `session` (a direct connection, or a
    /// pooler in session pooling) or `transaction` (a pooler in transaction pooling, such
    /// as PgBouncer's `pool_mode = transaction`: nothing is prepared, nothing kept in the
    /// session).
    #[arg(
        long,
        env = "IDEM_POOLER",
        value_enum,
        default_value = "session",
        global = true
    )]
    pooler: PoolerArg,
    /// Machine-readable output: one JSON document on stdout.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// The values of `--pooler`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PoolerArg {
    Session,
    Transaction,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the status table's migrations (creates the schema), or list them.
    Migrate {
        #[command(subcommand)]
        action: Option<MigrateAction>,
    },
    /// Look at keys, retry or release failed and parked ones.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Delete `success` keys older than the retention window, in batches (one cleaner at a
    /// time). A duplicate arriving after its key was deleted runs its handler again.
    ///
    /// Also keeps the time buckets of handlers with `event_time`: makes those from now to
    /// the future bound ahead, where missing, and drops the expired ones whole (each with
    /// all its keys). With --dry-run, lists the buckets it would make and drop.
    Purge(PurgeArgs),
    /// Keys per scope and status (in the status table and the time buckets), the oldest
    /// lease in progress, the table's size, and, once keys are kept by their fact's time,
    /// the time buckets: how many, the oldest and newest fact hour they hold, how far
    /// ahead they are made, the horizon before which facts are refused.
    ///
    /// The counts read every key of both tables; the buckets' figures come from their
    /// register and the catalog (no count).
    Stats(StatsArgs),
    /// The scopes recorded, with their owners and key definitions, or release one.
    Scopes {
        #[command(subcommand)]
        action: Option<ScopesAction>,
    },
    /// idem-kafka's transactional outbox: the lag (the oldest unsent record), the relays,
    /// the parked records; put a parked record back in line.
    Outbox(outbox::OutboxArgs),
    /// The lag of a Kafka consumer group on every partition of its topic: the broker's
    /// watermarks beside the group's positions (committed to Kafka, or stored in
    /// PostgreSQL with when each last moved), a total, and the partitions that stalled
    /// (exit code 8).
    Lag(lag::LagArgs),
}

#[derive(Debug, Args)]
struct StatsArgs {
    /// Also show the time buckets, and list each with its estimated keys (the catalog's
    /// estimate, as the last VACUUM or ANALYZE left it: nothing is counted) and size;
    /// with --json, print the buckets alone.
    #[arg(long)]
    buckets: bool,
}

#[derive(Debug, Subcommand)]
enum ScopesAction {
    /// List the scopes (the default): owner, key definition, a declared key change
    /// (`previous_key`) and the last delivery that the previous key answered alone.
    List,
    /// Forget what the database records of a scope (its owner and key definition), once
    /// the old version of its handler has stopped: after a crate renamed, a key field
    /// renamed, or to retire a handler whose keys a new one must not be taken for.
    Release {
        /// The scope.
        scope: String,
    },
}

#[derive(Debug, Subcommand)]
enum MigrateAction {
    /// Apply the pending migrations (the default).
    Run,
    /// List the migrations; exits with 5 when some are pending.
    Status,
}

#[derive(Debug, Subcommand)]
enum KeysAction {
    /// One key, by scope and key id, or by scope and key field values. A key kept by its
    /// fact's time is found the same way, and shows its fact_time.
    Show(KeyArgs),
    /// Keys by scope, status and age, a page at a time (a FACT TIME column when the page
    /// holds keys kept by their fact's time).
    List(ListArgs),
    /// Give failed and parked keys a fresh count of attempts: the next delivery runs the
    /// handler again.
    Retry(ChangeArgs),
    /// Delete failed and parked keys: the next delivery is a first delivery, with any
    /// payload.
    Release(ChangeArgs),
}

#[derive(Debug, Args)]
struct KeyArgs {
    /// The handler's scope.
    #[arg(long)]
    scope: String,
    /// The key id (a UUID).
    #[arg(long, conflicts_with = "field", required_unless_present = "field")]
    key: Option<Uuid>,
    /// A key field value, in the order of the handler's `key = "..."`: `name=value`
    /// (a string) or `name:type=value` (type str, int, bool, uuid, date, time). Repeat for
    /// each field. The `event_time` field is a `time`, to the nanosecond the producer
    /// sent (`occurred_at:time=2026-12-07T03:20:00.123456Z`).
    #[arg(long = "field", value_name = "NAME[:TYPE]=VALUE")]
    field: Vec<String>,
}

#[derive(Debug, Args)]
struct FilterArgs {
    /// Only this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Only this status (processing, success, failed, parked); repeat for several.
    #[arg(long = "status", value_name = "STATUS", value_parser = parse_status)]
    statuses: Vec<idem_runtime::Status>,
    /// Only keys last changed longer ago than this (`90s`, `15m`, `2h`, `7d`).
    #[arg(long, value_name = "AGE", value_parser = parse_duration)]
    older_than: Option<Duration>,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Keys per page.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Start after this cursor (`<scope>/<key>`, printed at the end of the previous page).
    #[arg(long, value_name = "CURSOR")]
    after: Option<String>,
}

#[derive(Debug, Args)]
struct ChangeArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// One key id (with `--scope`).
    #[arg(long, requires = "scope", conflicts_with = "field")]
    key: Option<Uuid>,
    /// One key by its field values (with `--scope`), as for `keys show`.
    #[arg(long = "field", requires = "scope", value_name = "NAME[:TYPE]=VALUE")]
    field: Vec<String>,
    /// Every failed and parked key, when no other selection is given.
    #[arg(long)]
    all: bool,
    /// Show what would change, change nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
struct PurgeArgs {
    /// Delete `success` keys last changed longer ago than this.
    #[arg(long, value_name = "AGE", default_value = "7d", value_parser = parse_duration)]
    older_than: Duration,
    /// A window of its own for a scope: `scope=AGE`; repeat for several.
    #[arg(long, value_name = "SCOPE=AGE")]
    scope_window: Vec<String>,
    /// The most rows one batch deletes.
    #[arg(long, default_value_t = 5_000)]
    batch_size: u32,
    /// The statement timeout of each batch.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    statement_timeout: Duration,
    /// The width of a time bucket made ahead (a minute to a day).
    #[arg(long, value_name = "WIDTH", default_value = "1h", value_parser = parse_duration)]
    bucket_width: Duration,
    /// How far ahead of now time buckets are made: the consumers' future bound
    /// (`Retention::future_bound`), beyond which their facts are refused anyway.
    #[arg(long, value_name = "BOUND", default_value = "1h", value_parser = parse_duration)]
    future_bound: Duration,
    /// Count what would be deleted and list the time buckets that would be made and
    /// dropped; change nothing.
    #[arg(long)]
    dry_run: bool,
}

fn parse_status(text: &str) -> Result<idem_runtime::Status, String> {
    text.parse()
        .map_err(|error: idem_runtime::UnknownStatus| error.to_string())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return parse_failure(error),
    };
    let json = cli.json;
    let secrets = connect::secrets(cli.database_url.as_deref());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idem: error: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let message = connect::redact(&failure.message, &secrets);
            if json {
                let document = serde_json::json!({ "error": message, "kind": failure.kind });
                eprintln!("{document}");
            } else {
                eprintln!("idem: error: {message}");
            }
            ExitCode::from(failure.code)
        }
    }
}

/// An argument the parser refused: with `--json` among the arguments, one JSON object on
/// stderr as for every other error (kind `usage`, exit code 2); help and version, and
/// errors without `--json`, as the parser prints them.
fn parse_failure(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let asked_for_json = std::env::args_os()
        .skip(1)
        .take_while(|arg| arg != "--")
        .any(|arg| arg == "--json");
    let shown = matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if !asked_for_json || shown {
        error.exit();
    }
    let rendered = error.render().to_string();
    // The parser's first paragraph, without its `error: `; its usage line and `--help`
    // hint are for a terminal.
    let message = rendered
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .trim()
        .trim_start_matches("error: ");
    let failure = Failure::usage(message);
    let document = serde_json::json!({ "error": failure.message, "kind": failure.kind });
    eprintln!("{document}");
    ExitCode::from(failure.code)
}

async fn run(cli: Cli) -> Result<(), Failure> {
    // A schema name that is not a plain identifier is refused before connecting.
    idem_runtime::config::Identifier::new(&cli.schema)
        .map_err(|error| Failure::usage(error.to_string()))?;
    let options = connect::options(cli.database_url.as_deref())?;
    let pool = connect::pool(options, cli.database_url.as_deref()).await?;
    let idem = Idem::builder(pool)
        .schema(&cli.schema)
        .pooler(match cli.pooler {
            PoolerArg::Session => idem_runtime::Pooler::Session,
            PoolerArg::Transaction => idem_runtime::Pooler::Transaction,
        })
        .build()
        .map_err(|error| Failure::usage(error.to_string()))?;
    let out = output::Output { json: cli.json };
    match cli.command {
        Command::Migrate { action } => migrate(&idem, &out, action).await,
        Command::Outbox(args) => outbox::run(&idem, &out, args).await,
        Command::Lag(args) => lag::run(&idem, &out, args).await,
        Command::Keys { action } => {
            admin::ensure_migrated(&idem).await?;
            keys(&idem, &out, action).await
        }
        Command::Purge(args) => {
            admin::ensure_migrated(&idem).await?;
            purge(&idem, &out, args).await
        }
        Command::Stats(args) => {
            admin::ensure_migrated(&idem).await?;
            if args.buckets && cli.json {
                out.buckets(&admin::time_buckets(&idem).await?);
                return Ok(());
            }
            out.stats(&admin::stats(&idem).await?, args.buckets);
            Ok(())
        }
        Command::Scopes { action } => {
            admin::ensure_migrated(&idem).await?;
            match action.unwrap_or(ScopesAction::List) {
                ScopesAction::List => out.scopes(&admin::scopes(&idem).await?),
                ScopesAction::Release { scope } => {
                    if !admin::release_scope(&idem, &scope).await? {
                        return Err(Failure::new(
                            6,
                            "unknown_scope",
                            format!(
                                "no scope `{scope}` is recorded in schema `{}`; `idem scopes` lists them",
                                idem.config().schema()
                            ),
                        ));
                    }
                    out.released_scope(&scope);
                }
            }
            Ok(())
        }
    }
}

async fn migrate(
    idem: &Idem,
    out: &output::Output,
    action: Option<MigrateAction>,
) -> Result<(), Failure> {
    match action.unwrap_or(MigrateAction::Run) {
        MigrateAction::Run => {
            let before = admin::migration_status(idem).await?;
            idem.migrate().await.map_err(|error| {
                Failure::new(1, "migrate", format!("migration failed: {error}"))
            })?;
            let applied: Vec<_> = before.into_iter().filter(|m| !m.applied).collect();
            out.migrated(idem.config().schema().as_str(), &applied);
            Ok(())
        }
        MigrateAction::Status => {
            let status = admin::migration_status(idem).await?;
            out.migrations(&status);
            let pending = status.iter().filter(|m| !m.applied).count();
            if pending > 0 {
                return Err(AdminError::NotMigrated {
                    schema: idem.config().schema().to_string(),
                    pending,
                }
                .into());
            }
            Ok(())
        }
    }
}

fn key_of(key: Option<Uuid>, fields: &[String]) -> Result<Option<Uuid>, Failure> {
    if let Some(key) = key {
        return Ok(Some(key));
    }
    if fields.is_empty() {
        return Ok(None);
    }
    let fields = fields
        .iter()
        .map(|field| KeyField::parse(field))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(admin::key_from_fields(&fields)?.as_uuid()))
}

fn filter(args: &FilterArgs) -> KeyFilter {
    let mut filter = KeyFilter::new();
    if let Some(scope) = &args.scope {
        filter = filter.scope(scope);
    }
    for status in &args.statuses {
        filter = filter.status(*status);
    }
    if let Some(age) = args.older_than {
        filter = filter.older_than(age);
    }
    filter
}

async fn keys(idem: &Idem, out: &output::Output, action: KeysAction) -> Result<(), Failure> {
    match action {
        KeysAction::Show(args) => {
            let key = key_of(args.key, &args.field)?
                .ok_or_else(|| Failure::usage("give --key or --field"))?;
            out.key(&admin::show_key(idem, &args.scope, key).await?);
        }
        KeysAction::List(args) => {
            let after = match &args.after {
                Some(text) => Some(Cursor::parse(text).ok_or_else(|| {
                    Failure::usage(format!("--after {text:?}: expected <scope>/<key>"))
                })?),
                None => None,
            };
            let limit = args.limit.max(1);
            let rows = admin::list_keys(idem, &filter(&args.filter), after.as_ref(), limit).await?;
            let next = (rows.len() == limit as usize)
                .then(|| rows.last().map(Cursor::after))
                .flatten();
            out.list(&rows, next.as_ref());
        }
        KeysAction::Retry(args) => {
            let selection = selection(&args)?;
            out.change(
                "retried",
                &admin::retry_keys(idem, &selection, args.dry_run).await?,
            );
        }
        KeysAction::Release(args) => {
            let selection = selection(&args)?;
            out.change(
                "released",
                &admin::release_keys(idem, &selection, args.dry_run).await?,
            );
        }
    }
    Ok(())
}

fn selection(args: &ChangeArgs) -> Result<KeyFilter, Failure> {
    let mut selection = filter(&args.filter);
    if let Some(key) = key_of(args.key, &args.field)? {
        selection = selection.key(key);
    }
    if selection == KeyFilter::new() && !args.all {
        return Err(Failure::usage(
            "select keys with --scope, --key, --field, --status or --older-than, or give --all for every failed and parked key",
        ));
    }
    Ok(selection)
}

async fn purge(idem: &Idem, out: &output::Output, args: PurgeArgs) -> Result<(), Failure> {
    let mut retention = Retention::new(args.older_than)
        .batch_size(args.batch_size)
        .statement_timeout(args.statement_timeout);
    for window in &args.scope_window {
        let (scope, age) = window.rsplit_once('=').ok_or_else(|| {
            Failure::usage(format!("--scope-window {window:?}: expected SCOPE=AGE"))
        })?;
        let age = parse_duration(age).map_err(Failure::usage)?;
        retention = retention.scope_window(scope, age);
    }
    retention = retention
        .bucket_width(args.bucket_width)
        .future_bound(args.future_bound);
    if args.dry_run {
        out.purge_plan(&admin::purge_plan(idem, &retention).await?);
    } else {
        out.purge(&idem.purge_with(&retention).await?);
    }
    Ok(())
}
