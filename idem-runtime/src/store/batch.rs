//! The statements of a batch: every key of the batch claimed in one statement, the
//! `failed` ones taken over in one more, the results stored in one; for keys kept in the
//! status table, and for keys kept by their facts' times (`event_time`), each in its
//! fact's bucket of the timed table. Also what a batch needs around them: the buckets of
//! its facts made where missing, and which of its keys are done.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres, Row};
use uuid::Uuid;

use super::sql::Value;
use super::{Bucket, Existing, Statements, Status};

/// The SQL of batches, for the status table and for the timed table.
#[derive(Debug)]
pub(super) struct Sql {
    plain: OnTable,
    timed: OnTable,
    /// Makes the buckets of a batch's facts, where missing: what each fact's bucket is.
    buckets: String,
    /// Which of a list of keys succeeded with the given fingerprint, each in its scope
    /// and, where it has a fact's time, in that fact's bucket; in list order.
    done: String,
}

/// The statements of a batch on one table.
#[derive(Debug)]
struct OnTable {
    /// Claims every key of a batch, returning the keys in the way.
    claim: String,
    /// Takes over the `failed` keys of a batch.
    retake: String,
    /// Stores the results of a batch's new messages.
    store_results: String,
}

impl Sql {
    // Two sets of statements side by side: the timed ones differ by the fact's time in
    // every row they name, and by the window the claim inserts in.
    /// `table`: the status table, `<schema>.idem_keys`; the timed table and the bucket
    /// function are the same schema's.
    pub(super) fn new(table: &str) -> Self {
        let schema = table.strip_suffix(".idem_keys").unwrap_or(table);
        let timed = &format!("{schema}.idem_timed_keys");
        // What the claim's answer aggregates over the keys in the way (`l`, with their
        // rows `k`): whether each fact is inside its window, and the lock timeout set
        // back for the body unless a `failed` key is to be taken over first.
        let answer = |in_window: &str, to_take_over: &str| {
            format!(
                "SELECT (SELECT pg_current_xact_id_if_assigned()::text::bigint FROM claimed LIMIT 1) AS xid, \
                 CASE WHEN coalesce(bool_and(NOT ({to_take_over})), true) \
                 THEN set_config('lock_timeout', $4, true) END AS restored, \
                 array_agg(l.key) AS keys, array_agg(k.status) AS statuses, \
                 array_agg(k.attempts) AS attempts, array_agg(k.fingerprint) AS fingerprints, \
                 array_agg(k.result) AS results, array_agg(k.last_error) AS last_errors, \
                 array_agg({in_window}) AS in_window"
            )
        };
        // A fact inside its window on the database clock: `$6` the scope's window and
        // `$7` the bound ahead, in milliseconds (as the claim of one message checks it).
        let in_window = |at: &str| {
            format!(
                "({at} >= now() - $6::bigint * interval '1 millisecond' \
                  AND {at} < now() + $7::bigint * interval '1 millisecond')"
            )
        };
        // The batch's facts lie between `$8` and `$9`: the buckets outside that span are
        // pruned from the join of the batch's keys to the timed table.
        let span = "k.fact_time BETWEEN $8::timestamptz AND $9::timestamptz";
        Sql {
            plain: OnTable {
                claim: format!(
                    "WITH input AS ( \
                    SELECT * FROM unnest($2::uuid[], $3::bytea[]) AS i(key, fingerprint)), \
                    claimed AS ( \
                    INSERT INTO {table} (scope, key, status, attempts, fingerprint) \
                    SELECT $1, key, 'success', 1, fingerprint FROM input ORDER BY key \
                    ON CONFLICT (scope, key) DO NOTHING \
                    RETURNING key), \
                    lost AS ( \
                    SELECT i.key FROM input i WHERE NOT EXISTS (SELECT FROM claimed c WHERE c.key = i.key)) \
                    {} \
                    FROM lost l \
                    LEFT JOIN {table} k ON k.scope = $1 AND k.key = l.key",
                    answer("true", "k.status IS NOT DISTINCT FROM 'failed'")
                ),
                retake: format!(
                    "UPDATE {table} AS k SET status = 'success', attempts = k.attempts + 1, updated_at = now(), \
                    fingerprint = coalesce(k.fingerprint, f.fingerprint) \
                    FROM unnest($2::uuid[], $3::bytea[]) AS f(key, fingerprint) \
                    WHERE k.scope = $1 AND k.key = f.key AND k.status = 'failed' \
                    RETURNING k.key, pg_current_xact_id()::text::bigint"
                ),
                store_results: format!(
                    "UPDATE {table} AS k SET result = v.result \
                    FROM unnest($2::uuid[], $3::json[]) AS v(key, result) \
                    WHERE k.scope = $1 AND k.key = v.key"
                ),
            },
            // Each key in its fact's bucket (`$5`, the facts' times, one per key). Only
            // the facts inside their window are inserted; the others come back with the
            // keys in the way, whose rows say whether a final row answers them. A fact
            // whose bucket does not exist fails the insert (23514), which the caller
            // answers by making the batch's buckets. A key is one fact's (its time is
            // one of the key's fields): the key order is the rows' order.
            timed: OnTable {
                claim: format!(
                    "WITH input AS ( \
                    SELECT * FROM unnest($2::uuid[], $3::bytea[], $5::timestamptz[]) AS i(key, fingerprint, fact_time)), \
                    claimed AS ( \
                    INSERT INTO {timed} (scope, key, fact_time, status, attempts, fingerprint) \
                    SELECT $1, key, fact_time, 'success', 1, fingerprint FROM input \
                    WHERE {} ORDER BY key \
                    ON CONFLICT (scope, key, fact_time) DO NOTHING \
                    RETURNING key), \
                    lost AS ( \
                    SELECT i.key, i.fact_time FROM input i WHERE NOT EXISTS (SELECT FROM claimed c WHERE c.key = i.key)) \
                    {} \
                    FROM lost l \
                    LEFT JOIN {timed} k ON k.scope = $1 AND k.key = l.key AND k.fact_time = l.fact_time AND {span}",
                    in_window("fact_time"),
                    answer(
                        &in_window("l.fact_time"),
                        &format!(
                            "k.status IS NOT DISTINCT FROM 'failed' AND {}",
                            in_window("l.fact_time")
                        )
                    )
                ),
                retake: format!(
                    "UPDATE {timed} AS k SET status = 'success', attempts = k.attempts + 1, updated_at = now(), \
                    fingerprint = coalesce(k.fingerprint, f.fingerprint) \
                    FROM unnest($2::uuid[], $3::bytea[], $4::timestamptz[]) AS f(key, fingerprint, fact_time) \
                    WHERE k.scope = $1 AND k.key = f.key AND k.fact_time = f.fact_time AND k.status = 'failed' \
                    AND k.fact_time BETWEEN $5::timestamptz AND $6::timestamptz \
                    RETURNING k.key, pg_current_xact_id()::text::bigint"
                ),
                store_results: format!(
                    "UPDATE {timed} AS k SET result = v.result \
                    FROM unnest($2::uuid[], $3::json[], $4::timestamptz[]) AS v(key, result, fact_time) \
                    WHERE k.scope = $1 AND k.key = v.key AND k.fact_time = v.fact_time \
                    AND k.fact_time BETWEEN $5::timestamptz AND $6::timestamptz"
                ),
            },
            // One call of the bucket function per fact (`$1`, in order): it makes the
            // bucket where it is missing, under its advisory lock, or says the fact is
            // outside its window or before the expired horizon.
            buckets: format!(
                "SELECT f.at, {schema}.idem_timed_bucket(f.at, $2::bigint * interval '1 millisecond', $3, $4) AS made \
                 FROM unnest($1::timestamptz[]) WITH ORDINALITY AS f(at, n) ORDER BY f.n"
            ),
            // A key with a time is looked up in its bucket only (the span of the list's
            // times prunes the others), one without in the status table.
            done: format!(
                "SELECT coalesce(k.status = 'success' AND (k.fingerprint IS NULL OR l.fingerprint IS NULL \
                                 OR k.fingerprint = l.fingerprint), false) AS done \
                 FROM unnest($1::text[], $2::uuid[], $3::bytea[], $4::timestamptz[]) \
                      WITH ORDINALITY AS l(scope, key, fingerprint, fact_time, position) \
                 LEFT JOIN LATERAL ( \
                    SELECT p.status, p.fingerprint FROM {table} AS p \
                    WHERE l.fact_time IS NULL AND p.scope = l.scope AND p.key = l.key \
                    UNION ALL \
                    SELECT t.status, t.fingerprint FROM {timed} AS t \
                    WHERE l.fact_time IS NOT NULL AND t.scope = l.scope AND t.key = l.key \
                      AND t.fact_time = l.fact_time \
                      AND t.fact_time BETWEEN $5::timestamptz AND $6::timestamptz \
                    LIMIT 1) AS k ON true \
                 ORDER BY l.position"
            ),
        }
    }
}

