//! The base build with its handler moved to another module, `handlers::billing::apply`,
//! and no `scope`: its default scope is now `scenario::handlers::billing::apply`.

use driver::{Delivering, Delivery, Handler, OrderEvent};
use idem_runtime::Idem;

pub mod handlers {
    pub mod billing {
        use crate::OrderEvent;
        use idem_runtime::idempotent;
        use sqlx::PgConnection;

        #[idempotent(key = "order_ref, order_no")]
        pub async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
            driver::record_effect(tx, "apply", event.fact).await
        }
    }
}

fn apply(idem: &Idem, fact: i64) -> Delivering<'_> {
    Box::pin(
        async move { Delivery::of(handlers::billing::apply(idem, &OrderEvent::of(fact)).await) },
    )
}

pub fn main() {
    driver::main(&[Handler {
        name: "apply",
        deliver: apply,
    }]);
}
