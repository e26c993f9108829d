//! What a scope records of its handler survives a deploy, checked at the handler's first
//! delivery: a key derived otherwise is refused (`Error::KeyChanged`) while the scope has
//! keys, a declared change (`previous_key`) answers facts of either definition, a handler
//! without `scope` renamed or moved away from its keys is refused (`Error::HandlerMoved`),
//! and a handler renamed with its `scope` kept takes the scope over. The rows an earlier
//! build left are written here as that build would have; the scenario suite of `tests/`
//! runs the builds themselves as processes.
use crate::support::orders::{EventType, OrderEvent};
use crate::support::testing;
use idem_runtime::key::KeyBuilder;
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id, event_type", scope = "identity_orders")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[idempotent(
    key = "event_key",
    previous_key = "order_id, event_type",
    scope = "identity_rekeyed"
)]
async fn apply_rekeyed(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

// No `scope`: `protocol::scope_identity_across_deploys::settle` and `::notify`, two
// handlers of one message and key (a fan-out).
#[idempotent(key = "order_id")]
async fn settle(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[idempotent(key = "order_id")]
async fn notify(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

const SETTLE: &str = "protocol::scope_identity_across_deploys::settle";

fn event(order_id: &str) -> OrderEvent {
    let mut event = testing::paid(order_id, 100);
    // The producer's key of the fact, derived from the order.
    event.event_key = Some(
        idem_runtime::key::key_of(&[&"event", &order_id])
            .unwrap()
            .as_uuid(),
    );
    event
}

async fn effects(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM order_effects")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn scope_column(pool: &PgPool, scope: &str, column: &str) -> Option<String> {
    sqlx::query_scalar(&format!(
        "SELECT {column}::text FROM idem.idem_scopes WHERE scope = $1"
    ))
    .bind(scope)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// What a build whose handler derived its keys as `definition` recorded for `scope`.
async fn recorded_by_earlier_build(pool: &PgPool, scope: &str, definition: &str) {
    sqlx::query(
        "INSERT INTO idem.idem_scopes (scope, owner, handler, shared, key_definition, message_type) \
         VALUES ($1, 'protocol', NULL, false, $2, 'OrderEvent') \
         ON CONFLICT (scope) DO UPDATE SET key_definition = EXCLUDED.key_definition",
    )
    .bind(scope)
    .bind(definition)
    .execute(pool)
    .await
    .unwrap();
}

/// A fact that succeeded under `key` in `scope`.
async fn succeeded(pool: &PgPool, scope: &str, key: uuid::Uuid, result: &str) {
    sqlx::query(
        "INSERT INTO idem.idem_keys (scope, key, status, attempts, result) \
         VALUES ($1, $2, 'success', 1, $3::json)",
    )
    .bind(scope)
    .bind(key)
    .bind(result)
    .execute(pool)
    .await
    .unwrap();
}

fn old_key(order_id: &str) -> uuid::Uuid {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .part("event_type", &EventType::Paid)
        .unwrap()
        .finish()
        .as_uuid()
}

#[sqlx::test(migrations = false)]
async fn the_first_delivery_records_what_the_keys_are_made_of(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    assert!(apply(&idem, &event("o-1")).await.unwrap().is_executed());
    assert_eq!(
        scope_column(&pool, "identity_orders", "key_definition")
            .await
            .as_deref(),
        Some("idem:v1 key(order_id s, event_type s)")
    );
    assert_eq!(
        scope_column(&pool, "identity_orders", "message_type")
            .await
            .as_deref(),
        Some("OrderEvent")
    );
}

#[sqlx::test(migrations = false)]
async fn a_key_derived_otherwise_is_refused_while_the_scope_has_keys(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    assert!(apply(&idem, &event("o-1")).await.unwrap().is_executed());
    // The build before this one keyed the scope on the order alone.
    let earlier = "idem:v1 key(order_id s)";
    sqlx::query("UPDATE idem.idem_scopes SET key_definition = $1 WHERE scope = 'identity_orders'")
        .bind(earlier)
        .execute(&pool)
        .await
        .unwrap();

    let deployed = Idem::new(pool.clone());
    let error = apply(&deployed, &event("o-2")).await.unwrap_err();
    assert_eq!(error.disposition(), Disposition::Halt);
    let Error::KeyChanged(changed) = &error else {
        panic!("expected KeyChanged, got {error:?}");
    };
    assert_eq!(changed.scope(), "identity_orders");
    assert_eq!(changed.recorded(), earlier);
    assert_eq!(changed.current(), "idem:v1 key(order_id s, event_type s)");
    let text = error.to_string();
    for needle in [
        earlier,
        "previous_key = \"order_id\"",
        "release_scope(\"identity_orders\")",
    ] {
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    assert_eq!(effects(&pool).await, 1, "nothing ran");
    // Refused on every delivery, not only the first.
    assert!(matches!(
        apply(&deployed, &event("o-3")).await,
        Err(Error::KeyChanged(_))
    ));
}

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "identity_timed"
)]
async fn apply_timed(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, event).await.map(|_| ())
}

#[sqlx::test(migrations = false)]
async fn keys_kept_by_time_or_not_are_another_definition_refused_while_the_scope_has_keys(
    pool: PgPool,
) {
    let idem = testing::setup(&pool).await;
    assert!(
        apply_timed(&idem, &event("o-1"))
            .await
            .unwrap()
            .is_executed()
    );
    assert_eq!(
        scope_column(&pool, "identity_timed", "key_definition")
            .await
            .as_deref(),
        Some("idem:v1 key(order_id s, occurred_at t) time(occurred_at)")
    );
    // The build before this one kept the same keys in the status table.
    let earlier = "idem:v1 key(order_id s, occurred_at t)";
    sqlx::query("UPDATE idem.idem_scopes SET key_definition = $1 WHERE scope = 'identity_timed'")
        .bind(earlier)
        .execute(&pool)
        .await
        .unwrap();
    let deployed = Idem::new(pool.clone());
    let error = apply_timed(&deployed, &event("o-2")).await.unwrap_err();
    let Error::KeyChanged(changed) = &error else {
        panic!("expected KeyChanged, got {error:?}");
    };
    assert_eq!(changed.recorded(), earlier);
    let text = error.to_string();
    // Into the time buckets, the move can be declared.
    for needle in [
        "event_time",
        "previous_key = \"order_id, occurred_at\"",
        "a `scope` of its own",
    ] {
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    assert_eq!(effects(&pool).await, 1, "nothing ran");
}

#[idempotent(
    key = "order_id, occurred_at",
    scope = "identity_layout",
    shared_scope = true
)]
async fn apply_untimed(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, event).await.map(|_| ())
}

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "identity_layout",
    shared_scope = true
)]
async fn apply_layout_timed(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, event).await.map(|_| ())
}

