use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    id: String,
}

struct Orders;

impl Orders {
    // The key is read from the message, not from `self`.
    #[idempotent(key = "self.id")]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        let _ = (tx, &event.id);
        Ok(())
    }

    #[idempotent(key(self.id))]
    async fn apply_identifiers(
        &self,
        tx: &mut PgConnection,
        event: &OrderEvent,
    ) -> Result<(), sqlx::Error> {
        let _ = (tx, &event.id);
        Ok(())
    }
}

fn main() {}
