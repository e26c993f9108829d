//! A lease-mode handler whose keys are kept by the fact's time (`event_time`): each of 200
//! facts, whose times straddle a bucket boundary, delivered three times at once, with no
//! bucket made beforehand: every body runs once, the concurrent deliveries wait out
//! `InProgress` and get the stored result, and every key is in its fact's bucket. A fact
//! outside its window is refused and never run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use idem_runtime::lease::Lease;
use idem_runtime::{Error, Outcome, idempotent};

use crate::route::{Database, Route, deliver_until_final};

const FACTS: i64 = 200;

pub struct Job {
    pub fact_id: i64,
    pub at: DateTime<Utc>,
    pub runs: Arc<Mutex<HashMap<i64, u32>>>,
}

#[idempotent(
    key = "fact_id, at",
    event_time = "at",
    scope = "timed_lease_notify",
    mode = "lease",
    lease = "30s"
)]
async fn notify(lease: &Lease, job: &Job) -> Result<String, std::io::Error> {
    *job.runs.lock().unwrap().entry(job.fact_id).or_default() += 1;
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(format!("sent-{}-{}", job.fact_id, lease.key()))
}

pub async fn run(route: Route) {
    let database = Database::create(route, "lease_time_buckets").await;
    let idem = route.idem(&database.name, 8).await;
    idem.migrate().await.unwrap();
    // Either side of the start of the hour before this one.
    let boundary = (Utc::now() - TimeDelta::hours(1))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap();
    let at = move |fact_id: i64| boundary + TimeDelta::milliseconds(fact_id - FACTS / 2);
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let (idem, runs) = (idem.clone(), runs.clone());
            tokio::spawn(async move {
                let mut receipts = Vec::new();
                for fact_id in 0..FACTS {
                    let job = Job {
                        fact_id,
                        at: at(fact_id),
                        runs: runs.clone(),
                    };
                    let (outcome, errors) = deliver_until_final(|| notify(&idem, &job)).await;
                    for error in &errors {
                        assert!(
                            matches!(error, Error::InProgress { .. }),
                            "timed lease fact {fact_id} through {}: {error}",
                            route.name()
                        );
                    }
                    receipts.push(match outcome {
                        Ok(Outcome::Executed(receipt) | Outcome::Duplicate(Some(receipt))) => {
                            receipt
                        }
                        other => panic!(
                            "timed lease fact {fact_id} through {}: {other:?}",
                            route.name()
                        ),
                    });
                }
                receipts
            })
        })
        .collect();
    let mut receipts = Vec::new();
    for task in tasks {
        receipts.push(task.await.unwrap());
    }
    assert!(
        receipts.windows(2).all(|pair| pair[0] == pair[1]),
        "every delivery got the one receipt"
    );
    {
        let runs = runs.lock().unwrap();
        assert_eq!(runs.len() as i64, FACTS);
        assert!(
            runs.values().all(|&count| count == 1),
            "a body ran twice: {runs:?}"
        );
    }
    assert_eq!(
        database
            .count(
                "SELECT count(*) FROM idem.idem_timed_keys \
                 WHERE status = 'success' AND attempts = 1 AND lease_expires_at IS NULL"
            )
            .await,
        FACTS
    );
    assert_eq!(
        database
            .count("SELECT count(DISTINCT tableoid) FROM idem.idem_timed_keys")
            .await,
        2
    );
    assert_eq!(
        database.count("SELECT count(*) FROM idem.idem_keys").await,
        0
    );
    // A fact older than its window: refused, never run.
    let late = Job {
        fact_id: FACTS,
        at: Utc::now() - TimeDelta::days(30),
        runs: runs.clone(),
    };
    let refused = notify(&idem, &late).await.unwrap_err();
    assert!(
        matches!(refused, Error::OutsideWindow { .. }),
        "{refused:?}"
    );
    assert!(!runs.lock().unwrap().contains_key(&FACTS));
    database.drop().await;
}
