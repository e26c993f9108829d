//! The statements of a delivery in transaction mode: the claim and the takeover of a
//! key, the commit, a failure recorded, and the reads of a key's row.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::sql::Value;
use super::timed::FactWindow;
use super::{Existing, KeyRecord, Statements, attempts_value, existing, failure_recorded};

/// What a claim statement is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimedKey<'a> {
    pub scope: &'a str,
    pub key: Uuid,
    pub fingerprint: Option<&'a [u8]>,
    /// The lock timeout the body runs with: the session's own.
    pub body_lock_timeout: &'a str,
    /// Where the key is kept by its fact's time: the time and its window.
    pub time: Option<FactWindow>,
    /// Whether the claim reads the row in its way in the same statement (duplicates are
    /// not rare in the scope), or inserts alone.
    pub read_in_the_way: bool,
}

/// A key's row: its scope, its key, and its fact's time where the key is kept by it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyAt<'a> {
    pub scope: &'a str,
    pub key: Uuid,
    pub fact_time: Option<DateTime<Utc>>,
}

/// What the claim statement found.
#[derive(Debug)]
pub(crate) enum Claim {
    /// This transaction inserted the key, or took over a `failed` one; `xid` is the
    /// transaction's id, which the commit checks.
    Won { xid: i64 },
    /// No row back: the claim's insert ran into a row (the takeover statement reads it),
    /// or the takeover found nothing in its snapshot (the row in the way was committed or
    /// deleted while the statement waited). Claim again.
    Again,
    /// The key exists and is not ours: succeeded, parked, held by a lease, or recorded
    /// with another payload fingerprint.
    Existing(Existing),
    /// A key kept by its fact's time: the fact is outside its window, and no final row
    /// of it is left to answer it.
    Outside,
}

/// The columns of a claim's answer: the transaction id when the key was won, the row in
/// the way otherwise.
pub(super) const CLAIM_COLUMNS: &str = "xid, NULL::text AS status, NULL::integer AS attempts, \
     NULL::bytea AS fingerprint, NULL::json AS result, NULL::text AS last_error";

/// The SQL of a delivery in transaction mode, for one status table.
#[derive(Debug)]
pub(super) struct Sql {
    /// The commit's check: fails in an aborted transaction (SQLSTATE 25P02) and outside a
    /// transaction block (25P01), and needs neither a plan nor a snapshot.
    check: String,
    commit_only: String,
    claim: String,
    claim_reading: String,
    takeover: String,
    read: String,
    record_failure: String,
    park_committed: String,
    record: String,
    done: String,
    reset: String,
}

