//! Batches whose keys are kept by their facts' times (`event_time`): eight tasks deliver
//! overlapping batches of 100 over 1,000 facts that straddle a bucket boundary, in
//! different orders at once, with no bucket made beforehand (the batches make them,
//! concurrently, through the route): each fact applied once, each key in its fact's
//! bucket. Then a batch with one fact past the window: that fact alone is refused and
//! never runs, the others run; delivered again, the others are duplicates.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use idem_runtime::{Disposition, Error, Outcome, WindowEdge, idempotent};
use sqlx::PgConnection;

use crate::route::{Database, Route};

const FACTS: i64 = 1_000;
const TASKS: usize = 8;
const BATCH: usize = 100;

#[derive(Clone, Debug)]
pub struct Fact {
    pub fact_id: i64,
    pub occurred_at: DateTime<Utc>,
}

#[idempotent(
    key = "fact_id, occurred_at",
    event_time = "occurred_at",
    scope = "timed_batches"
)]
async fn apply_all(tx: &mut PgConnection, facts: &[&Fact]) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO timed_batch_effects (fact_id) SELECT * FROM unnest($1::bigint[])")
        .bind(facts.iter().map(|fact| fact.fact_id).collect::<Vec<_>>())
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

pub async fn run(route: Route) {
    let database = Database::create(route, "time_bucket_batches").await;
    sqlx::query("CREATE TABLE timed_batch_effects (fact_id bigint NOT NULL)")
        .execute(&database.direct)
        .await
        .unwrap();
    let idem = route.idem(&database.name, 10).await;
    idem.migrate().await.unwrap();

    // 1,000 facts around the last hour boundary (the newest a few minutes ahead at most).
    let boundary = Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap();
    let facts: Vec<Fact> = (0..FACTS)
        .map(|fact_id| Fact {
            fact_id,
            occurred_at: boundary + TimeDelta::milliseconds((fact_id - FACTS / 2) * 600),
        })
        .collect();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (idem, facts) = (idem.clone(), facts.clone());
            tokio::spawn(async move {
                let mut executed = 0;
                // Each task its own batches: overlapping windows, every other one reversed.
                for round in 0..(FACTS as usize / BATCH) {
                    let start = (task * 37 + round * BATCH) % facts.len();
                    let mut batch: Vec<Fact> = (0..BATCH)
                        .map(|i| facts[(start + i) % facts.len()].clone())
                        .collect();
                    if task % 2 == 1 {
                        batch.reverse();
                    }
                    for (fact, outcome) in batch.iter().zip(apply_all(&idem, &batch).await) {
                        match outcome {
                            Ok(Outcome::Executed(())) => executed += 1,
                            Ok(Outcome::Duplicate(_)) | Err(Error::InProgress { .. }) => {}
                            Err(error) => panic!("fact {}: {error}", fact.fact_id),
                        }
                    }
                }
                executed
            })
        })
        .collect();
    let mut executed = 0;
    for task in tasks {
        executed += task.await.unwrap();
    }
    // A last delivery of everything, as a consumer redelivers what was in progress.
    for outcome in apply_all(&idem, &facts).await {
        match outcome {
            Ok(Outcome::Executed(())) => executed += 1,
            Ok(Outcome::Duplicate(_)) => {}
            Err(error) => panic!("{error}"),
        }
    }
    assert_eq!(executed, FACTS, "through {}", route.name());
    assert_eq!(
        database
            .count("SELECT count(*) FROM (SELECT fact_id FROM timed_batch_effects GROUP BY fact_id HAVING count(*) = 1) AS once")
            .await,
        FACTS,
        "each fact once"
    );
    assert_eq!(
        database
            .count("SELECT count(*) FROM idem.idem_timed_keys")
            .await,
        FACTS
    );
    assert_eq!(
        database
            .count("SELECT count(DISTINCT tableoid) FROM idem.idem_timed_keys")
            .await,
        2,
        "the facts straddle two buckets"
    );
    assert_eq!(
        database.count("SELECT count(*) FROM idem.idem_keys").await,
        0,
        "nothing in the status table"
    );

    // One fact of the batch past the window (7 days by default): refused alone.
    let now = Utc::now();
    let batch = vec![
        Fact {
            fact_id: 5_000,
            occurred_at: now - TimeDelta::minutes(1),
        },
        Fact {
            fact_id: 5_001,
            occurred_at: now - TimeDelta::days(8),
        },
        Fact {
            fact_id: 5_002,
            occurred_at: now - TimeDelta::hours(2),
        },
    ];
    let outcomes = apply_all(&idem, &batch).await;
    assert!(
        outcomes[0].as_ref().is_ok_and(Outcome::is_executed),
        "{outcomes:?}"
    );
    match &outcomes[1] {
        Err(
            error @ Error::OutsideWindow {
                edge: WindowEdge::Past,
                ..
            },
        ) => assert_eq!(error.disposition(), Disposition::DeadLetter),
        other => panic!("{other:?}"),
    }
    assert!(
        outcomes[2].as_ref().is_ok_and(Outcome::is_executed),
        "{outcomes:?}"
    );
    let again = apply_all(&idem, &batch).await;
    assert!(
        again[0].as_ref().is_ok_and(Outcome::is_duplicate),
        "{again:?}"
    );
    assert!(
        matches!(again[1], Err(Error::OutsideWindow { .. })),
        "{again:?}"
    );
    assert!(
        again[2].as_ref().is_ok_and(Outcome::is_duplicate),
        "{again:?}"
    );
    assert_eq!(
        database
            .count("SELECT count(*) FROM timed_batch_effects WHERE fact_id >= 5000")
            .await,
        2,
        "the refused fact never ran"
    );
    database.drop().await;
}
