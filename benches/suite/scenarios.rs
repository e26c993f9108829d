//! The scenarios: the same business write (one row into `order_effects`) per message,
//! bare, through the article's algorithm written by hand, and through `#[idempotent]`
//! (per message, batched, in lease mode, with and without the Redis cache, next to a busy
//! key, through PgBouncer in transaction pooling).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use idem_demo::orders::{EventType, OrderEvent};
use idem_runtime::key::KeyBuilder;
use idem_runtime::lease::Lease;
use idem_runtime::{Error, Idem, Outcome, idempotent};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

/// The business write of every scenario.
pub(crate) const INSERT_EFFECT: &str =
    "INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3)";

/// The status table of the hand-written article algorithm: what a user following the
/// article writes alone (unique message id, status, timestamps).
pub const CREATE_ARTICLE_MESSAGES: &str = "CREATE TABLE IF NOT EXISTS article_messages (
    msg_id uuid PRIMARY KEY,
    status text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
)";

/// The tables that every cell starts from empty.
pub const TRUNCATE: &str = "TRUNCATE order_effects, article_messages, idem.idem_keys";

/// One benchmark scenario. A scenario processes messages one at a time per worker (its
/// `step`); later scenarios (batches) process several per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(into = "&'static str")]
pub enum Scenario {
    /// `BEGIN; INSERT; COMMIT`: the reference, no idempotency.
    Bare,
    /// The article's algorithm by hand: insert-on-conflict, select for update, business
    /// write, update status, commit.
    Article,
    /// `#[idempotent]` (transactional mode), no stored result.
    Idem,
    /// `#[idempotent]` storing the handler's result (the new row's id) for replay.
    IdemResult,
    /// `#[idempotent]`, every message a duplicate of a key that already succeeded.
    IdemDup,
    /// The hand-written article algorithm, every message a duplicate.
    ArticleDup,
    /// The cheapest SQL with idem's guarantees, by hand with the same client: `BEGIN` with
    /// the lock timeout, the key's insert (`ON CONFLICT DO NOTHING RETURNING`), the
    /// business row, `COMMIT`.
    Lean,
    /// The cheapest correct duplicate by hand: one read of the key's row, no transaction.
    LeanDup,
    /// `#[idempotent(batch = true)]`, batches of 10 new messages.
    Batch10,
    /// `#[idempotent(batch = true)]`, batches of 100 new messages.
    Batch100,
    /// `#[idempotent(batch = true)]`, batches of 500 new messages.
    Batch500,
    /// The reference of batches: `BEGIN; INSERT ... SELECT FROM unnest(...); COMMIT` for
    /// 500 messages, no idempotency.
    BareBatch500,
    /// A batch handler (message parameter `&[&OrderEvent]`), batches of 500 new messages:
    /// the body writes them with one multi-row insert.
    BatchBulk500,
    /// `#[idempotent(mode = "lease")]`, new messages, the body an external call (no write).
    Lease,
    /// Duplicate storm through PostgreSQL only: every message delivered 4 times.
    Storm,
    /// `#[idempotent]` with the Redis cache, new messages (the cache's cost).
    IdemRedis,
    /// `#[idempotent]` with the Redis cache, every message a duplicate already in Redis.
    IdemDupRedis,
    /// Duplicate storm with the Redis cache.
    StormRedis,
    /// Duplicate storm with the cache pointed at a port where nothing listens.
    StormRedisDown,
    /// New messages as in `Idem`, measured while one other key is held by a body that
    /// takes `--busy-secs` (10 s) and `--busy-duplicates` (100) duplicates of that key are
    /// delivered. `busy-key/idem` is the cost of the busy key to the other keys.
    BusyKey,
    /// `Bare` with the business insert not prepared for reuse (`.persistent(false)`), on a
    /// direct connection: the SQL of `pgbouncer-bare` without the pooler in between.
    BareUnprepared,
    /// `Idem` with the handle built for a transaction pooler (`Pooler::Transaction`) and the
    /// handler's insert written with `.persistent(false)`, on a direct connection: the SQL
    /// of `pgbouncer-idem` without the pooler in between.
    IdemUnprepared,
    /// `IdemDup` with the handle built for a transaction pooler, on a direct connection: the
    /// SQL of `pgbouncer-idem-dup` without the pooler in between.
    IdemDupUnprepared,
    /// `BareUnprepared` through PgBouncer in transaction pooling.
    PgbouncerBare,
    /// `IdemUnprepared` through PgBouncer in transaction pooling.
    PgbouncerIdem,
    /// Duplicates of succeeded keys through PgBouncer in transaction pooling, the handle
    /// built with `Pooler::Transaction`.
    PgbouncerIdemDup,
}

