//! Paths that once skipped an effect, stalled a partition or retried forever: handlers
//! sharing a scope by accident, failures only the commit sees, hostile error texts and
//! results, duplicates piling up behind a busy key, unbounded waits, bodies that end
//! their own transaction, and takeovers that forgot the payload fingerprint.
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::support::orders::OrderEvent;
use crate::support::testing::{self, Checkpoint};
// What the attribute generates in another crate, written out here to declare handlers of
// several crates in one test: the private module of generated code, not a public API.
use idem_runtime::__private_v0_1_0::{
    DefinedPart, HandlerSpec, KeyLayout, MessageKeys, NoResult, run_transactional,
};
use idem_runtime::key::KeyBuilder;
use idem_runtime::{Disposition, Error, Idem, Outcome, Status, idempotent};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

fn key_of(order_id: &str) -> idem_runtime::IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

async fn effects(pool: &PgPool) -> i64 {
    testing::count_rows(pool, "order_effects").await
}

/// The status of the key of `order_id` in `scope`, which must exist.
async fn status(idem: &Idem, scope: &str, order_id: &str) -> Status {
    idem.record(scope, key_of(order_id))
        .await
        .unwrap()
        .expect("the key has a row")
        .status
}

// ---- Two handlers called `handle` in two modules keep their own keys.

mod billing {
    use super::*;

    #[idempotent(key = "order_id")]
    pub async fn handle(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
        testing::insert_effect(tx, event).await
    }
}

mod shipping {
    use super::*;

    #[idempotent(key = "order_id")]
    pub async fn handle(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
        testing::insert_effect(tx, event).await
    }
}

#[sqlx::test(migrations = false)]
async fn handlers_named_handle_in_two_modules_each_apply_their_effect(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-two-modules", 100);
    assert!(billing::handle(&idem, &event).await.unwrap().is_executed());
    assert!(shipping::handle(&idem, &event).await.unwrap().is_executed());
    assert!(billing::handle(&idem, &event).await.unwrap().is_duplicate());
    assert!(
        shipping::handle(&idem, &event)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(effects(&pool).await, 2);
    let scopes: Vec<String> = sqlx::query_scalar("SELECT scope FROM idem.idem_keys ORDER BY scope")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        scopes,
        [
            concat!(module_path!(), "::billing::handle"),
            concat!(module_path!(), "::shipping::handle")
        ]
    );
}

// ---- Two handlers that use one scope without saying so are refused before anything runs.

