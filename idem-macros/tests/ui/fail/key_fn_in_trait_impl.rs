//! In a trait impl, the key function is an item the trait does not declare: the error
//! points at the handler's name; `key_fn = false` is the way out
//! (`pass/key_fn_in_trait_impl.rs`).
use idem_runtime::{Handled, Idem, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

trait Apply {
    async fn apply(&self, idem: &Idem, event: &OrderEvent) -> Handled<Result<(), sqlx::Error>>;
}

struct Payments;

impl Apply for Payments {
    #[idempotent(key = "order_id")]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        let _ = (tx, &event.order_id);
        Ok(())
    }
}

fn main() {}