impl Sql {
    // Some 80 lines: one field per statement of a delivery, each next to the comment that
    // says why it is written so; nothing here branches, and the statements read best side
    // by side.
    pub(super) fn new(table: &str, timed: &str) -> Self {
        // The row in the way, read in the same statement when nothing was written.
        let in_the_way = |written: &str| {
            format!(
                "SELECT {CLAIM_COLUMNS} FROM {written} \
                 UNION ALL \
                 SELECT NULL, k.status, k.attempts, k.fingerprint, k.result, k.last_error \
                 FROM {table} AS k \
                 WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS (SELECT FROM {written})"
            )
        };
        // `SAVEPOINT` is refused outside a transaction block, even in the implicit one of a
        // multi-statement query, like every statement in an aborted transaction. Opening
        // it costs no plan, no snapshot and no write; `COMMIT` ends it with the rest.
        let check = "SAVEPOINT idem_commit_check".to_owned();
        let insert = format!(
            "INSERT INTO {table} AS k (scope, key, status, attempts, fingerprint) \
             VALUES ($1, $2, 'success', 1, $3) \
             ON CONFLICT (scope, key) DO NOTHING"
        );
        let returning = "RETURNING pg_current_xact_id()::text::bigint AS xid, \
                         set_config('lock_timeout', $4, true) AS restored";
        Sql {
            commit_only: format!("{check}; COMMIT"),
            check,
            // The common case, a new key, is one insert. No row back: a row is in the way
            // (or was committed while this statement waited behind it), which the
            // takeover statement then reads.
            claim: format!("{insert} {returning}"),
            // Where duplicates are not rare: a duplicate is answered by the claim, which
            // reads the row in the way with its snapshot. No row back: that row was
            // committed while the statement waited behind it (its snapshot is older).
            claim_reading: format!(
                "WITH inserted AS ({insert} {returning}) {}",
                in_the_way("inserted")
            ),
            // A `failed` key with the same payload is taken over under its row lock; a
            // fingerprint first given now is recorded.
            takeover: format!(
                "WITH claimed AS ( \
                    UPDATE {table} AS k \
                    SET status = 'success', attempts = k.attempts + 1, updated_at = now(), \
                        fingerprint = coalesce(k.fingerprint, $3) \
                    WHERE k.scope = $1 AND k.key = $2 AND k.status = 'failed' \
                      AND ($3::bytea IS NULL OR k.fingerprint IS NULL OR k.fingerprint = $3) \
                    RETURNING pg_current_xact_id()::text::bigint AS xid, \
                              set_config('lock_timeout', $4, true) AS restored) {}",
                in_the_way("claimed")
            ),
            // The key's row alone, read outside a transaction: answers a duplicate
            // without the claim's transaction (see `duplicate_rate`).
            read: format!(
                "SELECT status, attempts, fingerprint, result, last_error \
                 FROM {table} WHERE scope = $1 AND key = $2"
            ),
            // After the handler's transaction rolled back. Never overwrites a success (or a
            // parked key) that another delivery wrote meanwhile.
            record_failure: format!(
                "INSERT INTO {table} AS k (scope, key, status, attempts, fingerprint, last_error) \
                 VALUES ($1, $2, CASE WHEN $5 <= 1 THEN 'parked' ELSE 'failed' END, 1, $3, $4) \
                 ON CONFLICT (scope, key) DO UPDATE \
                 SET attempts = k.attempts + 1, \
                     status = CASE WHEN k.attempts + 1 >= $5 THEN 'parked' ELSE 'failed' END, \
                     last_error = EXCLUDED.last_error, updated_at = now(), \
                     fingerprint = coalesce(k.fingerprint, EXCLUDED.fingerprint) \
                 WHERE k.status = 'failed' \
                 RETURNING attempts, status"
            ),
            // A row that the transaction `$3` committed itself (its body ran `COMMIT`).
            park_committed: format!(
                "UPDATE {table} SET status = 'parked', last_error = $4, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND xmin = xid($3::text::xid8)"
            ),
            // By scope and key alone: in the status table, or in any bucket of the timed
            // table (a scope's keys are in one of the two).
            record: format!(
                "SELECT scope, key, status, attempts, last_error, result, fingerprint, created_at, \
                 updated_at FROM {table} WHERE scope = $1 AND key = $2 \
                 UNION ALL \
                 SELECT scope, key, status, attempts, last_error, result, fingerprint, created_at, \
                 updated_at FROM {timed} WHERE scope = $1 AND key = $2 \
                 LIMIT 1"
            ),
            // Which of a list of keys succeeded with the given fingerprint, in list order.
            // One probe of the primary key per listed key: a join would let the planner
            // hash the scope's whole key set (its generic plan knows neither the list's
            // length nor the scope's size), reading every key of the scope per call.
            done: format!(
                "SELECT coalesce(( \
                    SELECT k.status = 'success' AND (k.fingerprint IS NULL OR l.fingerprint IS NULL \
                           OR k.fingerprint = l.fingerprint) \
                    FROM {table} AS k WHERE k.scope = $1 AND k.key = l.key), false) AS done \
                 FROM unnest($2::uuid[], $3::bytea[]) WITH ORDINALITY AS l(key, fingerprint, position) \
                 ORDER BY l.position"
            ),
            reset: format!(
                "WITH plain AS ( \
                    UPDATE {table} SET status = 'failed', attempts = 0, updated_at = now() \
                    WHERE scope = $1 AND key = $2 AND status IN ('failed', 'parked') RETURNING 1), \
                 timed AS ( \
                    UPDATE {timed} SET status = 'failed', attempts = 0, updated_at = now() \
                    WHERE scope = $1 AND key = $2 AND status IN ('failed', 'parked') RETURNING 1) \
                 SELECT (SELECT count(*) FROM plain) + (SELECT count(*) FROM timed) AS reset"
            ),
        }
    }
}

/// Statements ending each with `; `, to precede `COMMIT` in one simple query, after the
/// lock timeout of `lock_timeout` (idem's, which bounds their waits as it bounds every
/// wait idem causes: the body ran with the session's own); nothing when there are none.
fn joined(lock_timeout: &str, statements: &[String]) -> String {
    if statements.is_empty() {
        return String::new();
    }
    statements.iter().fold(
        format!("SET LOCAL lock_timeout = '{lock_timeout}'; "),
        |mut text, statement| {
            text.push_str(statement.trim_end().trim_end_matches(';'));
            text.push_str("; ");
            text
        },
    )
}

