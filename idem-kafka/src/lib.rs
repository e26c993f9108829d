//! A Kafka consumer-group member for idempotent handlers of [idem](idem_runtime).
//!
//! Write the handler with `#[idempotent]`, say how a payload decodes and which handler a
//! message goes to ([`Handler`]), and let a [`Consumer`] do the rest:
//!
//! - offsets are committed only after the handler's transaction committed, or stored in
//!   PostgreSQL by that transaction itself ([`OffsetStore::Postgres`]);
//! - what can never succeed (undecodable, no key, a key first applied with another
//!   payload, a parked key) goes to the dead-letter table `kafka_dead_letters`, and the
//!   consumer moves on;
//! - what may succeed later (the database is down, the key is in flight elsewhere) is
//!   retried with a back-off, without committing past it;
//! - the partitions a member holds are worked in parallel, each in order, one delivery
//!   in flight per partition, at most [`max_in_flight`](ConsumerBuilder::max_in_flight)
//!   at once;
//! - rebalances finish the revoked partitions' deliveries in flight, then commit (and
//!   store) what they processed; a graceful shutdown finishes the deliveries in flight
//!   and leaves the group;
//! - each message (or batch) is handled in a `process <topic>` span after the
//!   OpenTelemetry messaging conventions, with idem's outcome on it.
//!
//! ```no_run
//! use idem_kafka::{Consumer, Fate, Handler, Position};
//! use idem_runtime::{Idem, idempotent};
//! use sqlx::PgConnection;
//!
//! #[derive(serde::Deserialize)]
//! struct Payment { order_id: String, amount_cents: i64 }
//!
//! #[idempotent(key = "order_id", fingerprint = "amount_cents")]
//! async fn record_payment(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO payments (order_id, amount_cents) VALUES ($1, $2)")
//!         .bind(&payment.order_id)
//!         .bind(payment.amount_cents)
//!         .execute(&mut *tx)
//!         .await
//!         .map(|_| ())
//! }
//!
//! struct Payments;
//!
//! impl Handler for Payments {
//!     type Message = Payment;
//!     fn decode(&self, payload: &[u8]) -> Result<Payment, String> {
//!         idem_kafka::decode_json(payload)
//!     }
//!     async fn handle(&self, idem: &Idem, payment: &Payment, _: Option<&Position>) -> Fate {
//!         Fate::of(record_payment(idem, payment).await)
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idem::new(sqlx::PgPool::connect("postgres://localhost/app").await?);
//! idem.migrate().await?;
//! let consumer = Consumer::builder("127.0.0.1:9092", "payments", "payments").build(idem, Payments)?;
//! consumer.migrate().await?;
//! consumer.run(idem_kafka::shutdown_signal()).await?;
//! # Ok(()) }
//! ```
//!
//! # Tables
//!
//! [`Consumer::migrate`] (or [`migrate`]) creates the offset table `kafka_offsets`, the
//! dead-letter table `kafka_dead_letters` and the outbox (`kafka_outbox`, with its relays'
//! leases in `kafka_outbox_relays`; see [`outbox`]) in a schema of their own, `<idem's schema>_kafka`
//! (`idem_kafka` by default): the adapter issues no SQL against idem's tables, and asks
//! idem's handle what it needs ([`Idem::done_keys`](idem_runtime::Idem::done_keys)).
//! Read them through the crate, not by their names: [`dead_letters`] (what was set
//! aside, with its bytes) and [`stored_offsets`].
#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch_positions;
mod builder;
mod consumer;
mod context;
mod dead_letter;
mod delivery;
mod dispatch;
mod error;
mod fate;
mod group_view;
mod handler;
mod handover;
mod headway;
mod lanes;
mod offset_store;
pub mod outbox;
mod position;
mod position_behind;
mod progress;
mod received;
mod schema;
mod settings;
mod shutdown;
mod stall_watch;
mod stats;
mod store;
mod telemetry;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod test_util;
mod worker;

pub use batch_positions::BatchPositions;
pub use builder::ConsumerBuilder;
pub use consumer::Consumer;
pub use dead_letter::DeadLetter;
pub use error::ConsumerError;
pub use fate::{Fate, Reason};
pub use group_view::{PartitionLag, group_lag};
pub use handler::{Handler, decode_json};
pub use headway::PartitionHeadway;
pub use offset_store::OffsetStore;
pub use position::Position;
pub use position_behind::PositionBehind;
pub use received::{Keyed, Received};
pub use schema::{MIGRATOR, Schema, migrate};
pub use shutdown::shutdown_signal;
pub use stats::{Snapshot, Stats, caught_up};
pub use store::{dead_letters, stored_offsets};
