//! A database migrated by a later release (a rolling upgrade half done, or a rollback):
//! `Idem::migrate` succeeds, handlers keep working, and the migration status lists the
//! migrations this release does not know.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, admin, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn a_newer_schema_is_migrated_and_used(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // What a later release's migration leaves behind: a row of its own in the
    // bookkeeping table, and something it added to the schema.
    sqlx::query(
        "INSERT INTO idem._sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9001, 'a later release', TRUE, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ALTER TABLE idem.idem_keys ADD COLUMN later_release_column text")
        .execute(&pool)
        .await
        .unwrap();

    idem.migrate().await.expect("a newer schema is tolerated");
    admin::ensure_migrated(&idem)
        .await
        .expect("nothing of this release is pending");
    let status = admin::migration_status(&idem).await.unwrap();
    let newer: Vec<_> = status.iter().filter(|m| !m.known).collect();
    assert_eq!(newer.len(), 1, "{status:?}");
    assert_eq!(
        (
            newer[0].version,
            newer[0].description.as_str(),
            newer[0].applied
        ),
        (9001, "a later release", true)
    );
    assert!(
        status.iter().filter(|m| m.known).all(|m| m.applied),
        "{status:?}"
    );
    assert_eq!(status.last().map(|m| m.version), Some(9001));

    let event = testing::paid("order-1", 100);
    assert!(apply(&idem, &event).await.unwrap().is_executed());
    assert!(matches!(
        apply(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(_))
    ));
}