impl Statements {
    /// Claims `key` in the caller's transaction: inserts it, or answers [`Claim::Again`]
    /// when a row is in the way, unless the claim reads that row in the same statement
    /// ([`ClaimedKey::read_in_the_way`]; [`Claim::Again`] then when the row is not in the
    /// statement's snapshot). A claim that wins sets the lock timeout to
    /// `body_lock_timeout` for the body.
    pub(crate) async fn claim(
        &self,
        conn: &mut PgConnection,
        key: ClaimedKey<'_>,
    ) -> Result<Claim, sqlx::Error> {
        let statement = match (key.time, key.read_in_the_way) {
            (Some(_), false) => &self.timed.claim,
            (Some(_), true) => &self.timed.claim_reading,
            (None, false) => &self.delivery.claim,
            (None, true) => &self.delivery.claim_reading,
        };
        self.claim_with(statement, conn, key).await
    }

    /// Takes over a `failed` key with a matching payload, or reads the row in the way
    /// with a new snapshot.
    pub(crate) async fn takeover(
        &self,
        conn: &mut PgConnection,
        key: ClaimedKey<'_>,
    ) -> Result<Claim, sqlx::Error> {
        let statement = match key.time {
            Some(_) => &self.timed.takeover,
            None => &self.delivery.takeover,
        };
        self.claim_with(statement, conn, key).await
    }

    async fn claim_with(
        &self,
        statement: &str,
        conn: &mut PgConnection,
        key: ClaimedKey<'_>,
    ) -> Result<Claim, sqlx::Error> {
        // A fixed array, no allocation on the claim's path: the timed statements take
        // the fact's time and window as `$5` to `$7`.
        let (at, window_ms, ahead_ms) = key.time.map_or((None, 0, 0), |time| {
            (Some(time), time.window_ms, time.ahead_ms)
        });
        let values = [
            key.scope.into(),
            key.key.into(),
            key.fingerprint.into(),
            key.body_lock_timeout.into(),
            at.map_or(Value::Int8(None), |time| Value::from(time.at)),
            Value::from(window_ms),
            Value::from(ahead_ms),
        ];
        let values = if key.time.is_some() {
            &values[..]
        } else {
            &values[..4]
        };
        let row = self.query(statement, values).fetch_optional(conn).await?;
        let Some(row) = row else {
            return Ok(Claim::Again);
        };
        if let Some(xid) = row.try_get::<Option<i64>, _>("xid")? {
            return Ok(Claim::Won { xid });
        }
        if key.time.is_none() {
            return existing(&row).map(Claim::Existing);
        }
        // A timed key: a row saying only that the fact is outside its window, or the row
        // in the way; a `failed` one outside the window is not run again either.
        let in_window: bool = row.try_get("in_window")?;
        if row.try_get::<Option<&str>, _>("status")?.is_none() {
            return Ok(Claim::Outside);
        }
        let found = existing(&row)?;
        if !in_window && found.status == super::Status::Failed {
            return Ok(Claim::Outside);
        }
        Ok(Claim::Existing(found))
    }

    /// The key's row, if any, read on its own (one statement, no transaction block).
    pub(crate) async fn read(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        fact_time: Option<DateTime<Utc>>,
    ) -> Result<Option<Existing>, sqlx::Error> {
        let row = match fact_time {
            Some(at) => self.read_timed(conn, scope, key, at).await?,
            None => {
                self.query(&self.delivery.read, &[scope.into(), key.into()])
                    .fetch_optional(conn)
                    .await?
            }
        };
        row.as_ref().map(existing).transpose()
    }

