//! A handler may implement a trait method whose signature is the rewritten one
//! (`&Idem` for the connection, `Handled<...>` for the result), with `key_fn = false`:
//! the trait declares no key function. Callers reach the handler through the trait,
//! statically or generically.
use idem_runtime::{Handled, Idem, Outcome, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

trait Apply {
    async fn apply(&self, idem: &Idem, event: &OrderEvent) -> Handled<Result<(), sqlx::Error>>;
}

struct Payments;

impl Apply for Payments {
    #[idempotent(key = "order_id", key_fn = false)]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        let _ = (tx, &event.order_id);
        Ok(())
    }
}

/// A trait with a result and a lease-mode handler.
trait Notify {
    async fn notify(&self, idem: &Idem, event: &OrderEvent) -> Handled<Result<u32, std::io::Error>>;
}

impl Notify for Payments {
    #[idempotent(key = "order_id", mode = "lease", scope = "notify", key_fn = false)]
    async fn notify(&self, event: &OrderEvent) -> Result<u32, std::io::Error> {
        let _ = &event.order_id;
        Ok(7)
    }
}

async fn deliver<H: Apply + Notify>(handler: &H, idem: &Idem, event: &OrderEvent) {
    let _: Outcome<()> = handler.apply(idem, event).await.unwrap();
    let _: Outcome<u32> = handler.notify(idem, event).await.unwrap();
}

fn main() {
    let _ = deliver::<Payments>;
}
