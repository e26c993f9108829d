//! Delivered twice: one execution, one effect, the same result replayed.

use std::fmt::Debug;
use std::future::Future;

use super::brief::Brief;
use super::database::Effects;
use super::deliveries::assert_replays;
use super::keys::{KeySnapshot, assert_all_succeeded};
use crate::{Error, Idem, Outcome};

/// Delivers a message twice and checks what idempotence promises: the first delivery is
/// `Executed` and applies exactly one effect, the second is a `Duplicate` that replays the
/// same value (or `Duplicate(None)` for a handler with `store_result = false`) and
/// applies none, and the message's key ends `success`. Returns the executed value.
///
/// `deliver` makes one delivery of the same message, the way the consumer calls the
/// handler: `|| apply_payment(&idem, &event)`. The message must be new to the status
/// table.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # struct OrderEvent;
/// # async fn apply_payment(idem: &Idem, event: &OrderEvent) -> Result<Outcome<i64>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem, event: OrderEvent) {
/// use idem_runtime::testing::{self, Effects};
///
/// let payments = Effects::query("SELECT count(*) FROM payments");
/// let payment_id = testing::assert_idempotent(&idem, &payments, || apply_payment(&idem, &event)).await;
/// # let _ = payment_id; }
/// ```
///
/// # Panics
///
/// When a delivery returns something else, or the effects do not rise by exactly one,
/// or the key is not `success` afterwards. The message names the delivery, what it
/// returned and the effect counts before and after each delivery.
pub async fn assert_idempotent<T, E, F, Fut>(idem: &Idem, effects: &Effects, mut deliver: F) -> T
where
    T: Debug + PartialEq,
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    const CONTEXT: &str = "assert_idempotent";
    let pool = idem.pool();
    let keys = KeySnapshot::take(idem).await;
    let before = effects.count(pool).await;

    let first = deliver().await;
    let after_first = effects.count(pool).await;
    let value = match first {
        Ok(Outcome::Executed(value)) => value,
        Ok(Outcome::Duplicate(value)) => panic!(
            "{CONTEXT}: delivery 1 of 2: expected Executed, got Duplicate({value:?}): the \
             message was applied before the test; deliver a message whose key is new"
        ),
        Err(error) => {
            panic!(
                "{CONTEXT}: delivery 1 of 2: expected Executed, got the error {:?}",
                Brief(&error)
            )
        }
    };
    assert!(
        after_first == before + 1,
        "{CONTEXT}: delivery 1 of 2 returned Executed({value:?}), but the effects went from \
         {before} to {after_first} (expected {}){}",
        before + 1,
        missing_effect_hint(before, after_first),
    );

    let second = deliver().await;
    let after_second = effects.count(pool).await;
    let context = format!(
        "{CONTEXT}: delivery 2 of 2 (effects: {before} before, {after_first} after delivery 1, \
         {after_second} after delivery 2)"
    );
    assert_replays(&context, Some(&value), &second);
    assert!(
        after_second == after_first,
        "{context}: the duplicate changed the effects: the handler writes outside its \
         transaction, or something else writes them"
    );
    assert_all_succeeded(idem, &keys, CONTEXT).await;
    value
}

/// Why an execution may show no effect.
pub(crate) fn missing_effect_hint(before: i64, after: i64) -> &'static str {
    if after == before {
        ": are the effects written through the handler's connection, and does the query count them?"
    } else {
        ""
    }
}
