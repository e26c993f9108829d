//! The `idem` binary, run as a process against a throwaway database: each command's output
//! (tables and `--json`) and exit code, and its errors: a bad URL, an unreachable
//! database, a missing schema, an unknown key; a password never shows. `idem lag` runs
//! against the Kafka broker of `KAFKA_BROKERS` (else 127.0.0.1:9092), which must answer.
use std::process::Command;

use idem_runtime::{Idem, idempotent};
use serde_json::Value;
use sqlx::postgres::PgConnectOptions;
use sqlx::{PgConnection, PgPool};

#[derive(Debug, Clone)]
struct Shipment {
    order_id: String,
    seq: i64,
    refuse: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("carrier refused the shipment")]
struct Refused;

#[idempotent(key = "order_id, seq", scope = "cli::ship", max_attempts = 2)]
async fn ship(tx: &mut PgConnection, shipment: &Shipment) -> Result<(), Refused> {
    if shipment.refuse {
        return Err(Refused);
    }
    sqlx::query("INSERT INTO shipments (order_id, seq) VALUES ($1, $2)")
        .bind(&shipment.order_id)
        .bind(shipment.seq)
        .execute(tx)
        .await
        .map(drop)
        .map_err(|_| Refused)
}

fn shipment(order_id: &str, seq: i64) -> Shipment {
    Shipment {
        order_id: order_id.to_owned(),
        seq,
        refuse: false,
    }
}

fn refused(order_id: &str) -> Shipment {
    Shipment {
        refuse: true,
        ..shipment(order_id, 1)
    }
}

/// The URL of the test's database, with `password` (ignored by trust authentication).
fn url(pool: &PgPool, password: Option<&str>) -> String {
    let options: std::sync::Arc<PgConnectOptions> = pool.connect_options();
    let user = options.get_username();
    let credentials = match password {
        Some(password) => format!("{user}:{password}"),
        None => user.to_owned(),
    };
    format!(
        "postgres://{credentials}@{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().expect("the test database's name")
    )
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {}", self.stdout))
    }
}

