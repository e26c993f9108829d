//! Tests of idempotent handlers (feature `testing`): deliver a message and check what
//! idempotence promises, race deliveries, and turn faults on around a handler.
//!
//! Add the kit to the dev-dependencies, with sqlx's test macro:
//!
//! ```toml
//! [dev-dependencies]
//! idem-runtime = { version = "0.1", features = ["testing"] }
//! sqlx = { version = "0.8", features = ["runtime-tokio", "postgres", "macros", "migrate"] }
//! ```
//!
//! Each `#[sqlx::test]` gets a database of its own, created from `DATABASE_URL` with the
//! crate's `migrations/` applied (the business tables); [`idem`] migrates idem's status
//! table in it. The effects of a handler are counted by a query the test supplies
//! ([`Effects`]), before and after the deliveries each check makes.
//!
//! # Testing the README's handler
//!
//! ```no_run
//! use idem_runtime::testing::{self, Effects, Fault};
//! use idem_runtime::{Outcome, idempotent};
//! use sqlx::{PgConnection, PgPool};
//!
//! #[derive(Debug, Clone)]
//! struct OrderEvent {
//!     order_id: String,
//!     event_type: String,
//!     amount_cents: i64,
//! }
//!
//! #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
//! struct Receipt {
//!     payment_id: i64,
//! }
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error(transparent)]
//! struct PaymentError(#[from] sqlx::Error);
//!
//! #[idempotent(key = "order_id, event_type")]
//! async fn apply_payment(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, PaymentError> {
//!     let payment_id = sqlx::query_scalar("INSERT INTO payments (order_id, cents) VALUES ($1, $2) RETURNING id")
//!         .bind(&event.order_id)
//!         .bind(event.amount_cents)
//!         .fetch_one(&mut *tx)
//!         .await?;
//!     Ok(Receipt { payment_id })
//! }
//!
//! fn paid(order_id: &str) -> OrderEvent {
//!     OrderEvent { order_id: order_id.into(), event_type: "paid".into(), amount_cents: 4200 }
//! }
//!
//! fn payments() -> Effects {
//!     Effects::query("SELECT count(*) FROM payments")
//! }
//!
//! // Delivered twice: executed once, one payment, the receipt replayed.
//! #[sqlx::test]
//! async fn a_payment_applies_once(pool: PgPool) {
//!     let idem = testing::idem(pool).await;
//!     let event = paid("o-1");
//!     let receipt = testing::assert_idempotent(&idem, &payments(), || apply_payment(&idem, &event)).await;
//!     assert!(receipt.payment_id > 0);
//! }
//!
//! // Eight consumers on as many machines receive the same event at once.
//! #[sqlx::test]
//! async fn racing_consumers_apply_it_once(pool: PgPool) {
//!     let idem = testing::idem(pool).await;
//!     let event = paid("o-2");
//!     let consumers = testing::processes(&idem, 8);
//!     let report = testing::assert_race_applies_once(&idem, &payments(), 8, |i| {
//!         apply_payment(&consumers[i], &event)
//!     })
//!     .await;
//!     println!("{report}");
//! }
//!
//! // Crashes and failovers around the handler: the payment is still applied once.
//! #[sqlx::test]
//! async fn faults_lose_and_double_nothing(pool: PgPool) {
//!     let idem = testing::idem(pool).await;
//!     for (n, fault) in [Fault::FailBeforeCommit, Fault::KillBackendInBody, Fault::KillBackendDuringCommit]
//!         .into_iter()
//!         .enumerate()
//!     {
//!         let event = paid(&format!("o-fault-{n}"));
//!         testing::assert_survives(&idem, fault, &payments(), || apply_payment(&idem, &event)).await;
//!     }
//! }
//!
//! // The delivery dropped at each point where it waits (a cancelled task, a timeout).
//! #[sqlx::test]
//! async fn dropped_deliveries_leave_nothing_behind(pool: PgPool) {
//!     let idem = &testing::idem(pool).await;
//!     testing::assert_survives_drops(idem, &payments(), |n| async move {
//!         apply_payment(idem, &paid(&format!("o-drop-{n}"))).await
//!     })
//!     .await;
//! }
//! ```
//!
//! Each check panics with what differed: which delivery, what it returned, the effect
//! counts before and after. A handler that is not idempotent fails them: a function that
//! inserts on every call fails [`assert_idempotent`]; a handler that writes its effect
//! outside its transaction (through the pool, or to another system in transaction mode)
//! fails [`assert_survives`] with [`Fault::FailBeforeCommit`].
//!
//! # Faults
//!
//! [`inject`] arms a [`Fault`] on a runtime handle; the next delivery through it that
//! reaches the fault's point fires it. The points exist only in builds with the feature
//! `testing`: a production build has neither the slot nor the checks.
//!
//! | fault | mode | what happens |
//! |-------|------|--------------|
//! | [`Fault::FailBeforeCommit`] | transaction, batch | the connection is lost after the body returned `Ok`, before `COMMIT` |
//! | [`Fault::KillBackendInBody`] | transaction | the body's backend is terminated while the body runs |
//! | [`Fault::KillBackendDuringCommit`] | transaction | the backend is terminated while `COMMIT` is in flight; either may win |
//! | [`Fault::AbandonLease`] | lease | the worker vanishes after its claim, holding the lease until it expires |
//! | [`Fault::AbandonLeaseAfterBody`] | lease | the worker vanishes after the effect, before `success` is recorded |
//!
//! Dropping a delivery needs no fault: [`assert_survives_drops`] drops it at each point
//! where it waits.
//!
//! # What each check catches
//!
//! | handler bug | caught by |
//! |-------------|-----------|
//! | the effect applied on every delivery (no idempotency at all) | every check |
//! | the effect written outside the handler's transaction (through the pool, by a spawned task) | [`assert_survives`] with [`Fault::FailBeforeCommit`] or [`Fault::KillBackendInBody`], [`assert_survives_drops`] |
//! | a failed statement swallowed, `Ok` returned | [`assert_idempotent`] (the commit refuses it) |
//! | a key that changes between deliveries (a timestamp, a random id) | [`assert_idempotent`] |
//! | lease mode: the effect sent without [`Lease::key`](crate::lease::Lease::key) as its idempotency key | [`assert_survives`] with [`Fault::AbandonLeaseAfterBody`] (always); [`assert_survives_drops`] only when a drop lands between the effect and `success`, which a run may miss |
//!
//! # Writing the checks
//!
//! - **Effects are counted in the database**: [`Effects`] runs a query that returns one
//!   count (`SELECT count(*) FROM ...`), once per effect. A sum (of amounts, of balances)
//!   does not count deliveries; a stand-in for an external system records each call in a
//!   table so that its calls can be counted.
//! - **Bind the message first**: the closure returns the delivery's future, which borrows
//!   the message; a message built inside the closure is a temporary it cannot return
//!   (`E0515`). Write `let event = paid("o-1");` and `|| apply_payment(&idem, &event)`, or
//!   an `async move` block that owns the message, as [`assert_survives_drops`]'s closure
//!   above does.
//! - **Batch handlers** (`batch = true`) are checked one message at a time through their
//!   `_batch` function:
//!   `|| async { apply_payment_batch(&idem, std::slice::from_ref(&event)).await.into_iter().next().unwrap() }`.
//! - **One handle per fault**: a fault fires on deliveries through the handle it is
//!   armed on, not through the handles of [`processes`].
//!
//! # Lower-level tools
//!
//! [`race`] delivers a message concurrently and reports the outcomes without judging
//! them; [`processes`] gives handles that race in PostgreSQL rather than inside the
//! process. [`Checkpoint`] pauses a handler body where a test wants it, [`count_rows`]
//! counts a table's rows, and [`wait_for_lease_expiry`] waits for a lease to expire on
//! the database's clock.

mod assertions;
mod brief;
mod cancel;
mod checkpoint;
mod database;
mod deliveries;
pub(crate) mod faults;
mod keys;
mod race;
mod survive;

pub use assertions::assert_idempotent;
pub use cancel::{Drops, assert_survives_drops};
pub use checkpoint::Checkpoint;
pub use database::{Effects, count_rows, idem, idem_with, processes, wait_for_lease_expiry};
pub use faults::{Fault, Injection, inject};
pub use race::{RaceReport, assert_race_applies_once, race};
pub use survive::{Survival, assert_survives};