/// How many times the storm scenarios deliver each message.
pub const STORM_DELIVERIES: u64 = 4;
/// The storm scenarios deliver a worker's messages in blocks of this many, each block
/// [`STORM_DELIVERIES`] times over, so a redelivery comes after the first one committed.
pub const STORM_BLOCK: u64 = 50;

impl From<Scenario> for &'static str {
    fn from(scenario: Scenario) -> Self {
        scenario.name()
    }
}

impl Scenario {
    pub const ALL: [Scenario; 26] = [
        Scenario::Bare,
        Scenario::Article,
        Scenario::Lean,
        Scenario::Idem,
        Scenario::IdemResult,
        Scenario::IdemDup,
        Scenario::LeanDup,
        Scenario::ArticleDup,
        Scenario::Batch10,
        Scenario::Batch100,
        Scenario::Batch500,
        Scenario::BareBatch500,
        Scenario::BatchBulk500,
        Scenario::Lease,
        Scenario::Storm,
        Scenario::IdemRedis,
        Scenario::IdemDupRedis,
        Scenario::StormRedis,
        Scenario::StormRedisDown,
        Scenario::BusyKey,
        Scenario::BareUnprepared,
        Scenario::IdemUnprepared,
        Scenario::IdemDupUnprepared,
        Scenario::PgbouncerBare,
        Scenario::PgbouncerIdem,
        Scenario::PgbouncerIdemDup,
    ];

    /// The scenarios of the `pooler` run: `bare`, `idem` and `idem-dup` through PgBouncer
    /// in transaction pooling, each next to the same on a direct connection, and the
    /// pooler's SQL on a direct connection (what the hop alone costs).
    pub const POOLER_RUN: [Scenario; 9] = [
        Scenario::Bare,
        Scenario::Idem,
        Scenario::IdemDup,
        Scenario::BareUnprepared,
        Scenario::IdemUnprepared,
        Scenario::IdemDupUnprepared,
        Scenario::PgbouncerBare,
        Scenario::PgbouncerIdem,
        Scenario::PgbouncerIdemDup,
    ];

    /// The scenarios of the default run that this build can run (the Redis ones need the
    /// `redis` feature; the `pooler` run's own ones are picked by name).
    pub fn available() -> Vec<Scenario> {
        Scenario::ALL
            .into_iter()
            .filter(|s| cfg!(feature = "redis") || !s.redis())
            .filter(|s| !s.pooler_run_only())
            .collect()
    }

    /// Part of the `pooler` run only, not of the default run.
    pub fn pooler_run_only(self) -> bool {
        matches!(
            self,
            Scenario::BareUnprepared
                | Scenario::IdemUnprepared
                | Scenario::IdemDupUnprepared
                | Scenario::PgbouncerBare
                | Scenario::PgbouncerIdem
                | Scenario::PgbouncerIdemDup
        )
    }

    /// Connects through PgBouncer in transaction pooling (`IDEM_PGBOUNCER_TRANSACTION_URL`).
    pub fn through_pgbouncer(self) -> bool {
        matches!(
            self,
            Scenario::PgbouncerBare | Scenario::PgbouncerIdem | Scenario::PgbouncerIdemDup
        )
    }

