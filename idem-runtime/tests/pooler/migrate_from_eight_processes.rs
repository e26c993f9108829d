//! `Idem::migrate` from eight processes at the same moment: every one succeeds, and the
//! status table's objects are in idem's schema, none in `public`.

use crate::child::run_children;
use crate::route::{Database, Route};

pub async fn run(route: Route) {
    let database = Database::create(route, "migrate").await;
    let outputs = run_children("child::migrate_entry", route, &database.name, 8);
    for (n, output) in outputs.iter().enumerate() {
        assert!(
            output.status.success(),
            "child {n} failed to migrate through {}:\n{}\n{}",
            route.name(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        // The child ran its one test, not none.
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("1 passed"),
            "child {n} ran no migration: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
    let migrations = idem_runtime::MIGRATOR.iter().count() as i64;
    assert_eq!(
        database
            .count("SELECT count(*) FROM idem._sqlx_migrations WHERE success")
            .await,
        migrations
    );
    assert_eq!(
        database
            .count(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = 'public' AND c.relname IN \
                 ('idem_keys', 'idem_scopes', 'idem_instance', '_sqlx_migrations')"
            )
            .await,
        0,
        "nothing of idem's in `public`"
    );
    assert_eq!(
        database
            .count("SELECT count(*) FROM idem.idem_instance")
            .await,
        1
    );
    // A ninth migration finds everything applied, through the route.
    route.idem(&database.name, 2).await.migrate().await.unwrap();
    database.drop().await;
}