#[idempotent(key = "order_id", scope = "payments")]
async fn record_payment(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[idempotent(key = "order_id", scope = "payments")]
async fn refund_payment(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

fn assert_conflict<T: std::fmt::Debug, E: std::fmt::Debug + std::fmt::Display>(
    outcome: Result<Outcome<T>, Error<E>>,
    names: &[&str],
) {
    let error = outcome.expect_err("a scope conflict");
    assert!(matches!(error, Error::ScopeConflict(_)), "{error:?}");
    assert_eq!(error.disposition(), Disposition::Halt);
    let text = error.to_string();
    for name in names {
        assert!(text.contains(name), "{text} names {name}");
    }
}

#[sqlx::test(migrations = false)]
async fn two_handlers_on_one_undeclared_scope_halt_before_anything_runs(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-shared-scope", 100);
    assert!(record_payment(&idem, &event).await.unwrap().is_executed());
    assert_conflict(
        refund_payment(&idem, &event).await,
        &["record_payment", "refund_payment", "payments"],
    );
    // Refused every time, and the refusal wrote nothing.
    assert_conflict(
        refund_payment(&idem, &testing::paid("o-other", 1)).await,
        &[],
    );
    assert_eq!(effects(&pool).await, 1);
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 1);
}

mod ledgers {
    use super::*;

    pub struct Billing;
    pub struct Shipping;

    impl Billing {
        #[idempotent(key = "order_id")]
        pub async fn handle(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
            testing::insert_effect(tx, event).await.map(drop)
        }
    }

    impl Shipping {
        #[idempotent(key = "order_id")]
        pub async fn handle(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
            testing::insert_effect(tx, event).await.map(drop)
        }
    }
}

#[sqlx::test(migrations = false)]
async fn methods_named_handle_in_two_impl_blocks_are_refused(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-methods", 100);
    assert!(
        ledgers::Billing::handle(&idem, &event)
            .await
            .unwrap()
            .is_executed()
    );
    assert_conflict(
        ledgers::Shipping::handle(&idem, &event).await,
        &["Billing", "Shipping"],
    );
    assert_eq!(effects(&pool).await, 1);
}

trait Ledger {
    const NAME: &'static str;
}
struct Cash;
struct Card;
impl Ledger for Cash {
    const NAME: &'static str = "cash";
}
impl Ledger for Card {
    const NAME: &'static str = "card";
}

#[idempotent(key = "order_id")]
async fn book<L: Ledger>(tx: &mut PgConnection, event: &OrderEvent) -> Result<String, sqlx::Error> {
    testing::insert_effect(tx, event).await?;
    Ok(L::NAME.to_owned())
}

#[sqlx::test(migrations = false)]
async fn two_instantiations_of_a_generic_handler_are_refused(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-generic", 100);
    assert_eq!(
        book::<Cash>(&idem, &event).await.unwrap(),
        Outcome::Executed("cash".to_owned())
    );
    assert_conflict(book::<Card>(&idem, &event).await, &["Cash", "Card"]);
    assert_eq!(effects(&pool).await, 1);
}

/// A handler as another service's `#[idempotent]` expands, its crate given by `spec`.
async fn run_as(
    idem: &Idem,
    spec: &HandlerSpec,
    order_id: &str,
) -> Result<Outcome<()>, Error<sqlx::Error>> {
    let event = testing::paid(order_id, 1);
    const KEY: [DefinedPart; 1] = [("order_id", |shape| shape.push('s'))];
    let layout = KeyLayout {
        key: &KEY,
        fingerprint: None,
        previous_key: None,
        message_type: std::any::type_name::<OrderEvent>,
        event_time: None,
        previous_event_time: None,
    };
    let keys = MessageKeys {
        key: key_of(order_id),
        fingerprint: None,
        previous: None,
        fact_time: None,
    };
    run_transactional(idem, spec, &layout, keys, NoResult, |mut tx| {
        let event = event.clone();
        async move {
            let result = testing::insert_effect(&mut tx, &event).await.map(drop);
            (tx, result)
        }
    })
    .await
}

#[sqlx::test(migrations = false)]
async fn another_crate_using_the_scope_in_the_database_is_refused_until_released(pool: PgPool) {
    let billing = testing::setup(&pool).await;
    // Another process: a handle of its own on the same database.
    let shipping = Idem::new(pool.clone());
    const BILLING: HandlerSpec =
        HandlerSpec::new("payments").declared_in("billing_service::handlers");
    const SHIPPING: HandlerSpec = HandlerSpec::new("payments").declared_in("shipping_service");
    assert!(
        run_as(&billing, &BILLING, "o-1")
            .await
            .unwrap()
            .is_executed()
    );
    assert_conflict(
        run_as(&shipping, &SHIPPING, "o-1").await,
        &["billing_service", "shipping_service", "release_scope"],
    );
    assert_eq!(effects(&pool).await, 1);

    // `shipping_service` is `billing_service` renamed: release the scope once.
    assert!(shipping.release_scope("payments").await.unwrap());
    assert!(
        run_as(&shipping, &SHIPPING, "o-1")
            .await
            .unwrap()
            .is_duplicate()
    );
    assert!(
        run_as(&shipping, &SHIPPING, "o-2")
            .await
            .unwrap()
            .is_executed()
    );
}

#[sqlx::test(migrations = false)]
async fn a_scope_declared_shared_by_every_handler_is_shared(pool: PgPool) {
    let first = testing::setup(&pool).await;
    let second = Idem::new(pool.clone());
    const SHARED_A: HandlerSpec = HandlerSpec::new("ledger").declared_in("a").shared_scope();
    const SHARED_B: HandlerSpec = HandlerSpec::new("ledger").declared_in("b").shared_scope();
    const ALONE: HandlerSpec = HandlerSpec::new("ledger").declared_in("c");
    assert!(
        run_as(&first, &SHARED_A, "o-1")
            .await
            .unwrap()
            .is_executed()
    );
    assert!(
        run_as(&second, &SHARED_B, "o-1")
            .await
            .unwrap()
            .is_duplicate()
    );
    // A handler that does not declare the scope shared is refused, in the process and
    // in the database.
    assert_conflict(
        run_as(&Idem::new(pool.clone()), &ALONE, "o-2").await,
        &["shared"],
    );
    assert_eq!(effects(&pool).await, 1);
}

// ---- Failures that only the commit sees count as attempts and park.

#[idempotent(key = "order_id", scope = "deferred", max_attempts = 2)]
async fn break_a_deferred_constraint(
    tx: &mut PgConnection,
    event: &OrderEvent,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO shipments (order_id, carrier_id) VALUES ($1, 42)")
        .bind(&event.order_id)
        .execute(&mut *tx)
        .await
        .map(drop)
}

#[sqlx::test(migrations = false)]
async fn a_deferred_constraint_broken_by_the_body_is_parked_after_max_attempts(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    sqlx::raw_sql(
        "CREATE TABLE carriers (id int PRIMARY KEY);
         CREATE TABLE shipments (order_id text PRIMARY KEY,
             carrier_id int REFERENCES carriers (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let event = testing::paid("o-deferred", 1);
    let error = break_a_deferred_constraint(&idem, &event)
        .await
        .expect_err("the commit fails");
    assert!(matches!(error, Error::Database(_)), "{error:?}");
    assert_eq!(error.disposition(), Disposition::Retry);
    let record = idem
        .record("deferred", key_of("o-deferred"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.attempts, 1);
    assert!(
        record.last_error.unwrap().contains("carrier"),
        "names the constraint"
    );
    // The attempt that parks the key says so: dead-letter it now.
    let error = break_a_deferred_constraint(&idem, &event)
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::Parked { attempts: 2, .. }),
        "{error:?}"
    );
    assert_eq!(error.disposition(), Disposition::DeadLetter);
    let error = break_a_deferred_constraint(&idem, &event)
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::Parked { attempts: 2, .. }),
        "{error:?}"
    );
    assert_eq!(error.disposition(), Disposition::DeadLetter);
    assert_eq!(testing::count_rows(&pool, "shipments").await, 0);
}

#[idempotent(key = "order_id", scope = "swallow")]
async fn swallow_a_failed_statement(
    tx: &mut PgConnection,
    event: &OrderEvent,
) -> Result<(), sqlx::Error> {
    let _ = sqlx::query("SELECT 1 / 0").execute(&mut *tx).await;
    testing::insert_effect(tx, &OrderEvent { ..event.clone() })
        .await
        .map(drop)
        .or(Ok(()))
}

#[sqlx::test(migrations = false)]
async fn a_body_that_swallows_a_failed_statement_is_parked_after_max_attempts(pool: PgPool) {
    let idem = Idem::builder(pool.clone()).max_attempts(3).build().unwrap();
    let idem = testing::setup_with(idem).await;
    let event = testing::paid("o-swallow", 1);
    for _ in 0..2 {
        let error = swallow_a_failed_statement(&idem, &event).await.unwrap_err();
        assert!(matches!(error, Error::Database(_)), "{error:?}");
    }
    let error = swallow_a_failed_statement(&idem, &event).await.unwrap_err();
    assert!(
        matches!(error, Error::Parked { attempts: 3, .. }),
        "{error:?}"
    );
    let error = swallow_a_failed_statement(&idem, &event).await.unwrap_err();
    assert!(
        matches!(error, Error::Parked { attempts: 3, .. }),
        "{error:?}"
    );
    assert_eq!(effects(&pool).await, 0);
}

// ---- Hostile results and error texts are stored, and never make the record fail.

#[idempotent(key = "order_id", scope = "nul_result")]
async fn answer_with_nul(tx: &mut PgConnection, event: &OrderEvent) -> Result<String, sqlx::Error> {
    testing::insert_effect(tx, event).await?;
    Ok(format!("nul \0 inside, {} after", event.order_id))
}

#[sqlx::test(migrations = false)]
async fn a_result_holding_a_nul_character_is_stored_and_replayed(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-nul", 1);
    let Outcome::Executed(first) = answer_with_nul(&idem, &event).await.unwrap() else {
        panic!("executes");
    };
    assert!(first.contains('\0'));
    assert_eq!(
        answer_with_nul(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(first))
    );
    assert_eq!(effects(&pool).await, 1);
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Hostile(String);

#[idempotent(key = "order_id", scope = "hostile_error", max_attempts = 2)]
async fn fail_with_hostile_text(_tx: &mut PgConnection, event: &OrderEvent) -> Result<(), Hostile> {
    Err(Hostile(format!(
        "{} refused: \0 and {}",
        event.order_id,
        "é".repeat(600_000)
    )))
}

#[sqlx::test(migrations = false)]
async fn an_error_text_with_nul_and_a_megabyte_is_recorded_sanitised_and_bounded(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-hostile", 1);
    let error = fail_with_hostile_text(&idem, &event).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Handler {
                attempts: 1,
                parked: false,
                ..
            }
        ),
        "{error:?}"
    );
    let error = fail_with_hostile_text(&idem, &event).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Handler {
                attempts: 2,
                parked: true,
                ..
            }
        ),
        "{error:?}"
    );
    let record = idem
        .record("hostile_error", key_of("o-hostile"))
        .await
        .unwrap()
        .unwrap();
    let text = record.last_error.unwrap();
    assert!(
        text.starts_with("o-hostile refused: \u{fffd} and é"),
        "{}",
        &text[..40]
    );
    assert!(text.ends_with("[truncated]"));
    assert!(text.len() <= 2048, "{} bytes", text.len());
    assert_eq!(record.status, Status::Parked);
}

