//! A consumer that runs under a role holding only `privileges::consumer_grants` (and its
//! business table's grants) takes every path of the protocol: new, duplicate, failure,
//! parking, lease mode, batches, keys kept by the fact's time (their buckets made on
//! demand and ahead), scope registration. Nothing needs DDL at run time.
use std::time::Duration;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::privileges::consumer_grants;
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("card declined")]
    Declined,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[idempotent(
    key = "order_id",
    scope = "restricted_pay",
    max_attempts = 2,
    batch = true
)]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, PayError> {
    if event.amount_cents < 0 {
        return Err(PayError::Declined);
    }
    Ok(testing::insert_effect(tx, event).await?)
}

#[idempotent(key = "order_id", scope = "restricted_record")]
async fn record(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    for event in events {
        testing::insert_effect(tx, event).await?;
    }
    Ok(())
}

// Keys kept by the fact's time: the claim makes the fact's bucket through a function of the
// schema's owner, without the right to create tables.
#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "restricted_timed"
)]
async fn pay_timed(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

// The batch handler of keys kept by the fact's time: its claim makes the buckets of the
// batch's facts through the same function.
#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "restricted_timed_batch"
)]
async fn record_timed(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    for event in events {
        testing::insert_effect(tx, event).await?;
    }
    Ok(())
}

#[idempotent(
    key = "order_id",
    scope = "restricted_notify",
    mode = "lease",
    lease = "30s"
)]
async fn notify(event: &OrderEvent) -> Result<String, std::io::Error> {
    Ok(format!("sent {}", event.order_id))
}

#[sqlx::test(migrations = false)]
async fn every_path_runs_under_a_role_without_ddl(pool: PgPool) {
    // The owner migrates and grants.
    let owner = testing::setup(&pool).await;
    let role = format!("idem_consumer_{}", uuid::Uuid::new_v4().simple());
    let schema = owner.config().schema().clone();
    let grants = consumer_grants(&schema, &role);
    sqlx::raw_sql(&format!(
        "CREATE ROLE {role} LOGIN;
         {grants}
         GRANT SELECT, INSERT ON order_effects TO {role};
         GRANT DELETE ON {schema}.idem_keys TO {role};
         GRANT USAGE ON SEQUENCE order_effects_id_seq TO {role};"
    ))
    .execute(&pool)
    .await
    .unwrap();

    let consumer_pool =
        PgPool::connect_with(pool.connect_options().as_ref().clone().username(&role))
            .await
            .unwrap();
    let idem = Idem::builder(consumer_pool.clone())
        .lock_timeout(Duration::from_secs(2))
        .build()
        .unwrap();

    // The role cannot change the schema.
    let ddl = sqlx::query(&format!("CREATE TABLE {schema}.intruder (id int)"))
        .execute(&consumer_pool)
        .await;
    assert!(ddl.is_err(), "the consumer role must not hold CREATE");

    let event = testing::paid("o-restricted", 100);
    assert!(pay(&idem, &event).await.unwrap().is_executed());
    assert!(pay(&idem, &event).await.unwrap().is_duplicate());

    let declined = testing::paid("o-declined", -1);
    let error = pay(&idem, &declined).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Handler {
                attempts: 1,
                parked: false,
                ..
            }
        ),
        "{error:?}"
    );
    let error = pay(&idem, &declined).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Handler {
                attempts: 2,
                parked: true,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(matches!(
        pay(&idem, &declined).await.unwrap_err(),
        Error::Parked { .. }
    ));

    let batch = [
        testing::paid("o-b1", 1),
        event.clone(),
        testing::paid("o-b2", 2),
    ];
    let outcomes = pay_batch(&idem, &batch).await;
    assert!(outcomes[0].as_ref().unwrap().is_executed());
    assert!(outcomes[1].as_ref().unwrap().is_duplicate());
    let outcomes = record(&idem, &[testing::paid("o-r1", 1), testing::paid("o-r2", 2)]).await;
    assert!(
        outcomes
            .iter()
            .all(|outcome| outcome.as_ref().unwrap().is_executed())
    );

    // A batch spanning two buckets, neither made yet.
    let mut earlier = testing::paid("o-tb1", 1);
    earlier.occurred_at -= chrono::TimeDelta::hours(2);
    let timed_batch = [earlier, testing::paid("o-tb2", 2)];
    let outcomes = record_timed(&idem, &timed_batch).await;
    assert!(
        outcomes
            .iter()
            .all(|outcome| outcome.as_ref().unwrap().is_executed()),
        "{outcomes:?}"
    );
    let keys: Vec<_> = timed_batch
        .iter()
        .map(|event| record_timed_key(event).unwrap())
        .collect();
    let mut conn = consumer_pool.acquire().await.unwrap();
    assert_eq!(
        idem.done_handler_keys(&mut conn, &keys).await.unwrap(),
        [true, true]
    );
    drop(conn);

    let timed = testing::paid("o-timed", 5);
    assert!(pay_timed(&idem, &timed).await.unwrap().is_executed());
    assert!(pay_timed(&idem, &timed).await.unwrap().is_duplicate());
    // The consumer's grants do not let it expire buckets: a window of its choosing could
    // drop the bucket of the facts being delivered now.
    let expire = sqlx::query(&format!("SELECT {schema}.idem_timed_expire(3600000, 200)"))
        .execute(&consumer_pool)
        .await
        .unwrap_err();
    assert_eq!(
        expire.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("42501"),
        "{expire:?}"
    );
    // The cleanup's upkeep of the buckets, under the same role once given what the role
    // that runs the cleanup needs: `DELETE` on the status table (granted above) and
    // `EXECUTE` on the expiry of buckets.
    sqlx::raw_sql(&format!(
        "GRANT EXECUTE ON FUNCTION {schema}.idem_timed_expire(bigint, integer) TO {role};"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let report = idem.purge().await.unwrap();
    assert!(report.buckets_made > 0, "{report:?}");

    assert_eq!(
        notify(&idem, &event).await.unwrap(),
        Outcome::Executed("sent o-restricted".to_owned())
    );
    assert!(notify(&idem, &event).await.unwrap().is_duplicate());

    consumer_pool.close().await;
    sqlx::raw_sql(&format!("DROP OWNED BY {role}; DROP ROLE {role};"))
        .execute(&pool)
        .await
        .unwrap();
}
