//! The `idem` binary on keys kept by their fact's time (`event_time`), run as a process
//! against a throwaway database: `keys show` finds one by its field values (the time to
//! the nanosecond) and shows its fact time, `keys list` adds a FACT TIME column, `keys
//! retry` and `keys release` change one by scope and key, `stats` counts them and shows
//! the time buckets, `purge --dry-run` names the buckets the cleanup would make and drop,
//! and `purge` then makes and drops them; also through PgBouncer in transaction pooling.
use std::process::Command;

use chrono::{DateTime, DurationRound, SecondsFormat, TimeDelta, Utc};
use idem_runtime::{Idem, idempotent};
use serde_json::Value;
use sqlx::postgres::PgConnectOptions;
use sqlx::{PgConnection, PgPool};

const SCOPE: &str = "cli::readings";

#[derive(Debug, Clone)]
struct Reading {
    meter: String,
    taken_at: DateTime<Utc>,
    refused: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("the reading is refused")]
struct Refused;

#[idempotent(
    key = "meter, taken_at",
    event_time = "taken_at",
    scope = "cli::readings",
    max_attempts = 2
)]
async fn record_reading(tx: &mut PgConnection, reading: &Reading) -> Result<(), Refused> {
    let _ = tx;
    if reading.refused {
        return Err(Refused);
    }
    Ok(())
}

#[idempotent(key = "meter", scope = "cli::meters")]
async fn register_meter(tx: &mut PgConnection, reading: &Reading) -> Result<(), Refused> {
    let _ = (tx, reading);
    Ok(())
}

fn reading(meter: &str, age: TimeDelta, refused: bool) -> Reading {
    Reading {
        meter: meter.to_owned(),
        taken_at: (Utc::now() - age)
            .duration_trunc(TimeDelta::microseconds(1))
            .unwrap(),
        refused,
    }
}

/// The `--field` arguments of `reading`'s key.
fn fields(reading: &Reading) -> [String; 4] {
    [
        "--field".to_owned(),
        format!("meter={}", reading.meter),
        "--field".to_owned(),
        format!(
            "taken_at:time={}",
            reading.taken_at.to_rfc3339_opts(SecondsFormat::Nanos, true)
        ),
    ]
}

