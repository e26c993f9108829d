//! The entry points that generated code calls: a `<handler>_batch` of `batch = true`
//! ([`run_batch`]) and a batch handler ([`run_batch_handler`]), each planning the batch, running its
//! transaction and settling every message's outcome (see the [module docs](super)).

use std::future::Future;

use super::BatchOutcomes;
use super::pass::{Claimed, Fallback, Pass, batch_pass, each_alone, run_each, run_once, settle};
use super::plan::{Planned, refuse_all};
use super::timed::Window;
use crate::Idem;
use crate::handler::{BatchResult, HandlerSpec, NoResult, ResultCodec};
use crate::key::KeyError;
use crate::key::definition::KeyLayout;
use crate::key::handler_key::MessageKeys;
use crate::key_transaction::KeyTransaction;
use crate::outcome::{Handled, HandlerError};
use crate::scope;
use crate::telemetry::{self, Mode};

/// Runs `body` for every message of `messages` whose key has not succeeded yet, in one
/// transaction with the claims of all their keys.
///
/// `derive` gives each message's key and payload fingerprint. `body` receives the open
/// transaction and one message and hands the transaction back with its result. Returns
/// one outcome per message, in order. This is what `#[idempotent(batch = true)]`
/// generates a call of (as `<handler>_batch`).
#[allow(clippy::too_many_arguments)]
pub async fn run_batch<'m, M, T, E, C, D, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    layout: &KeyLayout<'_>,
    messages: &'m [M],
    derive: D,
    codec: C,
    mut body: F,
) -> BatchOutcomes<T, E>
where
    C: ResultCodec<T> + Copy,
    E: HandlerError,
    D: FnMut(&'m M) -> Result<MessageKeys, KeyError>,
    F: FnMut(KeyTransaction, &'m M) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    if let Err(error) = idem
        .check_scope(spec, scope::handler_identity::<F>(), layout)
        .await
    {
        return counted(spec, refuse_all(messages, error));
    }
    let mut planned = Planned::new(messages, layout.event_time, derive);
    let window = layout.event_time.map(|_| Window::of(idem, spec));
    let (to_claim, turns) = planned.take_turns(idem, spec.scope);
    let keyed = |index: usize| planned.keyed(index);
    let (each, derived) = (&mut body, &keyed);
    let pass = match layout.previous_key {
        Some(_) => one_by_one(to_claim),
        None => {
            batch_pass(
                idem,
                spec,
                &to_claim,
                &keyed,
                window,
                &codec,
                move |tx, xid, owned, _succeeded| {
                    run_each(idem, spec, tx, xid, messages, owned, derived, codec, each)
                },
            )
            .await
        }
    };
    drop(turns);
    let message_keys = |index: usize| planned.message_keys(index);
    let previous_timed = layout.previous_timed();
    let outcomes = settle(
        idem,
        spec,
        pass,
        &message_keys,
        previous_timed,
        codec,
        |tx, index| body(tx, &messages[index]),
    )
    .await;
    planned.decide(outcomes);
    decide_alone(
        idem,
        spec,
        &mut planned,
        previous_timed,
        codec,
        |tx, index| body(tx, &messages[index]),
    )
    .await;
    counted(spec, planned.finish(&codec))
}

/// Runs the body of a **batch handler** once for all messages of `messages` whose keys
/// have not succeeded yet, in one transaction with the claims of all their keys.
///
/// `derive` gives each message's key and payload fingerprint, as for [`run_batch`]. `body`
/// receives the open transaction and the claimed messages, in message order (never
/// none), and hands the transaction back with its result, `Result<(), E>`. Returns one
/// outcome per message, in order (a [`BatchOutcomes<(), E>`](BatchOutcomes)):
/// [`Outcome::Executed`](crate::Outcome::Executed) for the messages the body received,
/// [`Outcome::Duplicate(None)`](crate::Outcome::Duplicate) for those already processed (nothing
/// is stored for replay).
///
/// When the body fails, the batch rolls back and each claimed message is processed on
/// its own by [`run_transactional`](crate::transactional::run_transactional()), the body receiving a
/// slice of that one message (see the [module docs](super)). So the body may run more than
/// once, each earlier run rolled back as a whole.
///
/// A handler whose message parameter is a slice, `#[idempotent(key = "...")] async fn
/// h(tx: &mut PgConnection, events: &[&M]) -> Result<(), E>`, generates a call of this
/// function.
pub async fn run_batch_handler<'m, M, R, D, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    layout: &KeyLayout<'_>,
    messages: &'m [M],
    derive: D,
    mut body: F,
) -> Vec<Handled<R>>
where
    R: BatchResult,
    R::Error: HandlerError,
    D: FnMut(&'m M) -> Result<MessageKeys, KeyError>,
    F: FnMut(KeyTransaction, Vec<&'m M>) -> Fut,
    Fut: Future<Output = (KeyTransaction, R)>,
{
    if let Err(error) = idem
        .check_scope(spec, scope::handler_identity::<F>(), layout)
        .await
    {
        return counted(spec, refuse_all(messages, error));
    }
    let mut planned = Planned::new(messages, layout.event_time, derive);
    let window = layout.event_time.map(|_| Window::of(idem, spec));
    let (to_claim, turns) = planned.take_turns(idem, spec.scope);
    let keyed = |index: usize| planned.keyed(index);
    let mut body = |tx, slice| {
        let running = body(tx, slice);
        async move {
            let (tx, result) = running.await;
            (tx, result.into_result())
        }
    };
    let once = &mut body;
    let keys_of = &keyed;
    let pass = match layout.previous_key {
        Some(_) => one_by_one(to_claim),
        None => {
            batch_pass(
                idem,
                spec,
                &to_claim,
                &keyed,
                window,
                &NoResult,
                move |tx, xid, owned, succeeded| {
                    let claimed = Claimed { owned, succeeded };
                    run_once(idem, spec.scope, tx, xid, messages, claimed, keys_of, once)
                },
            )
            .await
        }
    };
    drop(turns);
    let message_keys = |index: usize| planned.message_keys(index);
    let previous_timed = layout.previous_timed();
    let outcomes = settle(
        idem,
        spec,
        pass,
        &message_keys,
        previous_timed,
        NoResult,
        |tx, index| body(tx, vec![&messages[index]]),
    )
    .await;
    planned.decide(outcomes);
    decide_alone(
        idem,
        spec,
        &mut planned,
        previous_timed,
        NoResult,
        |tx, index| body(tx, vec![&messages[index]]),
    )
    .await;
    counted(spec, planned.finish(&NoResult))
}

/// The pass of a handler that declares `previous_key`: every message claims its keys
/// under both definitions on its own, in a transaction of its own (see
/// [`run_transactional`](crate::transactional::run_transactional())).
fn one_by_one<T, E>(to_claim: Vec<usize>) -> Pass<T, E> {
    Pass::OneByOne {
        retry: to_claim,
        decided: Vec::new(),
        reason: Fallback::PreviousKey,
    }
}

/// Decides on its own each message that [`Planned::alone`] names, once the batch's
/// messages are decided, `one` giving its body (the transaction and the message's index).
async fn decide_alone<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    planned: &mut Planned<T, E>,
    previous_timed: bool,
    codec: C,
    one: F,
) where
    C: ResultCodec<T> + Copy,
    E: HandlerError,
    F: FnMut(KeyTransaction, usize) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    let alone = planned.alone();
    if alone.is_empty() {
        return;
    }
    let message_keys = |index: usize| planned.message_keys(index);
    let decided = each_alone(idem, spec, alone, &message_keys, previous_timed, codec, one).await;
    planned.decide(decided);
}

/// Counts each message's outcome (see [`telemetry`](crate::telemetry)).
fn counted<T, E>(spec: &HandlerSpec, outcomes: BatchOutcomes<T, E>) -> BatchOutcomes<T, E> {
    for outcome in &outcomes {
        telemetry::count(spec.scope, Mode::Batch, telemetry::outcome_label(outcome));
    }
    outcomes
}
