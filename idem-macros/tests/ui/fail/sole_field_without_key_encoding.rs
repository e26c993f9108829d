use std::collections::HashMap;

use idem_runtime::idempotent;
use sqlx::PgConnection;

enum Channel {
    Web,
    Shop,
}

struct Payment {
    amount: f64,
    ratio: f32,
    attributes: HashMap<String, String>,
    channel: Channel,
}

// A key of one field that has no key encoding gets the reason for that field (floats,
// hash maps, a type without `#[derive(KeyPart)]`), not the rule about timestamps.
#[idempotent(key = "amount")]
async fn by_amount(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    let _ = (tx, payment);
    Ok(())
}

#[idempotent(key = "ratio")]
async fn by_ratio(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    let _ = (tx, payment);
    Ok(())
}

#[idempotent(key = "attributes")]
async fn by_attributes(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    let _ = (tx, payment);
    Ok(())
}

#[idempotent(key = "channel")]
async fn by_channel(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    let _ = (tx, matches!(payment.channel, Channel::Web | Channel::Shop));
    Ok(())
}

fn main() {}