/// Runs `idem -D url args...`, without the environment's `DATABASE_URL` and libpq variables.
fn idem(url: &str, args: &[&str]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for variable in [
        "DATABASE_URL",
        "PGHOST",
        "PGPORT",
        "PGUSER",
        "PGPASSWORD",
        "PGDATABASE",
        "IDEM_POOLER",
    ] {
        command.env_remove(variable);
    }
    let output = command
        .arg("-D")
        .arg(url)
        .args(args)
        .output()
        .expect("run idem");
    Run {
        code: output.status.code().expect("an exit code"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

#[track_caller]
fn ok(run: Run) -> Run {
    assert_eq!(
        run.code, 0,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    run
}

/// A migrated status table with: shipments o-1..o-5 (seq 1) succeeded, o-failed failed
/// once, o-parked parked.
async fn setup(pool: &PgPool) -> Idem {
    let idem = Idem::new(pool.clone());
    idem.migrate().await.unwrap();
    sqlx::query("CREATE TABLE shipments (order_id text NOT NULL, seq bigint NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    for i in 1..=5 {
        assert!(
            ship(&idem, &shipment(&format!("o-{i}"), 1))
                .await
                .unwrap()
                .is_executed()
        );
    }
    assert!(ship(&idem, &refused("o-failed")).await.is_err());
    for _ in 0..2 {
        assert!(ship(&idem, &refused("o-parked")).await.is_err());
    }
    idem
}

fn key_of(order_id: &str, seq: i64) -> uuid::Uuid {
    idem_runtime::key::KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .part("seq", &seq)
        .unwrap()
        .finish()
        .as_uuid()
}

async fn shipments(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM shipments")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn migrate_applies_and_status_exits_non_zero_while_pending(pool: PgPool) {
    let url = url(&pool, None);
    let pending = idem(&url, &["migrate", "status", "--json"]);
    assert_eq!(pending.code, 5, "{}", pending.stderr);
    let document = pending.json();
    assert!(document["pending"].as_u64().unwrap() >= 7, "{document}");
    assert_eq!(document["migrations"][0]["version"], 1);
    assert_eq!(document["migrations"][0]["applied"], false);
    let human = idem(&url, &["migrate", "status"]);
    assert_eq!(human.code, 5);
    assert!(
        human
            .stdout
            .starts_with("VERSION  STATE    DESCRIPTION\n0001     pending  create idem keys"),
        "{}",
        human.stdout
    );
    assert!(human.stderr.contains("not migrated"), "{}", human.stderr);

    let applied = ok(idem(&url, &["migrate"]));
    assert!(
        applied.stdout.contains("applied 0001 create idem keys"),
        "{}",
        applied.stdout
    );
    assert!(
        applied.stdout.ends_with("schema idem: up to date\n"),
        "{}",
        applied.stdout
    );
    let status = ok(idem(&url, &["migrate", "status", "--json"])).json();
    assert_eq!(status["pending"], 0);
    let again = ok(idem(&url, &["migrate", "run", "--json"])).json();
    assert_eq!(again["applied"].as_array().unwrap().len(), 0, "{again}");

    // Another schema: migrated separately.
    let other = idem(&url, &["--schema", "billing_idem", "migrate", "status"]);
    assert_eq!(other.code, 5);
    ok(idem(&url, &["--schema", "billing_idem", "migrate"]));
    ok(idem(
        &url,
        &["--schema", "billing_idem", "migrate", "status"],
    ));
}

#[sqlx::test(migrations = false)]
async fn migrate_status_shows_the_migrations_of_a_later_release(pool: PgPool) {
    let url = url(&pool, None);
    ok(idem(&url, &["migrate"]));
    // A later release's migration, applied on the same database (a rolling upgrade, or
    // a rollback to this release).
    sqlx::query(
        "INSERT INTO idem._sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9001, 'a later release', TRUE, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let status = ok(idem(&url, &["migrate", "status", "--json"])).json();
    assert_eq!(
        (status["pending"].as_u64(), status["unknown"].as_u64()),
        (Some(0), Some(1)),
        "{status}"
    );
    let last = status["migrations"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (last["version"].as_i64(), last["known"].as_bool()),
        (Some(9001), Some(false)),
        "{last}"
    );
    let human = ok(idem(&url, &["migrate", "status"]));
    assert!(
        human
            .stdout
            .contains("9001     applied, unknown  a later release"),
        "{}",
        human.stdout
    );
    assert!(
        human.stdout.contains("applied by a later release of idem"),
        "{}",
        human.stdout
    );
    // Migrating again keeps it, and the other commands work.
    ok(idem(&url, &["migrate"]));
    ok(idem(&url, &["stats"]));
}

#[sqlx::test(migrations = false)]
async fn scopes_lists_owners_and_key_definitions_and_releases_one(pool: PgPool) {
    let _idem = setup(&pool).await;
    let url = url(&pool, None);
    let listed = ok(idem(&url, &["scopes", "--json"])).json();
    let scopes = listed["scopes"].as_array().unwrap();
    assert_eq!(scopes.len(), 1, "{listed}");
    assert_eq!(scopes[0]["scope"], "cli::ship");
    assert_eq!(scopes[0]["owner"], "cli");
    assert_eq!(
        scopes[0]["key_definition"],
        "idem:v1 key(order_id s, seq i)"
    );
    assert!(scopes[0]["previous_key_definition"].is_null(), "{listed}");
    let human = ok(idem(&url, &["scopes"]));
    assert!(
        human.stdout.starts_with("SCOPE      OWNER  HANDLER"),
        "{}",
        human.stdout
    );
    assert!(
        human.stdout.contains("idem:v1 key(order_id s, seq i)"),
        "{}",
        human.stdout
    );

    // A declared key change in progress shows, with its last use.
    sqlx::query(
        "UPDATE idem.idem_scopes SET previous_key_definition = 'idem:v1 key(order_id s)', \
         previous_key_seen_at = now() WHERE scope = 'cli::ship'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let human = ok(idem(&url, &["scopes", "list"]));
    assert!(
        human
            .stdout
            .contains("cli::ship: key changed from `idem:v1 key(order_id s)` (previous_key)"),
        "{}",
        human.stdout
    );

    let released = ok(idem(&url, &["scopes", "release", "cli::ship", "--json"])).json();
    assert_eq!(released["released"], true);
    let again = idem(&url, &["scopes", "release", "cli::ship"]);
    assert_eq!(again.code, 6, "{}", again.stderr);
    assert!(
        again.stderr.contains("no scope `cli::ship` is recorded"),
        "{}",
        again.stderr
    );
    let listed = ok(idem(&url, &["scopes", "--json"])).json();
    assert_eq!(listed["scopes"].as_array().unwrap().len(), 0, "{listed}");
    assert_eq!(shipments_keys(&pool).await, 7, "the keys stay");
}

#[sqlx::test(migrations = false)]
async fn a_missing_schema_is_exit_code_5(pool: PgPool) {
    let url = url(&pool, None);
    for args in [
        &["keys", "list"][..],
        &["stats"],
        &["purge", "--dry-run"],
        &[
            "keys",
            "show",
            "--scope",
            "s",
            "--key",
            "00000000-0000-8000-8000-000000000000",
        ],
    ] {
        let run = idem(&url, args);
        assert_eq!(run.code, 5, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("schema `idem` is not migrated"),
            "{}",
            run.stderr
        );
        assert!(run.stdout.is_empty());
    }
    let json = idem(&url, &["stats", "--json"]);
    assert_eq!(json.code, 5);
    let error: Value = serde_json::from_str(json.stderr.trim()).unwrap();
    assert_eq!(error["kind"], "not_migrated");
    // An invalid schema name is refused before any SQL.
    assert_eq!(idem(&url, &["--schema", "x; drop", "stats"]).code, 2);
}

// Long on purpose: the ways of naming one key, side by side, against the same stored keys.
#[sqlx::test(migrations = false)]
async fn keys_show_finds_a_key_by_id_or_by_field_values(pool: PgPool) {
    let _idem = setup(&pool).await;
    let url = url(&pool, None);
    let key = key_of("o-1", 1).to_string();

    let by_fields = ok(idem(
        &url,
        &[
            "keys",
            "show",
            "--scope",
            "cli::ship",
            "--field",
            "order_id=o-1",
            "--field",
            "seq:int=1",
            "--json",
        ],
    ))
    .json();
    assert_eq!(by_fields["key"], key.as_str());
    assert_eq!(by_fields["status"], "success");
    assert_eq!(by_fields["attempts"], 1);

    let by_id = ok(idem(
        &url,
        &["keys", "show", "--scope", "cli::ship", "--key", &key],
    ));
    assert!(
        by_id.stdout.contains(&format!("key              {key}\n")),
        "{}",
        by_id.stdout
    );
    assert!(
        by_id.stdout.contains("status           success\n"),
        "{}",
        by_id.stdout
    );

    let parked = ok(idem(
        &url,
        &[
            "keys",
            "show",
            "--scope",
            "cli::ship",
            "--field",
            "order_id=o-parked",
            "--field",
            "seq:int=1",
            "--json",
        ],
    ))
    .json();
    assert_eq!(parked["status"], "parked");
    assert_eq!(parked["last_error"], "carrier refused the shipment");

    // The same values typed as a string make another key, which does not exist.
    let unknown = idem(
        &url,
        &[
            "keys",
            "show",
            "--scope",
            "cli::ship",
            "--field",
            "order_id=o-1",
            "--field",
            "seq=1",
        ],
    );
    assert_eq!(unknown.code, 6, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("no key") && unknown.stderr.contains("cli::ship"),
        "{}",
        unknown.stderr
    );
    let other_scope = idem(
        &url,
        &["keys", "show", "--scope", "cli::other", "--key", &key],
    );
    assert_eq!(other_scope.code, 6);
    let bad_field = idem(
        &url,
        &[
            "keys",
            "show",
            "--scope",
            "cli::ship",
            "--field",
            "seq:int=x",
        ],
    );
    assert_eq!(bad_field.code, 2, "{}", bad_field.stderr);
}

#[sqlx::test(migrations = false)]
async fn keys_list_filters_and_pages(pool: PgPool) {
    let _idem = setup(&pool).await;
    let url = url(&pool, None);

    let all = ok(idem(&url, &["keys", "list", "--json"])).json();
    assert_eq!(all["keys"].as_array().unwrap().len(), 7);
    assert!(all["next"].is_null());

    // Pages of 3, following the cursor: every key once, in order.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["keys", "list", "--limit", "3", "--json"];
        if let Some(cursor) = &after {
            args.extend(["--after", cursor.as_str()]);
        }
        let page = ok(idem(&url, &args)).json();
        for key in page["keys"].as_array().unwrap() {
            seen.push(key["key"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen.len(), 7);
    assert_eq!(seen, sorted);

    let problems = ok(idem(
        &url,
        &[
            "keys", "list", "--status", "failed", "--status", "parked", "--json",
        ],
    ))
    .json();
    let statuses: Vec<&str> = problems["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses.len(), 2);
    assert!(statuses.contains(&"failed") && statuses.contains(&"parked"));

    // Age: one key two hours old.
    sqlx::query("UPDATE idem.idem_keys SET updated_at = now() - interval '2 hours' WHERE key = $1")
        .bind(key_of("o-3", 1))
        .execute(&pool)
        .await
        .unwrap();
    let old = ok(idem(
        &url,
        &["keys", "list", "--older-than", "1h", "--json"],
    ))
    .json();
    assert_eq!(old["keys"].as_array().unwrap().len(), 1);
    assert_eq!(old["keys"][0]["key"], key_of("o-3", 1).to_string().as_str());

    let human = ok(idem(
        &url,
        &["keys", "list", "--scope", "cli::ship", "--limit", "2"],
    ));
    let mut lines = human.stdout.lines();
    assert!(
        lines.next().unwrap().starts_with("SCOPE      KEY"),
        "{}",
        human.stdout
    );
    assert_eq!(lines.clone().count(), 3, "{}", human.stdout);
    assert!(
        human.stdout.contains("more: --after 'cli::ship/"),
        "{}",
        human.stdout
    );
    assert_eq!(idem(&url, &["keys", "list", "--status", "done"]).code, 2);
}

// Long on purpose: one story over one status table, each step reading the state the
// previous one left (the retried parked key is among the failed keys the bulk release counts).
#[sqlx::test(migrations = false)]
async fn keys_retry_and_release_change_failed_and_parked_keys(pool: PgPool) {
    let idem_handle = setup(&pool).await;
    let url = url(&pool, None);
    let parked = key_of("o-parked", 1).to_string();

    // Nothing selected: refused.
    let unselected = idem(&url, &["keys", "retry"]);
    assert_eq!(unselected.code, 2, "{}", unselected.stderr);
    assert!(unselected.stderr.contains("--all"), "{}", unselected.stderr);

    // A dry run shows the key and changes nothing.
    let dry = ok(idem(
        &url,
        &[
            "keys",
            "retry",
            "--scope",
            "cli::ship",
            "--key",
            &parked,
            "--dry-run",
            "--json",
        ],
    ))
    .json();
    assert_eq!(
        (dry["dry_run"].as_bool(), dry["count"].as_u64()),
        (Some(true), Some(1))
    );
    assert_eq!(dry["keys"][0]["status"], "parked");
    let still = ok(idem(
        &url,
        &[
            "keys",
            "show",
            "--scope",
            "cli::ship",
            "--key",
            &parked,
            "--json",
        ],
    ))
    .json();
    assert_eq!(still["status"], "parked");

    // Retried: the next delivery runs the body again.
    let retried = ok(idem(
        &url,
        &["keys", "retry", "--scope", "cli::ship", "--key", &parked],
    ));
    assert!(
        retried.stdout.ends_with("1 key(s) retried\n"),
        "{}",
        retried.stdout
    );
    let now = ok(idem(
        &url,
        &[
            "keys",
            "show",
            "--scope",
            "cli::ship",
            "--key",
            &parked,
            "--json",
        ],
    ))
    .json();
    assert_eq!(
        (now["status"].as_str(), now["attempts"].as_i64()),
        (Some("failed"), Some(0))
    );
    let before = shipments(&pool).await;
    assert!(
        ship(&idem_handle, &shipment("o-parked", 1))
            .await
            .unwrap()
            .is_executed()
    );
    assert_eq!(shipments(&pool).await, before + 1);

    // A succeeded key cannot be retried or released; an unknown one is exit code 6.
    let success = key_of("o-1", 1).to_string();
    let wrong = idem(
        &url,
        &["keys", "release", "--scope", "cli::ship", "--key", &success],
    );
    assert_eq!(wrong.code, 7, "{}", wrong.stderr);
    assert!(wrong.stderr.contains("is `success`"), "{}", wrong.stderr);
    let unknown = idem(
        &url,
        &[
            "keys",
            "retry",
            "--scope",
            "cli::ship",
            "--field",
            "order_id=nope",
            "--field",
            "seq:int=1",
        ],
    );
    assert_eq!(unknown.code, 6, "{}", unknown.stderr);
    let not_releasable = idem(&url, &["keys", "release", "--status", "success"]);
    assert_eq!(not_releasable.code, 2, "{}", not_releasable.stderr);

    // Bulk: every failed key, dry run first.
    for i in 0..3 {
        assert!(
            ship(&idem_handle, &refused(&format!("o-bulk-{i}")))
                .await
                .is_err()
        );
    }
    let preview = ok(idem(
        &url,
        &["keys", "release", "--status", "failed", "--dry-run"],
    ));
    assert!(
        preview
            .stdout
            .ends_with("dry run: 4 key(s) would be released\n"),
        "{}",
        preview.stdout
    );
    let released = ok(idem(&url, &["keys", "release", "--all", "--json"])).json();
    assert_eq!(
        (released["dry_run"].as_bool(), released["count"].as_u64()),
        (Some(false), Some(4))
    );
    let left = ok(idem(&url, &["keys", "list", "--json"])).json();
    assert!(
        left["keys"]
            .as_array()
            .unwrap()
            .iter()
            .all(|key| key["status"] == "success"),
        "{left}"
    );
    // Released: a delivery is a first delivery again.
    assert!(
        ship(&idem_handle, &shipment("o-bulk-0", 1))
            .await
            .unwrap()
            .is_executed()
    );
}

// Long on purpose: stats before and after purges of one status table, the windows (default,
// per scope, declared by a handler) applied in turn.
#[sqlx::test(migrations = false)]
async fn purge_and_stats_report_the_status_table(pool: PgPool) {
    let _idem = setup(&pool).await;
    let url = url(&pool, None);
    // o-1 and o-2 succeeded 10 days ago; the parked key is as old, and stays.
    sqlx::query(
        "UPDATE idem.idem_keys SET created_at = now() - interval '10 days', updated_at = now() - interval '10 days' \
         WHERE key = ANY($1)",
    )
    .bind(vec![key_of("o-1", 1), key_of("o-2", 1), key_of("o-parked", 1)])
    .execute(&pool)
    .await
    .unwrap();

    let stats = ok(idem(&url, &["stats", "--json"])).json();
    assert_eq!(stats["total"], 7);
    let counts = stats["counts"].as_array().unwrap();
    let count_of = |status: &str| {
        counts
            .iter()
            .find(|count| count["scope"] == "cli::ship" && count["status"] == status)
            .map(|count| count["count"].as_i64().unwrap())
    };
    assert_eq!(
        (count_of("success"), count_of("failed"), count_of("parked")),
        (Some(5), Some(1), Some(1))
    );
    assert!(stats["table_bytes"].as_i64().unwrap() > 0);
    assert!(stats["oldest_lease"].is_null());
    assert_eq!(stats["windows"], serde_json::json!([]));
    // A window declared by a handler (as `retention = "30d"` records it).
    sqlx::query("UPDATE idem.idem_scopes SET retention_ms = 2592000000 WHERE scope = 'cli::ship'")
        .execute(&pool)
        .await
        .unwrap();
    let human = ok(idem(&url, &["stats"]));
    assert!(
        human
            .stdout
            .contains("retention of cli::ship: 30d (declared by its handler)\n"),
        "{}",
        human.stdout
    );
    assert!(
        human
            .stdout
            .starts_with("SCOPE      STATUS   KEYS  OLDEST\n"),
        "{}",
        human.stdout
    );
    assert!(human.stdout.contains("total keys: 7\n"), "{}", human.stdout);
    assert!(human.stdout.contains("table size: "), "{}", human.stdout);

    let kept = ok(idem(&url, &["purge", "--dry-run", "--json"])).json();
    assert_eq!(
        kept["deleted"], 0,
        "the handler's 30 days keep them: {kept}"
    );
    sqlx::query("UPDATE idem.idem_scopes SET retention_ms = NULL")
        .execute(&pool)
        .await
        .unwrap();
    let dry = ok(idem(&url, &["purge", "--dry-run", "--json"])).json();
    assert_eq!(
        (dry["dry_run"].as_bool(), dry["deleted"].as_u64()),
        (Some(true), Some(2))
    );
    assert_eq!(ok(idem(&url, &["stats", "--json"])).json()["total"], 7);

    // A scope window of its own keeps them.
    let kept = ok(idem(
        &url,
        &["purge", "--scope-window", "cli::ship=30d", "--json"],
    ))
    .json();
    assert_eq!(kept["deleted"], 0);

    let purged = ok(idem(&url, &["purge", "--batch-size", "1"]));
    assert!(
        purged.stdout.contains("cli::ship  2\n")
            && purged
                .stdout
                .contains("deleted 2 key(s) in 3 batch(es), 0 timeout(s)"),
        "{}",
        purged.stdout
    );
    let after = ok(idem(&url, &["stats", "--json"])).json();
    assert_eq!(after["total"], 5);
    // Shorter than the default: the recent successes go too.
    let short = ok(idem(&url, &["purge", "--older-than", "0s", "--json"])).json();
    assert_eq!(short["deleted"], 3, "{short}");
    assert_eq!(idem(&url, &["purge", "--older-than", "soon"]).code, 2);
}

// Long on purpose: a table of bad connections, each run through the same checks of exit code
// and redaction.
#[sqlx::test(migrations = false)]
async fn bad_urls_and_unreachable_databases_have_their_exit_codes_and_never_show_a_password(
    pool: PgPool,
) {
    let _idem = setup(&pool).await;
    let secret = "Sup3r-S3cret-Pa55";
    let with_password = url(&pool, Some(secret));
    let options: std::sync::Arc<PgConnectOptions> = pool.connect_options();
    let (host, port) = (options.get_host().to_owned(), options.get_port());

    let runs = [
        // Trust authentication ignores the password: the commands work.
        (0, idem(&with_password, &["stats"])),
        (0, idem(&with_password, &["keys", "list", "--json"])),
        (
            6,
            idem(
                &with_password,
                &["keys", "show", "--scope", "cli::ship", "--field", "nope"],
            ),
        ),
        // Not a URL, another scheme, a bad port.
        (
            3,
            idem(
                &format!("postgres://app:{secret}@{host}:notaport/db"),
                &["stats"],
            ),
        ),
        (
            3,
            idem(&format!("mysql://app:{secret}@{host}/db"), &["stats"]),
        ),
        (
            3,
            idem(
                &format!("postgres://app:{secret}@{host}:{port}/db?sslmode=sometimes"),
                &["stats"],
            ),
        ),
        // Nothing listening; a database that does not exist.
        (
            4,
            idem(
                &format!("postgres://app:{secret}@127.0.0.1:1/db"),
                &["stats", "--json"],
            ),
        ),
        (
            4,
            idem(
                &format!("postgres://postgres:{secret}@{host}:{port}/no_such_db_here"),
                &["stats"],
            ),
        ),
    ];
    for (expected, run) in &runs {
        assert_eq!(
            run.code, *expected,
            "stdout: {}\nstderr: {}",
            run.stdout, run.stderr
        );
        assert!(!run.stdout.contains(secret), "{}", run.stdout);
        assert!(!run.stderr.contains(secret), "{}", run.stderr);
    }
    let bad = &runs[3].1;
    assert!(
        bad.stderr
            .contains("invalid database URL postgres://app:***@"),
        "{}",
        bad.stderr
    );
    let refused: Value = serde_json::from_str(runs[6].1.stderr.trim()).unwrap();
    assert_eq!(refused["kind"], "connect");
    assert!(
        runs[7].1.stderr.contains("no_such_db_here"),
        "{}",
        runs[7].1.stderr
    );

    // The libpq variables, when no URL is given.
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("DATABASE_URL")
        .env("PGHOST", &host)
        .env("PGPORT", port.to_string())
        .env("PGUSER", options.get_username())
        .env("PGPASSWORD", secret)
        .env("PGDATABASE", options.get_database().unwrap())
        .args(["stats", "--json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stats: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(stats["total"], 7);
    // PGPASSWORD is redacted from errors too.
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("DATABASE_URL")
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", "1")
        .env("PGPASSWORD", secret)
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(4));
    assert!(!String::from_utf8_lossy(&output.stderr).contains(secret));
}

#[sqlx::test(migrations = false)]
async fn sslmode_in_the_url_connects_over_tls(pool: PgPool) {
    let _idem = setup(&pool).await;
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&pool)
        .await
        .unwrap();
    let plain = url(&pool, None);
    let require = idem(&format!("{plain}?sslmode=require"), &["stats", "--json"]);
    let verify = idem(&format!("{plain}?sslmode=verify-full"), &["stats"]);
    if ssl == "on" {
        // Encrypted without checking the certificate; checked against the webpki roots,
        // the server's own certificate is refused.
        assert_eq!(require.code, 0, "{}", require.stderr);
        assert_eq!(require.json()["total"], 7);
        assert_eq!(verify.code, 4, "{}", verify.stderr);
        assert!(verify.stderr.contains("certificate"), "{}", verify.stderr);
    } else {
        // The server has no TLS: the client asked for it (it is built with TLS support).
        for run in [&require, &verify] {
            assert_eq!(run.code, 4, "{}", run.stderr);
            assert!(run.stderr.contains("TLS"), "{}", run.stderr);
            assert!(
                !run.stderr.contains("without TLS support"),
                "{}",
                run.stderr
            );
        }
    }
    ok(idem(&format!("{plain}?sslmode=disable"), &["stats"]));
}

/// Through PgBouncer in transaction pooling (`IDEM_PGBOUNCER_TRANSACTION_URL`, which
/// `scripts/test.sh` exports) with `--pooler transaction`: migrate, list, retry, stats and
/// purge work, and the keys they change are the ones a direct connection sees.
#[sqlx::test(migrations = false)]
async fn every_command_works_through_a_transaction_pooler(pool: PgPool) {
    let _idem = setup(&pool).await;
    let pooler = std::env::var("IDEM_PGBOUNCER_TRANSACTION_URL").expect(
        "IDEM_PGBOUNCER_TRANSACTION_URL: run the tests through scripts/test.sh, or export what `scripts/services.sh up --print-env pgbouncer` prints",
    );
    let base = pooler.rsplit_once('/').expect("a URL with a database").0;
    let database = pool.connect_options().get_database().unwrap().to_owned();
    let url = format!("{base}/{database}");
    let through = |args: &[&str]| {
        let mut args = args.to_vec();
        args.extend(["--pooler", "transaction"]);
        idem(&url, &args)
    };
    ok(through(&["migrate"]));
    ok(through(&["migrate", "status"]));
    let parked = ok(through(&["keys", "list", "--status", "parked", "--json"])).json();
    assert_eq!(parked["keys"].as_array().map(Vec::len), Some(1), "{parked}");
    ok(through(&["keys", "retry", "--all", "--status", "parked"]));
    let record: (String, i32) =
        sqlx::query_as("SELECT status, attempts FROM idem.idem_keys WHERE key = $1")
            .bind(key_of("o-parked", 1))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(record, ("failed".to_owned(), 0));
    let stats = ok(through(&["stats", "--json"])).json();
    assert_eq!(stats["total"], 7);
    let dry_run = ok(through(&[
        "purge",
        "--older-than",
        "0s",
        "--dry-run",
        "--json",
    ]))
    .json();
    assert_eq!(dry_run["deleted"], 5, "{dry_run}");
    ok(through(&["purge", "--older-than", "0s"]));
    assert_eq!(shipments_keys(&pool).await, 2);
    // The pooler's server connections to the test's database end with it.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&pool)
    .await
    .unwrap();
}

/// The status table's rows.
async fn shipments_keys(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem.idem_keys")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn outbox_shows_the_lag_lists_parked_records_and_puts_one_back(pool: PgPool) {
    let url = url(&pool, None);
    // No outbox yet: said so, exit code 5.
    let missing = idem(&url, &["outbox"]);
    assert_eq!(missing.code, 5, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("has no outbox"),
        "{}",
        missing.stderr
    );

    let idem_handle = Idem::new(pool.clone());
    idem_handle.migrate().await.unwrap();
    let schema = idem_kafka::Schema::for_idem(&idem_handle);
    idem_kafka::migrate(&idem_handle, &schema).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let records = (0..3).map(|n| {
        idem_kafka::outbox::Record::to("receipts")
            .idempotency_key(uuid::Uuid::from_u128(n + 1))
            .key(format!("order-{n}"))
            .payload("{}")
    });
    idem_kafka::outbox::send_all_in(&schema, &mut tx, records)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // One record set aside as the relay does it.
    sqlx::query(
        "UPDATE idem_kafka.kafka_outbox SET parked_at = now(), attempts = 1, \
         last_error = 'Message production error: MessageSizeTooLarge' \
         WHERE idem_key = '00000000-0000-0000-0000-000000000001'",
    )
    .execute(&pool)
    .await
    .unwrap();

    let status = ok(idem(&url, &["outbox"]));
    assert!(
        status.stdout.contains("2 unsent") && status.stdout.contains("1 parked"),
        "{}",
        status.stdout
    );
    let json: Value = serde_json::from_str(&ok(idem(&url, &["--json", "outbox"])).stdout).unwrap();
    assert_eq!(json["unsent"], 2);
    assert_eq!(json["parked"], 1);
    assert!(json["oldest_unsent_seconds"].as_f64().unwrap() >= 0.0);

    let parked = ok(idem(&url, &["--json", "outbox", "parked"]));
    let parked: Value = serde_json::from_str(&parked.stdout).unwrap();
    let id = parked["parked"][0]["id"].as_i64().unwrap();
    assert_eq!(
        parked["parked"][0]["idem_key"],
        "00000000-0000-0000-0000-000000000001"
    );
    assert!(
        ok(idem(&url, &["outbox", "parked"]))
            .stdout
            .contains("MessageSizeTooLarge")
    );
    // The outbox's schema is named before or after the action.
    for args in [
        &["outbox", "--outbox-schema", "idem_kafka", "parked"][..],
        &["outbox", "parked", "--outbox-schema", "idem_kafka"][..],
    ] {
        let named = ok(idem(&url, args));
        assert!(
            named.stdout.contains("MessageSizeTooLarge"),
            "{args:?}: {}",
            named.stdout
        );
    }
    let elsewhere = idem(
        &url,
        &["outbox", "parked", "--outbox-schema", "nowhere_kafka"],
    );
    assert_eq!(elsewhere.code, 5, "{}", elsewhere.stderr);

    let unknown = idem(&url, &["outbox", "retry", "999999"]);
    assert_eq!(unknown.code, 6, "{}", unknown.stderr);
    assert_eq!(idem(&url, &["outbox", "retry"]).code, 2);
    let retried = ok(idem(&url, &["outbox", "retry", &id.to_string()]));
    assert!(retried.stdout.contains("1 record(s)"), "{}", retried.stdout);
    let json: Value = serde_json::from_str(&ok(idem(&url, &["--json", "outbox"])).stdout).unwrap();
    assert_eq!(
        (json["unsent"].clone(), json["parked"].clone()),
        (3.into(), 0.into())
    );
}

/// The broker of `idem lag`'s tests: `KAFKA_BROKERS`, else 127.0.0.1:9092.
fn brokers() -> String {
    std::env::var("KAFKA_BROKERS")
        .ok()
        .filter(|brokers| !brokers.is_empty())
        .unwrap_or_else(|| "127.0.0.1:9092".to_owned())
}

/// A new topic on the broker, of as many partitions as `records` has numbers, partition
/// `p` holding `records[p]` records; fails the test, saying so, when the broker does not answer.
async fn topic_with_records(brokers: &str, records: &[i64]) -> String {
    use rdkafka::ClientConfig;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use std::time::Duration;

    let topic = format!(
        "idem-cli-lag-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    let partitions = i32::try_from(records.len()).unwrap();
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let answered = tokio::task::spawn_blocking(move || {
        probe
            .fetch_metadata(None, Duration::from_secs(10))
            .map(|_| probe)
    })
    .await
    .unwrap();
    let probe = answered.unwrap_or_else(|error| {
        panic!(
            "`idem lag`'s tests need a Kafka broker at {brokers} (KAFKA_BROKERS): it does not answer: {error}"
        )
    });
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .create_topics(
            [&NewTopic::new(
                &topic,
                partitions,
                TopicReplication::Fixed(1),
            )],
            &options,
        )
        .await
        .unwrap()
    {
        result.unwrap_or_else(|(name, code)| panic!("creating topic {name}: {code}"));
    }
    let wanted = records.len();
    let waited = topic.clone();
    tokio::task::spawn_blocking(move || {
        for _ in 0..150 {
            let metadata = probe
                .fetch_metadata(Some(&waited), Duration::from_secs(5))
                .unwrap();
            if metadata.topics().iter().any(|t| {
                t.name() == waited && t.error().is_none() && t.partitions().len() == wanted
            }) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("topic {waited} never showed its {wanted} partitions");
    })
    .await
    .unwrap();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("message.timeout.ms", "10000")
        .create()
        .unwrap();
    // Records waiting since 10 minutes ago, as a stalled partition's are.
    let stamped_at = chrono::Utc::now().timestamp_millis() - 600_000;
    for (partition, count) in (0..).zip(records) {
        for n in 0..*count {
            let payload = format!("record {n}");
            producer
                .send(
                    FutureRecord::<str, str>::to(&topic)
                        .partition(partition)
                        .payload(&payload)
                        .timestamp(stamped_at),
                    Duration::from_secs(10),
                )
                .await
                .unwrap_or_else(|(error, _)| panic!("producing to {topic}: {error}"));
        }
    }
    topic
}

#[sqlx::test(migrations = false)]
async fn lag_shows_every_partition_and_exits_8_when_one_stalled(pool: PgPool) {
    let url = url(&pool, None);
    let brokers = brokers();
    // Partition 0 holds 5 records, partition 1 holds 3.
    let topic = topic_with_records(&brokers, &[5, 3]).await;
    let group = format!("{topic}-appliers");
    let lag = |extra: &[&str]| {
        let mut args = vec![
            "lag",
            "--brokers",
            &brokers,
            "--group",
            &group,
            "--topic",
            &topic,
        ];
        args.extend_from_slice(extra);
        idem(&url, &args)
    };

    // Positions in PostgreSQL before idem-kafka's tables exist: said so, exit code 5.
    let missing = lag(&["--offsets", "postgres"]);
    assert_eq!(missing.code, 5, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("no kafka_offsets table"),
        "{}",
        missing.stderr
    );

    let idem_handle = Idem::new(pool.clone());
    idem_handle.migrate().await.unwrap();
    let schema = idem_kafka::Schema::for_idem(&idem_handle);
    idem_kafka::migrate(&idem_handle, &schema).await.unwrap();
    // Partition 0 at offset 2, last moved ten minutes ago; partition 1 at offset 1, just
    // moved.
    sqlx::query(
        "INSERT INTO idem_kafka.kafka_offsets \
         (consumer_group, topic, kafka_partition, next_offset, updated_at) VALUES \
         ($1, $2, 0, 2, now() - interval '10 minutes'), ($1, $2, 1, 1, now())",
    )
    .bind(&group)
    .bind(&topic)
    .execute(&pool)
    .await
    .unwrap();

    let human = lag(&["--offsets", "postgres"]);
    assert_eq!(human.code, 8, "{}\n{}", human.stdout, human.stderr);
    let lines: Vec<&str> = human.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "group {group} on topic {topic}, positions stored in PostgreSQL (idem_kafka.kafka_offsets)"
        ),
        "{}",
        human.stdout
    );
    assert_eq!(
        lines[1], "PARTITION  POSITION  LOW  HIGH  LAG  MOVED",
        "{}",
        human.stdout
    );
    assert!(
        lines[2].starts_with("0          2         0    5     3    10m 0")
            && lines[2].ends_with("s ago  stalled"),
        "{}",
        human.stdout
    );
    assert!(
        lines[3].starts_with("1          1         0    3     2    ")
            && lines[3].ends_with("s ago"),
        "{}",
        human.stdout
    );
    assert_eq!(
        lines[4],
        "total lag: 5 on 2 partition(s); 1 stalled (lag, and no move for longer than 30s)"
    );
    assert!(
        human.stderr.contains("stalled") && human.stderr.contains("partition(s) 0 (lag 3"),
        "{}",
        human.stderr
    );

    let json = lag(&["--offsets", "postgres", "--json"]);
    assert_eq!(json.code, 8, "{}", json.stderr);
    let error: Value = serde_json::from_str(json.stderr.trim()).unwrap();
    assert_eq!(error["kind"], "stalled");
    let document = json.json();
    assert_eq!(document["offsets"], "postgres");
    assert_eq!(document["schema"], "idem_kafka");
    assert_eq!(document["total_lag"], 5);
    assert_eq!(document["stalled"], 1);
    let first = &document["partitions"][0];
    assert_eq!(
        (
            &first["partition"],
            &first["position"],
            &first["low_watermark"],
            &first["high_watermark"],
            &first["lag"],
            &first["stalled"]
        ),
        (
            &0.into(),
            &2.into(),
            &0.into(),
            &5.into(),
            &3.into(),
            &true.into()
        ),
        "{document}"
    );
    assert!(first["moved_seconds_ago"].as_f64().unwrap() >= 600.0);
    assert!(first["moved_at"].is_string());
    let second = &document["partitions"][1];
    assert_eq!(
        (&second["position"], &second["lag"], &second["stalled"]),
        (&1.into(), &2.into(), &false.into()),
        "{document}"
    );

    assert!(first["waiting_since"].is_string(), "{document}");

    // A longer bound: nothing stalled, exit code 0.
    let patient = ok(lag(&["--offsets", "postgres", "--stalled-after", "1h"]));
    assert!(
        patient
            .stdout
            .contains("; 0 stalled (lag, and no move for longer than 1h)"),
        "{}",
        patient.stdout
    );
    assert!(!patient.stdout.contains("stalled\n"), "{}", patient.stdout);
    // An idle partition (caught up, its position last moved ten minutes ago) that a record
    // just reached: lag, but nothing has waited long: not stalled.
    sqlx::query(
        "UPDATE idem_kafka.kafka_offsets SET next_offset = 3, updated_at = now() - interval '10 minutes' \
         WHERE consumer_group = $1 AND topic = $2 AND kafka_partition = 1",
    )
    .bind(&group)
    .bind(&topic)
    .execute(&pool)
    .await
    .unwrap();
    {
        use rdkafka::ClientConfig;
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("message.timeout.ms", "10000")
            .create()
            .unwrap();
        producer
            .send(
                FutureRecord::<str, str>::to(&topic)
                    .partition(1)
                    .payload("fresh"),
                std::time::Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|(error, _)| panic!("producing to {topic}: {error}"));
    }
    let fresh = lag(&["--offsets", "postgres", "--json"]);
    let document = fresh.json();
    let idle = &document["partitions"][1];
    assert_eq!(
        (&idle["lag"], &idle["stalled"]),
        (&1.into(), &false.into()),
        "{document}"
    );
    // Back as it was for what follows.
    sqlx::query(
        "UPDATE idem_kafka.kafka_offsets SET next_offset = 1, updated_at = now() \
         WHERE consumer_group = $1 AND topic = $2 AND kafka_partition = 1",
    )
    .bind(&group)
    .bind(&topic)
    .execute(&pool)
    .await
    .unwrap();

    // The schema named; another one without the table.
    ok(lag(&[
        "--offsets",
        "postgres",
        "--kafka-schema",
        "idem_kafka",
        "--stalled-after",
        "1h",
    ]));
    let elsewhere = lag(&["--offsets", "postgres", "--kafka-schema", "nowhere_kafka"]);
    assert_eq!(elsewhere.code, 5, "{}", elsewhere.stderr);
    assert_eq!(
        lag(&["--offsets", "postgres", "--stalled-after", "soon"]).code,
        2
    );

    // Positions in Kafka (the default), where the group committed nothing: no position,
    // the whole partition is lag (partition 1 holds the fresh record too), nothing said
    // stalled.
    let kafka = ok(lag(&["--json"])).json();
    assert_eq!(kafka["offsets"], "kafka");
    assert_eq!(kafka["schema"], Value::Null);
    assert_eq!(kafka["total_lag"], 9);
    assert_eq!(kafka["stalled"], 0);
    assert_eq!(kafka["partitions_with_position"], 0);
    for (partition, high) in [(0, 5), (1, 4)] {
        let row = &kafka["partitions"][partition];
        assert_eq!(
            (
                &row["position"],
                &row["low_watermark"],
                &row["high_watermark"],
                &row["lag"],
                &row["moved_at"]
            ),
            (
                &Value::Null,
                &0.into(),
                &high.into(),
                &high.into(),
                &Value::Null
            ),
            "{kafka}"
        );
    }
    let kafka = ok(lag(&["--offsets", "kafka"]));
    let lines: Vec<&str> = kafka.stdout.lines().collect();
    assert!(
        lines[0].ends_with("positions committed to Kafka"),
        "{}",
        kafka.stdout
    );
    assert_eq!(lines[2], "0          -         0    5     5    -");
    assert_eq!(lines[3], "1          -         0    4     4    -");
    assert!(
        kafka
            .stdout
            .contains(&format!("group {group} has no position on topic {topic}")),
        "{}",
        kafka.stdout
    );

    // The group commits a position on partition 0.
    commit(&brokers, &group, &topic, 0, 4).await;
    let committed = ok(lag(&["--offsets", "kafka"]));
    let lines: Vec<&str> = committed.stdout.lines().collect();
    assert_eq!(lines[2], "0          4         0    5     1    -");
    assert_eq!(lines[3], "1          -         0    4     4    -");
    assert_eq!(
        lines[4],
        "total lag: 5 on 2 partition(s); 0 stalled (lag, and no move for longer than 30s)"
    );
    assert_eq!(
        lines[5],
        "positions in Kafka do not say when they last moved: no partition is marked stalled"
    );

    // A topic the broker does not know: said so, exit code 6.
    let unknown = idem(
        &url,
        &[
            "lag",
            "--brokers",
            &brokers,
            "--group",
            &group,
            "--topic",
            &format!("{topic}-nowhere"),
        ],
    );
    assert_eq!(unknown.code, 6, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("knows no topic"),
        "{}",
        unknown.stderr
    );
    // A broker that does not answer: exit code 4.
    let unreachable = idem(
        &url,
        &[
            "--json",
            "lag",
            "--brokers",
            "127.0.0.1:1",
            "--group",
            &group,
            "--topic",
            &topic,
        ],
    );
    assert_eq!(unreachable.code, 4, "{}", unreachable.stderr);
    let error: Value = serde_json::from_str(unreachable.stderr.trim()).unwrap();
    assert_eq!(error["kind"], "broker");
    assert!(
        error["error"].as_str().unwrap().contains("127.0.0.1:1"),
        "{error}"
    );
}

/// Commits `offset` as `group`'s position on `partition` of `topic`, without joining the
/// group.
async fn commit(brokers: &str, group: &str, topic: &str, partition: i32, offset: i64) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, partition, Offset::Offset(offset))
        .unwrap();
    tokio::task::spawn_blocking(move || consumer.commit(&list, CommitMode::Sync))
        .await
        .unwrap()
        .unwrap_or_else(|error| panic!("committing {group}'s position: {error}"));
}

/// An argument the parser refuses is one JSON object on stderr with `--json`, as every
/// other error is, and the parser's own text without.
#[test]
fn with_json_an_argument_the_parser_refuses_is_a_json_error() {
    let url = "postgres://postgres@127.0.0.1:1/never_reached";
    let refused = idem(
        url,
        &["--json", "keys", "show", "--scope", "x", "--key", "zz"],
    );
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    let error: Value = serde_json::from_str(refused.stderr.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", refused.stderr));
    assert_eq!(error["kind"], "usage");
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|text| text.starts_with("invalid value 'zz' for '--key <KEY>'")),
        "{error}"
    );
    let unknown = idem(url, &["--json", "stats", "--no-such-flag"]);
    assert_eq!(unknown.code, 2);
    let error: Value = serde_json::from_str(unknown.stderr.trim()).unwrap();
    assert_eq!(error["kind"], "usage");
    // Without --json, the parser's text and its hint.
    let plain = idem(url, &["keys", "show", "--scope", "x", "--key", "zz"]);
    assert_eq!(plain.code, 2);
    assert!(
        plain.stderr.starts_with("error: invalid value 'zz'"),
        "{}",
        plain.stderr
    );
    assert!(plain.stderr.contains("--help"), "{}", plain.stderr);
    // Help is help, with --json too.
    let help = idem(url, &["--json", "--help"]);
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("Usage: idem"), "{}", help.stdout);
}