#[sqlx::test(migrations = false)]
async fn a_released_scope_with_keys_in_the_other_table_is_refused(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let fact = event("o-1");
    assert!(apply_untimed(&idem, &fact).await.unwrap().is_executed());
    // The definition is forgotten (the step a crate rename asks for); the keys stay.
    idem.release_scope("identity_layout").await.unwrap();
    let deployed = Idem::new(pool.clone());
    let error = apply_layout_timed(&deployed, &fact).await.unwrap_err();
    assert!(matches!(error, Error::KeyChanged(_)), "{error:?}");
    // The move into the time buckets can be declared there too.
    for needle in [
        "kept in the status table",
        "previous_key = \"order_id, occurred_at\"",
    ] {
        assert!(
            error.to_string().contains(needle),
            "{needle:?} not in {error}"
        );
    }
    assert_eq!(effects(&pool).await, 1, "the fact did not run again");
}

#[sqlx::test(migrations = false)]
async fn a_key_changed_on_a_scope_without_keys_is_recorded(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    recorded_by_earlier_build(&pool, "identity_orders", "idem:v1 key(order_id s)").await;
    assert!(apply(&idem, &event("o-1")).await.unwrap().is_executed());
    assert_eq!(
        scope_column(&pool, "identity_orders", "key_definition")
            .await
            .as_deref(),
        Some("idem:v1 key(order_id s, event_type s)")
    );
}