    /// The runtime handle is built with `.pooler(Pooler::Transaction)`.
    pub fn transaction_pooler(self) -> bool {
        matches!(
            self,
            Scenario::IdemUnprepared
                | Scenario::IdemDupUnprepared
                | Scenario::PgbouncerIdem
                | Scenario::PgbouncerIdemDup
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Bare => "bare",
            Scenario::Article => "article",
            Scenario::Idem => "idem",
            Scenario::IdemResult => "idem-result",
            Scenario::IdemDup => "idem-dup",
            Scenario::ArticleDup => "article-dup",
            Scenario::Lean => "lean",
            Scenario::LeanDup => "lean-dup",
            Scenario::Batch10 => "batch-10",
            Scenario::Batch100 => "batch-100",
            Scenario::Batch500 => "batch-500",
            Scenario::BareBatch500 => "bare-batch-500",
            Scenario::BatchBulk500 => "batch-bulk-500",
            Scenario::Lease => "lease",
            Scenario::Storm => "storm",
            Scenario::IdemRedis => "idem-redis",
            Scenario::IdemDupRedis => "idem-dup-redis",
            Scenario::StormRedis => "storm-redis",
            Scenario::StormRedisDown => "storm-redis-down",
            Scenario::BusyKey => "busy-key",
            Scenario::BareUnprepared => "bare-unprepared",
            Scenario::IdemUnprepared => "idem-unprepared",
            Scenario::IdemDupUnprepared => "idem-dup-unprepared",
            Scenario::PgbouncerBare => "pgbouncer-bare",
            Scenario::PgbouncerIdem => "pgbouncer-idem",
            Scenario::PgbouncerIdemDup => "pgbouncer-idem-dup",
        }
    }

    pub fn parse(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Scenario::Bare => "BEGIN; INSERT business row; COMMIT (no idempotency)",
            Scenario::Article => {
                "by hand: BEGIN; INSERT status ON CONFLICT DO NOTHING; SELECT FOR UPDATE; INSERT business row; UPDATE status; COMMIT"
            }
            Scenario::Idem => "#[idempotent(store_result = false)], new message",
            Scenario::IdemResult => "#[idempotent] storing the new row's id, new message",
            Scenario::IdemDup => "#[idempotent], every message a duplicate of a success",
            Scenario::ArticleDup => "by hand (article), every message a duplicate of a success",
            Scenario::Lean => {
                "by hand, the cheapest SQL with the same guarantees: BEGIN; SET LOCAL lock_timeout; INSERT key ON CONFLICT DO NOTHING RETURNING; INSERT business row; COMMIT"
            }
            Scenario::LeanDup => {
                "by hand, the cheapest correct duplicate: one read of the key's row, no transaction"
            }
            Scenario::Batch10 => "#[idempotent(batch = true)], batches of 10 new messages",
            Scenario::Batch100 => "#[idempotent(batch = true)], batches of 100 new messages",
            Scenario::Batch500 => "#[idempotent(batch = true)], batches of 500 new messages",
            Scenario::BareBatch500 => {
                "BEGIN; INSERT 500 business rows FROM unnest(...); COMMIT (no idempotency)"
            }
            Scenario::BatchBulk500 => {
                "#[idempotent] batch handler (events: &[&OrderEvent]), batches of 500 new messages written by one INSERT FROM unnest(...)"
            }
            Scenario::Lease => {
                "#[idempotent(mode = \"lease\")], new message, body an external call (no database write)"
            }
            Scenario::Storm => "#[idempotent], every message delivered 4 times, PostgreSQL only",
            Scenario::IdemRedis => "#[idempotent] with the Redis cache, new message",
            Scenario::IdemDupRedis => {
                "#[idempotent] with the Redis cache, every message a duplicate already in Redis"
            }
            Scenario::StormRedis => {
                "#[idempotent] with the Redis cache, every message delivered 4 times"
            }
            Scenario::StormRedisDown => {
                "#[idempotent] with the cache at a port where nothing listens, every message delivered 4 times"
            }
            Scenario::BusyKey => {
                "#[idempotent], new message, while one other key is held by a slow body and duplicates of it arrive"
            }
            Scenario::BareUnprepared => {
                "bare with the business insert .persistent(false), direct connection"
            }
            Scenario::IdemUnprepared => {
                "#[idempotent], new message, Pooler::Transaction and the body's insert .persistent(false), direct connection"
            }
            Scenario::IdemDupUnprepared => {
                "#[idempotent], Pooler::Transaction, every message a duplicate of a success, direct connection"
            }
            Scenario::PgbouncerBare => {
                "bare with the business insert .persistent(false), through PgBouncer (pool_mode = transaction)"
            }
            Scenario::PgbouncerIdem => {
                "#[idempotent], new message, Pooler::Transaction and the body's insert .persistent(false), through PgBouncer (pool_mode = transaction)"
            }
            Scenario::PgbouncerIdemDup => {
                "#[idempotent], Pooler::Transaction, every message a duplicate of a success, through PgBouncer (pool_mode = transaction)"
            }
        }
    }

    /// Every message of the scenario was already processed before the cell starts.
    pub fn duplicates(self) -> bool {
        matches!(
            self,
            Scenario::IdemDup
                | Scenario::ArticleDup
                | Scenario::LeanDup
                | Scenario::IdemDupRedis
                | Scenario::IdemDupUnprepared
                | Scenario::PgbouncerIdemDup
        )
    }

    /// Messages per step.
    pub fn batch_size(self) -> usize {
        match self {
            Scenario::Batch10 => 10,
            Scenario::Batch100 => 100,
            Scenario::Batch500 | Scenario::BareBatch500 | Scenario::BatchBulk500 => 500,
            _ => 1,
        }
    }

    /// The runtime handle of the scenario has a Redis cache.
    pub fn redis(self) -> bool {
        matches!(
            self,
            Scenario::IdemRedis
                | Scenario::IdemDupRedis
                | Scenario::StormRedis
                | Scenario::StormRedisDown
        )
    }

    /// Connections of the cell's pool beyond one per worker: a `busy-key` cell's slow body
    /// holds one of its own, so that the workers have as many as in an `idem` cell.
    pub fn extra_connections(self) -> usize {
        match self {
            Scenario::BusyKey => 1,
            _ => 0,
        }
    }

    /// Has a round-trip probe: not `busy-key`, whose messages are `idem`'s (the busy key
    /// needs a connection besides the probe's one).
    pub fn probed(self) -> bool {
        self != Scenario::BusyKey
    }

    /// Runs with `synchronous_commit=on` only (the setting's effect is measured on the
    /// per-message scenarios).
    pub fn sync_on_only(self) -> bool {
        !matches!(
            self,
            Scenario::Bare
                | Scenario::Article
                | Scenario::Lean
                | Scenario::Idem
                | Scenario::IdemResult
        )
    }
}

