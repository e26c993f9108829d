//! The deployed build (of the current release, and of the previous one): a handler
//! without `scope`, `scenario::handlers::apply`, keyed on `order_ref` (a UUID's text)
//! and `order_no`.

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
}

fn apply(idem: &Idem, fact: i64) -> Delivering<'_> {
    Box::pin(async move { Delivery::of(handlers::apply(idem, &OrderEvent::of(fact)).await) })
}

pub fn main() {
    driver::main(&[Handler {
        name: "apply",
        deliver: apply,
    }]);
}