/// `times` cut into runs whose facts fall in at most
/// [`BUCKETS_A_TRANSACTION`](super::timed::BUCKETS_A_TRANSACTION) cells of `width` (as
/// `idem_timed_bucket` aligns them, on 2000-01-01 UTC): a run makes that many buckets at
/// most (more only where buckets of another width split a cell). In order.
fn bucket_chunks(times: &[DateTime<Utc>], width: std::time::Duration) -> Vec<&[DateTime<Utc>]> {
    let width = i64::try_from(width.as_micros()).unwrap_or(i64::MAX).max(1);
    // 2000-01-01 UTC, in microseconds since 1970.
    const ORIGIN: i64 = 946_684_800_000_000;
    let cell = |at: &DateTime<Utc>| (at.timestamp_micros() - ORIGIN).div_euclid(width);
    let mut chunks = Vec::new();
    let (mut start, mut cells, mut last) = (0, 0, None);
    for (i, at) in times.iter().enumerate() {
        let this = cell(at);
        if last != Some(this) {
            if cells == super::timed::BUCKETS_A_TRANSACTION {
                chunks.push(&times[start..i]);
                (start, cells) = (i, 0);
            }
            cells += 1;
            last = Some(this);
        }
    }
    if start < times.len() {
        chunks.push(&times[start..]);
    }
    chunks
}

