//! What the doc tests of the guide share: a database of their own for each block that runs.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Connection, PgConnection};

/// A database created for one doc test from `DATABASE_URL` (default
/// `postgres://postgres@127.0.0.1:5432/postgres`), dropped with this guard: the guide's
/// programs create tables and scopes as a user's would, and must neither meet each other's
/// nor what an earlier run left.
pub struct FreshDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl FreshDatabase {
    /// Creates `idem_guide_<label>_<time>_<process>_<n>`; drops the guide's databases that
    /// an earlier run left behind more than an hour ago (a block that aborted).
    pub fn create(label: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let admin_url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_secs();
        let name = format!(
            "idem_guide_{label}_{now}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        block_on(async {
            let mut admin = PgConnection::connect(&admin_url)
                .await
                .expect("the guide's doc tests need PostgreSQL at DATABASE_URL");
            let stale: Vec<String> = sqlx::query_scalar(
                "SELECT datname FROM pg_database WHERE datname LIKE 'idem\\_guide\\_%'",
            )
            .fetch_all(&mut admin)
            .await
            .expect("list the guide's databases");
            for old in stale {
                let created = old
                    .split('_')
                    .find_map(|part| part.parse::<u64>().ok().filter(|t| *t > 1_000_000_000));
                if created.is_some_and(|t| t + 3600 < now) {
                    let _ =
                        sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS \"{old}\" WITH (FORCE)"))
                            .execute(&mut admin)
                            .await;
                }
            }
            sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
                .execute(&mut admin)
                .await
                .expect("create the doc test's database");
        });
        let url = with_database(&admin_url, &name);
        FreshDatabase {
            admin_url,
            name,
            url,
        }
    }

    /// The URL of the new database.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for FreshDatabase {
    fn drop(&mut self) {
        block_on(async {
            if let Ok(mut admin) = PgConnection::connect(&self.admin_url).await {
                let _ = sqlx::raw_sql(&format!(
                    "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                    self.name
                ))
                .execute(&mut admin)
                .await;
            }
        });
    }
}

/// `url` with its database name replaced by `database`, its query kept.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut new = format!("{}/{database}", &base[..host_end]);
    if let Some(query) = query {
        new.push('?');
        new.push_str(query);
    }
    new
}

/// Runs a future to its end on a runtime of its own (one thread).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

/// Runs `example` with a pool on a fresh database, on a runtime of its own: the harness of
/// the blocks that are fragments of a program (hidden in the guide).
pub fn run<F, Fut>(label: &str, example: F)
where
    F: FnOnce(sqlx::PgPool) -> Fut,
    Fut: std::future::Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    let database = FreshDatabase::create(label);
    block_on(async {
        let pool = sqlx::PgPool::connect(database.url())
            .await
            .expect("connect to the doc test's database");
        let result = example(pool.clone()).await;
        pool.close().await;
        if let Err(error) = result {
            panic!("the example failed: {error}");
        }
    });
}

/// Runs `example` with the URL of a fresh database, on a runtime of its own.
pub fn run_with_url<F, Fut>(label: &str, example: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    let database = FreshDatabase::create(label);
    let result = block_on(example(database.url().to_owned()));
    if let Err(error) = result {
        panic!("the example failed: {error}");
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn a_url_gets_another_database() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h/db?sslmode=require", "x"),
            "postgres://u:p@h/x?sslmode=require"
        );
        assert_eq!(
            with_database("postgres://h:5432", "x"),
            "postgres://h:5432/x"
        );
    }
}
