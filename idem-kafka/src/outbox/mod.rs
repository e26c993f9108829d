//! Publishing from a handler, exactly once downstream: a transactional outbox and its
//! relay.
//!
//! A handler's body that publishes to Kafka directly either tells the world before its
//! transaction commits (and a rollback cannot take it back) or after (and a crash in
//! between loses the record for good, since a redelivery of the fact is a duplicate that
//! runs nothing). [`send`] instead writes the record into the outbox table
//! `kafka_outbox`, in the body's transaction: the record exists if and only if the
//! claim of the key and the body's effects commit. The [`Relay`], which runs in every
//! consumer process, publishes what committed, with an idempotent producer, and marks it
//! sent after the broker acknowledged it.
//!
//! ```no_run
//! use idem_kafka::outbox::{self, Record};
//! use idem_runtime::idempotent;
//! use sqlx::PgConnection;
//!
//! #[derive(serde::Deserialize, serde::Serialize)]
//! struct Payment { order_id: String, amount_cents: i64 }
//!
//! #[idempotent(key = "order_id")]
//! async fn apply_payment(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO payments (order_id, amount_cents) VALUES ($1, $2)")
//!         .bind(&payment.order_id)
//!         .bind(payment.amount_cents)
//!         .execute(&mut *tx)
//!         .await?;
//!     // Published once the transaction commits; never if it rolls back.
//!     outbox::send(tx, Record::to("receipts").name("receipt").key(&payment.order_id).json(payment)?)
//!         .await?;
//!     Ok(())
//! }
//! ```
//!
//! # Every record carries a key of its own
//!
//! Each record is stamped with an idempotency key in the header [`KEY_HEADER`]
//! (`idem-key`, the UUID's text): the key of the parts `"idem:outgoing"`, the handler's
//! scope, the key of the fact being handled and the record's [name](Record::name)
//! ([`CurrentDelivery::derived_key`](idem_runtime::CurrentDelivery::derived_key)). Every run of the
//! same fact derives the same keys, so a record published twice (a relay that died
//! between the broker's acknowledgement and marking the record sent) is a duplicate that
//! the next consumer's handler recognises: key it on the header with [`Keyed`](crate::Keyed)
//! and `#[idempotent(key = "idem_key")]`.
//!
//! # From a handler whose keys are kept by the fact's time
//!
//! The key of a fact handled with `event_time` is derived from its time among its other
//! fields, so a record's derived key names the fact and its time too: every run of the
//! fact derives it again, and the records of two facts that differ only by their time
//! get keys of their own. For the next hop to keep its keys by the same time, put the
//! fact's time in the record's payload and name it with `event_time` there, next to the
//! header's key:
//!
//! ```no_run
//! use chrono::{DateTime, Utc};
//! use idem_kafka::Keyed;
//! use idem_kafka::outbox::{self, Record};
//! use idem_runtime::idempotent;
//! use sqlx::PgConnection;
//!
//! #[derive(serde::Deserialize, serde::Serialize)]
//! struct Payment { order_id: String, amount_cents: i64, occurred_at: DateTime<Utc> }
//!
//! // The first hop: its keys in the bucket of the payment's time.
//! #[idempotent(key = "order_id, occurred_at", event_time = "occurred_at")]
//! async fn apply_payment(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
//!     // The payload carries the fact's time, the same on every run of the fact.
//!     outbox::send(tx, Record::to("receipts").name("receipt").key(&payment.order_id).json(payment)?)
//!         .await?;
//!     Ok(())
//! }
//!
//! // The next hop: keyed on the record's own key, kept by the same time.
//! #[idempotent(key = "idem_key, message.occurred_at", event_time = "message.occurred_at")]
//! async fn file_receipt(tx: &mut PgConnection, receipt: &Keyed<Payment>) -> Result<(), sqlx::Error> {
//!     # let _ = (tx, &receipt.message.order_id, receipt.message.amount_cents);
//!     Ok(())
//! }
//! ```
//!
//! # Order
//!
//! Records of one topic and Kafka key are published in the order their transactions
//! committed: the write of a record takes a transaction-scoped lock on the topic and key
//! (advisory lock class [`LOCK_CLASS`]) before the record is numbered, so a second
//! transaction sending for the same key waits at its commit for the first to end, and a
//! record's number follows the commits. All
//! records of a topic and key are in one of the outbox's [`SHARDS`] shards, and one relay
//! at a time publishes a shard, in that order (see [`Relay`]).
//!
//! All the records of one body are written in one statement at its commit, which takes
//! their locks in one order (by the lock's number): two bodies sending for the same keys
//! in opposite orders wait for each other, and never deadlock on these locks.
//!
//! # Trace context
//!
//! A record sent while a consumer handles a message carries that message's trace
//! (`traceparent`, W3C Trace Context): the incoming `traceparent` header's trace, with a
//! span id of its own; a message without one starts a trace that the consumer's `process`
//! span records as `trace_parent`.
pub mod admin;
mod error;
mod pending;
mod record;
mod relay;
mod trace;

