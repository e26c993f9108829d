//! The statements on the outbox (`kafka_outbox`) and its relays' leases
//! (`kafka_outbox_relays`).

use std::time::Duration;

use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::schema::Schema;

/// The advisory lock class (the first key of `pg_advisory_xact_lock(int, int)`) of the
/// locks that [`send`](crate::outbox::send) takes on a topic and Kafka key.
pub const LOCK_CLASS: i32 = 0x1de0_0b0c;

fn outbox_table(schema: &Schema) -> String {
    format!("{}.kafka_outbox", schema.as_str())
}

fn relays_table(schema: &Schema) -> String {
    format!("{}.kafka_outbox_relays", schema.as_str())
}

/// The transaction-local setting (`set_config(..., true)`) in which the sends of a
/// handler's body note themselves, one entry each, when they are made: `,t<token>` for
/// the records of one call, `,k<key>` for a record's given or named key, `,u<key>` for an
/// unnamed record of the message whose key that is. A savepoint that the body rolls back
/// takes back, with its effects, what its sends noted (PostgreSQL restores a setting
/// changed inside a savepoint when it is rolled back), so that the commit writes the
/// records that are still part of the transaction, and no other.
const SENT: &str = "idem_outbox.sent";

/// The records of one send whose keys are not derived from a position, and the messages
/// its unnamed records follow from.
#[derive(Debug)]
pub(crate) struct Sends<'a> {
    /// A number that no other send of this process uses.
    pub token: u64,
    /// The keys of its records that are given or derived from a name.
    pub keys: &'a [Uuid],
    /// Per message that its unnamed records follow from: the message's key, and how
    /// many of them.
    pub unnamed: &'a [(Uuid, u32)],
}

/// What the transaction held when a send noted itself.
#[derive(Debug)]
pub(crate) enum Noted {
    /// The send is noted; per entry of [`Sends::unnamed`], how many unnamed records of
    /// that message the transaction already holds: the position of the first of this
    /// send's.
    Sent(Vec<u32>),
    /// The key at this index of [`Sends::keys`] was sent before in the transaction, and is
    /// still part of it; nothing was noted.
    Again(usize),
}

/// Notes a handler body's send in its transaction (see [`SENT`]), in one statement:
/// refused (nothing noted) when one of its keys is there already.
pub(crate) async fn note_sends(
    tx: &mut PgConnection,
    schema: &Schema,
    sends: &Sends<'_>,
) -> Result<Noted, sqlx::Error> {
    use std::fmt::Write as _;
    let keys: Vec<String> = sends
        .keys
        .iter()
        .map(|key| format!(",k{}", key.simple()))
        .collect();
    let unnamed: Vec<String> = sends
        .unnamed
        .iter()
        .map(|(key, _)| format!(",u{}", key.simple()))
        .collect();
    let mut appended = format!(",t{}", sends.token);
    for key in &keys {
        appended.push_str(key);
    }
    for (entry, (_, count)) in unnamed.iter().zip(sends.unnamed) {
        for _ in 0..*count {
            let _ = write!(appended, "{entry}");
        }
    }
    if let ([key], []) = (keys.as_slice(), unnamed.as_slice()) {
        // The common send, one record with a name or a key: a statement without arrays.
        let row = sqlx::query(&format!(
            "SELECT strpos(v, $1) > 0 AS again, \
                    set_config('{SENT}', CASE WHEN strpos(v, $1) > 0 THEN v ELSE v || $2 END, true) AS noted \
             FROM (SELECT coalesce(current_setting('{SENT}', true), '') AS v) AS sent"
        ))
        .bind(key)
        .bind(&appended)
        .persistent(schema.prepared())
        .fetch_one(&mut *tx)
        .await?;
        return Ok(match row.try_get::<bool, _>("again")? {
            true => Noted::Again(0),
            false => Noted::Sent(Vec::new()),
        });
    }
    let row = sqlx::query(&format!(
        "SELECT (SELECT min(i)::int4 FROM unnest($1::text[]) WITH ORDINALITY AS x(k, i) \
                 WHERE strpos(v, k) > 0) AS again, \
                ARRAY(SELECT ((length(v) - length(replace(v, u, ''))) / length(u))::int4 \
                      FROM unnest($2::text[]) WITH ORDINALITY AS x(u, i) ORDER BY i) AS before, \
                set_config('{SENT}', CASE WHEN EXISTS (SELECT FROM unnest($1::text[]) AS k \
                                                       WHERE strpos(v, k) > 0) \
                                     THEN v ELSE v || $3 END, true) AS noted \
         FROM (SELECT coalesce(current_setting('{SENT}', true), '') AS v) AS sent"
    ))
    .bind(&keys)
    .bind(&unnamed)
    .bind(&appended)
    .persistent(schema.prepared())
    .fetch_one(&mut *tx)
    .await?;
    if let Some(again) = row.try_get::<Option<i32>, _>("again")? {
        return Ok(Noted::Again(usize::try_from(again - 1).unwrap_or(0)));
    }
    let before: Vec<i32> = row.try_get("before")?;
    Ok(Noted::Sent(
        before
            .into_iter()
            .map(|count| u32::try_from(count).unwrap_or(0))
            .collect(),
    ))
}