// ---- Lease mode: a completion the server refuses counts as an attempt.

#[idempotent(
    key = "order_id",
    scope = "refused_completion",
    mode = "lease",
    lease = "30s",
    max_attempts = 2
)]
async fn notify(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = event;
    SENT.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

static SENT: AtomicU32 = AtomicU32::new(0);

#[sqlx::test(migrations = false)]
async fn a_lease_completion_refused_by_the_server_is_parked_after_max_attempts(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_success() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'completion refused'; END $$;
         CREATE TRIGGER refuse_success BEFORE UPDATE ON idem.idem_keys FOR EACH ROW
             WHEN (NEW.status = 'success') EXECUTE FUNCTION refuse_success()",
    )
    .execute(&pool)
    .await
    .unwrap();
    let event = testing::paid("o-refused", 1);
    let error = notify(&idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::Database(_)), "{error:?}");
    let error = notify(&idem, &event).await.unwrap_err();
    assert!(
        matches!(error, Error::Parked { attempts: 2, .. }),
        "{error:?}"
    );
    let error = notify(&idem, &event).await.unwrap_err();
    assert!(
        matches!(error, Error::Parked { attempts: 2, .. }),
        "{error:?}"
    );
    assert_eq!(
        SENT.load(Ordering::SeqCst),
        2,
        "the effect ran at most max_attempts times"
    );
}

