//! The operator API on keys kept by their fact's time (`event_time`), against PostgreSQL:
//! such a key is shown, listed, found from its field values, counted, retried, reset and
//! released by scope and key as a key of the status table is, with its fact time; the
//! overview shows the time buckets (how far back and ahead they reach, the horizon, the
//! catalog's estimate of their rows); the purge plan names the buckets that the next
//! upkeep makes and drops, and the upkeep then does exactly that; the gauges of the
//! buckets follow.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use idem_runtime::admin::{self, AdminError, Cursor, KeyField, KeyFilter, TimeBuckets};
use idem_runtime::key::KeyBuilder;
use idem_runtime::retention::Retention;
use idem_runtime::{Error, Idem, IdempotencyKey, Status, idempotent};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use sqlx::{PgConnection, PgPool};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone)]
struct Reading {
    meter: String,
    taken_at: DateTime<Utc>,
    /// The handler fails for a reading that is refused.
    refused: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("the reading is refused")]
struct Refused;

#[idempotent(
    key = "meter, taken_at",
    event_time = "taken_at",
    scope = "admin::readings",
    max_attempts = 2
)]
async fn record_reading(tx: &mut PgConnection, reading: &Reading) -> Result<String, Refused> {
    let _ = tx;
    if reading.refused {
        return Err(Refused);
    }
    Ok(format!("reading of {}", reading.meter))
}

/// A handler of the status table, beside the timed one.
#[idempotent(key = "meter", scope = "admin::meters")]
async fn register_meter(tx: &mut PgConnection, reading: &Reading) -> Result<(), Refused> {
    let _ = (tx, reading);
    Ok(())
}

fn reading(meter: &str, age: TimeDelta) -> Reading {
    Reading {
        meter: meter.to_owned(),
        // Microseconds: what the bucket keeps of the fact's time, so that the fact time
        // read back is the message's.
        taken_at: (Utc::now() - age)
            .duration_trunc(TimeDelta::microseconds(1))
            .unwrap(),
        refused: false,
    }
}

fn key_of(reading: &Reading) -> IdempotencyKey {
    KeyBuilder::new()
        .part("meter", &reading.meter)
        .unwrap()
        .part("taken_at", &reading.taken_at)
        .unwrap()
        .finish()
}

/// The recorder of this test binary (installed once).
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

/// The gauges of `schema` set since the last snapshot (a snapshot takes them), by name.
fn gauges(schema: &str) -> HashMap<String, f64> {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.key()
                .labels()
                .any(|label| label.key() == "schema" && label.value() == schema)
        })
        .filter_map(|(key, .., value)| match value {
            DebugValue::Gauge(value) => Some((key.key().name().to_owned(), value.into_inner())),
            _ => None,
        })
        .collect()
}

/// A migrated schema with: a timed reading applied two hours ago, a timed reading parked
/// (its fact 30 hours old), one failed once (its fact now), and a meter of the status table.
async fn setup(pool: &PgPool) -> (Idem, Reading, Reading, Reading) {
    let idem = Idem::new(pool.clone());
    idem.migrate().await.unwrap();
    let applied = reading("m-applied", TimeDelta::hours(2));
    assert!(record_reading(&idem, &applied).await.unwrap().is_executed());
    let parked = Reading {
        refused: true,
        ..reading("m-parked", TimeDelta::hours(30))
    };
    for _ in 0..2 {
        assert!(matches!(
            record_reading(&idem, &parked).await,
            Err(Error::Handler { .. })
        ));
    }
    let failed = Reading {
        refused: true,
        ..reading("m-failed", TimeDelta::zero())
    };
    assert!(record_reading(&idem, &failed).await.is_err());
    assert!(
        register_meter(&idem, &reading("m-plain", TimeDelta::zero()))
            .await
            .unwrap()
            .is_executed()
    );
    (idem, applied, parked, failed)
}

