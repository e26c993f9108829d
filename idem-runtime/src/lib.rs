//! Idempotent message handlers over PostgreSQL.
//!
//! `#[idempotent]` rewrites an async handler so that every delivery of the same business
//! fact has its effects applied exactly once, however often and however concurrently the
//! message arrives:
//!
//! ```no_run
//! use idem_runtime::{idempotent, Idem, Outcome};
//! use sqlx::PgConnection;
//!
//! struct OrderEvent {
//!     order_id: String,
//!     event_type: String,
//!     amount_cents: i64,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Receipt {
//!     payment_id: i64,
//! }
//!
//! #[idempotent(key = "order_id, event_type", fingerprint = "amount_cents")]
//! async fn apply_payment(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
//!     let payment_id = sqlx::query_scalar(
//!         "INSERT INTO payments (order_id, amount_cents) VALUES ($1, $2) RETURNING id",
//!     )
//!     .bind(&event.order_id)
//!     .bind(event.amount_cents)
//!     .fetch_one(&mut *tx)
//!     .await?;
//!     Ok(Receipt { payment_id })
//! }
//!
//! # async fn consume(idem: &Idem, event: &OrderEvent) -> Result<(), idem_runtime::Error<sqlx::Error>> {
//! // Called with the runtime handle in place of the connection:
//! match apply_payment(idem, event).await? {
//!     Outcome::Executed(receipt) => println!("paid: {}", receipt.payment_id),
//!     Outcome::Duplicate(receipt) => println!("already paid: {:?}", receipt.map(|r| r.payment_id)),
//! }
//! # Ok(()) }
//! ```
//!
//! # What the attribute generates
//!
//! The handler above becomes, in outline (the real expansion names its items through
//! `idem_runtime::__private_v<version>`, a hidden module that is not a public API: see
//! [Semver](#semver)):
//!
//! ```text
//! async fn apply_payment(idem: &Idem, event: &OrderEvent) -> Result<Outcome<Receipt>, Error<sqlx::Error>> {
//!     const SPEC: HandlerSpec = HandlerSpec::new(concat!(module_path!(), "::apply_payment"))
//!         .declared_in(module_path!());
//!     let key = KeyBuilder::new()                       // the key's fields, in order
//!         .part("order_id", &event.order_id)?
//!         .part("event_type", &event.event_type)?
//!         .finish();
//!     let fingerprint = KeyBuilder::fingerprint().part("amount_cents", &event.amount_cents)?.digest();
//!     run_transactional(idem, &SPEC, key, Some(fingerprint), JsonResult, move |mut transaction| async move {
//!         let result = {
//!             let tx: &mut PgConnection = &mut *transaction;
//!             /* the original body, unchanged */
//!         };
//!         (transaction, result)
//!     })
//!     .await
//! }
//! ```
//!
//! - The first parameter (`tx: &mut PgConnection`) becomes `&Idem`; the other parameters
//!   stay. The message is the second parameter; its fields named in `key` are checked at
//!   compile time.
//! - The return type `Result<T, E>` becomes [`Handled<Result<T, E>>`](Handled), that is
//!   `Result<Outcome<T>, Error<E>>`.
//! - The body runs as written (`?` and `return` behave as in the original function) on
//!   the transaction's connection, and may run again after a serialization failure or a
//!   deadlock rolled an earlier run back (and, in a batch, again on its own after another
//!   message failed). Each run takes its own clone of the parameters taken by value (an
//!   owned message, `limits: Limits`): they must be `Clone` (the compile error says why),
//!   and the body may move out of its copy. A lease-mode body runs once and takes its
//!   parameters as they are.
//! - The key is also checked at compile time to hold a field that is not a timestamp
//!   (see [`key`](key#keys-made-only-of-timestamps)).
//! - With `mode = "lease"` the handler takes an optional `lease: &Lease` guard instead of
//!   the connection and runs the [`lease`] protocol; with `batch = true` a second
//!   function `<handler>_batch(&Idem, &[Message], ...)` returns
//!   [`BatchOutcomes`](batch::BatchOutcomes) and runs the body once per new message of
//!   the batch (see [`batch`]).
//! - A handler whose message parameter is a slice of references, `&[&Message]`, is a
//!   *batch handler* (below): it becomes `handler(&Idem, &[Message], ...)`.
//!
//! # Batch handlers
//!
//! When the body can write many messages at once (one multi-row `INSERT` for the whole
//! batch), take the messages as a slice: the body then runs **once per batch**, with the
//! messages whose keys are new, in the order of the batch.
//!
//! ```no_run
//! use idem_runtime::{idempotent, Idem, Outcome};
//! use sqlx::PgConnection;
//!
//! struct OrderEvent {
//!     order_id: String,
//!     event_type: String,
//!     amount_cents: i64,
//! }
//!
//! #[idempotent(key = "order_id, event_type", fingerprint = "amount_cents")]
//! async fn record_orders(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
//!     let ids: Vec<&str> = events.iter().map(|e| e.order_id.as_str()).collect();
//!     let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
//!     let amounts: Vec<i64> = events.iter().map(|e| e.amount_cents).collect();
//!     sqlx::query(
//!         "INSERT INTO order_effects (order_id, event_type, amount_cents) \
//!          SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
//!     )
//!     .bind(&ids)
//!     .bind(&types)
//!     .bind(&amounts)
//!     .execute(&mut *tx)
//!     .await?;
//!     Ok(())
//! }
//!
//! # async fn consume(idem: &Idem, batch: &[OrderEvent]) {
//! // The whole batch in, one outcome per message out, in order.
//! let outcomes = record_orders(idem, batch).await;
//! for (event, outcome) in batch.iter().zip(outcomes) {
//!     match outcome {
//!         Ok(Outcome::Executed(())) => println!("{}: recorded", event.order_id),
//!         Ok(Outcome::Duplicate(_)) => println!("{}: recorded before", event.order_id),
//!         Err(error) => println!("{}: {error} ({:?})", event.order_id, error.disposition()),
//!     }
//! }
//! # }
//! ```
//!
//! - The slice parameter makes the batch handler: no argument is needed. It must be
//!   `&[&Message]` (the body gets the new messages only, borrowed from the caller's
//!   `&[Message]`); `&[Message]`, `Vec<..>` or a lease-mode batch handler are compile
//!   errors that say so.
//! - `key` and `fingerprint` name fields of `Message`, checked at compile time; each
//!   message is keyed, fingerprinted and decided on its own. Duplicates (in the table or
//!   earlier in the same batch), parked keys, payload mismatches and key errors never
//!   reach the body; when no message is new, the body does not run and nothing is
//!   written. `scope`, `max_attempts` and the parameters after the slice work as for a
//!   handler of one message.
//! - The handler returns `Result<(), E>`: one body run covers many messages, so there is
//!   no value per message to return or to replay, and duplicates get
//!   `Outcome::Duplicate(None)`. Another `Ok` type is a compile error, and so are
//!   `store_result`, `batch = true`, `cache` and `cache_ttl`. For a value per message,
//!   write a handler of one message with `batch = true`.
//! - All keys are claimed in one statement and everything commits once. If the body
//!   fails, the batch rolls back and its new messages are processed one at a time (the
//!   body receiving a slice of one), so that only the failing message records its
//!   failure: see [`batch`].
//!
//! # Attribute arguments
//!
//! | argument | meaning |
//! |----------|---------|
//! | `key = "a, b.c"` or `key(a, b.c)` | **required**: the message fields (paths) that identify the business fact, in order. A field named with a keyword is `type` or `r#type`, a tuple field its index (`pair.0`). Written as identifiers, the fields follow an IDE's renames, and the compiler's errors and suggestions ("a field with a similar name exists") point at the field at fault; inside a string, stable Rust underlines the whole string, and the errors name the field (or its type). `None` in an `Option` field is [`Error::Key`] at run time |
//! | `scope = "name"` | the handler's stable identity in the status table; default: the handler's module path and name (`concat!(module_path!(), "::apply_payment")`, such as `billing::apply_payment`). Renaming or moving the function changes the default scope: the moved handler is refused at its first delivery ([`Error::HandlerMoved`]) until it names its old scope here (see [`scope`]) |
//! | `event_time = "at"` or `event_time(at)` | keeps the handler's keys by the fact's own time, in hourly time buckets that the cleanup drops whole, instead of the status table: see [`time_buckets`]. It names one of the `key` fields (a path too, `"meta.at"`; compile errors otherwise), of type chrono's `DateTime<Utc>`, `DateTime<Local>` or `DateTime<FixedOffset>` (any `DateTime<Tz>`: the instant counts, not the zone), `NaiveDateTime` (read as UTC), `std::time::SystemTime`, or an `Option`, `&` or `Box` of one (`None` has no time: the key cannot be derived). A fact older than the scope's window, or further ahead than the future bound, is refused ([`Error::OutsideWindow`]) and never run. Added to a scope with keys in the status table, it is declared with `previous_key` |
//! | `previous_key = "a, b"` or `previous_key(a, b)` | a declared change of `key`: the fields the scope's keys were derived from before. A delivery is a duplicate when its fact succeeded under either definition; both keys are claimed in the one transaction, so builds of the old and the new key deliver each fact once between them. Without it, a changed key is refused ([`Error::KeyChanged`]) while the scope has keys. Transaction mode only; remove it once no fact of the old key can be delivered again (see [`scope`]). With `event_time`, it also declares the move of the keys from the status table into the time buckets (the same fields when only `event_time` is new): see [`time_buckets`] |
//! | `previous_event_time = "at"` | with `event_time` and `previous_key`: the previous definition kept its keys by the fact's time too, so the previous keys are in the fact's bucket instead of the status table. It names the field `event_time` names, one of `previous_key`'s fields (compile errors otherwise) |
//! | `shared_scope = true` | with `scope`: other handlers use the same scope on purpose, and each says so; without it, two handlers on one scope are refused at their first run (`Error::ScopeConflict`). Without `scope`, a compile error |
//! | `fingerprint = "x, y"` or `fingerprint(x, y)` | payload fields compared on every duplicate: the same key with other values is [`Error::PayloadMismatch`]. `None` in an `Option` field is a value here ([`KeyBuilder::fingerprint`](key::KeyBuilder::fingerprint)) |
//! | `max_attempts = 3` | failed attempts before the key is parked (default: the runtime's, 5) |
//! | `store_result = false` | do not store the result; duplicates get `Outcome::Duplicate(None)` and the result type need not be serde. A handler returning `Result<(), E>` stores nothing either way, and its duplicates get `Outcome::Duplicate(Some(()))` |
//! | `mode = "lease"`, `lease = "30s"` | lease mode, for effects outside the database: see [`lease`] |
//! | `batch = true` | also generate `<handler>_batch` over a slice of messages, running the body once per new message: see [`batch`]. A batch handler (message parameter `&[&Message]`, see [above](#batch-handlers)) needs no argument and runs its body once per batch |
//! | `cache = false`, `cache_ttl = "30m"` | feature `redis`: this handler skips the Redis cache of duplicates, or keeps its entries that long (default: the handle's TTL); see [`cache`]. Without the feature, a compile error names it |
//! | `retention = "30d"` | how long the handler's `success` keys are kept before the retention cleanup may delete them (units `ms`, `s`, `m`, `h`, `d`; default: the cleaner's window, 7 days); recorded with the scope in the database, where every cleaner reads it: see [`retention`] |
//! | `key_fn = "name"`, `key_fn = false` | the name of the key function generated next to the handler (default, or `key_fn = true`: `<handler>_key`; see [below](#the-key-of-a-message-for-callers)), for a name that clashes with an item of yours; `false` generates none, as a method of a trait impl needs. The name must be an identifier (a keyword as `r#type`), neither the handler's nor its `_batch` variant's |
//! | `crate = "path"` | where `idem_runtime` is, when the dependency is renamed |
//!
//! # The key of a message, for callers
//!
//! Next to every handler, the attribute generates `<handler>_key(&message)`, with the
//! handler's visibility: the [`HandlerKey`] the handler derives from the message (its
//! scope, the message's [`IdempotencyKey`] and payload fingerprint), or [`KeyError`]
//! when a key field is `None`. Producers that stamp keys, consumers that track
//! positions, tests and tools call it rather than deriving the key again with
//! [`KeyBuilder`](key::KeyBuilder), so that they follow the handler's `key`, `fingerprint`
//! and `scope`. In an `impl` it is an associated function (`Payments::apply_key(&event)`);
//! for a batch handler it takes one message; it is generic over those of the handler's
//! type parameters that the message's type names.
//!
//! The name is the handler's with `_key` appended, next to the handler: an item of yours
//! of that name (a handler `rotate` next to your `rotate_key`) is a compile error, "the
//! name `rotate_key` is defined multiple times", pointing at the handler's name. Name the
//! key function otherwise with `key_fn = "other_name"`, or generate none with
//! `key_fn = false`.
//!
//! In a trait impl, set `key_fn = false`: the key function would be an item that the
//! trait does not declare ("method `apply_key` is not a member of trait"). The handler
//! itself implements a trait method whose signature is the rewritten one:
//!
//! ```no_run
//! use idem_runtime::{idempotent, Handled, Idem};
//! use sqlx::PgConnection;
//! # struct OrderEvent { order_id: String }
//!
//! trait Apply {
//!     async fn apply(&self, idem: &Idem, event: &OrderEvent) -> Handled<Result<(), sqlx::Error>>;
//! }
//!
//! struct Payments;
//!
//! impl Apply for Payments {
//!     #[idempotent(key = "order_id", key_fn = false)]
//!     async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
//!         # let _ = (tx, &event.order_id);
//!         Ok(())
//!     }
//! }
//! ```
//!
//! The default scope of such a handler is its module path and the method's name, the
//! same for every impl of the trait in that module: give each impl its own
//! `scope = "..."`, or the second one to run gets [`Error::ScopeConflict`]. `batch = true`
//! would add `apply_batch`, which the trait does not declare either.
//!
//! # Guarantees
//!
//! - Effects written through the handler's connection are applied exactly once per
//!   `(scope, key)`: the claim, the effects and the `success` commit together.
//! - A concurrent delivery of the same key waits for the first one's transaction, then
//!   sees `success` (a duplicate) or, if it failed, retries. It waits at most the lock
//!   timeout, then returns [`Error::InProgress`].
//! - A handler error rolls the effects back and records `failed`, the error text and the
//!   attempts; after `max_attempts` the key is parked.
//! - A dropped future (a cancelled task, a timeout) rolls its transaction back: no claim
//!   is left behind (in transaction mode; in lease mode the key is held until its lease
//!   expires).
//! - Effects outside the database (HTTP calls, e-mails) are *not* covered: they may repeat
//!   when a transaction rolls back after them.
//! - With the `redis` feature and a cache on the handle (`IdemBuilder::redis`), a
//!   duplicate of a succeeded key is answered from Redis without a query to PostgreSQL;
//!   only committed successes are cached, and Redis being down or slow only sends
//!   deliveries back to PostgreSQL: see [`cache`].
//!
//! # Semver
//!
//! From 1.0, a minor or patch release keeps working what this covers:
//!
//! - the items these docs show: the root's re-exports and the public modules (`admin`,
//!   `batch`, `cache`, `config`, `key`, `lease`, `migrations`, `privileges`, `retention`,
//!   `scope`, `telemetry`, `time_buckets`, and `testing` with its feature), their types,
//!   functions and
//!   documented behaviour;
//! - the arguments of `#[idempotent]` and `#[derive(KeyPart)]`, and the signatures of the
//!   functions they generate (the handler taking `&Idem`, returning
//!   [`Handled`]; `<handler>_batch` returning [`BatchOutcomes`](batch::BatchOutcomes);
//!   `<handler>_key` returning [`HandlerKey`]);
//! - the key encoding ([`key`]: a message keyed today gets the same key from every later
//!   1.x), the status table's stored format and its migrations ([`MIGRATOR`]): a release
//!   only adds migrations, which [`Idem::migrate`] applies, reads what earlier releases
//!   wrote, and keeps working on the schema of the next release (a rolling upgrade, a
//!   rollback); the default scope of every handler shape, and what a scope records of
//!   its handler and key definition;
//! - the metric names and labels listed in [`telemetry`] (labels may be added).
//!
//! Not covered: `idem_runtime::__private_v<version>`, the hidden module that generated
//! code refers to (its name changes with every release, and idem-macros is pinned to the
//! runtime's version, so generated code always meets its own); the text of error messages
//! and logs; how the `testing` kit (feature `testing`) arranges its faults inside the
//! runtime (its `Fault`s and what they do to a delivery are covered). `redis`, with
//! the feature, is a public dependency: see [`cache::redis`](cache).

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
pub mod batch;
pub mod cache;
pub mod config;
mod current;
mod duplicate_rate;
mod error_text;
mod faults;
mod handle;
mod handler;
mod inflight;
pub mod key;
mod key_transaction;
pub mod lease;
pub mod migrations;
mod outcome;
mod private;
pub mod privileges;
mod registry;
pub mod retention;
mod runtime;
pub mod scope;
mod store;
pub mod telemetry;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
pub mod time_buckets;
mod transactional;

pub use config::{Config, ConfigError, ErrorTexts, Pooler};
pub use current::{AtCommit, CurrentDelivery};
pub use error_text::{ErrorChain, storable_text_of};
pub use handle::IdemBuilder;
pub use idem_macros::{KeyPart, idempotent};
pub use key::{HandlerKey, IdempotencyKey, KeyError};
pub use outcome::{Disposition, Error, Handled, HandlerError, HandlerResult, Outcome, WindowEdge};
pub use runtime::Idem;
pub use store::{KeyRecord, MIGRATOR, Status, UnknownStatus};

// `#[doc(hidden)] pub mod __private_v<version>`: what the code generated by `#[idempotent]`
// and `#[derive(KeyPart)]` refers to, under a name that build.rs derives from this
// package's version. idem-macros (pinned with `=`) derives the same name from its own
// version, so generated code never meets a runtime of another version. Not a public API.
include!(concat!(env!("OUT_DIR"), "/private.rs"));
