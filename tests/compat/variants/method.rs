//! The base build with its handler turned into a method of a type of the same module,
//! `handlers::Handlers::apply`: the default scope of a method is its module path and name,
//! `scenario::handlers::apply`, as the function's was.

use driver::{Delivering, Delivery, Handler, OrderEvent};
use idem_runtime::Idem;

pub mod handlers {
    use super::OrderEvent;
    use idem_runtime::idempotent;
    use sqlx::PgConnection;

    /// The handlers of the application, as methods.
    pub struct Handlers;

    impl Handlers {
        #[idempotent(key = "order_ref, order_no")]
        pub async fn apply(
            &self,
            tx: &mut PgConnection,
            event: &OrderEvent,
        ) -> Result<(), sqlx::Error> {
            driver::record_effect(tx, "apply", event.fact).await
        }
    }
}

fn apply(idem: &Idem, fact: i64) -> Delivering<'_> {
    Box::pin(
        async move { Delivery::of(handlers::Handlers.apply(idem, &OrderEvent::of(fact)).await) },
    )
}

pub fn main() {
    driver::main(&[Handler {
        name: "apply",
        deliver: apply,
    }]);
}