use idem_runtime::CurrentDelivery;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::schema::Schema;
pub use crate::store::outbox::LOCK_CLASS;
use crate::store::outbox::{Insert, Noted, Sends, insert_now, note_sends};
use pending::PendingRecords;

pub use error::OutboxError;
pub use record::Record;
pub use relay::{Relay, RelayBuilder, RelayStats};
pub(crate) use trace::TraceContext;

/// The header that carries a record's idempotency key (the UUID's text, 36 bytes).
pub const KEY_HEADER: &str = "idem-key";

/// The header that carries the trace context (W3C Trace Context).
pub const TRACE_HEADER: &str = "traceparent";

/// The number of shards of the outbox: records are spread over them by topic and Kafka
/// key, and each is published by one relay at a time. Fixed: every release publishes
/// and orders by the same shards.
pub const SHARDS: i16 = 16;

/// Writes `record` into the outbox in `tx`, the transaction of the handler whose body
/// calls it; returns the record's idempotency key. The record is published after `tx`
/// commits, and never if it rolls back.
///
/// In a handler's body the row is written by the body's commit, in the same round trip
/// (after the body's effects, before `COMMIT`, its lock waits bounded by the handle's lock
/// timeout). The send itself notes the record in the transaction, in a round trip that
/// writes nothing: a body that fails does not write it, nor does a savepoint it rolls
/// back, and the part retried after such a rollback sends its records under the same keys
/// again (an unnamed record's position counts only the records the transaction holds). A
/// record whose key the transaction holds already (the same name twice) is refused with
/// [`OutboxError::Invalid`]. Outside a body it is written in `tx` at once.
///
/// The outbox is in the adapter's default schema for the handle the body runs on
/// (`<idem's schema>_kafka`); [`send_all_in`] takes another. Outside a handler's body
/// there is no handle to read it from, and [`send`] uses `idem_kafka`, the default
/// handle's: a handle with another schema sends there with [`send_all_in`] and
/// [`Schema::for_idem`].
///
/// Fails with [`OutboxError::NoDelivery`] outside a transactional handler's body, unless
/// the record has a key of its own ([`Record::idempotency_key`]).
pub async fn send(tx: &mut PgConnection, record: Record) -> Result<Uuid, OutboxError> {
    let mut keys = send_all(tx, [record]).await?;
    Ok(keys.remove(0))
}

/// Writes `records` into the outbox in `tx`, in one statement; returns their
/// idempotency keys, in order. See [`send`].
pub async fn send_all(
    tx: &mut PgConnection,
    records: impl IntoIterator<Item = Record>,
) -> Result<Vec<Uuid>, OutboxError> {
    let current = CurrentDelivery::get();
    let schema = match &current {
        Some(current) => Schema::for_idem(current.idem()),
        None => Schema::named(crate::schema::DEFAULT)
            .map_err(|error| OutboxError::Invalid(error.to_string()))?,
    };
    send_with(&schema, current.as_ref(), tx, records).await
}

/// [`send_all`] into the outbox of `schema` (a consumer built with
/// [`ConsumerBuilder::schema`](crate::ConsumerBuilder::schema)).
pub async fn send_all_in(
    schema: &Schema,
    tx: &mut PgConnection,
    records: impl IntoIterator<Item = Record>,
) -> Result<Vec<Uuid>, OutboxError> {
    send_with(schema, CurrentDelivery::get().as_ref(), tx, records).await
}

async fn send_with(
    schema: &Schema,
    current: Option<&CurrentDelivery>,
    tx: &mut PgConnection,
    records: impl IntoIterator<Item = Record>,
) -> Result<Vec<Uuid>, OutboxError> {
    let records: Vec<Record> = records.into_iter().collect();
    for record in &records {
        check(record)?;
    }
    if records.is_empty() {
        return Ok(Vec::new());
    }
    let (keys, noted) = match current {
        Some(current) => {
            let (keys, token) = body_keys(schema, current, tx, &records).await?;
            (keys, Some(token))
        }
        None => (
            records
                .iter()
                .map(|record| record.idem_key.ok_or(OutboxError::NoDelivery))
                .collect::<Result<Vec<_>, _>>()?,
            None,
        ),
    };
    let trace = TraceContext::current();
    let rows: Vec<Insert> = records
        .into_iter()
        .zip(&keys)
        .map(|(record, key)| row(record, *key, trace.as_ref(), noted))
        .collect();
    let database = match current {
        Some(current) => current
            .idem()
            .pool()
            .connect_options()
            .get_database()
            .unwrap_or_default()
            .to_owned(),
        None => String::new(),
    };
    let wake = wake_relays_now(&database, schema);
    let written = rows.len() as u64;
    match current {
        // In a handler's body: written in its commit's round trip, after its effects, if
        // the send is still part of the transaction then.
        Some(current) => {
            current.at_commit(|pending: &mut PendingRecords| pending.add(schema, rows, wake));
        }
        None => {
            let channel = wake.then(|| relay::channel(schema));
            insert_now(tx, schema, &rows, channel.as_deref())
                .await
                .map_err(OutboxError::Database)?;
        }
    }
    metrics::counter!("idem_outbox_written_total").increment(written);
    Ok(keys)
}

