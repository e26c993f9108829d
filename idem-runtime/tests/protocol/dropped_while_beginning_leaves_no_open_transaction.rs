//! A delivery dropped while its transaction's `BEGIN` is in flight (a timeout, an aborted
//! task, a lost `select!`) leaves no open transaction on the connection it took: the
//! pool's next user runs in autocommit, as it expects.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Idem, idempotent};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id, event_type", scope = "begun")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn a_delivery_dropped_while_its_transaction_begins_leaves_the_pool_in_autocommit(
    pool: PgPool,
) {
    let _ = testing::setup(&pool).await;
    let options: PgConnectOptions = pool.connect_options().as_ref().clone();
    for attempt in 0..20 {
        let name = format!("begin-drop-{attempt}");
        // One connection, handed out without a ping: the delivery's first wait is its
        // `BEGIN`.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(options.clone().application_name(&name))
            .await
            .unwrap();
        let idem = Idem::new(own.clone());
        // Scope checked, session settings read: nothing left to wait for before BEGIN.
        apply(&idem, &testing::paid(&format!("o-warm-{attempt}"), 1))
            .await
            .unwrap();
        // The warm-up's connection is back in the pool (its release runs in a task).
        while own.num_idle() < 1 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        {
            let event = testing::paid(&format!("o-dropped-{attempt}"), 2);
            let mut delivery = std::pin::pin!(apply(&idem, &event));
            // Polled once, then dropped: where the delivery waits for the server.
            tokio::select! {
                biased;
                _ = &mut delivery => {}
                () = std::future::ready(()) => {}
            }
        }
        // The connection, once back in the pool, is not inside a transaction.
        let conn = own.acquire().await.unwrap();
        let state: String =
            sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE application_name = $1")
                .bind(&name)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(
            state, "idle",
            "attempt {attempt}: the pool's connection was handed out in state {state:?}"
        );
        drop(conn);
        own.close().await;
    }
}
