//! Batches: many messages' keys claimed in one statement and committed once.
//!
//! A Kafka consumer receives messages in batches of hundreds. One transaction per message
//! caps throughput at the database's commit rate (one disk sync each); a batch pays one
//! commit for all its messages and keeps every guarantee per message:
//!
//! 1. the keys are derived; a message whose key cannot be derived gets [`Error::Key`],
//!    and a message whose key appeared earlier in the batch is a duplicate of that one
//!    (it gets the first one's outcome; with another payload fingerprint,
//!    [`Error::PayloadMismatch`]);
//! 2. `BEGIN`, then one statement claims every key (`INSERT ... SELECT FROM unnest(...)
//!    ON CONFLICT DO NOTHING`, in key order so that concurrent batches cannot deadlock)
//!    and reads the rows in the way; `failed` keys are taken over in one more statement.
//!    A key in the way that succeeded, is parked or has another payload is decided there,
//!    without running the body for its message;
//! 3. the body runs for the claimed messages on the same connection;
//! 4. one `COMMIT` makes all effects and all `success` rows visible together.
//!
//! Two kinds of handler use this path:
//!
//! - a per-message handler with `#[idempotent(batch = true)]`, whose generated
//!   `<handler>_batch` runs the body once per claimed message, in order, and stores each
//!   result (one statement for all of them) before the commit;
//! - a **batch handler**, whose message parameter is a slice
//!   (`events: &[&OrderEvent]`). Its body runs **once** per batch, with all the claimed
//!   messages, in message order, so that it can write them in one statement (a
//!   multi-row `INSERT ... SELECT FROM unnest(...)`). If no message is new, the body is
//!   not called and nothing is written. It returns `Result<(), E>`: one body run covers
//!   many messages, so there is no value per message to return or to store, and
//!   duplicates get [`Outcome::Duplicate(None)`](Outcome::Duplicate).
//!
//! **When a body fails** (or PostgreSQL reports a serialization failure, a deadlock or a
//! lock timeout, or the commit fails), the batch transaction rolls back as a whole and the
//! claimed messages are processed again one by one, each in a transaction of its own as a
//! handler of one message runs (a batch handler's body then gets a slice of one message): the failing message records its failure (attempts, and `parked`
//! after `max_attempts`), the others commit on their own. Messages already decided by the
//! claim (duplicates, parked keys, payload mismatches) keep that decision. The happy path
//! pays nothing for this (no savepoint per message, which would cost two round trips
//! each), and no message is lost or applied twice. The price is on the failure path: the
//! body's work for the whole batch is done again, message by message, so a body that
//! fails often should not be run in large batches.
//!
//! **Keys kept by the fact's time** (`event_time`, see [`time_buckets`](crate::time_buckets)):
//! the claim statement names each key's fact's time and inserts it in that fact's bucket
//! of `idem_timed_keys`, so one batch may span several buckets. Only the facts inside
//! their scope's window are inserted: a fact older than the window, or further ahead than
//! the future bound, with no final row of its key (none, or a `failed` one) gets
//! [`Error::OutsideWindow`] alone and never runs, while the rest of the batch goes on. A
//! claim that finds a bucket missing rolls back, makes the batch's buckets (one
//! statement, safe for concurrent creators and behind a transaction pooler) and claims
//! again; the facts the database refuses then (older than the buckets that expired) are
//! refused as outside their window. The takeover of `failed` keys, the results stored
//! and the one-by-one pass name each key's time as well.
//!
//! The Redis cache of duplicates (feature `redis`) is not consulted by the batch
//! statement, which decides all keys in one round trip anyway; the one-by-one pass after a
//! rollback uses it as a handler of one message does.

use crate::outcome::{Error, Outcome};

mod claim;
mod done;
mod pass;
mod plan;
pub(crate) mod protocol;
mod timed;

/// The outcome of each message of a batch, in the order of the messages: what a
/// `<handler>_batch` (`batch = true`) and a batch handler return.
pub type BatchOutcomes<T, E> = Vec<Result<Outcome<T>, Error<E>>>;