#[sqlx::test(migrations = false)]
async fn a_timed_key_is_shown_found_listed_and_counted_with_its_fact_time(pool: PgPool) {
    let (idem, applied, parked, failed) = setup(&pool).await;
    let scope = "admin::readings";

    // Shown by scope and key alone, with its fact time.
    let row = admin::show_key(&idem, scope, key_of(&applied).as_uuid())
        .await
        .unwrap();
    assert_eq!(row.status, "success");
    assert_eq!(row.fact_time, Some(applied.taken_at));
    assert_eq!(row.result, Some(serde_json::json!("reading of m-applied")));
    let plain = admin::list_keys(&idem, &KeyFilter::new().scope("admin::meters"), None, 10)
        .await
        .unwrap();
    assert_eq!(plain.len(), 1);
    assert_eq!(plain[0].fact_time, None, "a key of the status table");

    // Found from the field values a producer gives, the time to the nanosecond.
    let fields = [
        format!("meter={}", parked.meter),
        format!(
            "taken_at:time={}",
            parked
                .taken_at
                .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
        ),
    ]
    .map(|field| KeyField::parse(&field).unwrap());
    let key = admin::key_from_fields(&fields).unwrap();
    assert_eq!(key, key_of(&parked));
    let row = admin::show_key(&idem, scope, key.as_uuid()).await.unwrap();
    assert_eq!((row.status.as_str(), row.attempts), ("parked", 2));
    assert_eq!(row.fact_time, Some(parked.taken_at));
    let unknown = admin::show_key(&idem, scope, uuid::Uuid::nil()).await;
    assert!(
        matches!(unknown, Err(AdminError::UnknownKey { .. })),
        "{unknown:?}"
    );

    // Listed with the status table's keys, in (scope, key) order, a page at a time.
    let all = admin::list_keys(&idem, &KeyFilter::new(), None, 100)
        .await
        .unwrap();
    assert_eq!(all.len(), 4, "{all:?}");
    let order: Vec<(String, uuid::Uuid)> = all.iter().map(|r| (r.scope.clone(), r.key)).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);
    let mut paged = Vec::new();
    let mut after: Option<Cursor> = None;
    loop {
        let page = admin::list_keys(&idem, &KeyFilter::new(), after.as_ref(), 1)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(Cursor::after(last));
        paged.extend(page);
    }
    assert_eq!(paged, all, "one key a page gives every key once, in order");
    let parked_rows = admin::list_keys(
        &idem,
        &KeyFilter::new().scope(scope).status(Status::Parked),
        None,
        10,
    )
    .await
    .unwrap();
    assert_eq!(parked_rows.len(), 1);
    assert_eq!(parked_rows[0].fact_time, Some(parked.taken_at));
    let old = admin::list_keys(&idem, &KeyFilter::new().older_than(HOUR), None, 10)
        .await
        .unwrap();
    assert!(old.is_empty(), "every key changed just now: {old:?}");

    // Counted per scope and status, with the facts' span.
    let stats = admin::stats(&idem).await.unwrap();
    assert_eq!(stats.total, 4);
    assert_eq!(stats.timed_total, 3);
    let counts: Vec<(&str, &str, i64, bool)> = stats
        .counts
        .iter()
        .map(|c| (c.scope.as_str(), c.status.as_str(), c.count, c.timed))
        .collect();
    assert_eq!(
        counts,
        [
            ("admin::meters", "success", 1, false),
            ("admin::readings", "failed", 1, true),
            ("admin::readings", "parked", 1, true),
            ("admin::readings", "success", 1, true),
        ]
    );
    let parked_count = &stats.counts[2];
    assert_eq!(parked_count.oldest_fact, Some(parked.taken_at));
    assert_eq!(parked_count.newest_fact, Some(parked.taken_at));
    assert_eq!(stats.counts[0].oldest_fact, None);

    // The buckets the claims made: those of the three facts' hours.
    let buckets = &stats.buckets;
    assert_eq!(buckets.count, buckets.buckets.len());
    for fact in [&applied, &parked, &failed] {
        assert!(
            buckets
                .buckets
                .iter()
                .any(|b| b.starts_at <= fact.taken_at && fact.taken_at < b.ends_at),
            "a bucket holds {}: {buckets:?}",
            fact.taken_at
        );
    }
    assert_eq!(
        buckets.oldest,
        Some(parked.taken_at.duration_trunc(TimeDelta::hours(1)).unwrap())
    );
    assert_eq!(buckets.horizon, None, "no bucket expired");
    assert!(buckets.bytes > 0);
    // The catalog's estimates, once the table has been analyzed: no count.
    sqlx::query("ANALYZE idem.idem_timed_keys")
        .execute(&pool)
        .await
        .unwrap();
    let analyzed = admin::time_buckets(&idem).await.unwrap();
    assert_eq!(analyzed.estimated_rows, 3, "{analyzed:?}");
    assert!(analyzed.buckets.iter().all(|b| b.estimated_rows.is_some()));
}