#[idempotent(
    key = "order_id, event_type",
    scope = "bench_apply",
    shared_scope = true,
    store_result = false
)]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    insert_effect(&mut *tx, event).await?;
    Ok(())
}

/// The same handler as `apply`, with the batch variant `apply_batched_batch`.
#[idempotent(
    key = "order_id, event_type",
    scope = "bench_apply",
    shared_scope = true,
    store_result = false,
    batch = true
)]
pub(crate) async fn apply_batched(
    tx: &mut PgConnection,
    event: &OrderEvent,
) -> Result<(), sqlx::Error> {
    insert_effect(&mut *tx, event).await?;
    Ok(())
}

/// A batch handler over the same key and scope: the body writes all new messages of a
/// batch with one statement, as [`bare_batch`] does.
#[idempotent(
    key = "order_id, event_type",
    scope = "bench_apply",
    shared_scope = true
)]
pub(crate) async fn apply_bulk(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
) -> Result<(), sqlx::Error> {
    insert_batch(tx, events.iter().copied()).await
}

/// Lease mode: the body stands for a call to an external system.
#[idempotent(
    key = "order_id, event_type",
    scope = "bench_lease",
    mode = "lease",
    lease = "30s",
    store_result = false
)]
async fn notify(lease: &Lease, event: &OrderEvent) -> Result<(), std::io::Error> {
    std::hint::black_box((lease.token(), &event.order_id));
    Ok(())
}

/// What the body of the busy key does in the running `busy-key` cell: how long it holds
/// the key, and whom it tells when it starts. Taken by the first body run; a second run of
/// the body (a duplicate that was executed) finds nothing and returns at once.
static BUSY_BODY: Mutex<Option<(Duration, oneshot::Sender<Instant>)>> = Mutex::new(None);

/// The busy key's handler: the business write, then the key (and its transaction and
/// connection) held as long as the cell asked.
#[idempotent(
    key = "order_id, event_type",
    scope = "bench_busy",
    store_result = false
)]
async fn hold(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    insert_effect(&mut *tx, event).await?;
    let armed = BUSY_BODY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some((held, started)) = armed {
        let _ = started.send(Instant::now());
        tokio::time::sleep(held).await;
    }
    Ok(())
}

/// `apply` as the README advises behind a transaction pooler: the body's insert is not
/// prepared for reuse (`.persistent(false)`), so that sqlx caches no statement that idem
/// would have to close before the transaction ends (a round trip per message).
#[idempotent(
    key = "order_id, event_type",
    scope = "bench_apply",
    shared_scope = true,
    store_result = false
)]
async fn apply_unprepared(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    insert_effect_unprepared(&mut *tx, event).await?;
    Ok(())
}