/// A record's row, as [`insert_statement`] writes it.
#[derive(Debug)]
pub(crate) struct Insert {
    pub shard: i16,
    /// The lock on the record's topic and Kafka key (the second key of the advisory lock).
    pub lock: i32,
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub header_names: Vec<String>,
    pub header_values: Vec<Vec<u8>>,
    pub idem_key: Uuid,
    /// The token of the send that noted it in its transaction ([`note_sends`]): written
    /// only while the note is there. `None`: written whatever (a record written at once).
    pub noted: Option<u64>,
}

/// Writes `rows` into `schema`'s outbox at once, in the caller's transaction (outside a
/// handler's body), with the statement of [`insert_statement`].
pub(crate) async fn insert_now(
    tx: &mut PgConnection,
    schema: &Schema,
    rows: &[Insert],
    channel: Option<&str>,
) -> Result<(), sqlx::Error> {
    let statement = insert_statement(schema, rows, channel);
    sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&statement)).await?;
    Ok(())
}

/// The statement that writes `rows`, with every value written in: for the commit's round
/// trip of the delivery whose body sent the records
/// ([`CurrentDelivery::at_commit`](idem_runtime::CurrentDelivery::at_commit)), or at once.
/// Text and bytes are written as hexadecimal digits, numbers from their digits, UUIDs
/// from their canonical text: no value can be read as SQL. A row noted by a send is
/// written only if its note is still in the transaction. The locks of the rows written
/// are taken first, in one order, then the rows are numbered in that order: records of
/// one topic and key keep the order they were sent in, and two transactions sending for
/// the same keys in any orders wait for each other without a deadlock. The notification
/// for the relays follows when `channel` is given.
pub(crate) fn insert_statement(schema: &Schema, rows: &[Insert], channel: Option<&str>) -> String {
    use std::fmt::Write as _;
    let table = outbox_table(schema);
    let bytes = |value: Option<&[u8]>| match value {
        Some(value) => format!("'\\x{}'::bytea", hex::encode(value)),
        None => "NULL::bytea".to_owned(),
    };
    let text = |value: &str| {
        format!(
            "convert_from('\\x{}'::bytea, 'UTF8')",
            hex::encode(value.as_bytes())
        )
    };
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&index| (rows[index].lock, index));
    // Each noted record only while its note is in the transaction.
    let noted = |token: Option<u64>| match token {
        Some(token) => format!(
            " WHERE strpos(coalesce(current_setting('{SENT}', true), '') || ',', ',t{token},') > 0"
        ),
        None => String::new(),
    };
    let mut values = String::new();
    for (n, &index) in order.iter().enumerate() {
        let row = &rows[index];
        let names: Vec<String> = row.header_names.iter().map(|name| text(name)).collect();
        let header_values: Vec<String> = row
            .header_values
            .iter()
            .map(|value| bytes(Some(value)))
            .collect();
        let _ = write!(
            values,
            "{union}SELECT {shard}::int2, {topic}, {partition}::int4, {key}, {payload}, \
             ARRAY[{names}]::text[], ARRAY[{header_values}]::bytea[], '{idem_key}'::uuid{noted}",
            union = if n == 0 { "" } else { " UNION ALL " },
            shard = row.shard,
            topic = text(&row.topic),
            partition = row.partition.map_or("NULL".to_owned(), |p| p.to_string()),
            key = bytes(row.key.as_deref()),
            payload = bytes(row.payload.as_deref()),
            names = names.join(", "),
            header_values = header_values.join(", "),
            idem_key = row.idem_key,
            noted = noted(row.noted),
        );
    }
    // The locks first, in one order (a target list is evaluated left to right), each
    // taken only for a record still noted; then the rows still noted, numbered in that
    // order. Two plain statements: a commit plans them in microseconds.
    let mut locks = Vec::new();
    for &index in &order {
        let row = &rows[index];
        let lock = format!("pg_advisory_xact_lock({LOCK_CLASS}, {})", row.lock);
        locks.push(match row.noted {
            Some(token) => format!(
                "CASE WHEN strpos(coalesce(current_setting('{SENT}', true), '') || ',', ',t{token},') > 0 \
                 THEN {lock} END"
            ),
            None => lock,
        });
    }
    locks.dedup();
    let mut statement = format!(
        "SELECT {locks}; \
         INSERT INTO {table} (shard, topic, kafka_partition, record_key, payload, header_names, \
                              header_values, idem_key) {values}",
        locks = locks.join(", "),
    );
    if let Some(channel) = channel {
        let _ = write!(statement, "; SELECT pg_notify({}, '')", text(channel));
    }
    statement
}