#[sqlx::test(migrations = false)]
async fn a_timed_key_is_retried_reset_and_released_by_scope_and_key(pool: PgPool) {
    let (idem, applied, parked, failed) = setup(&pool).await;
    let scope = "admin::readings";
    let one = |reading: &Reading| KeyFilter::new().scope(scope).key(key_of(reading).as_uuid());

    // A success is not retried: the error says why.
    let refused = admin::retry_keys(&idem, &one(&applied), false).await;
    assert!(
        matches!(&refused, Err(AdminError::WrongStatus { status, .. }) if status == "success"),
        "{refused:?}"
    );

    // Retry: a fresh count of attempts; the next delivery runs the body (and fails
    // again, once, without parking).
    let change = admin::retry_keys(&idem, &one(&parked), false)
        .await
        .unwrap();
    assert_eq!(change.keys.len(), 1);
    assert_eq!(change.keys[0].status, "parked", "as it was");
    assert_eq!(change.keys[0].fact_time, Some(parked.taken_at));
    let row = admin::show_key(&idem, scope, key_of(&parked).as_uuid())
        .await
        .unwrap();
    assert_eq!((row.status.as_str(), row.attempts), ("failed", 0));
    let again = record_reading(&idem, &parked).await;
    assert!(
        matches!(again, Err(Error::Handler { parked: false, .. })),
        "{again:?}"
    );
    assert!(
        record_reading(
            &idem,
            &Reading {
                refused: false,
                ..parked.clone()
            }
        )
        .await
        .unwrap()
        .is_executed()
    );

    // Idem::reset and Idem::record on a timed key.
    let failed_key = key_of(&failed);
    let record = idem.record(scope, failed_key).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Failed);
    assert!(idem.reset(scope, failed_key).await.unwrap());
    let record = idem.record(scope, failed_key).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Failed, 0));

    // Release: a dry run changes nothing; then the row is gone, and the next delivery is
    // a first delivery.
    let selection = KeyFilter::new().scope(scope);
    let dry = admin::release_keys(&idem, &selection, true).await.unwrap();
    assert!(dry.dry_run);
    assert_eq!(dry.keys.len(), 1, "{dry:?}");
    assert_eq!(dry.keys[0].key, failed_key.as_uuid());
    assert!(idem.record(scope, failed_key).await.unwrap().is_some());
    let released = admin::release_keys(&idem, &selection, false).await.unwrap();
    assert_eq!(released.keys.len(), 1);
    assert_eq!(released.keys[0].fact_time, Some(failed.taken_at));
    assert!(idem.record(scope, failed_key).await.unwrap().is_none());
    let gone = admin::show_key(&idem, scope, failed_key.as_uuid()).await;
    assert!(
        matches!(gone, Err(AdminError::UnknownKey { .. })),
        "{gone:?}"
    );
    assert!(
        record_reading(
            &idem,
            &Reading {
                refused: false,
                ..failed.clone()
            }
        )
        .await
        .unwrap()
        .is_executed()
    );

    // A bulk change over both tables: every failed and parked key, whichever table.
    let bad = Reading {
        refused: true,
        ..reading("m-bad", TimeDelta::minutes(5))
    };
    assert!(record_reading(&idem, &bad).await.is_err());
    let everything = admin::retry_keys(&idem, &KeyFilter::new(), true)
        .await
        .unwrap();
    assert_eq!(everything.keys.len(), 1, "{everything:?}");
    assert_eq!(everything.keys[0].fact_time, Some(bad.taken_at));
}

