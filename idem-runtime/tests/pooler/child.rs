//! What a child process of a test runs: this test binary started again with one ignored
//! test selected, told what to do by its environment.

use crate::route::Route;

/// Runs `Idem::migrate` through the route and database in `IDEM_POOLER_CHILD_*`, first
/// waiting for the moment `IDEM_POOLER_CHILD_START_MS` (milliseconds since the epoch),
/// so that every child migrates at the same moment.
#[tokio::test]
#[ignore = "run by migrate_from_eight_processes in a child process"]
async fn migrate_entry() {
    let (Ok(route), Ok(database), Ok(start)) = (
        std::env::var("IDEM_POOLER_CHILD_ROUTE"),
        std::env::var("IDEM_POOLER_CHILD_DATABASE"),
        std::env::var("IDEM_POOLER_CHILD_START_MS"),
    ) else {
        panic!("migrate_entry runs in a child process of migrate_from_eight_processes");
    };
    let route = match route.as_str() {
        "direct" => Route::Direct,
        "session" => Route::Session,
        _ => Route::Transaction,
    };
    let idem = route.idem(&database, 2).await;
    let start: u128 = start.parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    if start > now {
        tokio::time::sleep(std::time::Duration::from_millis((start - now) as u64)).await;
    }
    idem.migrate()
        .await
        .unwrap_or_else(|error| panic!("migrate through {}: {error}", route.name()));
}

/// Starts `count` children running `test` through `route` on `database`, all released at
/// the same moment, and waits for them: each one's exit status and output.
pub fn run_children(
    test: &str,
    route: Route,
    database: &str,
    count: usize,
) -> Vec<std::process::Output> {
    let exe = std::env::current_exe().unwrap();
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_000;
    let children: Vec<_> = (0..count)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([test, "--exact", "--ignored", "--test-threads=1"])
                .env("IDEM_POOLER_CHILD_ROUTE", route.name())
                .env("IDEM_POOLER_CHILD_DATABASE", database)
                .env("IDEM_POOLER_CHILD_START_MS", start.to_string())
                .env("IDEM_PGBOUNCER_SESSION_URL", Route::Session.url())
                .env("IDEM_PGBOUNCER_TRANSACTION_URL", Route::Transaction.url())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a child process")
        })
        .collect();
    children
        .into_iter()
        .map(|child| child.wait_with_output().unwrap())
        .collect()
}