/// A record as the relay publishes it.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub id: i64,
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub idem_key: Uuid,
    pub attempts: i32,
}

/// Renews this relay's leases and takes the shards whose lease expired (or that no relay
/// held yet), up to `wanted` shards in all; returns the shards it holds now.
pub(crate) async fn hold_shards(
    conn: &mut PgConnection,
    schema: &Schema,
    owner: Uuid,
    lease: Duration,
    shards: i16,
    wanted: i16,
) -> Result<Vec<i16>, sqlx::Error> {
    let table = relays_table(schema);
    let millis = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let rows = sqlx::query(&format!(
        "WITH renewed AS ( \
             UPDATE {table} SET expires_at = now() + $3 * interval '1 millisecond' \
             WHERE owner = $1 RETURNING shard), \
         taken AS ( \
             INSERT INTO {table} AS r (shard, owner, expires_at) \
             SELECT s, $1, now() + $3 * interval '1 millisecond' \
             FROM generate_series(0, $2 - 1) AS s \
             WHERE s NOT IN (SELECT shard FROM renewed) \
             ORDER BY random() \
             LIMIT greatest($4 - (SELECT count(*) FROM renewed), 0) \
             ON CONFLICT (shard) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at \
             WHERE r.expires_at < now() \
             RETURNING shard) \
         SELECT shard FROM renewed UNION ALL SELECT shard FROM taken ORDER BY 1"
    ))
    .bind(owner)
    .bind(i32::from(shards))
    .bind(millis)
    .bind(i64::from(wanted))
    .persistent(schema.prepared())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(|row| row.try_get(0)).collect()
}