fn url(pool: &PgPool) -> String {
    let options: std::sync::Arc<PgConnectOptions> = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
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
fn idem<S: AsRef<str>>(url: &str, args: &[S]) -> Run {
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
        .args(args.iter().map(AsRef::as_ref))
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

/// `args` followed by `reading`'s `--field` arguments.
fn with_fields(args: &[&str], reading: &Reading) -> Vec<String> {
    args.iter()
        .map(|arg| (*arg).to_owned())
        .chain(fields(reading))
        .collect()
}

#[sqlx::test(migrations = false)]
async fn timed_keys_are_shown_listed_counted_changed_and_their_buckets_kept(pool: PgPool) {
    let runtime = Idem::new(pool.clone());
    runtime.migrate().await.unwrap();
    let applied = reading("m-applied", TimeDelta::hours(2), false);
    let parked = reading("m-parked", TimeDelta::hours(30), true);
    let failed = reading("m-failed", TimeDelta::minutes(1), true);
    record_reading(&runtime, &applied).await.unwrap();
    for _ in 0..2 {
        assert!(record_reading(&runtime, &parked).await.is_err());
    }
    assert!(record_reading(&runtime, &failed).await.is_err());
    register_meter(&runtime, &reading("m-plain", TimeDelta::zero(), false))
        .await
        .unwrap();
    let url = url(&pool);

    // keys show: by the field values, with the fact time to the microsecond.
    let shown = ok(idem(
        &url,
        &with_fields(&["keys", "show", "--scope", SCOPE], &applied),
    ));
    let fact_time = applied
        .taken_at
        .to_rfc3339_opts(SecondsFormat::AutoSi, true);
    assert!(
        shown.stdout.contains("status           success\n"),
        "{}",
        shown.stdout
    );
    assert!(
        shown
            .stdout
            .contains(&format!("fact_time        {fact_time}\n")),
        "{}",
        shown.stdout
    );
    let document = ok(idem(
        &url,
        &with_fields(&["keys", "show", "--scope", SCOPE, "--json"], &parked),
    ))
    .json();
    assert_eq!(document["status"], "parked");
    let parked_key = document["key"].as_str().unwrap().to_owned();
    assert_eq!(
        document["fact_time"]
            .as_str()
            .map(|t| t.parse::<DateTime<Utc>>().unwrap()),
        Some(parked.taken_at)
    );
    let plain = ok(idem(
        &url,
        &[
            "keys",
            "show",
            "--scope",
            "cli::meters",
            "--field",
            "meter=m-plain",
        ],
    ));
    assert!(!plain.stdout.contains("fact_time"), "{}", plain.stdout);

    // keys list: a FACT TIME column for a page with timed keys, none without.
    let listed = ok(idem(&url, &["keys", "list", "--scope", SCOPE]));
    let header = listed.stdout.lines().next().unwrap();
    assert!(
        header.starts_with("SCOPE") && header.contains("UPDATED") && header.contains("FACT TIME"),
        "{}",
        listed.stdout
    );
    assert!(listed.stdout.contains(&fact_time), "{}", listed.stdout);
    assert!(listed.stdout.ends_with("3 key(s)\n"), "{}", listed.stdout);
    let plain = ok(idem(&url, &["keys", "list", "--scope", "cli::meters"]));
    assert!(!plain.stdout.contains("FACT TIME"), "{}", plain.stdout);
    let everything = ok(idem(&url, &["keys", "list", "--json"])).json();
    let keys = everything["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 4, "{everything}");
    assert_eq!(
        keys.iter()
            .filter(|key| key["fact_time"].is_string())
            .count(),
        3
    );

    // stats: the counts with the facts' span, and the buckets.
    let stats = ok(idem(&url, &["stats"]));
    for needle in [
        "SCOPE          STATUS   KEYS  OLDEST                FACTS",
        "total keys: 4\n",
        "keys kept by their fact's time: 3\n",
        "time buckets: ",
        "time buckets made ahead: ",
        "time bucket horizon: none (no bucket has expired)\n",
    ] {
        assert!(stats.stdout.contains(needle), "{needle}: {}", stats.stdout);
    }
    let document = ok(idem(&url, &["stats", "--json"])).json();
    assert_eq!(document["total"], 4);
    assert_eq!(document["timed_total"], 3);
    assert!(document["buckets"]["count"].as_u64().unwrap() >= 3);
    assert!(document["buckets"]["horizon"].is_null());
    let buckets = ok(idem(&url, &["stats", "--buckets"]));
    assert!(
        buckets
            .stdout
            .contains("BUCKET                           FROM"),
        "{}",
        buckets.stdout
    );
    let document = ok(idem(&url, &["stats", "--buckets", "--json"])).json();
    let count = document["count"].as_u64().unwrap();
    assert_eq!(document["buckets"].as_array().unwrap().len() as u64, count);

    // keys retry / release: one timed key by scope and key, or by its fields.
    let retried = ok(idem(
        &url,
        &["keys", "retry", "--scope", SCOPE, "--key", &parked_key],
    ));
    assert!(
        retried.stdout.ends_with("1 key(s) retried\n"),
        "{}",
        retried.stdout
    );
    let after = ok(idem(
        &url,
        &[
            "keys",
            "show",
            "--scope",
            SCOPE,
            "--key",
            &parked_key,
            "--json",
        ],
    ))
    .json();
    assert_eq!(
        (after["status"].as_str(), after["attempts"].as_i64()),
        (Some("failed"), Some(0))
    );
    let success = idem(
        &url,
        &with_fields(&["keys", "retry", "--scope", SCOPE], &applied),
    );
    assert_eq!(success.code, 7, "{}", success.stderr);
    let released = ok(idem(
        &url,
        &with_fields(&["keys", "release", "--scope", SCOPE, "--json"], &failed),
    ))
    .json();
    assert_eq!(released["count"], 1);
    assert!(released["keys"][0]["fact_time"].is_string());
    let gone = idem(
        &url,
        &with_fields(&["keys", "show", "--scope", SCOPE], &failed),
    );
    assert_eq!(gone.code, 6, "{}", gone.stderr);

    // purge --dry-run: the buckets it would make ahead and drop (the parked fact's, 30
    // hours old, with a one-day window); then purge does it.
    let dry = ok(idem(
        &url,
        &[
            "purge",
            "--dry-run",
            "--older-than",
            "1d",
            "--future-bound",
            "3h",
        ],
    ));
    let parked_bucket = format!(
        "idem_timed_keys_{}",
        parked
            .taken_at
            .duration_trunc(TimeDelta::hours(1))
            .unwrap()
            .format("%Y%m%d_%H%M%S")
    );
    assert!(
        dry.stdout
            .contains(&format!("dry run: time bucket {parked_bucket} (")),
        "{}",
        dry.stdout
    );
    assert!(dry.stdout.contains(" would be made\n"), "{}", dry.stdout);
    let plan = ok(idem(
        &url,
        &[
            "purge",
            "--dry-run",
            "--older-than",
            "1d",
            "--future-bound",
            "3h",
            "--json",
        ],
    ))
    .json();
    assert_eq!(plan["dry_run"], true);
    assert_eq!(
        plan["buckets_to_drop"].as_array().unwrap().len(),
        1,
        "{plan}"
    );
    assert_eq!(plan["buckets_to_drop"][0]["name"], parked_bucket.as_str());
    let to_make = plan["buckets_to_make"].as_array().unwrap().len();
    assert!(to_make >= 1, "{plan}");
    assert_eq!(plan["buckets_made"], to_make);
    assert_eq!(plan["buckets_dropped"], 1);

    let purged = ok(idem(
        &url,
        &[
            "purge",
            "--older-than",
            "1d",
            "--future-bound",
            "3h",
            "--json",
        ],
    ))
    .json();
    assert_eq!(purged["buckets_made"], to_make, "{purged}");
    assert_eq!(purged["buckets_dropped"], 1, "{purged}");
    let stats = ok(idem(&url, &["stats", "--json"])).json();
    assert_eq!(
        stats["buckets"]["horizon"]
            .as_str()
            .map(|t| t.parse::<DateTime<Utc>>().unwrap()),
        Some(parked.taken_at.duration_trunc(TimeDelta::hours(1)).unwrap() + TimeDelta::hours(1))
    );
    let human = ok(idem(&url, &["stats"]));
    assert!(
        human
            .stdout
            .contains(": facts before it are refused as outside the window\n"),
        "{}",
        human.stdout
    );
    let again = ok(idem(
        &url,
        &[
            "purge",
            "--dry-run",
            "--older-than",
            "1d",
            "--future-bound",
            "3h",
        ],
    ));
    assert!(
        again
            .stdout
            .ends_with("dry run: 0 key(s) would be deleted\n"),
        "{}",
        again.stdout
    );
}

/// Through PgBouncer in transaction pooling (`IDEM_PGBOUNCER_TRANSACTION_URL`, which
/// `scripts/test.sh` exports) with `--pooler transaction`: the commands on timed keys and
/// buckets work, and change what a direct connection sees.
#[sqlx::test(migrations = false)]
async fn timed_keys_and_buckets_through_a_transaction_pooler(pool: PgPool) {
    let runtime = Idem::new(pool.clone());
    runtime.migrate().await.unwrap();
    let parked = reading("m-parked", TimeDelta::hours(30), true);
    for _ in 0..2 {
        assert!(record_reading(&runtime, &parked).await.is_err());
    }
    let pooler = std::env::var("IDEM_PGBOUNCER_TRANSACTION_URL").expect(
        "IDEM_PGBOUNCER_TRANSACTION_URL: run the tests through scripts/test.sh, or export what `scripts/services.sh up --print-env pgbouncer` prints",
    );
    let base = pooler.rsplit_once('/').expect("a URL with a database").0;
    let database = pool.connect_options().get_database().unwrap().to_owned();
    let url = format!("{base}/{database}");
    let through = |args: Vec<String>| {
        let mut args = args;
        args.extend(["--pooler".to_owned(), "transaction".to_owned()]);
        idem(&url, &args)
    };
    let strings = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();

    let shown = ok(through(with_fields(
        &["keys", "show", "--scope", SCOPE, "--json"],
        &parked,
    )))
    .json();
    assert_eq!(shown["status"], "parked");
    let listed = ok(through(strings(&["keys", "list", "--json"]))).json();
    assert_eq!(listed["keys"].as_array().unwrap().len(), 1, "{listed}");
    let stats = ok(through(strings(&["stats", "--json"]))).json();
    assert_eq!(stats["timed_total"], 1, "{stats}");
    let buckets = ok(through(strings(&["stats", "--buckets", "--json"]))).json();
    assert!(buckets["count"].as_u64().unwrap() >= 1, "{buckets}");
    let plan = ok(through(strings(&[
        "purge",
        "--dry-run",
        "--older-than",
        "1d",
        "--json",
    ])))
    .json();
    assert_eq!(
        plan["buckets_to_drop"].as_array().unwrap().len(),
        1,
        "{plan}"
    );
    ok(through(with_fields(
        &["keys", "retry", "--scope", SCOPE],
        &parked,
    )));
    let row: (String, i32) =
        sqlx::query_as("SELECT status, attempts FROM idem.idem_timed_keys WHERE scope = $1")
            .bind(SCOPE)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(row, ("failed".to_owned(), 0));
    let purged = ok(through(strings(&["purge", "--older-than", "1d", "--json"]))).json();
    assert_eq!(purged["buckets_dropped"], 1, "{purged}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idem.idem_timed_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "the parked fact's key went with its bucket");
    // The pooler's server connections to the test's database end with it (the next run
    // drops and makes the database again).
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&pool)
    .await
    .unwrap();
}
