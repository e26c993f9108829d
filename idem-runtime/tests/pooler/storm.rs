//! 16 tasks x 300 deliveries over 1,000 facts, duplicates at the same moment included
//! (tasks `t` and `t + 10` deliver the same fact at each step), to two handlers: one whose
//! queries are not prepared for reuse (`persistent(false)`, what the README advises behind
//! a transaction pooler) and one written as sqlx's defaults have it (its statements cached
//! on the connection). Every fact applied once by each, no attempt counted, nothing parked.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::PgConnection;

use crate::route::{Database, Route, deliver_until_final};

const TASKS: usize = 16;
const DELIVERIES: usize = 300;
const FACTS: usize = 1_000;

pub struct Fact {
    pub fact_id: i64,
    pub amount_cents: i64,
}

#[idempotent(
    key = "fact_id",
    fingerprint = "amount_cents",
    scope = "storm_unprepared"
)]
async fn apply_unprepared(tx: &mut PgConnection, fact: &Fact) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO storm_effects (handler, fact_id, amount_cents) VALUES ('unprepared', $1, $2)",
    )
    .bind(fact.fact_id)
    .bind(fact.amount_cents)
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[idempotent(key = "fact_id", fingerprint = "amount_cents", scope = "storm_cached")]
async fn apply_cached(tx: &mut PgConnection, fact: &Fact) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO storm_effects (handler, fact_id, amount_cents) VALUES ('cached', $1, $2) RETURNING id",
    )
    .bind(fact.fact_id)
    .bind(fact.amount_cents)
    .fetch_one(&mut *tx)
    .await
}

pub async fn run(route: Route) {
    let database = Database::create(route, "storm").await;
    sqlx::query(
        "CREATE TABLE storm_effects (id bigserial PRIMARY KEY, handler text NOT NULL, \
         fact_id bigint NOT NULL, amount_cents bigint NOT NULL)",
    )
    .execute(&database.direct)
    .await
    .unwrap();
    let idem = route.idem(&database.name, 16).await;
    idem.migrate().await.unwrap();
    let retried = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let idem: Idem = idem.clone();
            let retried = retried.clone();
            tokio::spawn(async move {
                for step in 0..DELIVERIES {
                    let fact_id = ((task * DELIVERIES + step) % FACTS) as i64;
                    let fact = Fact {
                        fact_id,
                        amount_cents: fact_id * 10,
                    };
                    let (unprepared, errors) =
                        deliver_until_final(|| apply_unprepared(&idem, &fact)).await;
                    check(route, "unprepared", fact_id, unprepared, &errors);
                    retried.fetch_add(errors.len(), Ordering::Relaxed);
                    let (cached, errors) = deliver_until_final(|| apply_cached(&idem, &fact)).await;
                    check(route, "cached", fact_id, cached, &errors);
                    retried.fetch_add(errors.len(), Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    for handler in ["unprepared", "cached"] {
        let applied_once = database
            .count(&format!(
                "SELECT count(*) FROM (SELECT fact_id FROM storm_effects WHERE handler = '{handler}' \
                 GROUP BY fact_id HAVING count(*) = 1) AS once"
            ))
            .await;
        let rows = database
            .count(&format!(
                "SELECT count(*) FROM storm_effects WHERE handler = '{handler}'"
            ))
            .await;
        assert_eq!(
            (applied_once, rows),
            (FACTS as i64, FACTS as i64),
            "{handler} through {}",
            route.name()
        );
        let settled = database
            .count(&format!(
                "SELECT count(*) FROM idem.idem_keys WHERE scope = 'storm_{handler}' \
                 AND status = 'success' AND attempts = 1"
            ))
            .await;
        assert_eq!(
            settled, FACTS as i64,
            "every key of {handler} succeeded at its first attempt"
        );
    }
    assert_eq!(
        database
            .count("SELECT count(*) FROM idem.idem_keys WHERE status <> 'success'")
            .await,
        0
    );
    eprintln!(
        "storm through {}: {} deliveries, {} redelivered after a retry disposition",
        route.name(),
        2 * TASKS * DELIVERIES,
        retried.load(Ordering::Relaxed)
    );
    database.drop().await;
}

/// A final outcome is executed or duplicate; no error on the way was the handler's.
fn check<T>(
    route: Route,
    handler: &str,
    fact_id: i64,
    outcome: Result<Outcome<T>, Error<sqlx::Error>>,
    errors: &[Error<sqlx::Error>],
) {
    let route = route.name();
    match outcome {
        Ok(Outcome::Executed(_) | Outcome::Duplicate(_)) => {}
        Err(error) => panic!("{handler} fact {fact_id} through {route}: {error}"),
    }
    for error in errors {
        match error {
            Error::InProgress { .. } => {}
            other => panic!(
                "{handler} fact {fact_id} through {route}: a retried error that is not in-progress: {other}"
            ),
        }
    }
}