#[idempotent(key = "order_id, event_type", scope = "bench_apply_result")]
async fn apply_with_result(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(&event.order_id)
    .bind("paid")
    .bind(event.amount_cents)
    .fetch_one(&mut *tx)
    .await
}

async fn bare(pool: &PgPool, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    insert_effect(&mut tx, event).await?;
    tx.commit().await
}

/// The bare transaction with the business insert not prepared for reuse. Through PgBouncer
/// 1.18 in transaction pooling, sqlx's default (a named statement, prepared once per
/// connection and cached) cannot be used: the next transaction of the same client
/// connection may run on another server connection, where the statement is missing
/// (26000) or is another client's of the same name (42P05). PgBouncer 1.21 and later can
/// track named statements (`max_prepared_statements`); the bench's 1.18 cannot.
async fn bare_unprepared(pool: &PgPool, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    insert_effect_unprepared(&mut tx, event).await?;
    tx.commit().await
}

/// The business write of the per-message scenarios as an unnamed statement: parsed and
/// described in one round trip, bound and executed in a second one.
async fn insert_effect_unprepared(
    conn: &mut PgConnection,
    event: &OrderEvent,
) -> Result<(), sqlx::Error> {
    sqlx::query(INSERT_EFFECT)
        .bind(&event.order_id)
        .bind("paid")
        .bind(event.amount_cents)
        .persistent(false)
        .execute(conn)
        .await?;
    Ok(())
}

/// The business write of the per-message scenarios: one row.
async fn insert_effect(conn: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    sqlx::query(INSERT_EFFECT)
        .bind(&event.order_id)
        .bind("paid")
        .bind(event.amount_cents)
        .execute(conn)
        .await?;
    Ok(())
}

/// The bare batch: one transaction, one multi-row insert, one commit.
async fn bare_batch(pool: &PgPool, events: &[OrderEvent]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    insert_batch(&mut tx, events).await?;
    tx.commit().await
}

/// The business write of the batch scenarios: one row per event, one statement.
async fn insert_batch<'e>(
    conn: &mut PgConnection,
    events: impl IntoIterator<Item = &'e OrderEvent>,
) -> Result<(), sqlx::Error> {
    let events: Vec<&OrderEvent> = events.into_iter().collect();
    let ids: Vec<&str> = events.iter().map(|e| e.order_id.as_str()).collect();
    let types: Vec<&str> = events.iter().map(|_| "paid").collect();
    let amounts: Vec<i64> = events.iter().map(|e| e.amount_cents).collect();
    sqlx::query(
        "INSERT INTO order_effects (order_id, event_type, amount_cents) \
         SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
    )
    .bind(&ids)
    .bind(&types)
    .bind(&amounts)
    .execute(conn)
    .await?;
    Ok(())
}

/// The key of `event` in the hand-written scenarios' tables, as idem derives it.
fn key_of(event: &OrderEvent) -> Result<uuid::Uuid, String> {
    Ok(KeyBuilder::new()
        .part("order_id", &event.order_id)
        .and_then(|k| k.part("event_type", &event.event_type))
        .map_err(|e| e.to_string())?
        .finish()
        .as_uuid())
}

/// The cheapest SQL with idem's guarantees, written by hand with the same client: the
/// key's row and the business row in one transaction whose lock waits are bounded.
/// Returns whether the body ran.
async fn lean(pool: &PgPool, event: &OrderEvent) -> Result<bool, String> {
    let key = key_of(event)?;
    let run = async {
        let mut tx = pool
            .begin_with("BEGIN; SET LOCAL lock_timeout = '5000ms'")
            .await?;
        let won: Option<bool> = sqlx::query_scalar(
            "INSERT INTO idem.idem_keys (scope, key, status, attempts) \
             VALUES ('bench_lean', $1, 'success', 1) \
             ON CONFLICT (scope, key) DO NOTHING RETURNING true",
        )
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        if won.is_none() {
            return Ok(false);
        }
        insert_effect(&mut tx, event).await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(true)
    };
    run.await.map_err(|e| e.to_string())
}

