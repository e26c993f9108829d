//! The three ways to PostgreSQL, and a database of its own for each test.

use std::str::FromStr;
use std::sync::OnceLock;

use idem_runtime::{Idem, Pooler};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Executor, PgPool};

/// The server connections of the session pooler per database (`scripts/services.sh`).
const SESSION_POOL_SIZE: u32 = 8;

/// How a test's handles reach PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A direct connection.
    Direct,
    /// PgBouncer, `pool_mode = session`.
    Session,
    /// PgBouncer, `pool_mode = transaction`.
    Transaction,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::Session => "session",
            Route::Transaction => "transaction",
        }
    }

    /// What the handle is told about the pooler.
    pub fn pooler(self) -> Pooler {
        match self {
            Route::Transaction => Pooler::Transaction,
            Route::Direct | Route::Session => Pooler::Session,
        }
    }

    /// The URL of the route's server (database `postgres`, or the URL's).
    pub fn url(self) -> String {
        let urls = urls();
        match self {
            Route::Direct => urls.direct.clone(),
            Route::Session => urls.session.clone(),
            Route::Transaction => urls.transaction.clone(),
        }
    }

    /// The route's connect options to `database`.
    pub fn options(self, database: &str) -> PgConnectOptions {
        PgConnectOptions::from_str(&self.url())
            .expect("a PostgreSQL URL")
            .database(database)
            .disable_statement_logging()
    }

    /// A handle over the route to `database`, as an application behind it builds one.
    pub async fn idem(self, database: &str, connections: u32) -> Idem {
        // In session pooling each client connection holds a server connection while it
        // lives: a pool larger than the pooler's (`default_pool_size = 8`) waits for one.
        let connections = match self {
            Route::Session => connections.min(SESSION_POOL_SIZE),
            Route::Direct | Route::Transaction => connections,
        };
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .connect_with(self.options(database))
            .await
            .unwrap_or_else(|error| panic!("connect through {}: {error}", self.name()));
        Idem::builder(pool).pooler(self.pooler()).build().unwrap()
    }
}

struct Urls {
    direct: String,
    session: String,
    transaction: String,
}

fn urls() -> &'static Urls {
    static URLS: OnceLock<Urls> = OnceLock::new();
    URLS.get_or_init(|| {
        let direct = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let from_env = (
            std::env::var("IDEM_PGBOUNCER_SESSION_URL"),
            std::env::var("IDEM_PGBOUNCER_TRANSACTION_URL"),
        );
        let (session, transaction) = match from_env {
            (Ok(session), Ok(transaction)) => (session, transaction),
            _ => from_services_script(),
        };
        Urls {
            direct,
            session,
            transaction,
        }
    })
}

/// Starts (or finds) the PgBouncer instances of `scripts/services.sh`.
fn from_services_script() -> (String, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh");
    // Into a file, not a pipe: the servers it starts keep running, and must not hold the
    // test's end of a pipe open.
    let printed = std::env::temp_dir().join(format!("idem-pooler-env-{}", std::process::id()));
    let status = std::process::Command::new("bash")
        .args([script, "up", "--print-env", "postgres", "pgbouncer"])
        .stdout(std::fs::File::create(&printed).expect("a temporary file"))
        .stderr(std::process::Stdio::inherit())
        .status()
        .expect("run scripts/services.sh");
    assert!(
        status.success(),
        "scripts/services.sh up pgbouncer failed: the pooler tests need PgBouncer (see the README's set-up)"
    );
    let text = std::fs::read_to_string(&printed).unwrap();
    let _ = std::fs::remove_file(&printed);
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("export {name}=")))
            .map(|value| value.trim_matches(|c| c == '\'' || c == '"').to_owned())
            .unwrap_or_else(|| panic!("scripts/services.sh printed no {name}"))
    };
    (
        value("IDEM_PGBOUNCER_SESSION_URL"),
        value("IDEM_PGBOUNCER_TRANSACTION_URL"),
    )
}

/// A database of the test's own, created and dropped on a direct connection.
pub struct Database {
    pub name: String,
    /// A direct connection to it: what the checks read.
    pub direct: PgPool,
}

impl Database {
    pub async fn create(route: Route, test: &str) -> Database {
        let name = format!("idem_pooler_{}_{test}_{}", route.name(), std::process::id());
        let admin = Route::Direct.options("postgres");
        let mut conn = admin.connect().await.expect("connect to PostgreSQL");
        conn.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
            .await
            .unwrap();
        conn.execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .unwrap();
        let direct = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(Route::Direct.options(&name))
            .await
            .unwrap();
        Database { name, direct }
    }

    /// Drops the database, and the pooler's server connections to it with it.
    pub async fn drop(self) {
        self.direct.close().await;
        let mut conn = Route::Direct.options("postgres").connect().await.unwrap();
        conn.execute(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name).as_str())
            .await
            .unwrap();
    }

    /// A count read on the direct connection.
    pub async fn count(&self, query: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(query)
            .fetch_one(&self.direct)
            .await
            .unwrap_or_else(|error| panic!("{query}: {error}"))
    }
}

/// Delivers until the outcome is final, as a consumer would: a `Retry` disposition is
/// delivered again. Returns the outcome and the errors met on the way.
pub async fn deliver_until_final<T, E, F, Fut>(
    mut deliver: F,
) -> (
    Result<idem_runtime::Outcome<T>, idem_runtime::Error<E>>,
    Vec<idem_runtime::Error<E>>,
)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<idem_runtime::Outcome<T>, idem_runtime::Error<E>>>,
{
    let mut errors = Vec::new();
    for _ in 0..200 {
        match deliver().await {
            Err(error) if error.disposition() == idem_runtime::Disposition::Retry => {
                errors.push(error);
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            result => return (result, errors),
        }
    }
    panic!(
        "still retried after 200 deliveries: {:?}",
        errors.last().map(|_| ())
    );
}