/// Gives up this relay's leases (a graceful stop), so that others take the shards at once.
pub(crate) async fn release_shards(
    conn: &mut PgConnection,
    schema: &Schema,
    owner: Uuid,
) -> Result<(), sqlx::Error> {
    let table = relays_table(schema);
    sqlx::query(&format!("DELETE FROM {table} WHERE owner = $1"))
        .bind(owner)
        .persistent(schema.prepared())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The next unsent, unparked records of each of `shards` (at most `limit` each), in
/// order, in one query; shards with nothing waiting are left out.
pub(crate) async fn pending(
    conn: &mut PgConnection,
    schema: &Schema,
    shards: &[i16],
    limit: i64,
) -> Result<Vec<(i16, Vec<Pending>)>, sqlx::Error> {
    let table = outbox_table(schema);
    let rows = sqlx::query(&format!(
        "SELECT s.shard, p.* FROM unnest($1::smallint[]) AS s(shard) \
         CROSS JOIN LATERAL ( \
             SELECT id, topic, kafka_partition, record_key, payload, header_names, \
                    header_values, idem_key, attempts \
             FROM {table} AS o \
             WHERE o.shard = s.shard AND o.sent_at IS NULL AND o.parked_at IS NULL \
             ORDER BY o.id LIMIT $2) AS p \
         ORDER BY s.shard, p.id"
    ))
    .bind(shards)
    .bind(limit)
    .persistent(schema.prepared())
    .fetch_all(&mut *conn)
    .await?;
    let mut by_shard: Vec<(i16, Vec<Pending>)> = Vec::new();
    for row in &rows {
        let shard: i16 = row.try_get("shard")?;
        let names: Vec<String> = row.try_get("header_names")?;
        let values: Vec<Vec<u8>> = row.try_get("header_values")?;
        let record = Pending {
            id: row.try_get("id")?,
            topic: row.try_get("topic")?,
            partition: row.try_get("kafka_partition")?,
            key: row.try_get("record_key")?,
            payload: row.try_get("payload")?,
            headers: names.into_iter().zip(values).collect(),
            idem_key: row.try_get("idem_key")?,
            attempts: row.try_get("attempts")?,
        };
        match by_shard.last_mut() {
            Some((last, records)) if *last == shard => records.push(record),
            _ => by_shard.push((shard, vec![record])),
        }
    }
    Ok(by_shard)
}

/// Marks records sent, if this relay still holds their shard; returns how many.
pub(crate) async fn mark_sent(
    conn: &mut PgConnection,
    schema: &Schema,
    owner: Uuid,
    shard: i16,
    ids: &[i64],
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let (table, relays) = (outbox_table(schema), relays_table(schema));
    let done = sqlx::query(&format!(
        "UPDATE {table} SET sent_at = now() \
         WHERE id = ANY($1) AND sent_at IS NULL \
           AND EXISTS (SELECT FROM {relays} WHERE shard = $2 AND owner = $3)"
    ))
    .bind(ids)
    .bind(shard)
    .bind(owner)
    .persistent(schema.prepared())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Records a failed publication of record `id`: parked with `error` when `park`, else
/// counted (`attempts`) with `error` for the next try.
pub(crate) async fn record_failure(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    error: &str,
    park: bool,
) -> Result<(), sqlx::Error> {
    let table = outbox_table(schema);
    sqlx::query(&format!(
        "UPDATE {table} SET attempts = attempts + 1, last_error = $2, \
                            parked_at = CASE WHEN $3 THEN now() END \
         WHERE id = $1 AND sent_at IS NULL"
    ))
    .bind(id)
    .bind(error)
    .bind(park)
    .persistent(schema.prepared())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Deletes records sent before `cutoff` ago, `batch` at a time (oldest first); returns
/// how many it deleted. Unsent and parked records stay.
pub(crate) async fn purge_sent(
    conn: &mut PgConnection,
    schema: &Schema,
    older_than: Duration,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let table = outbox_table(schema);
    let millis = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
    let mut deleted = 0;
    loop {
        let done = sqlx::query(&format!(
            "DELETE FROM {table} WHERE id IN ( \
                 SELECT id FROM {table} \
                 WHERE sent_at < now() - $1 * interval '1 millisecond' \
                 ORDER BY id LIMIT $2)"
        ))
        .bind(millis)
        .bind(batch)
        .persistent(schema.prepared())
        .execute(&mut *conn)
        .await?;
        deleted += done.rows_affected();
        if done.rows_affected() < u64::try_from(batch).unwrap_or(u64::MAX) {
            return Ok(deleted);
        }
    }
}

/// How long the oldest unsent (and unparked) record has waited.
pub(crate) async fn oldest_unsent(
    conn: &mut PgConnection,
    schema: &Schema,
) -> Result<Option<Duration>, sqlx::Error> {
    let table = outbox_table(schema);
    let millis: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT (extract(epoch FROM now() - min(created_at)) * 1000)::bigint FROM {table} \
         WHERE sent_at IS NULL AND parked_at IS NULL"
    ))
    .persistent(schema.prepared())
    .fetch_one(&mut *conn)
    .await?;
    Ok(millis.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
}

/// The outbox at a glance: records waiting, parked and sent (kept), and the oldest
/// waiting record's age.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutboxSummary {
    /// Records not published yet (and not parked).
    pub unsent: i64,
    /// Records set aside with their error.
    pub parked: i64,
    /// Published records still kept.
    pub sent: i64,
    /// How long the oldest unsent record has waited.
    pub oldest_unsent: Option<Duration>,
    /// Shards and the relay that holds each, with the time its lease has left.
    pub relays: Vec<(i16, Uuid, Duration)>,
}

pub(crate) async fn summary(
    conn: &mut PgConnection,
    schema: &Schema,
) -> Result<OutboxSummary, sqlx::Error> {
    let (table, relays) = (outbox_table(schema), relays_table(schema));
    let row = sqlx::query(&format!(
        "SELECT count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL) AS unsent, \
                count(*) FILTER (WHERE parked_at IS NOT NULL AND sent_at IS NULL) AS parked, \
                count(*) FILTER (WHERE sent_at IS NOT NULL) AS sent, \
                (extract(epoch FROM now() - min(created_at) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL)) * 1000)::bigint AS oldest \
         FROM {table}"
    ))
    .persistent(schema.prepared())
    .fetch_one(&mut *conn)
    .await?;
    let held = sqlx::query(&format!(
        "SELECT shard, owner, greatest((extract(epoch FROM expires_at - now()) * 1000)::bigint, 0) AS left_ms \
         FROM {relays} ORDER BY shard"
    ))
    .persistent(schema.prepared())
    .fetch_all(&mut *conn)
    .await?;
    let millis = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    Ok(OutboxSummary {
        unsent: row.try_get("unsent")?,
        parked: row.try_get("parked")?,
        sent: row.try_get("sent")?,
        oldest_unsent: row.try_get::<Option<i64>, _>("oldest")?.map(millis),
        relays: held
            .iter()
            .map(|row| {
                Ok((
                    row.try_get("shard")?,
                    row.try_get("owner")?,
                    millis(row.try_get("left_ms")?),
                ))
            })
            .collect::<Result<_, sqlx::Error>>()?,
    })
}

/// A record set aside, as `idem outbox parked` lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ParkedRecord {
    /// The record's number in the outbox.
    pub id: i64,
    /// Its topic.
    pub topic: String,
    /// Its Kafka key.
    pub key: Option<Vec<u8>>,
    /// The partition it was sent to, if it named one.
    pub partition: Option<i32>,
    /// When it was parked.
    pub parked_at: chrono::DateTime<chrono::Utc>,
    /// Its idempotency key.
    pub idem_key: Uuid,
    /// Publications that failed.
    pub attempts: i32,
    /// The last failure's text.
    pub error: Option<String>,
}