/// The cheapest correct duplicate, by hand: the key's row, read outside a transaction.
/// Returns whether the key was new.
async fn lean_duplicate(pool: &PgPool, event: &OrderEvent) -> Result<bool, String> {
    let key = key_of(event)?;
    let status: Option<String> = sqlx::query_scalar(
        "SELECT status FROM (SELECT status, attempts, fingerprint, result, last_error \
         FROM idem.idem_keys WHERE scope = 'bench_lean' AND key = $1) AS k",
    )
    .bind(key)
    .fetch_optional(pool)
    .await
    .map_err(|e| e.to_string())?;
    Ok(status.as_deref() != Some("success"))
}

/// The article's algorithm the obvious way. Returns whether the body ran.
async fn article(pool: &PgPool, event: &OrderEvent) -> Result<bool, String> {
    let key = key_of(event)?;
    let run = async {
        let mut tx = pool.begin().await?;
        sqlx::query(
            "INSERT INTO article_messages (msg_id, status) VALUES ($1, 'processing') \
             ON CONFLICT (msg_id) DO NOTHING",
        )
        .bind(key)
        .execute(&mut *tx)
        .await?;
        let status: String =
            sqlx::query_scalar("SELECT status FROM article_messages WHERE msg_id = $1 FOR UPDATE")
                .bind(key)
                .fetch_one(&mut *tx)
                .await?;
        if status == "success" {
            tx.commit().await?;
            return Ok(false);
        }
        insert_effect(&mut tx, event).await?;
        sqlx::query(
            "UPDATE article_messages SET status = 'success', updated_at = now() WHERE msg_id = $1",
        )
        .bind(key)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(true)
    };
    run.await.map_err(|e| e.to_string())
}

pub(crate) fn event(order_id: String) -> OrderEvent {
    OrderEvent {
        order_id,
        event_type: EventType::Paid,
        amount_cents: 1250,
        occurred_at: chrono::DateTime::UNIX_EPOCH,
        event_key: None,
    }
}

fn duplicate_id(index: usize) -> String {
    format!("dup-{index}")
}

/// Everything a cell's workers share.
pub struct Cell {
    pub scenario: Scenario,
    pub pool: PgPool,
    pub idem: Idem,
    /// Distinguishes the messages of this cell from every other cell's.
    pub tag: String,
    pub concurrency: usize,
    /// The number of already processed messages that duplicate scenarios cycle through.
    pub duplicate_keys: usize,
}