// ---- Duplicates of a busy key hold no connection; other keys go on.

#[derive(Clone)]
struct Held {
    event: OrderEvent,
    hold: Option<Checkpoint>,
}

#[idempotent(key = "event.order_id", scope = "busy", batch = true)]
async fn apply_held(tx: &mut PgConnection, held: &Held) -> Result<i64, sqlx::Error> {
    let id = testing::insert_effect(tx, &held.event).await?;
    if let Some(hold) = &held.hold {
        hold.reach().await;
    }
    Ok(id)
}

#[sqlx::test(migrations = false)]
async fn duplicates_of_a_busy_key_hold_no_connection_and_other_keys_go_on(pool: PgPool) {
    let small = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let idem = Idem::builder(small)
        .lock_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let idem = testing::setup_with(idem).await;
    let hold = Checkpoint::new();
    let busy = testing::paid("o-busy", 1);
    let first = tokio::spawn({
        let (idem, held) = (
            idem.clone(),
            Held {
                event: busy.clone(),
                hold: Some(hold.clone()),
            },
        );
        async move { apply_held(&idem, &held).await }
    });
    hold.reached().await;
    let duplicates: Vec<_> = (0..30)
        .map(|_| {
            let (idem, held) = (
                idem.clone(),
                Held {
                    event: busy.clone(),
                    hold: None,
                },
            );
            tokio::spawn(async move { apply_held(&idem, &held).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Thirty duplicates wait, and a pool of three still serves other keys at once.
    let started = Instant::now();
    for n in 0..10 {
        let held = Held {
            event: testing::paid(&format!("o-free-{n}"), 1),
            hold: None,
        };
        assert!(apply_held(&idem, &held).await.unwrap().is_executed());
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // A batch with the busy key does not wait for it either.
    let batch = [
        Held {
            event: busy.clone(),
            hold: None,
        },
        Held {
            event: testing::paid("o-batch", 1),
            hold: None,
        },
    ];
    let started = Instant::now();
    let outcomes = apply_held_batch(&idem, &batch).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(outcomes[0], Err(Error::InProgress { .. })),
        "{:?}",
        outcomes[0]
    );
    assert!(outcomes[1].as_ref().unwrap().is_executed());

    hold.release();
    let Outcome::Executed(id) = first.await.unwrap().unwrap() else {
        panic!("the first delivery executes");
    };
    for duplicate in duplicates {
        assert_eq!(
            duplicate.await.unwrap().unwrap(),
            Outcome::Duplicate(Some(id))
        );
    }
    assert_eq!(effects(&pool).await, 12);
}

// ---- Every wait the library causes is bounded by the lock timeout.

#[derive(Debug, thiserror::Error)]
#[error("declined")]
struct Declined;

struct Declining {
    order_id: String,
    /// Reached once the body runs, holding the key's row; released when the body may fail.
    running: Checkpoint,
}

#[idempotent(key = "order_id", scope = "bounded")]
async fn decline(_tx: &mut PgConnection, message: &Declining) -> Result<(), Declined> {
    message.running.reach().await;
    Err(Declined)
}

/// Holds back, while closed, every connection a pool hands out (idle or new).
#[derive(Clone)]
struct Gate(std::sync::Arc<tokio::sync::watch::Sender<bool>>);

impl Gate {
    fn open() -> Self {
        Gate(std::sync::Arc::new(tokio::sync::watch::Sender::new(true)))
    }

    fn close(&self) {
        self.0.send_replace(false);
    }

    fn reopen(&self) {
        self.0.send_replace(true);
    }

    async fn pass(&self) {
        let mut open = self.0.subscribe();
        open.wait_for(|open| *open).await.expect("the gate lives");
    }

    /// `options` with every connection held at the gate before it is handed out.
    fn guard(&self, options: PgPoolOptions) -> PgPoolOptions {
        let (new, idle) = (self.clone(), self.clone());
        options
            .after_connect(move |_, _| {
                let gate = new.clone();
                Box::pin(async move {
                    gate.pass().await;
                    Ok(())
                })
            })
            .before_acquire(move |_, _| {
                let gate = idle.clone();
                Box::pin(async move {
                    gate.pass().await;
                    Ok(true)
                })
            })
    }
}

#[sqlx::test(migrations = false)]
async fn recording_a_failure_behind_a_locked_row_waits_at_most_the_lock_timeout(pool: PgPool) {
    // Sessions that would wait forever on their own.
    let gate = Gate::open();
    let unbounded = gate
        .guard(PgPoolOptions::new())
        .connect_with(
            pool.connect_options()
                .as_ref()
                .clone()
                .options([("lock_timeout", "0")]),
        )
        .await
        .unwrap();
    let lock_timeout = Duration::from_millis(500);
    let idem = Idem::builder(unbounded)
        .lock_timeout(lock_timeout)
        .build()
        .unwrap();
    let idem = testing::setup_with(idem).await;
    let key = key_of("o-bounded");

    // The key failed before; this delivery takes it over and fails again, while another
    // session queues for the row's lock and then keeps it.
    sqlx::query("INSERT INTO idem.idem_keys (scope, key, status, attempts) VALUES ('bounded', $1, 'failed', 1)")
        .bind(key.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    let running = Checkpoint::new();
    let delivery = tokio::spawn({
        let idem = idem.clone();
        let message = Declining {
            order_id: "o-bounded".to_owned(),
            running: running.clone(),
        };
        async move { decline(&idem, &message).await }
    });
    running.reached().await;
    let queued = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut other = pool.begin().await.unwrap();
            sqlx::query("SELECT 1 FROM idem.idem_keys WHERE key = $1 FOR UPDATE")
                .bind(key.as_uuid())
                .execute(&mut *other)
                .await
                .unwrap();
            other
        }
    });
    // The body fails only once the other session waits for the row's lock.
    while sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap()
        == 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The rollback does not hand the lock over: it wakes the other session, which takes
    // the row once it runs, and a recording that reaches the row before it finds the row
    // free and takes it first (PostgreSQL queues only those that find a row locked). The
    // recording gets its connection only once the other session holds the row's lock.
    gate.close();
    running.release();
    let other = queued.await.unwrap();
    gate.reopen();
    let started = Instant::now();
    let error = delivery.await.unwrap().unwrap_err();
    assert!(
        started.elapsed() < lock_timeout * 4,
        "{:?}",
        started.elapsed()
    );
    // Not recorded (the row is someone else's for now), but not stuck either.
    assert!(
        matches!(error, Error::Handler { attempts: 0, .. }),
        "{error:?}"
    );

    // `reset` behind the same lock returns within the lock timeout too.
    let started = Instant::now();
    assert!(idem.reset("bounded", key).await.is_err());
    assert!(
        started.elapsed() < lock_timeout * 4,
        "{:?}",
        started.elapsed()
    );
    other.rollback().await.unwrap();
}

#[idempotent(key = "order_id", scope = "bounded_lease", mode = "lease")]
async fn lease_notify(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = event;
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_lease_claim_behind_a_locked_row_waits_at_most_the_lock_timeout(pool: PgPool) {
    let unbounded = PgPoolOptions::new()
        .connect_with(
            pool.connect_options()
                .as_ref()
                .clone()
                .options([("lock_timeout", "0")]),
        )
        .await
        .unwrap();
    let lock_timeout = Duration::from_millis(500);
    let idem = Idem::builder(unbounded)
        .lock_timeout(lock_timeout)
        .build()
        .unwrap();
    let idem = testing::setup_with(idem).await;
    let key = key_of("o-lease-bounded");
    sqlx::query("INSERT INTO idem.idem_keys (scope, key, status, attempts) VALUES ('bounded_lease', $1, 'failed', 1)")
        .bind(key.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idem.idem_keys WHERE key = $1 FOR UPDATE")
        .bind(key.as_uuid())
        .execute(&mut *other)
        .await
        .unwrap();
    let started = Instant::now();
    let error = lease_notify(&idem, &testing::paid("o-lease-bounded", 1))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < lock_timeout * 4,
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    other.rollback().await.unwrap();
    assert!(
        lease_notify(&idem, &testing::paid("o-lease-bounded", 1))
            .await
            .unwrap()
            .is_executed()
    );
}

// ---- A body that ends its own transaction is not reported executed.

#[idempotent(key = "order_id", scope = "self_ending")]
async fn end_own_transaction(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, event).await?;
    let statement = if event.amount_cents == 0 {
        "ROLLBACK"
    } else {
        "COMMIT"
    };
    sqlx::query(statement).execute(&mut *tx).await.map(drop)
}

#[sqlx::test(migrations = false)]
async fn a_body_that_rolls_back_itself_is_parked_not_executed(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-rollback", 0);
    let error = end_own_transaction(&idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::TransactionEnded { .. }), "{error:?}");
    assert_eq!(error.disposition(), Disposition::DeadLetter);
    assert_eq!(effects(&pool).await, 0);
    assert_eq!(
        status(&idem, "self_ending", "o-rollback").await,
        Status::Parked
    );
    let error = end_own_transaction(&idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::Parked { .. }), "{error:?}");
}

/// A helper written for any connection, which opens a transaction of its own: on the
/// handler's connection, sqlx's `begin` cannot tell that idem's transaction is open.
async fn record_in_own_transaction(
    conn: &mut PgConnection,
    event: &OrderEvent,
) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let mut inner = conn.begin().await?;
    testing::insert_effect(&mut inner, event).await?;
    inner.commit().await
}

