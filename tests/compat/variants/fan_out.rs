//! The base build with a second handler of the same message: `notify`, another name, the
//! same key fields, no `scope` (its default scope is `scenario::handlers::notify`).

use driver::{Delivering, Delivery, Handler, OrderEvent};
use idem_runtime::Idem;

pub mod handlers {
    use super::OrderEvent;
    use idem_runtime::idempotent;
    use sqlx::PgConnection;

    #[idempotent(key = "order_ref, order_no")]
    pub async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        driver::record_effect(tx, "apply", event.fact).await
    }

    #[idempotent(key = "order_ref, order_no")]
    pub async fn notify(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        driver::record_effect(tx, "notify", event.fact).await
    }
}

fn apply(idem: &Idem, fact: i64) -> Delivering<'_> {
    Box::pin(async move { Delivery::of(handlers::apply(idem, &OrderEvent::of(fact)).await) })
}

fn notify(idem: &Idem, fact: i64) -> Delivering<'_> {
    Box::pin(async move { Delivery::of(handlers::notify(idem, &OrderEvent::of(fact)).await) })
}

pub fn main() {
    driver::main(&[
        Handler {
            name: "apply",
            deliver: apply,
        },
        Handler {
            name: "notify",
            deliver: notify,
        },
    ]);
}