impl Cell {
    /// Processes the messages of one step of `worker`; returns how many.
    pub async fn step(&self, worker: usize, iteration: u64) -> Result<u64, String> {
        let message = || {
            if self.scenario.duplicates() {
                let spread = iteration as usize * self.concurrency + worker;
                event(duplicate_id(spread % self.duplicate_keys))
            } else {
                event(format!("{}-{worker}-{iteration}", self.tag))
            }
        };
        let batch = |size: usize| -> Vec<OrderEvent> {
            (0..size)
                .map(|i| event(format!("{}-{worker}-{iteration}-{i}", self.tag)))
                .collect()
        };
        let event = message();
        match self.scenario {
            Scenario::Batch10 | Scenario::Batch100 | Scenario::Batch500 => {
                let events = batch(self.scenario.batch_size());
                for outcome in apply_batched_batch(&self.idem, &events).await {
                    let outcome = outcome.map_err(|e| e.to_string())?;
                    expect(matches!(outcome, Outcome::Executed(_)), true)?;
                }
                return Ok(events.len() as u64);
            }
            Scenario::BatchBulk500 => {
                let events = batch(self.scenario.batch_size());
                for outcome in apply_bulk(&self.idem, &events).await {
                    let outcome = outcome.map_err(|e| e.to_string())?;
                    expect(matches!(outcome, Outcome::Executed(())), true)?;
                }
                return Ok(events.len() as u64);
            }
            Scenario::BareBatch500 => {
                let events = batch(self.scenario.batch_size());
                bare_batch(&self.pool, &events)
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(events.len() as u64);
            }
            Scenario::Lease => {
                let outcome = notify(&self.idem, &event)
                    .await
                    .map_err(|e| e.to_string())?;
                expect(matches!(outcome, Outcome::Executed(_)), true)?;
            }
            Scenario::Storm | Scenario::StormRedis | Scenario::StormRedisDown => {
                // Blocks of STORM_BLOCK messages, each block delivered STORM_DELIVERIES
                // times over: the first pass is new, the others duplicates.
                let round = STORM_BLOCK * STORM_DELIVERIES;
                let (block, within) = (iteration / round, iteration % round);
                let index = block * STORM_BLOCK + within % STORM_BLOCK;
                let storm = self::event(format!("{}-{worker}-s{index}", self.tag));
                let outcome = apply(&self.idem, &storm).await.map_err(|e| e.to_string())?;
                expect(
                    matches!(outcome, Outcome::Executed(_)),
                    within < STORM_BLOCK,
                )?;
            }
            Scenario::IdemRedis | Scenario::IdemDupRedis => {
                let outcome = apply(&self.idem, &event).await.map_err(|e| e.to_string())?;
                expect(
                    matches!(outcome, Outcome::Executed(_)),
                    self.scenario == Scenario::IdemRedis,
                )?;
            }
            Scenario::Bare => bare(&self.pool, &event).await.map_err(|e| e.to_string())?,
            Scenario::BareUnprepared | Scenario::PgbouncerBare => {
                bare_unprepared(&self.pool, &event)
                    .await
                    .map_err(|e| e.to_string())?
            }
            Scenario::IdemUnprepared
            | Scenario::IdemDupUnprepared
            | Scenario::PgbouncerIdem
            | Scenario::PgbouncerIdemDup => {
                let outcome = apply_unprepared(&self.idem, &event)
                    .await
                    .map_err(|e| e.to_string())?;
                expect(
                    matches!(outcome, Outcome::Executed(_)),
                    !self.scenario.duplicates(),
                )?;
            }
            Scenario::Article => expect(article(&self.pool, &event).await?, true)?,
            Scenario::ArticleDup => expect(article(&self.pool, &event).await?, false)?,
            Scenario::Lean => expect(lean(&self.pool, &event).await?, true)?,
            Scenario::LeanDup => expect(lean_duplicate(&self.pool, &event).await?, false)?,
            Scenario::Idem | Scenario::IdemDup | Scenario::BusyKey => {
                let outcome = apply(&self.idem, &event).await.map_err(|e| e.to_string())?;
                expect(
                    matches!(outcome, Outcome::Executed(_)),
                    self.scenario != Scenario::IdemDup,
                )?;
            }
            Scenario::IdemResult => {
                let outcome = apply_with_result(&self.idem, &event)
                    .await
                    .map_err(|e| e.to_string())?;
                expect(matches!(outcome, Outcome::Executed(_)), true)?;
            }
        }
        Ok(1)
    }
}

/// The busy key of a `busy-key` cell: its first delivery, whose body holds the key, and
/// the duplicates of it delivered while the body runs.
pub struct Busy {
    /// When the body started to hold the key.
    pub started: Instant,
    /// When the body lets go of it.
    pub until: Instant,
    duplicates: usize,
    tasks: JoinSet<Result<Delivery, String>>,
}

/// How one delivery of the busy key ended.
enum Delivery {
    /// The first delivery ran the body.
    Executed,
    /// A duplicate was answered `Duplicate`, after `in_progress` answers `InProgress`
    /// (each delivered again).
    Duplicate { in_progress: u64 },
}