#[idempotent(key = "order_id", scope = "nested_begin")]
async fn begin_on_the_connection(
    tx: &mut PgConnection,
    event: &OrderEvent,
) -> Result<(), sqlx::Error> {
    record_in_own_transaction(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn a_body_that_begins_a_transaction_on_its_connection_is_parked_not_executed(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-nested", 1);
    let error = begin_on_the_connection(&idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::TransactionEnded { .. }), "{error:?}");
    assert!(error.to_string().contains("tx.begin()"), "{error}");
    // The helper's commit committed the claim and the effect together; nothing runs twice.
    assert_eq!(effects(&pool).await, 1);
    assert_eq!(
        status(&idem, "nested_begin", "o-nested").await,
        Status::Parked
    );
    let error = begin_on_the_connection(&idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::Parked { .. }), "{error:?}");
    assert_eq!(effects(&pool).await, 1);
}

#[sqlx::test(migrations = false)]
async fn a_body_that_commits_itself_is_parked_not_executed(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-commit", 1);
    let error = end_own_transaction(&idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::TransactionEnded { .. }), "{error:?}");
    // What the body committed itself stays committed; the key it committed with it is
    // parked, for an operator to look at: never run again, never reported done.
    assert_eq!(effects(&pool).await, 1);
    assert_eq!(
        status(&idem, "self_ending", "o-commit").await,
        Status::Parked
    );
    let error = end_own_transaction(&idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::Parked { .. }), "{error:?}");
    assert_eq!(effects(&pool).await, 1);
}

