//! Batches of 500 over 1,000 facts, two tasks delivering the same batches in opposite
//! orders at once, then all of them again: every fact applied once, each stored result
//! replayed; ten facts whose first delivery failed are taken over by the batch.

use idem_runtime::{Outcome, idempotent};
use sqlx::PgConnection;

use crate::route::{Database, Route};

const FACTS: i64 = 1_000;
const BATCH: usize = 500;
const FAILED_FIRST: i64 = 10;

#[derive(Clone)]
pub struct Fact {
    pub fact_id: i64,
    pub fail: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("declined")]
    Declined,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[idempotent(key = "fact_id", scope = "batches", batch = true)]
async fn apply(tx: &mut PgConnection, fact: &Fact) -> Result<String, ApplyError> {
    if fact.fail {
        return Err(ApplyError::Declined);
    }
    sqlx::query("INSERT INTO batch_effects (fact_id) VALUES ($1)")
        .bind(fact.fact_id)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    Ok(format!("receipt-{}", fact.fact_id))
}

pub async fn run(route: Route) {
    let database = Database::create(route, "batches").await;
    sqlx::query("CREATE TABLE batch_effects (fact_id bigint NOT NULL)")
        .execute(&database.direct)
        .await
        .unwrap();
    let idem = route.idem(&database.name, 8).await;
    idem.migrate().await.unwrap();
    for fact_id in 0..FAILED_FIRST {
        let failed = apply(
            &idem,
            &Fact {
                fact_id,
                fail: true,
            },
        )
        .await;
        assert!(
            matches!(
                failed,
                Err(idem_runtime::Error::Handler { attempts: 1, .. })
            ),
            "{failed:?}"
        );
    }
    let facts: Vec<Fact> = (0..FACTS)
        .map(|fact_id| Fact {
            fact_id,
            fail: false,
        })
        .collect();
    let batches: Vec<Vec<Fact>> = facts.chunks(BATCH).map(<[Fact]>::to_vec).collect();
    let forward = {
        let (idem, batches) = (idem.clone(), batches.clone());
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for batch in &batches {
                outcomes.extend(apply_batch(&idem, batch).await);
            }
            outcomes
        })
    };
    let backward = {
        let (idem, batches) = (idem.clone(), batches.clone());
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for batch in batches.iter().rev() {
                outcomes.extend(apply_batch(&idem, batch).await);
            }
            outcomes
        })
    };
    let mut executed = 0;
    for outcomes in [forward.await.unwrap(), backward.await.unwrap()] {
        for outcome in outcomes {
            match outcome {
                Ok(Outcome::Executed(_)) => executed += 1,
                Ok(Outcome::Duplicate(_)) => {}
                // The other task holds the key: a consumer delivers it again (below).
                Err(idem_runtime::Error::InProgress { .. }) => {}
                Err(error) => panic!("batch through {}: {error}", route.name()),
            }
        }
    }
    // Everything again: each fact a duplicate now, with its stored result.
    for batch in &batches {
        for (fact, outcome) in batch.iter().zip(apply_batch(&idem, batch).await) {
            match outcome {
                Ok(Outcome::Duplicate(Some(receipt))) => {
                    assert_eq!(receipt, format!("receipt-{}", fact.fact_id));
                }
                Ok(Outcome::Executed(_)) => executed += 1,
                other => panic!(
                    "redelivery of fact {} through {}: {other:?}",
                    fact.fact_id,
                    route.name()
                ),
            }
        }
    }
    assert_eq!(executed, FACTS, "each fact executed once");
    assert_eq!(
        database.count("SELECT count(*) FROM batch_effects").await,
        FACTS
    );
    assert_eq!(
        database
            .count("SELECT count(DISTINCT fact_id) FROM batch_effects")
            .await,
        FACTS
    );
    assert_eq!(
        database
            .count("SELECT count(*) FROM idem.idem_keys WHERE status = 'success'")
            .await,
        FACTS
    );
    assert_eq!(
        database
            .count("SELECT count(*) FROM idem.idem_keys WHERE attempts = 2")
            .await,
        FAILED_FIRST,
        "the failed-first facts: one failure, then the batch's execution"
    );
    database.drop().await;
}
