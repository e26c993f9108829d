//! A handler that moves its keys into the time buckets (`event_time` with `previous_key`,
//! whose keys are in the status table), and one that changes its key while keeping its
//! keys by the fact's time (`previous_event_time`): during a rolling deploy, members of
//! the old and the new build deliver the same facts side by side, and each fact runs
//! once between them; a fact that succeeded under the previous key is a duplicate, with
//! the result stored then. Once the move is over, the old build is refused and the new
//! one runs beside the status table's keys, which expire with their window.
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use idem_runtime::__private_v0_1_0::{
    DefinedPart, HandlerSpec, JsonResult, KeyLayout, MessageKeys, run_transactional,
};
use idem_runtime::key::KeyBuilder;
use idem_runtime::{Disposition, Error, Idem, IdempotencyKey, Outcome};
use sqlx::PgPool;

use crate::support::orders::OrderEvent;
use crate::support::testing;

/// The builds of one handler, as they derive and keep their keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    /// `key = "order_id, occurred_at"`: keys in the status table.
    Plain,
    /// The move: the same key with `event_time = "occurred_at"` and `previous_key =
    /// "order_id, occurred_at"` (the status table's keys).
    Moving,
    /// After the move: `event_time` alone.
    Timed,
    /// A change of key in the time buckets: `key = "event_key, occurred_at"` with
    /// `previous_key = "order_id, occurred_at"` and `previous_event_time = "occurred_at"`.
    Rekeyed,
}

const OLD: [DefinedPart; 2] = [
    ("order_id", |shape| shape.push('s')),
    ("occurred_at", |shape| shape.push('t')),
];
const NEW: [DefinedPart; 2] = [
    ("event_key", |shape| shape.push('u')),
    ("occurred_at", |shape| shape.push('t')),
];

/// The key of `event` under the old definition.
fn old_key(event: &OrderEvent) -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .part("occurred_at", &event.occurred_at)
        .unwrap()
        .finish()
}

/// The key of `event` under the new definition.
fn new_key(event: &OrderEvent) -> IdempotencyKey {
    KeyBuilder::new()
        .part("event_key", &event.event_key)
        .unwrap()
        .part("occurred_at", &event.occurred_at)
        .unwrap()
        .finish()
}

/// A paid event of `order_id` that happened at `at`.
fn event(order_id: &str, at: DateTime<Utc>) -> OrderEvent {
    let mut event = testing::paid(order_id, 100);
    event.occurred_at = at;
    event.event_key = Some(
        idem_runtime::key::key_of(&[&"event", &order_id])
            .unwrap()
            .as_uuid(),
    );
    event
}

/// An instant inside the default window, to the microsecond, the same for every
/// delivery of a fact.
fn an_hour_ago() -> DateTime<Utc> {
    (Utc::now() - TimeDelta::hours(1))
        .duration_trunc(TimeDelta::microseconds(1))
        .unwrap()
}

/// One delivery of `event` as the handler of `build` in scope `scope` makes it.
async fn deliver_as(
    idem: &Idem,
    scope: &'static str,
    build: Build,
    event: &OrderEvent,
) -> Result<Outcome<i64>, Error<sqlx::Error>> {
    let spec = HandlerSpec::new(scope).declared_in("protocol");
    let at = Some(event.occurred_at);
    let (key, previous_key, event_time, previous_event_time) = match build {
        Build::Plain => (&OLD[..], None, None, None),
        Build::Moving => (&OLD[..], Some(&OLD[..]), Some("occurred_at"), None),
        Build::Timed => (&OLD[..], None, Some("occurred_at"), None),
        Build::Rekeyed => (
            &NEW[..],
            Some(&OLD[..]),
            Some("occurred_at"),
            Some("occurred_at"),
        ),
    };
    let layout = KeyLayout {
        key,
        fingerprint: None,
        previous_key,
        message_type: std::any::type_name::<OrderEvent>,
        event_time,
        previous_event_time,
    };
    let keys = MessageKeys {
        key: if build == Build::Rekeyed {
            new_key(event)
        } else {
            old_key(event)
        },
        fingerprint: None,
        previous: previous_key.map(|_| old_key(event)),
        fact_time: event_time.and(at),
    };
    let event = event.clone();
    run_transactional(idem, &spec, &layout, keys, JsonResult, |mut tx| {
        let event = event.clone();
        async move {
            let result = testing::insert_effect(&mut tx, &event).await;
            (tx, result)
        }
    })
    .await
}

