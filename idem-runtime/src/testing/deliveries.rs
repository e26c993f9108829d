//! What the assertions share: redelivering until a delivery settles, and checking that a
//! duplicate replays the value of the execution.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use super::brief::Brief;
use crate::{Disposition, Error, Outcome};

/// What a delivery of one message returns: the `Handled` result of an `#[idempotent]`
/// handler.
pub(crate) type Delivered<T, E> = Result<Outcome<T>, Error<E>>;

/// How long clean redeliveries are retried while the key is held (`InProgress`) or the
/// database reports a passing failure.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

/// Delivers again until a delivery ends in an [`Outcome`]: `InProgress` and the other
/// errors whose disposition is [`Disposition::Retry`] are delivered again after a pause,
/// as a consumer would. Returns the outcome and the deliveries it took.
///
/// # Panics
///
/// When a delivery fails for good (its disposition is not `Retry`), or none settles
/// within 30 seconds; `context` opens the message.
pub(crate) async fn until_settled<T, E, F, Fut>(context: &str, mut deliver: F) -> (Outcome<T>, u32)
where
    T: Debug,
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Delivered<T, E>>,
{
    let deadline = tokio::time::Instant::now() + SETTLE_WITHIN;
    let mut deliveries = 0;
    loop {
        deliveries += 1;
        let error = match deliver().await {
            Ok(outcome) => return (outcome, deliveries),
            Err(error) => error,
        };
        assert!(
            error.disposition() == Disposition::Retry,
            "{context}: clean redelivery {deliveries} failed for good ({:?}): {:?}",
            error.disposition(),
            Brief(&error)
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "{context}: no clean redelivery succeeded within {SETTLE_WITHIN:?} \
             ({deliveries} deliveries); the last one returned {:?}",
            Brief(&error)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks that `duplicate` is a duplicate that replays `executed` (or replays nothing,
/// for a handler that stores no result).
///
/// # Panics
///
/// When it is not; `context` opens the message.
pub(crate) fn assert_replays<T, E>(context: &str, executed: Option<&T>, duplicate: &Delivered<T, E>)
where
    T: Debug + PartialEq,
    E: Debug,
{
    match duplicate {
        Ok(outcome) => assert_outcome_replays(context, executed, outcome),
        Err(error) => panic!(
            "{context}: expected a duplicate, got the error {:?}",
            Brief(error)
        ),
    }
}

/// [`assert_replays`] for an outcome.
pub(crate) fn assert_outcome_replays<T>(context: &str, executed: Option<&T>, outcome: &Outcome<T>)
where
    T: Debug + PartialEq,
{
    match (outcome, executed) {
        (Outcome::Duplicate(Some(replayed)), Some(executed)) => assert!(
            replayed == executed,
            "{context}: the duplicate replayed {replayed:?}, but the execution returned {executed:?}"
        ),
        (Outcome::Duplicate(_), _) => {}
        (Outcome::Executed(value), _) => panic!(
            "{context}: expected a duplicate, got Executed({value:?}): the body ran again \
             (does the key change between deliveries, a timestamp or a random id in it?)"
        ),
    }
}
