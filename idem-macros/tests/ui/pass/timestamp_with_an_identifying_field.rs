//! A timestamp next to a field that identifies is a valid key, and so are a calendar
//! date alone (a business day) and a newtype around an identifier.
use chrono::{DateTime, NaiveDate, Utc};
use idem_runtime::{Idem, KeyPart, idempotent};
use sqlx::PgConnection;

#[derive(KeyPart)]
struct OrderId(String);

#[derive(KeyPart)]
struct OccurredAt(DateTime<Utc>);

#[derive(KeyPart)]
struct Stamp {
    at: DateTime<Utc>,
    by: String,
}

struct Event {
    order_id: OrderId,
    created_at: DateTime<Utc>,
    occurred_at: OccurredAt,
    day: NaiveDate,
    stamp: Stamp,
    retried_at: Vec<DateTime<Utc>>,
}

#[idempotent(key = "order_id, created_at")]
async fn by_order(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "occurred_at, retried_at, order_id")]
async fn by_order_last(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "day")]
async fn daily(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "order_id")]
async fn by_newtype(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

// A struct of several fields counts as identifying.
#[idempotent(key = "stamp")]
async fn by_stamp(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

async fn deliver(idem: &Idem, event: &Event) {
    let _ = by_order(idem, event).await;
    let _ = by_order_last(idem, event).await;
    let _ = daily(idem, event).await;
    let _ = by_newtype(idem, event).await;
    let _ = by_stamp(idem, event).await;
}

fn main() {
    let _ = deliver;
}