/// The earliest and the latest of `times`: the span of the buckets they are in.
fn span(times: &[DateTime<Utc>]) -> (DateTime<Utc>, DateTime<Utc>) {
    let earliest = times.iter().min().copied().unwrap_or_default();
    let latest = times.iter().max().copied().unwrap_or_default();
    (earliest, latest)
}

/// What the claim of a batch's keys found.
#[derive(Debug)]
pub(crate) struct BatchClaim {
    /// The transaction's id, if it wrote anything.
    pub xid: Option<i64>,
    /// The keys that were in the way, each with its row; `None`: the row was committed by
    /// a transaction that the claim waited for, and is not in the claim's snapshot.
    pub in_the_way: Vec<(Uuid, Option<Existing>)>,
    /// Keys kept by their facts' times whose fact is outside its window with no final
    /// row to answer it (no row, or a `failed` one): not claimed.
    pub outside: Vec<Uuid>,
}

/// An array column of the claim's row: empty when the aggregate had no rows (NULL).
fn column<T>(row: &PgRow, name: &str) -> Result<Vec<T>, sqlx::Error>
where
    Vec<T>: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    Ok(row.try_get::<Option<Vec<T>>, _>(name)?.unwrap_or_default())
}

impl Statements {
    /// Claims every key of `keys` (with its fingerprint) in the caller's transaction, in key
    /// order: in the status table, or, with `times`, each in its fact's bucket of the timed
    /// table where the fact is inside its window. Only the keys in the way come back, as
    /// arrays in one row (an aggregate always yields one): the happy path returns no row
    /// data but the transaction's id. A claim that met no `failed` key to take over sets
    /// the lock timeout to `body_lock_timeout`.
    ///
    /// `times`: the facts' times, one per key, with the window in milliseconds back from
    /// the database clock (the scope's retention window) and ahead of it (the future
    /// bound).
    pub(crate) async fn claim_batch(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[Uuid],
        fingerprints: &[Option<Vec<u8>>],
        times: Option<(&[DateTime<Utc>], i64, i64)>,
        body_lock_timeout: &str,
    ) -> Result<BatchClaim, sqlx::Error> {
        let mut values: Vec<Value<'_>> = vec![
            scope.into(),
            keys.into(),
            fingerprints.into(),
            body_lock_timeout.into(),
        ];
        let statement = match times {
            Some((times, window_ms, ahead_ms)) => {
                let (earliest, latest) = span(times);
                values.extend([
                    Value::from(times),
                    Value::from(window_ms),
                    Value::from(ahead_ms),
                    Value::from(earliest),
                    Value::from(latest),
                ]);
                &self.batch.timed.claim
            }
            None => &self.batch.plain.claim,
        };
        let row = self.query(statement, &values).fetch_one(conn).await?;
        let mut claim = BatchClaim {
            xid: row.try_get("xid")?,
            in_the_way: Vec::new(),
            outside: Vec::new(),
        };
        let lost: Vec<Uuid> = column(&row, "keys")?;
        if lost.is_empty() {
            return Ok(claim);
        }
        let statuses: Vec<Option<String>> = column(&row, "statuses")?;
        let attempts: Vec<Option<i32>> = column(&row, "attempts")?;
        let fingerprints: Vec<Option<Vec<u8>>> = column(&row, "fingerprints")?;
        let results: Vec<Option<serde_json::Value>> = column(&row, "results")?;
        let last_errors: Vec<Option<String>> = column(&row, "last_errors")?;
        let in_window: Vec<bool> = column(&row, "in_window")?;
        let rows = lost
            .into_iter()
            .zip(statuses)
            .zip(attempts)
            .zip(fingerprints)
            .zip(results)
            .zip(last_errors)
            .zip(in_window);
        for ((((((key, status), attempts), fingerprint), result), last_error), in_window) in rows {
            let existing = match status {
                Some(status) => Some(Existing {
                    status: Status::parse(&status)?,
                    attempts: attempts.and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
                    fingerprint,
                    result,
                    last_error,
                }),
                None => None,
            };
            // Outside its window, a fact is answered by a final row of its key alone (as
            // the claim of one message answers it).
            let unanswered = existing
                .as_ref()
                .is_none_or(|existing| existing.status == Status::Failed);
            if !in_window && unanswered {
                claim.outside.push(key);
            } else {
                claim.in_the_way.push((key, existing));
            }
        }
        Ok(claim)
    }

    /// Takes over the `failed` keys of `keys` (with their fingerprints, and their facts'
    /// `times` where they are kept by them) in the caller's transaction: the keys taken,
    /// each with the transaction's id.
    pub(crate) async fn retake_batch(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[Uuid],
        fingerprints: &[Option<Vec<u8>>],
        times: Option<&[DateTime<Utc>]>,
    ) -> Result<Vec<(Uuid, i64)>, sqlx::Error> {
        let mut values: Vec<Value<'_>> = vec![scope.into(), keys.into(), fingerprints.into()];
        let statement = on_table(
            &mut values,
            times,
            &self.batch.timed.retake,
            &self.batch.plain.retake,
        );
        self.query(statement, &values).fetch_all_as(conn).await
    }

    /// Sets the transaction's lock timeout to `lock_timeout` (the session's own, for the
    /// body, after a takeover that ran with the claim's).
    pub(crate) async fn restore_lock_timeout(
        &self,
        conn: &mut PgConnection,
        lock_timeout: &str,
    ) -> Result<(), sqlx::Error> {
        self.query(
            "SELECT set_config('lock_timeout', $1, true)",
            &[lock_timeout.into()],
        )
        .execute(conn)
        .await
        .map(drop)
    }

    /// Stores the results of a batch's new messages, in one statement (`times`: their
    /// facts' times, where the keys are kept by them).
    pub(crate) async fn store_batch_results(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[Uuid],
        results: &[serde_json::Value],
        times: Option<&[DateTime<Utc>]>,
    ) -> Result<(), sqlx::Error> {
        let mut values: Vec<Value<'_>> = vec![scope.into(), keys.into(), results.into()];
        let statement = on_table(
            &mut values,
            times,
            &self.batch.timed.store_results,
            &self.batch.plain.store_results,
        );
        self.query(statement, &values).execute(conn).await.map(drop)
    }

    /// Makes the buckets of the facts `times` (in order) that are missing, a few buckets
    /// a statement, each in its own transaction on `pool`
    /// ([`BUCKETS_A_TRANSACTION`](super::timed::BUCKETS_A_TRANSACTION)): what the
    /// database says of each fact's bucket, in order.
    pub(crate) async fn make_batch_buckets(
        &self,
        pool: &sqlx::PgPool,
        times: &[DateTime<Utc>],
        width: std::time::Duration,
        window_ms: i64,
        ahead_ms: i64,
    ) -> Result<Vec<(DateTime<Utc>, Bucket)>, sqlx::Error> {
        let mut answers = Vec::with_capacity(times.len());
        for chunk in bucket_chunks(times, width) {
            let rows = self
                .query(
                    &self.batch.buckets,
                    &[
                        chunk.into(),
                        super::millis(width).into(),
                        window_ms.into(),
                        ahead_ms.into(),
                    ],
                )
                .fetch_all(pool)
                .await?;
            for row in &rows {
                let bucket = match row.try_get::<&str, _>("made")? {
                    "too_old" => Bucket::TooOld,
                    "too_new" => Bucket::TooNew,
                    _ => Bucket::Ready,
                };
                answers.push((row.try_get("at")?, bucket));
            }
        }
        Ok(answers)
    }

    /// Which of `keys` (each with its scope and fingerprint) succeeded with that
    /// fingerprint, as `conn` sees them, in order. With `times` (one per key, the keys'
    /// facts' times), each key is looked up in its fact's bucket of the timed table;
    /// without, in the status table.
    pub(crate) async fn done_in(
        &self,
        conn: &mut PgConnection,
        scopes: &[String],
        keys: &[Uuid],
        fingerprints: &[Option<Vec<u8>>],
        times: Option<&[DateTime<Utc>]>,
    ) -> Result<Vec<bool>, sqlx::Error> {
        // Without times, an empty array: `unnest` pads it with NULLs.
        let times = times.unwrap_or_default();
        let (earliest, latest) = span(times);
        self.query(
            &self.batch.done,
            &[
                scopes.into(),
                keys.into(),
                fingerprints.into(),
                times.into(),
                earliest.into(),
                latest.into(),
            ],
        )
        .fetch_all(conn)
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect()
    }
}

/// The statement on the timed table, with the facts' `times` and their span after
/// `values`, or the one on the status table.
fn on_table<'s, 'v>(
    values: &mut Vec<Value<'v>>,
    times: Option<&'v [DateTime<Utc>]>,
    timed: &'s str,
    plain: &'s str,
) -> &'s str {
    let Some(times) = times else {
        return plain;
    };
    let (earliest, latest) = span(times);
    values.extend([
        Value::from(times),
        Value::from(earliest),
        Value::from(latest),
    ]);
    timed
}