#[sqlx::test(migrations = false)]
async fn a_declared_key_change_answers_facts_of_either_definition(pool: PgPool) {
    testing::setup(&pool).await;
    // One connection: a delivery holds no second one while its claim's is taken.
    let single = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(3))
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let idem = Idem::new(single);
    let old = "idem:v1 key(order_id s, event_type s)";
    recorded_by_earlier_build(&pool, "identity_rekeyed", old).await;
    succeeded(&pool, "identity_rekeyed", old_key("o-old"), "7").await;

    // A fact that succeeded under the old key: a duplicate, with the result stored then.
    assert_eq!(
        apply_rekeyed(&idem, &event("o-old")).await.unwrap(),
        Outcome::Duplicate(Some(7))
    );
    assert!(
        scope_column(&pool, "identity_rekeyed", "previous_key_seen_at")
            .await
            .is_some()
    );
    // A new fact runs once and claims both keys, so a build of the old key finds it done.
    let fresh = event("o-new");
    let Outcome::Executed(id) = apply_rekeyed(&idem, &fresh).await.unwrap() else {
        panic!("a new fact runs");
    };
    let stored: Vec<(uuid::Uuid, Option<String>)> = sqlx::query_as(
        "SELECT key, result::text FROM idem.idem_keys WHERE scope = 'identity_rekeyed' AND key = ANY($1) ORDER BY key",
    )
    .bind({
        let keys = apply_rekeyed_key(&fresh).unwrap();
        assert_eq!(keys.previous_key().map(|key| key.as_uuid()), Some(old_key("o-new")));
        vec![keys.previous_key().unwrap().as_uuid(), keys.key().as_uuid()]
    })
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert!(
        stored
            .iter()
            .all(|(_, result)| result.as_deref() == Some(&*id.to_string()))
    );
    assert!(apply_rekeyed(&idem, &fresh).await.unwrap().is_duplicate());
    // The scope records the transition.
    assert_eq!(
        scope_column(&pool, "identity_rekeyed", "key_definition")
            .await
            .as_deref(),
        Some("idem:v1 key(event_key u)")
    );
    assert_eq!(
        scope_column(&pool, "identity_rekeyed", "previous_key_definition")
            .await
            .as_deref(),
        Some(old)
    );
    assert_eq!(effects(&pool).await, 1);
}

#[sqlx::test(migrations = false)]
async fn a_handler_renamed_or_moved_away_from_its_keys_is_refused(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // `settle` was `protocol::billing::settle` in the build before: its scope has keys,
    // and no handler of this binary has it.
    let before = "protocol::billing::settle";
    recorded_by_earlier_build(&pool, before, "idem:v1 key(order_id s)").await;
    succeeded(
        &pool,
        before,
        KeyBuilder::new()
            .part("order_id", "o-1")
            .unwrap()
            .finish()
            .as_uuid(),
        "1",
    )
    .await;

    let error = settle(&idem, &event("o-1")).await.unwrap_err();
    assert_eq!(error.disposition(), Disposition::Halt);
    let Error::HandlerMoved(moved) = &error else {
        panic!("expected HandlerMoved, got {error:?}");
    };
    assert_eq!((moved.scope(), moved.previous_scope()), (SETTLE, before));
    let text = error.to_string();
    assert!(text.contains(&format!("scope = \"{before}\"")), "{text}");
    assert_eq!(effects(&pool).await, 0, "nothing ran");
}

#[sqlx::test(migrations = false)]
async fn a_second_handler_of_the_same_message_and_key_runs(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // `settle` ran in the build before; `notify` is new, with the same message and key.
    for order in ["o-1", "o-2"] {
        assert!(settle(&idem, &event(order)).await.unwrap().is_executed());
    }
    let deployed = Idem::new(pool.clone());
    for order in ["o-1", "o-2"] {
        assert!(
            notify(&deployed, &event(order))
                .await
                .unwrap()
                .is_executed()
        );
        assert!(
            settle(&deployed, &event(order))
                .await
                .unwrap()
                .is_duplicate()
        );
    }
    assert_eq!(effects(&pool).await, 4);
}