/// The keys of `records`, sent by a handler's body, and the token of their send, noted in
/// its transaction in one round trip ([`note_sends`]): a given key as it is, a named
/// record's derived from its fact and name, an unnamed record's from its position among
/// the unnamed records of its message that the transaction holds (a savepoint rolled back
/// takes its sends' positions back with them). A key that the transaction holds already
/// is refused: the receiving side would take the second record for a duplicate.
async fn body_keys(
    schema: &Schema,
    current: &CurrentDelivery,
    tx: &mut PgConnection,
    records: &[Record],
) -> Result<(Vec<Uuid>, u64), OutboxError> {
    let mut keys: Vec<Option<Uuid>> = Vec::with_capacity(records.len());
    let mut unnamed: Vec<(Uuid, u32)> = Vec::new();
    for record in records {
        let fact = current
            .keys()
            .get(record.message)
            .ok_or_else(|| no_message(current, record.message))?
            .as_uuid();
        keys.push(match (record.idem_key, &record.name) {
            (Some(key), _) => Some(key),
            (None, Some(name)) => current.derived_key(record.message, name),
            (None, None) => {
                match unnamed.iter_mut().find(|(key, _)| *key == fact) {
                    Some((_, count)) => *count += 1,
                    None => unnamed.push((fact, 1)),
                }
                None
            }
        });
    }
    let given: Vec<Uuid> = keys.iter().flatten().copied().collect();
    if let Some(twice) = (1..given.len()).find(|&i| given[..i].contains(&given[i])) {
        return Err(sent_twice(records, &keys, given[twice]));
    }
    let token = next_token();
    let sends = Sends {
        token,
        keys: &given,
        unnamed: &unnamed,
    };
    let mut next = match note_sends(tx, schema, &sends)
        .await
        .map_err(OutboxError::Database)?
    {
        Noted::Sent(before) => before,
        Noted::Again(index) => return Err(sent_twice(records, &keys, given[index])),
    };
    let keys = records
        .iter()
        .zip(keys)
        .map(|(record, key)| match key {
            Some(key) => key,
            None => {
                let fact = current.keys()[record.message].as_uuid();
                let slot = unnamed
                    .iter()
                    .position(|(key, _)| *key == fact)
                    .unwrap_or_default();
                let position = next[slot];
                next[slot] += 1;
                // The message exists: its key was found above.
                current
                    .derived_key(record.message, &format!("#{position}"))
                    .unwrap_or_default()
            }
        })
        .collect();
    Ok((keys, token))
}

/// A number that no other send of this process uses: what a send notes itself by.
fn next_token() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn sent_twice(records: &[Record], keys: &[Option<Uuid>], key: Uuid) -> OutboxError {
    let described = records
        .iter()
        .zip(keys)
        .find(|(_, known)| **known == Some(key))
        .map_or_else(String::new, |(record, _)| match &record.name {
            Some(name) => format!("named {name:?} "),
            None => "with that key given ".to_owned(),
        });
    OutboxError::Invalid(format!(
        "a record {described}for message {} was sent already by this run of the body (key {key}): \
         the receiving side would take the second for a duplicate; give each record a name of its own",
        records
            .iter()
            .zip(keys)
            .find(|(_, known)| **known == Some(key))
            .map_or(0, |(record, _)| record.message)
    ))
}

/// Whether this send also wakes the relays of `schema`'s outbox (in `database`): at most
/// once every 50 ms per process and outbox, since every notifying transaction takes the
/// server's notification lock at its commit. The relays poll besides, so a record sent
/// without a wake-up waits at most a poll.
fn wake_relays_now(database: &str, schema: &Schema) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::{Duration, Instant};
    static LAST: OnceLock<Mutex<HashMap<(String, String), Instant>>> = OnceLock::new();
    let mut last = LAST
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = Instant::now();
    let outbox = (database.to_owned(), schema.as_str().to_owned());
    match last.get(&outbox) {
        Some(at) if now.duration_since(*at) < Duration::from_millis(50) => false,
        _ => {
            last.insert(outbox, now);
            true
        }
    }
}

