//! An unreadable entry in Redis (not idem's format, a wrong Redis type, a result of another type) is counted and ignored: PostgreSQL answers, and its answer replaces the entry.

use crate::support::redis as redis_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::cache::redis;
use idem_runtime::{Outcome, idempotent, key::KeyBuilder};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
}

#[idempotent(key = "order_id", scope = "garbage_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
    Ok(Receipt {
        payment_id: testing::insert_effect(tx, event).await?,
    })
}

#[sqlx::test(migrations = false)]
async fn garbage_entries_fall_back_to_postgres(pool: PgPool) {
    let (idem, prefix) = redis_support::setup(&pool).await;
    let url = redis_support::redis_url();
    let event = testing::paid("o-garbage", 100);
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let name = redis_support::entry_name(&idem, &prefix, "garbage_pay", key).await;
    let Outcome::Executed(receipt) = pay(&idem, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };
    redis_support::written(&idem, 1).await;
    let good = redis_support::entry(&url, &name).await.expect("cached");

    let set_text = |text: &str| {
        let mut command = redis::cmd("SET");
        command.arg(&name).arg(text);
        command
    };
    let mut wrong_type = redis::cmd("LPUSH");
    wrong_type.arg(&name).arg("a list, not a string");
    let corruptions = [
        set_text("not json at all"),
        set_text(r#"{"v":99}"#),
        set_text(r#"{"v":1,"r":"a string, not a receipt"}"#),
        wrong_type,
    ];
    for (round, corruption) in corruptions.iter().enumerate() {
        redis_support::run(&url, &redis::cmd("DEL").arg(&name).clone()).await;
        redis_support::run(&url, corruption).await;
        let before = redis_support::stats(&idem);
        assert_eq!(
            pay(&idem, &event).await.unwrap(),
            Outcome::Duplicate(Some(receipt.clone()))
        );
        let after = redis_support::written(&idem, before.writes + 1).await;
        assert_eq!(after.errors, before.errors + 1, "round {round}: {after:?}");
        assert_eq!(after.hits, before.hits, "round {round}");
        // PostgreSQL's answer replaced the entry.
        assert_eq!(
            redis_support::entry(&url, &name).await.as_ref(),
            Some(&good),
            "round {round}"
        );
        assert_eq!(
            pay(&idem, &event).await.unwrap(),
            Outcome::Duplicate(Some(receipt.clone()))
        );
        assert_eq!(
            redis_support::stats(&idem).hits,
            after.hits + 1,
            "round {round}"
        );
    }
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
}
