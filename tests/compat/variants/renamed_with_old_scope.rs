//! The base build with its handler renamed, `apply` to `apply_order`, the documented way:
//! `scope` set to the default scope it had, `scenario::handlers::apply`.

use driver::{Delivering, Delivery, Handler, OrderEvent};
use idem_runtime::Idem;

pub mod handlers {
    use super::OrderEvent;
    use idem_runtime::idempotent;
    use sqlx::PgConnection;

    #[idempotent(key = "order_ref, order_no", scope = "scenario::handlers::apply")]
    pub async fn apply_order(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        driver::record_effect(tx, "apply", event.fact).await
    }
}

fn apply(idem: &Idem, fact: i64) -> Delivering<'_> {
    Box::pin(async move { Delivery::of(handlers::apply_order(idem, &OrderEvent::of(fact)).await) })
}

pub fn main() {
    driver::main(&[Handler {
        name: "apply",
        deliver: apply,
    }]);
}