#[derive(Clone)]
struct Line {
    order_id: String,
    end: Option<&'static str>,
}

#[idempotent(key = "order_id", scope = "ending_batch", batch = true)]
async fn apply_line(tx: &mut PgConnection, line: &Line) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, &testing::paid(&line.order_id, 1)).await?;
    if let Some(statement) = line.end {
        sqlx::query(statement).execute(&mut *tx).await?;
    }
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_batch_whose_body_ends_the_transaction_parks_its_keys_and_applies_nothing_twice(
    pool: PgPool,
) {
    let idem = testing::setup(&pool).await;
    for end in ["ROLLBACK", "COMMIT"] {
        let line = |n: &str, ends: bool| Line {
            order_id: format!("{end}-{n}"),
            end: ends.then_some(end),
        };
        let batch = [line("1", false), line("2", true), line("3", false)];
        let outcomes = apply_line_batch(&idem, &batch).await;
        for outcome in &outcomes {
            assert!(
                matches!(outcome, Err(Error::TransactionEnded { .. })),
                "{end}: {outcome:?}"
            );
        }
        // Nothing runs again, so nothing is applied twice; every key is parked.
        let outcomes = apply_line_batch(&idem, &batch).await;
        for outcome in &outcomes {
            assert!(
                matches!(outcome, Err(Error::Parked { .. })),
                "{end}: {outcome:?}"
            );
        }
        let doubled: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT order_id FROM order_effects \
             GROUP BY order_id HAVING count(*) > 1) d",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(doubled, 0, "{end}");
    }
}

