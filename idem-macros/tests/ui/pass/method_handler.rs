//! Handlers may be methods taking `&self` in an `impl` block, generic or not.
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

struct Payments {
    table: &'static str,
    applied: AtomicU64,
}

impl Payments {
    #[idempotent(key = "order_id")]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        sqlx::query(&format!("INSERT INTO {} VALUES ($1)", self.table))
            .bind(&event.order_id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    #[idempotent(key = "order_id", scope = "payments_count")]
    pub async fn count(
        &self,
        tx: &mut PgConnection,
        event: &OrderEvent,
    ) -> Result<u64, sqlx::Error> {
        let _ = (tx, &event.order_id);
        Ok(self.applied.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

struct Typed<T>(PhantomData<T>);

impl<T: Sync> Typed<T> {
    #[idempotent(key = "order_id", scope = "typed")]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        let _ = (tx, &event.order_id, &self.0);
        Ok(())
    }
}

async fn deliver(idem: &Idem, payments: &Payments, event: &OrderEvent) {
    let _ = payments.apply(idem, event).await;
    let _ = payments.count(idem, event).await;
    let _ = Typed::<u8>(PhantomData).apply(idem, event).await;
}

fn main() {
    let _ = deliver;
}
