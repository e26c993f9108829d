//! The status tables carry no `CHECK` constraint on their rows (migration 0012): the store
//! alone writes them, and PostgreSQL would plan the constraints at every statement. A
//! database migrated before loses them while claims go on, also while a long transaction
//! holds the status table; a bucket made since is attached without its range constraint.

use std::borrow::Cow;
use std::time::Duration;

use idem_runtime::MIGRATOR;
use idem_runtime::config::Identifier;
use idem_runtime::migrations::migrate_schema;
use sqlx::PgPool;
use sqlx::migrate::Migrator;

/// The `CHECK` constraints of the status tables and their buckets.
async fn row_checks(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.conrelid::regclass::text || ' ' || c.conname \
         FROM pg_constraint AS c JOIN pg_class AS t ON t.oid = c.conrelid \
         WHERE c.contype = 'c' AND t.relnamespace = 'idem'::regnamespace \
           AND (t.relname = 'idem_keys' OR t.relname LIKE 'idem\\_timed\\_keys%') \
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A claim's row, in a transaction of its own.
async fn claim(pool: &PgPool, n: i32) {
    sqlx::query(
        "INSERT INTO idem.idem_keys (scope, key, status, attempts) \
         VALUES ('a scope', md5($1::text)::uuid, 'success', 1)",
    )
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrations = false)]
async fn the_row_checks_go_while_claims_go_on(pool: PgPool) {
    let schema = Identifier::new("idem").unwrap();
    let before = Migrator {
        migrations: Cow::Owned(
            MIGRATOR
                .iter()
                .filter(|m| m.version < 12)
                .cloned()
                .collect(),
        ),
        ..Migrator::DEFAULT
    };
    migrate_schema(&pool, &schema, &before).await.unwrap();
    let bucket: String = sqlx::query_scalar(
        "SELECT idem.idem_timed_bucket(now(), interval '1 hour', 3600000, 3600000)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(bucket, "created");
    let checks = row_checks(&pool).await;
    assert_eq!(
        checks.len(),
        7,
        "status and attempts of the two tables and of the bucket, and its range: {checks:?}"
    );

    // A long transaction holds the status table (a slow handler's claim).
    let mut holder = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO idem.idem_keys (scope, key, status, attempts) \
         VALUES ('a scope', gen_random_uuid(), 'success', 1)",
    )
    .execute(&mut *holder)
    .await
    .unwrap();
    let migrating = {
        let pool = pool.clone();
        tokio::spawn(async move {
            migrate_schema(&pool, &Identifier::new("idem").unwrap(), &MIGRATOR).await
        })
    };
    // The migration asks for its lock a second at a time: claims pass between its tries
    // (a plain `ALTER TABLE` would hold them all behind it until the holder ends).
    for n in 0..5 {
        tokio::time::timeout(Duration::from_secs(30), claim(&pool, n))
            .await
            .expect("a claim does not wait behind the migration");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        !migrating.is_finished(),
        "the migration waits for the holder"
    );
    holder.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(120), migrating)
        .await
        .expect("the migration ends once the holder did")
        .unwrap()
        .unwrap();
    assert_eq!(row_checks(&pool).await, Vec::<String>::new());

    // A bucket made since is attached, then loses its range constraint.
    let bucket: String = sqlx::query_scalar(
        "SELECT idem.idem_timed_bucket(now() + interval '2 hours', interval '1 hour', 3600000, 86400000)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(bucket, "created");
    assert_eq!(row_checks(&pool).await, Vec::<String>::new());
    let attached: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idem.idem_timed_keys'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(attached, 2);
    // The bounds still route each row, and refuse one outside every bucket.
    sqlx::query(
        "INSERT INTO idem.idem_timed_keys (key, fact_time, attempts, scope, status) \
         VALUES (gen_random_uuid(), now() + interval '2 hours', 1, 'a scope', 'success')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let outside = sqlx::query(
        "INSERT INTO idem.idem_timed_keys (key, fact_time, attempts, scope, status) \
         VALUES (gen_random_uuid(), now() + interval '30 days', 1, 'a scope', 'success')",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        outside
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("23514")
    );
}