/// Eight members, four of each build, each a handle of its own delivering every fact in
/// an order of its own, retrying what is in progress: how many ran.
async fn race(
    pool: &PgPool,
    scope: &'static str,
    builds: [Build; 2],
    facts: &[OrderEvent],
) -> usize {
    let mut members = Vec::new();
    for member in 0..8_usize {
        let (idem, facts) = (Idem::new(pool.clone()), facts.to_vec());
        let build = builds[member % 2];
        members.push(tokio::spawn(async move {
            let mut order: Vec<usize> = (0..facts.len()).collect();
            order.rotate_left(member * facts.len() / 8);
            if member % 4 >= 2 {
                order.reverse();
            }
            let mut executed = 0;
            for index in order {
                loop {
                    match deliver_as(&idem, scope, build, &facts[index]).await {
                        Ok(outcome) => {
                            executed += usize::from(outcome.is_executed());
                            break;
                        }
                        Err(error) if error.disposition() == Disposition::Retry => continue,
                        Err(error) => panic!("member {member} ({build:?}): {error}"),
                    }
                }
            }
            executed
        }));
    }
    let mut executed = 0;
    for member in members {
        executed += member.await.unwrap();
    }
    executed
}

async fn effects(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), count(*) - count(DISTINCT order_id) FROM order_effects")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn keys_in(pool: &PgPool, table: &str, scope: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM idem.{table} WHERE scope = $1"
    ))
    .bind(scope)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_handler_moving_its_keys_into_time_buckets_runs_each_fact_once_beside_the_old_build(
    pool: PgPool,
) {
    const SCOPE: &str = "moving_orders";
    let setup = testing::setup(&pool).await;
    let at = an_hour_ago();
    // The old build ran first: its keys are in the status table.
    let first = event("o-first", at);
    let Outcome::Executed(first_id) = deliver_as(&setup, SCOPE, Build::Plain, &first)
        .await
        .unwrap()
    else {
        panic!("the first fact runs");
    };

    // The new build: the old build's fact is a duplicate, with its result.
    let moving = Idem::new(pool.clone());
    assert_eq!(
        deliver_as(&moving, SCOPE, Build::Moving, &first)
            .await
            .unwrap(),
        Outcome::Duplicate(Some(first_id))
    );

    // The rolling deploy: both builds side by side on 200 facts of various times.
    let facts: Vec<OrderEvent> = (0..200)
        .map(|i| event(&format!("o-{i}"), at + TimeDelta::milliseconds(i * 7)))
        .collect();
    assert_eq!(
        race(&pool, SCOPE, [Build::Plain, Build::Moving], &facts).await,
        facts.len(),
        "each fact ran once"
    );
    assert_eq!(effects(&pool).await, (201, 0));

    // Each fact is a duplicate to both builds, with the one result stored.
    let (old, new) = (Idem::new(pool.clone()), Idem::new(pool.clone()));
    for fact in &facts {
        let Outcome::Duplicate(Some(id)) =
            deliver_as(&old, SCOPE, Build::Plain, fact).await.unwrap()
        else {
            panic!("a duplicate to the old build, with its result");
        };
        assert_eq!(
            deliver_as(&new, SCOPE, Build::Moving, fact).await.unwrap(),
            Outcome::Duplicate(Some(id))
        );
    }
    assert!(keys_in(&pool, "idem_timed_keys", SCOPE).await > 0);

    // `previous_key` removed while the status table holds the scope's keys: refused,
    // with the declaration to keep (a fact that succeeded under one of them alone would
    // run again).
    let early = deliver_as(&Idem::new(pool.clone()), SCOPE, Build::Timed, &first)
        .await
        .unwrap_err();
    assert!(matches!(early, Error::KeyChanged(_)), "{early:?}");
    assert!(
        early
            .to_string()
            .contains("previous_key = \"order_id, occurred_at\""),
        "{early}"
    );
    // Once the status table's cleanup has deleted them, the move is over: the new build
    // without `previous_key` runs; the old build is refused from then on.
    sqlx::query("DELETE FROM idem.idem_keys WHERE scope = $1")
        .bind(SCOPE)
        .execute(&pool)
        .await
        .unwrap();
    let timed = Idem::new(pool.clone());
    let late = event("o-late", at);
    assert!(
        deliver_as(&timed, SCOPE, Build::Timed, &late)
            .await
            .unwrap()
            .is_executed()
    );
    let error = deliver_as(
        &Idem::new(pool.clone()),
        SCOPE,
        Build::Plain,
        &event("o-old", at),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, Error::KeyChanged(_)), "{error:?}");
    assert_eq!(effects(&pool).await, (202, 0));
}

