//! What the batch handler tests share: a bulk write of order events, a log of the slices
//! the body received, and the business rows as committed.

#![allow(dead_code)]

use std::sync::Mutex;

use super::orders::OrderEvent;
use sqlx::{PgConnection, PgPool};

/// The order ids of every slice a batch handler's body received, in call order.
#[derive(Debug, Default)]
pub struct Calls(Mutex<Vec<Vec<String>>>);

impl Calls {
    /// In the body: logs the slice it received.
    pub fn record(&self, events: &[&OrderEvent]) {
        let ids = events.iter().map(|e| e.order_id.clone()).collect();
        self.0.lock().unwrap().push(ids);
    }

    /// The slices received so far, as order ids.
    pub fn all(&self) -> Vec<Vec<String>> {
        self.0.lock().unwrap().clone()
    }

    /// How many times the body ran.
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Writes one `order_effects` row per event with one statement, in the order of `events`.
pub async fn insert_all(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let ids: Vec<&str> = events.iter().map(|e| e.order_id.as_str()).collect();
    let amounts: Vec<i64> = events.iter().map(|e| e.amount_cents).collect();
    sqlx::query(
        "INSERT INTO order_effects (order_id, event_type, amount_cents) \
         SELECT order_id, 'paid', amount_cents \
         FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS e(order_id, amount_cents, n) \
         ORDER BY n",
    )
    .bind(&ids)
    .bind(&amounts)
    .execute(tx)
    .await?;
    Ok(())
}

/// The committed business rows, `(order_id, amount_cents)`, in insertion order.
pub async fn effects(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT order_id, amount_cents FROM order_effects ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A batch of `paid` events, one per `(order_id, amount_cents)`, in order.
pub fn paid_batch(orders: &[(&str, i64)]) -> Vec<OrderEvent> {
    orders
        .iter()
        .map(|&(order, amount)| super::testing::paid(order, amount))
        .collect()
}

/// `ids` as owned strings, to compare with [`Calls::all`].
pub fn ids(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|&id| id.to_owned()).collect()
}

/// The outcomes of a batch in which no message may fail.
pub fn all_ok<E: std::fmt::Debug>(
    outcomes: idem_runtime::batch::BatchOutcomes<(), E>,
) -> Vec<idem_runtime::Outcome<()>> {
    outcomes
        .into_iter()
        .map(|outcome| outcome.expect("no message of this batch fails"))
        .collect()
}