/// What the busy key's deliveries did in one round of a `busy-key` cell.
#[derive(Debug, Clone, Serialize)]
pub struct BusyRound {
    /// Seconds the body held the key.
    pub held_secs: f64,
    /// Seconds the other keys were measured, all of them while the key was held.
    pub measured_secs: f64,
    /// Duplicates delivered while the body ran.
    pub duplicates: usize,
    /// `InProgress` answers to them (the key's turn not free within the lock timeout),
    /// each followed by a new delivery.
    pub in_progress_answers: u64,
    /// Duplicates answered `Duplicate` once the body had committed.
    pub duplicate_answers: u64,
    /// Seconds from the body's start until the last delivery was answered.
    pub settled_secs: f64,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

impl Busy {
    /// Waits for every delivery of the busy key; `measured_secs` is what the cell measured
    /// meanwhile.
    pub async fn finish(mut self, measured_secs: f64) -> BusyRound {
        let mut round = BusyRound {
            held_secs: 0.0,
            measured_secs,
            duplicates: self.duplicates,
            in_progress_answers: 0,
            duplicate_answers: 0,
            settled_secs: 0.0,
            errors: 0,
            first_error: None,
        };
        let mut executed = 0;
        while let Some(joined) = self.tasks.join_next().await {
            match joined {
                Ok(Ok(Delivery::Executed)) => {
                    executed += 1;
                    round.held_secs = self.started.elapsed().as_secs_f64();
                }
                Ok(Ok(Delivery::Duplicate { in_progress })) => {
                    round.duplicate_answers += 1;
                    round.in_progress_answers += in_progress;
                }
                Ok(Err(error)) => {
                    round.errors += 1;
                    round.first_error.get_or_insert(error);
                }
                Err(panicked) => {
                    round.errors += 1;
                    round.first_error.get_or_insert(panicked.to_string());
                }
            }
        }
        round.settled_secs = self.started.elapsed().as_secs_f64();
        if executed != 1 {
            round.errors += 1;
            round
                .first_error
                .get_or_insert(format!("the busy key's body ran {executed} times"));
        }
        round
    }
}

impl Cell {
    /// Delivers the busy key, whose body holds it for `held`, and once the body runs,
    /// `duplicates` duplicates of it at once; each duplicate answered `InProgress` is
    /// delivered again after a short pause, as a consumer would.
    pub async fn start_busy(&self, held: Duration, duplicates: usize) -> Result<Busy, String> {
        let (started_tx, started_rx) = oneshot::channel();
        *BUSY_BODY.lock().unwrap_or_else(PoisonError::into_inner) = Some((held, started_tx));
        let busy = event(format!("{}-busy", self.tag));
        let mut tasks = JoinSet::new();
        {
            let (idem, busy) = (self.idem.clone(), busy.clone());
            tasks.spawn(async move {
                match hold(&idem, &busy).await {
                    Ok(Outcome::Executed(())) => Ok(Delivery::Executed),
                    Ok(_) => Err("the busy key's first delivery was taken for a duplicate".into()),
                    Err(error) => Err(format!("the busy key's first delivery: {error}")),
                }
            });
        }
        let started = tokio::select! {
            biased;
            started = started_rx => started.map_err(|_| "its body did not start".to_string()),
            ended = tasks.join_next() => Err(match ended {
                Some(Ok(Err(error))) => error,
                _ => "its first delivery ended before its body started".into(),
            }),
            () = tokio::time::sleep(Duration::from_secs(60)) => {
                Err("its body did not start within 60 s".into())
            }
        };
        let started = match started {
            Ok(started) => started,
            Err(why) => {
                BUSY_BODY
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                tasks.abort_all();
                return Err(format!("busy key: {why}"));
            }
        };
        let until = started + held;
        // A duplicate still unanswered this long after the body ended is an error.
        let give_up = until + Duration::from_secs(60);
        for _ in 0..duplicates {
            let (idem, busy) = (self.idem.clone(), busy.clone());
            tasks.spawn(async move {
                let mut in_progress = 0;
                loop {
                    match hold(&idem, &busy).await {
                        Ok(Outcome::Duplicate(_)) => {
                            return Ok(Delivery::Duplicate { in_progress });
                        }
                        Ok(_) => {
                            return Err("a duplicate of the busy key ran its body again".into());
                        }
                        Err(Error::InProgress { .. }) if Instant::now() < give_up => {
                            in_progress += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(error) => return Err(format!("a duplicate of the busy key: {error}")),
                    }
                }
            });
        }
        Ok(Busy {
            started,
            until,
            duplicates,
            tasks,
        })
    }
}

/// Processes `keys` messages that `scenario` (a duplicate scenario) then receives again,
/// `parallel` at a time.
pub async fn populate(
    scenario: Scenario,
    pool: &PgPool,
    idem: &Idem,
    keys: usize,
    parallel: usize,
) -> Result<(), String> {
    let results: Vec<Result<(), String>> =
        futures::stream::iter((0..keys).map(|index| async move {
            let event = event(duplicate_id(index));
            match scenario {
                Scenario::IdemDup | Scenario::IdemDupRedis => apply(idem, &event)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Scenario::IdemDupUnprepared | Scenario::PgbouncerIdemDup => {
                    apply_unprepared(idem, &event)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
                Scenario::LeanDup => lean(pool, &event).await.map(|_| ()),
                _ => article(pool, &event).await.map(|_| ()),
            }
        }))
        .buffer_unordered(parallel)
        .collect()
        .await;
    results.into_iter().collect()
}

fn expect(executed: bool, wanted: bool) -> Result<(), String> {
    match (executed, wanted) {
        (true, true) | (false, false) => Ok(()),
        (false, true) => Err("a new message was taken for a duplicate".into()),
        (true, false) => Err("a duplicate ran the body again".into()),
    }
}