#[sqlx::test(migrations = false)]
async fn a_key_changed_in_the_time_buckets_runs_each_fact_once_beside_the_old_build(pool: PgPool) {
    const SCOPE: &str = "rekeyed_timed_orders";
    let setup = testing::setup(&pool).await;
    let at = an_hour_ago();
    let first = event("o-first", at);
    let Outcome::Executed(first_id) = deliver_as(&setup, SCOPE, Build::Timed, &first)
        .await
        .unwrap()
    else {
        panic!("the first fact runs");
    };
    let rekeyed = Idem::new(pool.clone());
    assert_eq!(
        deliver_as(&rekeyed, SCOPE, Build::Rekeyed, &first)
            .await
            .unwrap(),
        Outcome::Duplicate(Some(first_id))
    );

    let facts: Vec<OrderEvent> = (0..200)
        .map(|i| event(&format!("o-{i}"), at + TimeDelta::milliseconds(i * 7)))
        .collect();
    assert_eq!(
        race(&pool, SCOPE, [Build::Timed, Build::Rekeyed], &facts).await,
        facts.len(),
        "each fact ran once"
    );
    assert_eq!(effects(&pool).await, (201, 0));
    let (old, new) = (Idem::new(pool.clone()), Idem::new(pool.clone()));
    for fact in &facts {
        let Outcome::Duplicate(Some(id)) =
            deliver_as(&old, SCOPE, Build::Timed, fact).await.unwrap()
        else {
            panic!("a duplicate to the old build, with its result");
        };
        assert_eq!(
            deliver_as(&new, SCOPE, Build::Rekeyed, fact).await.unwrap(),
            Outcome::Duplicate(Some(id))
        );
    }
    // Every key of both definitions is in the time buckets.
    assert_eq!(keys_in(&pool, "idem_keys", SCOPE).await, 0);
    // A fact outside the window is refused under the previous key too, and never runs.
    let old_fact = event("o-ancient", Utc::now() - TimeDelta::days(30));
    let error = deliver_as(&new, SCOPE, Build::Rekeyed, &old_fact)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::OutsideWindow { .. }), "{error:?}");
    assert_eq!(effects(&pool).await, (201, 0));
}

#[sqlx::test(migrations = false)]
async fn a_move_into_time_buckets_without_previous_key_is_refused_with_the_declaration_to_make(
    pool: PgPool,
) {
    const SCOPE: &str = "undeclared_move";
    let setup = testing::setup(&pool).await;
    let at = an_hour_ago();
    assert!(
        deliver_as(&setup, SCOPE, Build::Plain, &event("o-1", at))
            .await
            .unwrap()
            .is_executed()
    );
    let error = deliver_as(
        &Idem::new(pool.clone()),
        SCOPE,
        Build::Timed,
        &event("o-1", at),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, Error::KeyChanged(_)), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("previous_key = \"order_id, occurred_at\""),
        "{text}"
    );
    assert_eq!(effects(&pool).await, (1, 0), "nothing ran again");
}

#[sqlx::test(migrations = false)]
async fn previous_key_removed_while_the_status_table_holds_the_scope_keys_runs_no_old_fact_again(
    pool: PgPool,
) {
    const SCOPE: &str = "moved_too_early";
    let setup = testing::setup(&pool).await;
    // A fact two hours old succeeded under the status table's key alone.
    let old_fact = event("o-old", an_hour_ago() - TimeDelta::hours(1));
    assert!(
        deliver_as(&setup, SCOPE, Build::Plain, &old_fact)
            .await
            .unwrap()
            .is_executed()
    );
    // The move is declared: its redelivery is a duplicate.
    let moving = Idem::new(pool.clone());
    assert!(matches!(
        deliver_as(&moving, SCOPE, Build::Moving, &old_fact)
            .await
            .unwrap(),
        Outcome::Duplicate(_)
    ));
    // `previous_key` removed seconds later: the build is refused, whichever fact it is
    // given first, and the old fact does not run again.
    for fact in [&old_fact, &event("o-new", an_hour_ago())] {
        let error = deliver_as(&Idem::new(pool.clone()), SCOPE, Build::Timed, fact)
            .await
            .unwrap_err();
        let Error::KeyChanged(changed) = &error else {
            panic!("expected KeyChanged, got {error:?}");
        };
        assert_eq!(
            changed.recorded(),
            "idem:v1 key(order_id s, occurred_at t) time(occurred_at)"
        );
        assert!(
            error
                .to_string()
                .contains("previous_key = \"order_id, occurred_at\""),
            "{error}"
        );
    }
    assert_eq!(effects(&pool).await, (1, 0), "nothing ran again");
    // The declared build still answers it.
    assert!(matches!(
        deliver_as(&Idem::new(pool.clone()), SCOPE, Build::Moving, &old_fact)
            .await
            .unwrap(),
        Outcome::Duplicate(_)
    ));
}
