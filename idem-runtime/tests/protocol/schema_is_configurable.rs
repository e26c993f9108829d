//! The status table's schema is configurable: invalid identifiers are rejected by `IdemBuilder::build`, and a custom schema holds the table.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{ConfigError, Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn invalid_settings_are_rejected_by_build(pool: PgPool) {
    let too_long = "s".repeat(49);
    for schema in [
        "idem; drop table order_effects",
        "Idem",
        "",
        "1idem",
        "idem-keys",
        "idem.keys",
        "\"idem\"",
        "idém",
        &too_long,
    ] {
        let error = Idem::builder(pool.clone())
            .schema(schema)
            .build()
            .unwrap_err();
        assert_eq!(error, ConfigError::InvalidIdentifier(schema.to_owned()));
        assert!(error.to_string().contains("invalid schema name"), "{error}");
    }
    let error = Idem::builder(pool.clone())
        .max_attempts(0)
        .build()
        .unwrap_err();
    assert_eq!(error, ConfigError::ZeroAttempts);

    for schema in ["_idem", "idem_2", &"s".repeat(48)] {
        let idem = Idem::builder(pool.clone()).schema(schema).build().unwrap();
        assert_eq!(idem.config().schema().as_str(), schema);
    }
}

#[sqlx::test(migrations = false)]
async fn custom_schema_holds_the_status_table(pool: PgPool) {
    let billing = testing::setup_with(
        Idem::builder(pool.clone())
            .schema("billing_idem")
            .build()
            .unwrap(),
    )
    .await;
    let located: Vec<String> = sqlx::query_scalar(
        "SELECT table_schema FROM information_schema.tables WHERE table_name = 'idem_keys'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(located, ["billing_idem"]);

    let event = testing::paid("o-schema", 60);
    assert!(apply(&billing, &event).await.unwrap().is_executed());
    assert_eq!(
        testing::count_rows(&pool, "billing_idem.idem_keys").await,
        1
    );
    assert!(apply(&billing, &event).await.unwrap().is_duplicate());

    // Migrating again is a no-op; a second schema is a separate status table.
    billing.migrate().await.unwrap();
    let other = Idem::builder(pool.clone())
        .schema("other_idem")
        .build()
        .unwrap();
    other.migrate().await.unwrap();
    assert!(matches!(
        apply(&other, &event).await.unwrap(),
        Outcome::Executed(_)
    ));
    assert_eq!(
        testing::count_rows(&pool, "billing_idem.idem_keys").await,
        1
    );
    assert_eq!(testing::count_rows(&pool, "other_idem.idem_keys").await, 1);
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 2);
}