/// Ends idem's transaction with sqlx's nested `begin()` and its rollback, writes an
/// effect (committed on its own), then fails.
#[idempotent(key = "order_id", scope = "ended_then_failed")]
async fn end_then_fail(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let inner = tx.begin().await?;
    inner.rollback().await?;
    testing::insert_effect(tx, event).await?;
    Err(sqlx::Error::RowNotFound)
}

#[sqlx::test(migrations = false)]
async fn a_body_that_ends_the_transaction_then_fails_is_parked_not_run_again(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-ended-failed", 1);
    let error = end_then_fail(&idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::TransactionEnded { .. }), "{error:?}");
    assert_eq!(error.disposition(), Disposition::DeadLetter);
    assert_eq!(effects(&pool).await, 1);
    assert_eq!(
        status(&idem, "ended_then_failed", "o-ended-failed").await,
        Status::Parked
    );
    let error = end_then_fail(&idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::Parked { .. }), "{error:?}");
    assert_eq!(effects(&pool).await, 1);
}

#[idempotent(key = "order_id", scope = "ended_then_failed_batch", batch = true)]
async fn end_then_fail_line(tx: &mut PgConnection, line: &Line) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, &testing::paid(&line.order_id, 1)).await?;
    if let Some(statement) = line.end {
        sqlx::query(statement).execute(&mut *tx).await?;
        testing::insert_effect(tx, &testing::paid(&line.order_id, 2)).await?;
        return Err(sqlx::Error::RowNotFound);
    }
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_batch_whose_body_ends_the_transaction_then_fails_runs_nothing_again(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    for end in ["ROLLBACK", "COMMIT"] {
        let line = |n: &str, ends: bool| Line {
            order_id: format!("failed-{end}-{n}"),
            end: ends.then_some(end),
        };
        let batch = [line("1", false), line("2", true), line("3", false)];
        for outcome in &end_then_fail_line_batch(&idem, &batch).await {
            assert!(
                matches!(outcome, Err(Error::TransactionEnded { .. })),
                "{end}: {outcome:?}"
            );
        }
        for outcome in &end_then_fail_line_batch(&idem, &batch).await {
            assert!(
                matches!(outcome, Err(Error::Parked { .. })),
                "{end}: {outcome:?}"
            );
        }
        let applied: Vec<(String, i64)> = sqlx::query_as(
            "SELECT order_id, count(*) FROM order_effects WHERE order_id LIKE $1 \
             GROUP BY order_id ORDER BY order_id",
        )
        .bind(format!("failed-{end}-%"))
        .fetch_all(&pool)
        .await
        .unwrap();
        // ROLLBACK: only what line 2 wrote after it (committed on its own); COMMIT: line
        // 1's and line 2's first effect with it, then line 2's second. Never twice a run.
        let expected: &[(&str, i64)] = match end {
            "ROLLBACK" => &[("2", 1)],
            _ => &[("1", 1), ("2", 2)],
        };
        let expected: Vec<(String, i64)> = expected
            .iter()
            .map(|(n, count)| (format!("failed-{end}-{n}"), *count))
            .collect();
        assert_eq!(applied, expected, "{end}");
    }
}

// ---- Two processes of one crate: handlers sharing a scope are refused there too.

#[sqlx::test(migrations = false)]
async fn methods_named_handle_in_two_processes_of_one_crate_are_refused(pool: PgPool) {
    let first = testing::setup(&pool).await;
    let second = Idem::new(pool.clone());
    let event = testing::paid("o-two-processes", 100);
    assert!(
        ledgers::Billing::handle(&first, &event)
            .await
            .unwrap()
            .is_executed()
    );
    assert_conflict(
        ledgers::Shipping::handle(&second, &event).await,
        &["Billing", "Shipping", "release_scope"],
    );
    assert_eq!(
        book::<Cash>(&first, &testing::paid("o-cash", 1))
            .await
            .unwrap(),
        Outcome::Executed("cash".to_owned())
    );
    assert_conflict(
        book::<Card>(&second, &testing::paid("o-card", 1)).await,
        &["Cash", "Card"],
    );
    assert_eq!(effects(&pool).await, 2);
}