    /// The statements that end a won claim's transaction, in one simple query: a check
    /// that fails unless the claim's transaction is still open and not aborted (a body that
    /// swallowed a failed statement, or ran `COMMIT` or `ROLLBACK` itself), the `UPDATE`
    /// storing `result` where there is one, and `COMMIT`.
    ///
    /// The result's values are inlined hex-encoded, so that no value can be read as SQL.
    /// The result is stored with `previous` too, the key under the previous definition
    /// that the transaction claimed, with its fact's time where it is kept by it (in the
    /// status table otherwise, as when a handler moved its keys into the time buckets).
    /// `at_commit` are the statements that the body left for its commit
    /// ([`CurrentDelivery::at_commit`](crate::CurrentDelivery::at_commit)), sent after the
    /// check and before `COMMIT`, under idem's lock timeout.
    pub(crate) fn commit(
        &self,
        scope: &str,
        key: Uuid,
        previous: Option<(Uuid, Option<DateTime<Utc>>)>,
        fact_time: Option<DateTime<Utc>>,
        result: Option<&serde_json::Value>,
        at_commit: &[String],
    ) -> std::borrow::Cow<'_, str> {
        let Some(result) = result else {
            return self.commit_only(at_commit);
        };
        let result = hex::encode(result.to_string());
        let scope = hex::encode(scope);
        // One `UPDATE` per table the keys are in: one where both are in the same.
        let update = |keys: String, fact_time: Option<DateTime<Utc>>| {
            // A timed key's row is in its fact's bucket: digits and `-:T.Z` only.
            let (table, in_bucket) = match fact_time {
                Some(at) => (
                    self.timed_table(),
                    format!(
                        " AND fact_time = '{}'::timestamptz",
                        at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                    ),
                ),
                None => (self.table.as_str(), String::new()),
            };
            format!(
                "UPDATE {table} SET result = convert_from(decode('{result}', 'hex'), 'UTF8')::json \
                 WHERE scope = convert_from(decode('{scope}', 'hex'), 'UTF8') AND key IN ({keys}){in_bucket}; "
            )
        };
        let updates = match previous {
            Some((previous, at)) if at == fact_time => {
                update(format!("'{key}', '{previous}'"), fact_time)
            }
            Some((previous, at)) => {
                update(format!("'{key}'"), fact_time) + &update(format!("'{previous}'"), at)
            }
            None => update(format!("'{key}'"), fact_time),
        };
        std::borrow::Cow::Owned(format!(
            "{check}; {updates}{at_commit}COMMIT",
            check = self.delivery.check,
            at_commit = joined(&self.claim_lock_timeout, at_commit),
        ))
    }

    /// [`commit`](Self::commit) without a result to store.
    pub(crate) fn commit_only(&self, at_commit: &[String]) -> std::borrow::Cow<'_, str> {
        if at_commit.is_empty() {
            return std::borrow::Cow::Borrowed(&self.delivery.commit_only);
        }
        std::borrow::Cow::Owned(format!(
            "{check}; {at_commit}COMMIT",
            check = self.delivery.check,
            at_commit = joined(&self.claim_lock_timeout, at_commit),
        ))
    }

    /// Records a failed attempt; returns the attempts and whether the key is now parked,
    /// or `None` when another delivery had already finished the key.
    pub(crate) async fn record_failure(
        &self,
        conn: &mut PgConnection,
        row: KeyAt<'_>,
        fingerprint: Option<&[u8]>,
        error: &str,
        max_attempts: u32,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        let KeyAt {
            scope,
            key,
            fact_time,
        } = row;
        let query = match fact_time {
            Some(at) => self.query(
                &self.timed.record_failure,
                &[
                    scope.into(),
                    key.into(),
                    fingerprint.into(),
                    error.into(),
                    at.into(),
                    attempts_value(max_attempts),
                ],
            ),
            None => self.query(
                &self.delivery.record_failure,
                &[
                    scope.into(),
                    key.into(),
                    fingerprint.into(),
                    error.into(),
                    attempts_value(max_attempts),
                ],
            ),
        };
        let row = query.fetch_optional(conn).await?;
        row.as_ref().map(failure_recorded).transpose()
    }

    /// Parks `key` if the transaction `xid` wrote its row and committed; `false` if not.
    pub(crate) async fn park_committed(
        &self,
        conn: &mut PgConnection,
        row: KeyAt<'_>,
        xid: i64,
        error: &str,
    ) -> Result<bool, sqlx::Error> {
        let KeyAt {
            scope,
            key,
            fact_time,
        } = row;
        let xid = xid.to_string();
        let mut values: Vec<Value<'_>> =
            vec![scope.into(), key.into(), xid.as_str().into(), error.into()];
        let statement = match fact_time {
            Some(at) => {
                values.push(at.into());
                &self.timed.park_committed
            }
            None => &self.delivery.park_committed,
        };
        let done = self.query(statement, &values).execute(conn).await?;
        Ok(done.rows_affected() > 0)
    }

    pub(crate) async fn record(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
    ) -> Result<Option<KeyRecord>, sqlx::Error> {
        self.query(&self.delivery.record, &[scope.into(), key.into()])
            .fetch_optional_as(conn)
            .await
    }

    pub(crate) async fn done(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[Uuid],
        fingerprints: &[Option<Vec<u8>>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        self.query(
            &self.delivery.done,
            &[scope.into(), keys.into(), fingerprints.into()],
        )
        .fetch_all(conn)
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect()
    }

    pub(crate) async fn reset(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
    ) -> Result<bool, sqlx::Error> {
        let row = self
            .query(&self.delivery.reset, &[scope.into(), key.into()])
            .fetch_one(conn)
            .await?;
        Ok(row.try_get::<i64, _>("reset")? == 1)
    }
}
