use std::time::SystemTime;

use chrono::{DateTime, FixedOffset, Local, NaiveDateTime, Utc};
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    occurred_at: DateTime<Utc>,
    local: DateTime<FixedOffset>,
    naive: NaiveDateTime,
    system: SystemTime,
    maybe: Option<DateTime<Utc>>,
    meta: Meta,
}

struct Meta {
    at: DateTime<Local>,
}

#[idempotent(key = "order_id, occurred_at", event_time = "occurred_at")]
async fn by_utc(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = tx;
    let _ = (&event.local, &event.naive, &event.system, &event.maybe);
    Ok(())
}

#[idempotent(key(order_id, local), event_time(local), scope = "by_offset")]
async fn by_offset(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(key = "order_id, naive", event_time = "naive", scope = "by_naive")]
async fn by_naive(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(key = "order_id, system", event_time = "system", scope = "by_system")]
async fn by_system(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(key = "order_id, maybe", event_time = "maybe", scope = "by_option")]
async fn by_option(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

// A nested field, in the process's local zone: the instant counts.
#[idempotent(key = "order_id, meta.at", event_time = "meta.at", scope = "by_nested")]
async fn by_nested(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

fn main() {
    let event = OrderEvent {
        order_id: "o-1".into(),
        occurred_at: Utc::now(),
        local: Utc::now().into(),
        naive: Utc::now().naive_utc(),
        system: SystemTime::now(),
        maybe: None,
        meta: Meta { at: Local::now() },
    };
    let key = by_utc_key(&event).unwrap();
    assert!(key.fact_time().is_some());
    assert!(by_option_key(&event).is_err(), "no time: no key");
    assert!(by_nested_key(&event).unwrap().fact_time().is_some());
    let _ = (by_offset_key(&event), by_naive_key(&event), by_system_key(&event));
}