/// Refuses a record that cannot be published as described.
fn check(record: &Record) -> Result<(), OutboxError> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if record.topic.is_empty()
        || record.topic.len() > 249
        || !record.topic.chars().all(legal)
        || record.topic == "."
        || record.topic == ".."
    {
        return Err(OutboxError::Invalid(format!(
            "a topic name has 1 to 249 characters of [a-zA-Z0-9._-] and is neither \".\" nor \"..\"; got {:?}",
            record.topic
        )));
    }
    if let Some(partition) = record.partition.filter(|partition| *partition < 0) {
        return Err(OutboxError::Invalid(format!(
            "a partition is 0 or above; got {partition}"
        )));
    }
    if let Some((name, _)) = record.headers.iter().find(|(name, _)| name.contains('\0')) {
        return Err(OutboxError::Invalid(format!(
            "a header name cannot hold a NUL character; got {name:?}"
        )));
    }
    if let Some((name, _)) = record.headers.iter().find(|(name, _)| name == KEY_HEADER) {
        return Err(OutboxError::Invalid(format!(
            "the header {name:?} is the outbox's own: it carries the record's idempotency key"
        )));
    }
    if let Some(name) = record.name.as_ref().filter(|name| name.starts_with('#')) {
        return Err(OutboxError::Invalid(format!(
            "a record's name cannot start with '#', which names the unnamed records by their position; got {name:?}"
        )));
    }
    Ok(())
}

/// A record's row, with its key: its shard and lock chosen, the trace context in its
/// headers.
fn row(record: Record, idem_key: Uuid, trace: Option<&TraceContext>, noted: Option<u64>) -> Insert {
    let mut headers = record.headers;
    if let Some(trace) = trace {
        headers.retain(|(name, _)| name != TRACE_HEADER);
        headers.push((TRACE_HEADER.to_owned(), trace.child().into_bytes()));
    }
    let lock = match (&record.key, record.partition) {
        (Some(key), _) => order_hash(&record.topic, key),
        (None, Some(partition)) => order_hash(&record.topic, &partition.to_be_bytes()),
        (None, None) => order_hash(&record.topic, idem_key.as_bytes()),
    };
    let (names, values) = headers.into_iter().unzip();
    Insert {
        shard: shard_of(lock),
        lock: lock as i32,
        topic: record.topic,
        partition: record.partition,
        key: record.key,
        payload: record.payload,
        header_names: names,
        header_values: values,
        idem_key,
        noted,
    }
}

fn no_message(current: &CurrentDelivery, message: usize) -> OutboxError {
    OutboxError::Invalid(format!(
        "the record follows from message {message}, but the body handles {} message(s)",
        current.keys().len()
    ))
}

/// FNV-1a (32 bits) of the topic, a zero byte and `key`: what orders a record, the same in
/// every process and release.
fn order_hash(topic: &str, key: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in topic.as_bytes().iter().chain(&[0]).chain(key) {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

fn shard_of(hash: u32) -> i16 {
    // SHARDS is positive and small: the remainder fits.
    (hash % SHARDS as u32) as i16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_that_cannot_be_published_is_refused_when_sent() {
        let refused = |record: Record| match check(&record) {
            Err(OutboxError::Invalid(why)) => why,
            other => panic!("not refused: {other:?}"),
        };
        assert!(refused(Record::to("")).contains("1 to 249"));
        assert!(refused(Record::to("bad topic!")).contains("[a-zA-Z0-9._-]"));
        assert!(refused(Record::to("t\0")).contains("[a-zA-Z0-9._-]"));
        assert!(refused(Record::to("..")).contains("neither"));
        assert!(refused(Record::to("t").partition(-1)).contains("0 or above"));
        assert!(refused(Record::to("t").header("a\0b", "v")).contains("NUL"));
        assert!(refused(Record::to("t").header(KEY_HEADER, "v")).contains("the outbox's own"));
        assert!(refused(Record::to("t").name("#0")).contains("cannot start with '#'"));
        assert!(check(&Record::to("ok.topic_1-a").header("h", b"\0\xff")).is_ok());
    }

    #[test]
    fn records_of_one_topic_and_key_share_a_shard_and_a_lock() {
        let a = order_hash("receipts", b"order-1");
        assert_eq!(a, order_hash("receipts", b"order-1"));
        assert_ne!(a, order_hash("receipts", b"order-2"));
        assert_ne!(a, order_hash("receipt", b"sorder-1"));
        // Fixed across releases: a stored record's shard never moves.
        assert_eq!(order_hash("receipts", b"order-1"), 322_501_034);
        assert!((0..SHARDS).contains(&shard_of(a)));
    }
}
