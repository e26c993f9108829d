//! Keys kept by the fact's time (`event_time`): 16 tasks deliver 1,000 facts whose times
//! straddle a bucket boundary, in 16 orders at once, with no bucket made beforehand (the
//! claims make them, concurrently): each fact applied once. Then the window's edges: a
//! duplicate of a fact still kept is a duplicate; a new fact older than its window, or too
//! far ahead, is refused and never run; a bucket dropped while deliveries of its facts race
//! the cleaner leaves every fact applied at most once, and every later delivery refused; a
//! 30-day scope's bucket outlives the default window's expiry.

use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use idem_runtime::retention::Retention;
use idem_runtime::{Error, Idem, Outcome, WindowEdge, idempotent};
use sqlx::PgConnection;
use sqlx::postgres::PgPoolOptions;

use crate::route::{Database, Route};

const FACTS: i64 = 1_000;
const TASKS: usize = 16;

#[derive(Clone, Debug)]
pub struct Fact {
    pub fact_id: i64,
    pub occurred_at: DateTime<Utc>,
}

#[idempotent(
    key = "fact_id, occurred_at",
    event_time = "occurred_at",
    scope = "timed_facts"
)]
async fn apply(tx: &mut PgConnection, fact: &Fact) -> Result<String, sqlx::Error> {
    sqlx::query("INSERT INTO timed_effects (scope, fact_id) VALUES ('timed_facts', $1)")
        .bind(fact.fact_id)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    Ok(format!("receipt-{}", fact.fact_id))
}

#[idempotent(
    key = "fact_id, occurred_at",
    event_time = "occurred_at",
    scope = "timed_audit",
    retention = "30d"
)]
async fn audit(tx: &mut PgConnection, fact: &Fact) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO timed_effects (scope, fact_id) VALUES ('timed_audit', $1)")
        .bind(fact.fact_id)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// A handle on `database` through `route` with `retention`. In session pooling the five