#[idempotent(key = "order_id", scope = "nul_lease", mode = "lease")]
async fn lease_answer_with_nul(event: &OrderEvent) -> Result<String, std::io::Error> {
    Ok(format!("nul \0 inside, {}", event.order_id))
}

#[sqlx::test(migrations = false)]
async fn a_lease_result_holding_a_nul_character_is_stored_and_replayed(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-nul-lease", 1);
    let Outcome::Executed(first) = lease_answer_with_nul(&idem, &event).await.unwrap() else {
        panic!("executes");
    };
    assert_eq!(
        lease_answer_with_nul(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(first))
    );
}

#[sqlx::test(migrations = false)]
async fn a_scope_with_a_nul_character_halts_before_anything_runs(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    const NUL: HandlerSpec = HandlerSpec::new("pay\0ments");
    assert_conflict(run_as(&idem, &NUL, "o-1").await, &["NUL"]);
    assert_eq!(effects(&pool).await, 0);
}

// ---- The takeover of a failed key records a fingerprint first given then.

#[idempotent(
    key = "order_id",
    fingerprint = "amount_cents",
    scope = "fingerprinted"
)]
async fn charge(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, event).await.map(drop)
}

#[sqlx::test(migrations = false)]
async fn the_takeover_of_a_failed_key_without_fingerprint_records_the_fingerprint(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // A failure recorded by a version of the handler that declared no fingerprint.
    sqlx::query(
        "INSERT INTO idem.idem_keys (scope, key, status, attempts, last_error) \
         VALUES ('fingerprinted', $1, 'failed', 1, 'timeout')",
    )
    .bind(key_of("o-fp").as_uuid())
    .execute(&pool)
    .await
    .unwrap();
    assert!(
        charge(&idem, &testing::paid("o-fp", 500))
            .await
            .unwrap()
            .is_executed()
    );
    let fingerprint: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT fingerprint FROM idem.idem_keys WHERE scope = 'fingerprinted'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(fingerprint.is_some());
    let error = charge(&idem, &testing::paid("o-fp", 999))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::PayloadMismatch { .. }), "{error:?}");
    assert!(
        charge(&idem, &testing::paid("o-fp", 500))
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(effects(&pool).await, 1);
}

// ---- A connection killed under a handler whose error keeps only the text counts nothing.

/// An error type that keeps the database error's text and drops the error itself, as
/// many applications' error types do.
#[derive(Debug)]
struct TextOnly(String);

impl std::fmt::Display for TextOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TextOnly {}

impl From<sqlx::Error> for TextOnly {
    fn from(error: sqlx::Error) -> Self {
        TextOnly(error.to_string())
    }
}

#[idempotent(key = "order_id", scope = "text_only", max_attempts = 1)]
async fn apply_text_only(
    tx: &mut PgConnection,
    event: &OrderEvent,
    pid_known: &Checkpoint,
    pid: &std::sync::Mutex<Option<i32>>,
) -> Result<(), TextOnly> {
    testing::insert_effect(tx, event).await?;
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await?;
    if pid.lock().unwrap().replace(backend).is_none() {
        pid_known.announce();
        sqlx::query("SELECT pg_sleep(30)").execute(&mut *tx).await?;
    }
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_killed_connection_counts_no_attempt_whatever_the_error_type(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-text-only", 100);
    let pid_known = Checkpoint::new();
    let pid = std::sync::Mutex::new(None);
    let delivery = apply_text_only(&idem, &event, &pid_known, &pid);
    let killer = async {
        pid_known.reached().await;
        // The body is inside `pg_sleep` once its backend waits on the timeout.
        let backend = pid.lock().unwrap().expect("published");
        let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
            .bind(backend)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(terminated);
    };
    let (outcome, ()) = tokio::join!(delivery, killer);
    match outcome {
        Err(Error::Handler {
            attempts: 0,
            parked: false,
            ..
        }) => {}
        other => panic!("a killed connection counted as the message's failure: {other:?}"),
    }
    // max_attempts = 1: had it counted, the key would be parked now.
    assert!(
        idem.record("text_only", key_of("o-text-only"))
            .await
            .unwrap()
            .is_none(),
        "nothing is recorded for a killed connection"
    );
    assert!(
        apply_text_only(&idem, &event, &pid_known, &pid)
            .await
            .unwrap()
            .is_executed()
    );
    assert_eq!(effects(&pool).await, 1);
}