#[sqlx::test(migrations = false)]
async fn the_purge_plan_names_the_buckets_the_upkeep_then_makes_and_drops(pool: PgPool) {
    snapshotter();
    let (idem, applied, parked, _) = setup(&pool).await;
    // The first upkeep: the buckets ahead, nothing expired within a week.
    let week = Retention::default();
    let plan = admin::purge_plan(&idem, &week).await.unwrap();
    assert!(plan.report.dry_run);
    assert!(plan.buckets_to_drop.is_empty(), "{plan:?}");
    let before = admin::time_buckets(&idem).await.unwrap();
    for range in &plan.buckets_to_make {
        assert!(range.starts_at < range.ends_at);
        assert!(
            !before
                .buckets
                .iter()
                .any(|b| b.starts_at < range.ends_at && range.starts_at < b.ends_at),
            "{range:?} overlaps none of {before:?}"
        );
    }
    assert_eq!(plan.report.buckets_made, plan.buckets_to_make.len() as u64);
    // The dry run of the handle counts what the plan names.
    let counted = idem.purge_dry_run(&week).await.unwrap();
    assert_eq!(counted.buckets_made, plan.report.buckets_made);
    assert_eq!(counted.buckets_dropped, 0);
    let report = idem.purge_with(&week).await.unwrap();
    assert_eq!(report.buckets_made, plan.buckets_to_make.len() as u64);
    assert_eq!(report.buckets_dropped, 0);
    let after = admin::time_buckets(&idem).await.unwrap();
    for range in &plan.buckets_to_make {
        assert!(
            after
                .buckets
                .iter()
                .any(|b| b.starts_at == range.starts_at && b.ends_at == range.ends_at),
            "{range:?} made as planned: {after:?}"
        );
    }
    let now = Utc::now();
    let ahead = after.newest_end.unwrap() - now;
    assert!(ahead >= TimeDelta::hours(1), "made an hour ahead: {ahead}");
    let again = admin::purge_plan(&idem, &week).await.unwrap();
    assert!(again.buckets_to_make.is_empty(), "{again:?}");

    // The gauges of the buckets, as the upkeep left them.
    let seconds = |at: Option<DateTime<Utc>>| at.unwrap().timestamp_micros() as f64 / 1e6;
    let expected = |buckets: &TimeBuckets| {
        HashMap::from([
            ("idem_time_buckets".to_owned(), buckets.count as f64),
            (
                "idem_time_buckets_oldest_start_timestamp_seconds".to_owned(),
                seconds(buckets.oldest),
            ),
            (
                "idem_time_buckets_newest_end_timestamp_seconds".to_owned(),
                seconds(buckets.newest_end),
            ),
        ])
    };
    assert_eq!(gauges("idem"), expected(&after));

    // With a one-day window, the parked fact's bucket (30 hours old) has expired, and
    // the applied one's (2 hours) has not: the plan names it, the upkeep drops it.
    let day = Retention::new(DAY);
    let plan = admin::purge_plan(&idem, &day).await.unwrap();
    let doomed: Vec<&str> = plan
        .buckets_to_drop
        .iter()
        .map(|b| b.name.as_str())
        .collect();
    assert_eq!(doomed.len(), 1, "{plan:?}");
    let bucket = &plan.buckets_to_drop[0];
    assert!(bucket.starts_at <= parked.taken_at && parked.taken_at < bucket.ends_at);
    assert!(plan.buckets_to_make.is_empty());
    assert_eq!(plan.report.buckets_dropped, 1);
    assert_eq!(idem.purge_dry_run(&day).await.unwrap().buckets_dropped, 1);
    let report = idem.purge_with(&day).await.unwrap();
    assert_eq!(report.buckets_dropped, 1);
    let after_drop = admin::time_buckets(&idem).await.unwrap();
    assert_eq!(after_drop.count, after.count - 1);
    assert_eq!(after_drop.horizon, Some(bucket.ends_at));
    assert!(!after_drop.buckets.iter().any(|b| b.name == bucket.name));
    assert_eq!(gauges("idem"), expected(&after_drop));
    // The parked key went with its bucket; the applied one stays.
    let parked_key = key_of(&parked).as_uuid();
    let gone = admin::show_key(&idem, "admin::readings", parked_key).await;
    assert!(
        matches!(gone, Err(AdminError::UnknownKey { .. })),
        "{gone:?}"
    );
    admin::show_key(&idem, "admin::readings", key_of(&applied).as_uuid())
        .await
        .unwrap();
    let plan = admin::purge_plan(&idem, &day).await.unwrap();
    assert!(plan.buckets_to_drop.is_empty() && plan.buckets_to_make.is_empty());
}
