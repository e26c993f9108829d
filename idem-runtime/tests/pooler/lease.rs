//! A lease-mode handler, each of 200 facts delivered three times at once: every body runs
//! once, the concurrent deliveries wait out `InProgress` and get the stored result.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::lease::Lease;
use idem_runtime::{Outcome, idempotent};

use crate::route::{Database, Route, deliver_until_final};

const FACTS: i64 = 200;

pub struct Job {
    pub fact_id: i64,
    pub runs: Arc<Mutex<HashMap<i64, u32>>>,
}

#[idempotent(key = "fact_id", scope = "lease_notify", mode = "lease", lease = "30s")]
async fn notify(lease: &Lease, job: &Job) -> Result<String, std::io::Error> {
    *job.runs.lock().unwrap().entry(job.fact_id).or_default() += 1;
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(format!("sent-{}-{}", job.fact_id, lease.key()))
}

pub async fn run(route: Route) {
    let database = Database::create(route, "lease").await;
    let idem = route.idem(&database.name, 8).await;
    idem.migrate().await.unwrap();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let (idem, runs) = (idem.clone(), runs.clone());
            tokio::spawn(async move {
                let mut receipts = Vec::new();
                for fact_id in 0..FACTS {
                    let job = Job {
                        fact_id,
                        runs: runs.clone(),
                    };
                    let (outcome, errors) = deliver_until_final(|| notify(&idem, &job)).await;
                    for error in &errors {
                        assert!(
                            matches!(error, idem_runtime::Error::InProgress { .. }),
                            "lease fact {fact_id} through {}: {error}",
                            route.name()
                        );
                    }
                    receipts.push(match outcome {
                        Ok(Outcome::Executed(receipt) | Outcome::Duplicate(Some(receipt))) => {
                            receipt
                        }
                        other => panic!("lease fact {fact_id} through {}: {other:?}", route.name()),
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
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len() as i64, FACTS);
    assert!(
        runs.values().all(|&count| count == 1),
        "a body ran twice: {runs:?}"
    );
    assert_eq!(
        database
            .count("SELECT count(*) FROM idem.idem_keys WHERE status = 'success' AND attempts = 1")
            .await,
        FACTS
    );
    database.drop().await;
}