#[sqlx::test(migrations = false)]
async fn a_handler_renamed_with_its_scope_kept_takes_the_scope_over(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    assert!(apply(&idem, &event("o-1")).await.unwrap().is_executed());
    // The build before named the handler otherwise, or had it as a method.
    sqlx::query("UPDATE idem.idem_scopes SET handler = 'protocol::orders::Ledger::apply' WHERE scope = 'identity_orders'")
        .execute(&pool)
        .await
        .unwrap();
    let deployed = Idem::new(pool.clone());
    assert!(
        apply(&deployed, &event("o-1"))
            .await
            .unwrap()
            .is_duplicate()
    );
    assert!(apply(&deployed, &event("o-2")).await.unwrap().is_executed());
    // The first handler recorded stays, for the build before (a rollback).
    assert_eq!(
        scope_column(&pool, "identity_orders", "handler")
            .await
            .as_deref(),
        Some("protocol::orders::Ledger::apply")
    );
}

/// One delivery as a build of the given key definition makes it: the old build claims
/// `old_key` alone, the new one `new_key` with `old_key` as its previous key.
async fn deliver_as(
    idem: &Idem,
    new_build: bool,
    order_id: &str,
) -> Result<Outcome<i64>, Error<sqlx::Error>> {
    use idem_runtime::__private_v0_1_0::{
        DefinedPart, HandlerSpec, JsonResult, KeyLayout, MessageKeys, run_transactional,
    };
    const SPEC: HandlerSpec = HandlerSpec::new("identity_racing").declared_in("protocol");
    const OLD: [DefinedPart; 2] = [
        ("order_id", |shape| shape.push('s')),
        ("event_type", |shape| shape.push('s')),
    ];
    const NEW: [DefinedPart; 1] = [("event_key", |shape| shape.push('u'))];
    let event = event(order_id);
    let new_key = KeyBuilder::new()
        .part("event_key", &event.event_key)
        .unwrap()
        .finish();
    let old = idem_runtime::IdempotencyKey::from_uuid(old_key(order_id));
    let (layout, keys) = if new_build {
        let layout = KeyLayout {
            key: &NEW,
            fingerprint: None,
            previous_key: Some(&OLD),
            message_type: std::any::type_name::<OrderEvent>,
            event_time: None,
            previous_event_time: None,
        };
        (
            layout,
            MessageKeys {
                key: new_key,
                fingerprint: None,
                previous: Some(old),
                fact_time: None,
            },
        )
    } else {
        let layout = KeyLayout {
            key: &OLD,
            fingerprint: None,
            previous_key: None,
            message_type: std::any::type_name::<OrderEvent>,
            event_time: None,
            previous_event_time: None,
        };
        (
            layout,
            MessageKeys {
                key: old,
                fingerprint: None,
                previous: None,
                fact_time: None,
            },
        )
    };
    run_transactional(idem, &SPEC, &layout, keys, JsonResult, |mut tx| {
        let event = event.clone();
        async move {
            let result = testing::insert_effect(&mut tx, &event).await;
            (tx, result)
        }
    })
    .await
}