/// handles of the test share the pooler's 8 server connections (each client connection
/// holds one while it lives): the first one takes 4, the others one each.
async fn handle(route: Route, database: &Database, retention: Retention, first: bool) -> Idem {
    let connections = match (route, first) {
        (Route::Session, true) => 4,
        (Route::Session, false) => 1,
        (Route::Direct | Route::Transaction, _) => 20,
    };
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(route.options(&database.name))
        .await
        .unwrap();
    Idem::builder(pool)
        .pooler(route.pooler())
        .retention(retention)
        .lock_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn hours(n: i64) -> TimeDelta {
    TimeDelta::hours(n)
}

pub async fn run(route: Route) {
    let database = Database::create(route, "time_buckets").await;
    sqlx::query("CREATE TABLE timed_effects (scope text NOT NULL, fact_id bigint NOT NULL)")
        .execute(&database.direct)
        .await
        .unwrap();
    let week = Retention::default();
    let idem = handle(route, &database, week, true).await;
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
                // Each task its own order: rotated, every other one reversed.
                let mut order: Vec<&Fact> = facts.iter().collect();
                order.rotate_left(task * 61 % facts.len());
                if task % 2 == 1 {
                    order.reverse();
                }
                for fact in order {
                    loop {
                        match apply(&idem, fact).await {
                            Ok(Outcome::Executed(_)) => executed += 1,
                            Ok(Outcome::Duplicate(Some(receipt))) => {
                                assert_eq!(receipt, format!("receipt-{}", fact.fact_id));
                            }
                            Ok(Outcome::Duplicate(None)) => panic!("a result is stored"),
                            Err(Error::InProgress { .. }) => continue,
                            Err(error) => panic!("fact {}: {error}", fact.fact_id),
                        }
                        break;
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
    assert_eq!(executed, FACTS, "through {}", route.name());
    assert_eq!(
        database
            .count("SELECT count(*) FROM (SELECT fact_id FROM timed_effects GROUP BY fact_id HAVING count(*) = 1) AS once")
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

    // The window's edges. A handle whose window is 3 hours applies a fact 150 minutes old;
    // a handle of the same scope whose window is 2 hours answers it as a duplicate (its
    // key is kept), and refuses a new fact of the same age, which never runs.
    let three_hours = handle(
        route,
        &database,
        Retention::new(Duration::from_secs(3 * 3600)),
        false,
    )
    .await;
    let two_hours = handle(
        route,
        &database,
        Retention::new(Duration::from_secs(2 * 3600)),
        false,
    )
    .await;
    let old = Fact {
        fact_id: 5_000,
        occurred_at: Utc::now() - TimeDelta::minutes(150),
    };
    assert!(apply(&three_hours, &old).await.unwrap().is_executed());
    assert!(apply(&two_hours, &old).await.unwrap().is_duplicate());
    let new_but_old = Fact {
        fact_id: 5_001,
        occurred_at: old.occurred_at,
    };
    let refused = apply(&two_hours, &new_but_old).await.unwrap_err();
    assert!(
        matches!(
            refused,
            Error::OutsideWindow {
                edge: WindowEdge::Past,
                ..
            }
        ),
        "{refused:?}"
    );
    assert_eq!(refused.disposition(), idem_runtime::Disposition::DeadLetter);
    let ahead = Fact {
        fact_id: 5_002,
        occurred_at: Utc::now() + hours(2),
    };
    let refused = apply(&idem, &ahead).await.unwrap_err();
    assert!(
        matches!(
            refused,
            Error::OutsideWindow {
                edge: WindowEdge::Future,
                ..
            }
        ),
        "{refused:?}"
    );
    assert_eq!(
        database
            .count("SELECT count(*) FROM timed_effects WHERE fact_id IN (5001, 5002)")
            .await,
        0,
        "refused facts never run"
    );

    // A 30-day scope's fact from 8 days ago, then the cleanup of a handle whose default
    // window is 7 days: the bucket stays (the scope declared 30 days), and the fact is a
    // duplicate.
    let kept = Fact {
        fact_id: 6_000,
        occurred_at: Utc::now() - TimeDelta::days(8),
    };
    assert!(audit(&idem, &kept).await.unwrap().is_executed());
    let report = idem.purge().await.unwrap();
    assert_eq!(report.buckets_dropped, 0, "{report:?}");
    assert!(audit(&idem, &kept).await.unwrap().is_duplicate());
    // The default-window scope refuses a fact of that age.
    let refused = apply(&idem, &kept).await.unwrap_err();
    assert!(
        matches!(refused, Error::OutsideWindow { .. }),
        "{refused:?}"
    );

    // A bucket dropped while deliveries of its facts race the cleaner. The deliverers'
    // window is 10 hours; the cleaner's 4 hours (and the scopes declare at most 30 days,
    // so the cleaner is given that declared window's scope out of the way first).
    sqlx::query("DELETE FROM idem.idem_scopes WHERE scope = 'timed_audit'")
        .execute(&database.direct)
        .await
        .unwrap();
    let deliverer = handle(
        route,
        &database,
        Retention::new(Duration::from_secs(10 * 3600)),
        false,
    )
    .await;
    let cleaner = handle(
        route,
        &database,
        Retention::new(Duration::from_secs(4 * 3600)),
        false,
    )
    .await;
    let hour_ago_5 = (Utc::now() - hours(5))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap();
    let doomed: Vec<Fact> = (0..200)
        .map(|n| Fact {
            fact_id: 7_000 + n,
            occurred_at: hour_ago_5 + TimeDelta::seconds(n),
        })
        .collect();
    let racing: Vec<_> = (0..4)
        .map(|_| {
            let (idem, doomed) = (deliverer.clone(), doomed.clone());
            tokio::spawn(async move {
                let mut refused_then_executed = false;
                let mut refused = false;
                for _ in 0..3 {
                    for fact in &doomed {
                        match apply(&idem, fact).await {
                            Ok(Outcome::Executed(_)) if refused => refused_then_executed = true,
                            Ok(_) | Err(Error::InProgress { .. }) => {}
                            Err(Error::OutsideWindow {
                                edge: WindowEdge::Past,
                                ..
                            }) => refused = true,
                            Err(error) => panic!("fact {}: {error}", fact.fact_id),
                        }
                    }
                }
                refused_then_executed
            })
        })
        .collect();
    // The cleaner drops the bucket once some deliveries went in.
    while database
        .count("SELECT count(*) FROM timed_effects WHERE fact_id >= 7000")
        .await
        < 20
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut dropped = 0;
    while dropped == 0 {
        dropped = cleaner.purge().await.unwrap().buckets_dropped;
    }
    for task in racing {
        assert!(
            !task.await.unwrap(),
            "a fact ran after the deliverer was told its bucket had expired"
        );
    }
    assert_eq!(
        database
            .count("SELECT count(*) FROM (SELECT fact_id FROM timed_effects WHERE fact_id >= 7000 GROUP BY fact_id HAVING count(*) > 1) AS twice")
            .await,
        0,
        "no fact applied twice"
    );
    // After the drop, every fact of the bucket is refused, whichever handle delivers it.
    for fact in &doomed {
        let refused = apply(&deliverer, fact).await.unwrap_err();
        assert!(
            matches!(refused, Error::OutsideWindow { .. }),
            "{refused:?}"
        );
    }
    database.drop().await;
}
