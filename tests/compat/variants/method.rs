//! The base build with its handler turned into a method of a type of the same module,
//! `handlers::Handlers::apply`: the default scope of a method is its module path and name,
//! `scenario::handlers::apply`, as the function's was.

use driver::{Delivering, Delivery, Handler};
use idem_runtime::Idem;

/// The message: the fact's number and the fields its key is made of.
pub struct OrderEvent {
    pub fact: i64,
    pub order_ref: String,
    pub order_no: i32,
}

impl OrderEvent {
    fn of(fact: i64) -> OrderEvent {
        OrderEvent {
            fact,
            order_ref: driver::order_ref(fact).to_string(),
            order_no: driver::order_no(fact),
        }
    }
}

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