pub(crate) async fn parked(
    conn: &mut PgConnection,
    schema: &Schema,
    limit: i64,
) -> Result<Vec<ParkedRecord>, sqlx::Error> {
    let table = outbox_table(schema);
    let rows = sqlx::query(&format!(
        "SELECT id, topic, record_key, kafka_partition, parked_at, idem_key, attempts, last_error \
         FROM {table} WHERE parked_at IS NOT NULL AND sent_at IS NULL ORDER BY id LIMIT $1"
    ))
    .bind(limit)
    .persistent(schema.prepared())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(ParkedRecord {
                id: row.try_get("id")?,
                topic: row.try_get("topic")?,
                key: row.try_get("record_key")?,
                partition: row.try_get("kafka_partition")?,
                parked_at: row.try_get("parked_at")?,
                idem_key: row.try_get("idem_key")?,
                attempts: row.try_get("attempts")?,
                error: row.try_get("last_error")?,
            })
        })
        .collect()
}

/// Puts a parked record (or every parked one, `id` = `None`) back in line, its attempts
/// counted from zero; returns how many.
pub(crate) async fn retry(
    conn: &mut PgConnection,
    schema: &Schema,
    id: Option<i64>,
) -> Result<u64, sqlx::Error> {
    let table = outbox_table(schema);
    let done = sqlx::query(&format!(
        "UPDATE {table} SET parked_at = NULL, attempts = 0 \
         WHERE parked_at IS NOT NULL AND sent_at IS NULL AND ($1::bigint IS NULL OR id = $1)"
    ))
    .bind(id)
    .persistent(schema.prepared())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}