#[sqlx::test(migrations = false)]
async fn builds_of_the_old_and_the_new_key_deliver_each_fact_once_between_them(pool: PgPool) {
    let setup = testing::setup(&pool).await;
    // The old build ran first: the scope records its definition.
    assert!(
        deliver_as(&setup, false, "o-first")
            .await
            .unwrap()
            .is_executed()
    );
    let facts: Vec<String> = (0..200).map(|i| format!("o-{i}")).collect();
    // Four members of each build, each a process of its own (a handle of its own), each
    // delivering every fact, in orders of their own.
    let mut members = Vec::new();
    for member in 0..8_usize {
        let (idem, facts) = (Idem::new(pool.clone()), facts.clone());
        members.push(tokio::spawn(async move {
            let new_build = member % 2 == 1;
            let mut order: Vec<usize> = (0..facts.len()).collect();
            order.rotate_left(member * 25);
            if member % 4 >= 2 {
                order.reverse();
            }
            let mut executed = 0;
            for index in order {
                loop {
                    match deliver_as(&idem, new_build, &facts[index]).await {
                        Ok(outcome) => {
                            executed += usize::from(outcome.is_executed());
                            break;
                        }
                        Err(error) if error.disposition() == Disposition::Retry => continue,
                        Err(error) => panic!("member {member}: {error}"),
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
    assert_eq!(executed, facts.len(), "each fact ran once");
    let doubled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT order_id FROM order_effects GROUP BY order_id HAVING count(*) > 1) AS d",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((doubled, effects(&pool).await), (0, 201));
    // The old build stopped: every fact delivered again is a duplicate of the new one.
    let after = Idem::new(pool.clone());
    for fact in &facts {
        assert!(deliver_as(&after, true, fact).await.unwrap().is_duplicate());
    }
}

#[derive(Debug, Clone, idem_runtime::KeyPart)]
struct Customer {
    first: String,
    last: String,
}

#[derive(Debug, Clone)]
struct Signup {
    customer: Customer,
    plan: i32,
}

#[idempotent(key = "customer, plan", scope = "identity_signups")]
async fn sign_up(tx: &mut PgConnection, signup: &Signup) -> Result<(), sqlx::Error> {
    let _ = (tx, signup);
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_derived_part_records_its_fields_by_name_and_order(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let signup = Signup {
        customer: Customer {
            first: "Ada".into(),
            last: "Lovelace".into(),
        },
        plan: 1,
    };
    assert!(sign_up(&idem, &signup).await.unwrap().is_executed());
    assert_eq!(
        scope_column(&pool, "identity_signups", "key_definition")
            .await
            .as_deref(),
        Some("idem:v1 key(customer l(first s,last s), plan i)")
    );
}

#[sqlx::test(migrations = false)]
async fn a_fingerprint_removed_keeps_the_keys_and_is_recorded(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // The build before compared a fingerprint; this one compares none.
    recorded_by_earlier_build(
        &pool,
        "identity_orders",
        "idem:v1 key(order_id s, event_type s) fingerprint(amount_cents i)",
    )
    .await;
    succeeded(&pool, "identity_orders", old_key("o-1"), "3").await;
    assert_eq!(
        apply(&idem, &event("o-1")).await.unwrap(),
        Outcome::Duplicate(Some(3))
    );
    assert_eq!(
        scope_column(&pool, "identity_orders", "key_definition")
            .await
            .as_deref(),
        Some("idem:v1 key(order_id s, event_type s)")
    );
}

#[sqlx::test(migrations = false)]
async fn a_handler_moved_and_rekeyed_in_one_deploy_is_refused(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // `settle` was `protocol::billing::settle`, keyed on the order and the event type.
    let before = "protocol::billing::settle";
    recorded_by_earlier_build(&pool, before, "idem:v1 key(order_id s, event_type s)").await;
    succeeded(&pool, before, old_key("o-1"), "1").await;
    let error = settle(&idem, &event("o-1")).await.unwrap_err();
    let Error::HandlerMoved(moved) = &error else {
        panic!("expected HandlerMoved, got {error:?}");
    };
    assert_eq!(moved.previous_scope(), before);
    assert!(
        error
            .to_string()
            .contains("the same message type (OrderEvent) and another key"),
        "{error}"
    );
}

#[sqlx::test(migrations = false)]
async fn a_scope_of_0_1_0_is_not_taken_for_a_renamed_handler(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // 0.1.0 recorded neither key definitions nor message types: a scope of the crate that
    // has keys and no handler here (retired) does not refuse a new handler.
    sqlx::query(
        "INSERT INTO idem.idem_scopes (scope, owner, handler, shared) \
         VALUES ('protocol::retired::handle', 'protocol', 'protocol::retired::handle', false)",
    )
    .execute(&pool)
    .await
    .unwrap();
    succeeded(&pool, "protocol::retired::handle", old_key("o-1"), "1").await;
    assert!(settle(&idem, &event("o-1")).await.unwrap().is_executed());
}

#[idempotent(key = "order_id, event_type", scope = "identity_batched", batch = true)]
async fn apply_batched(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn a_batch_of_a_changed_key_is_refused_message_by_message(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    recorded_by_earlier_build(&pool, "identity_batched", "idem:v1 key(order_id s)").await;
    succeeded(&pool, "identity_batched", old_key("o-0"), "1").await;
    let events = [event("o-1"), event("o-2")];
    let outcomes = apply_batched_batch(&idem, &events).await;
    assert_eq!(outcomes.len(), 2);
    for outcome in &outcomes {
        let error = outcome.as_ref().unwrap_err();
        assert!(matches!(error, Error::KeyChanged(_)), "{error:?}");
        assert_eq!(error.disposition(), Disposition::Halt);
    }
    assert_eq!(effects(&pool).await, 0, "nothing ran");
    // An empty batch asks nothing.
    assert!(apply_batched_batch(&idem, &[]).await.is_empty());
}
