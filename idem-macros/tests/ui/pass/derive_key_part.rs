//! `#[derive(KeyPart)]` on enums, newtypes and structs makes them key fields.
use chrono::NaiveDate;
use idem_runtime::{Idem, KeyPart, idempotent};
use sqlx::PgConnection;
use uuid::Uuid;

#[derive(KeyPart)]
enum EventType {
    Placed,
    Paid,
}

#[derive(KeyPart)]
enum Target {
    Order(Uuid),
    Line { order: Uuid, line: u32 },
    Everything,
}

#[derive(KeyPart)]
struct OrderId(String);

#[derive(KeyPart)]
struct Period {
    shop: u32,
    day: NaiveDate,
}

#[derive(KeyPart)]
struct Tagged<T> {
    tag: T,
}

struct OrderEvent {
    order_id: OrderId,
    event_type: EventType,
    target: Target,
    period: Period,
    tagged: Tagged<Vec<u8>>,
}

#[idempotent(key = "order_id, event_type, target, period, tagged")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id.0);
    Ok(())
}

// A derived part may be a key on its own.
#[idempotent(key = "order_id", scope = "by_order")]
async fn by_order(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

async fn deliver(idem: &Idem, event: &OrderEvent) {
    let _ = apply(idem, event).await;
    let _ = by_order(idem, event).await;
}

fn main() {
    let _ = deliver;
    let _ = (EventType::Placed, EventType::Paid, Target::Everything);
    let _ = Target::Line {
        order: Uuid::nil(),
        line: 1,
    };
    let _ = Target::Order(Uuid::nil());
    let _ = Period {
        shop: 1,
        day: NaiveDate::MIN,
    };
    let key = idem_runtime::key::KeyBuilder::new().part(
        "period",
        &Period {
            shop: 1,
            day: NaiveDate::MIN,
        },
    );
    let _ = key.map(|builder| builder.finish());
}
