//! A delivery under a fault, then clean redeliveries: the effects still apply once.

use std::fmt::Debug;
use std::future::Future;

use super::brief::Brief;
use super::database::{Effects, wait_until_lease_settles};
use super::deliveries::{assert_outcome_replays, assert_replays, until_settled};
use super::faults::{Fault, inject};
use super::keys::{KeySnapshot, assert_all_succeeded};
use crate::store::Status;
use crate::{Error, Idem, Outcome};

/// What [`assert_survives`] saw.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # async fn ship(idem: &Idem) -> Result<Outcome<()>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem) {
/// use idem_runtime::testing::{self, Effects, Fault};
///
/// let shipments = Effects::query("SELECT count(*) FROM shipments");
/// let survival =
///     testing::assert_survives(&idem, Fault::KillBackendDuringCommit, &shipments, || ship(&idem)).await;
/// if survival.committed_unseen {
///     println!("the commit went through before the backend died: {:?}", survival.faulty);
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Survival<T, E> {
    /// The fault.
    pub fault: Fault,
    /// What the delivery under the fault returned.
    pub faulty: Result<Outcome<T>, Error<E>>,
    /// The clean deliveries it took until one ended in an outcome (`InProgress` and
    /// passing errors are delivered again).
    pub redeliveries: u32,
    /// Whether the effects of the faulty delivery were committed although it returned an
    /// error (a commit that went through before its connection died).
    pub committed_unseen: bool,
}

/// Delivers a message under `fault`, then delivers it again cleanly until a delivery
/// ends in an outcome, and checks that the message still applied exactly once:
///
/// - a delivery that returned `Executed` has its effects committed, the faulty one too;
/// - exactly one delivery executed the body to a commit, or none if the faulty one's
///   commit went through unseen (then the clean one is a duplicate);
/// - the effects rose by exactly one, and the message's key is `success`;
/// - one more delivery is a duplicate that replays the execution's value.
///
/// Lease-mode faults leave the key claimed: the check waits for the lease to expire on
/// the database's clock before redelivering, so give the handler a short lease in tests.
/// `deliver` makes one delivery of the same message; the message must be new to the
/// status table. Returns what it saw.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # struct OrderEvent;
/// # async fn apply_payment(idem: &Idem, event: &OrderEvent) -> Result<Outcome<i64>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem, event: OrderEvent) {
/// use idem_runtime::testing::{self, Effects, Fault};
///
/// let payments = Effects::query("SELECT count(*) FROM payments");
/// testing::assert_survives(&idem, Fault::FailBeforeCommit, &payments, || {
///     apply_payment(&idem, &event)
/// })
/// .await;
/// # }
/// ```
///
/// # Panics
///
/// When the fault never fired (the delivery did not reach its point: a transaction-mode
/// fault on a lease-mode handler, a message that was applied before), or a check fails.
/// The message names the delivery, what it returned and the effect counts.
pub async fn assert_survives<T, E, F, Fut>(
    idem: &Idem,
    fault: Fault,
    effects: &Effects,
    mut deliver: F,
) -> Survival<T, E>
where
    T: Debug + PartialEq,
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    let context = format!("assert_survives({fault:?})");
    let pool = idem.pool();
    let keys = KeySnapshot::take(idem).await;
    let before = effects.count(pool).await;
    let (faulty, after_fault) =
        faulty_delivery(idem, fault, effects, before, &context, &mut deliver).await;

    // A worker that vanished holds its lease until it expires.
    for key in KeySnapshot::take(idem).await.touched_since(&keys) {
        if key.status == Status::Processing {
            wait_until_lease_settles(idem, &key.scope, key.key).await;
        }
    }

    let (settled, redeliveries) = until_settled(&context, &mut deliver).await;
    let after = effects.count(pool).await;
    let counts = format!(
        "effects: {before} before, {after_fault} after the faulty delivery, {after} after \
         {redeliveries} clean redeliveries"
    );
    let executed = applied_once(
        &context,
        &faulty,
        &settled,
        redeliveries,
        before,
        after,
        &counts,
    );
    let committed_unseen = faulty.is_err() && settled.is_duplicate();
    assert_all_succeeded(idem, &keys, &context).await;

    let last = deliver().await;
    let after_last = effects.count(pool).await;
    let context = format!("{context}: the delivery after the clean one; {counts}");
    assert_replays(&context, executed, &last);
    assert!(
        after_last == after,
        "{context} changed the effects from {after} to {after_last}"
    );
    Survival {
        fault,
        faulty,
        redeliveries,
        committed_unseen,
    }
}

/// The delivery with `fault` armed: checks that the fault fired and that the effects grew
/// by at most one (exactly one if it returned `Executed`); returns what it returned and
/// the effects after it.
async fn faulty_delivery<T, E, F, Fut>(
    idem: &Idem,
    fault: Fault,
    effects: &Effects,
    before: i64,
    context: &str,
    deliver: &mut F,
) -> (Result<Outcome<T>, Error<E>>, i64)
where
    T: Debug,
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    let injection = inject(idem, fault);
    let faulty = deliver().await;
    let fired = injection.disarm();
    let after_fault = effects.count(idem.pool()).await;
    assert!(
        fired,
        "{context}: the fault never fired: the delivery returned {:?} without reaching \
         {}; deliver a message whose key is new to a handler of that mode, through the handle \
         the fault is armed on (not one of `testing::processes`)",
        Brief(&faulty),
        fault.point()
    );
    match &faulty {
        Ok(Outcome::Executed(value)) => assert!(
            after_fault == before + 1,
            "{context}: the faulty delivery returned Executed({value:?}), but the effects went \
             from {before} to {after_fault} (expected {})",
            before + 1
        ),
        _ => assert!(
            after_fault <= before + 1,
            "{context}: the faulty delivery returned {:?} and the effects went from \
             {before} to {after_fault}: applied more than once",
            Brief(&faulty)
        ),
    }
    (faulty, after_fault)
}

/// Checks that the faulty delivery and the clean redelivery applied the effect exactly
/// once between them, and that a redelivery after `Executed` replays its value; returns
/// the executed value, if either returned one.
fn applied_once<'a, T: Debug + PartialEq, E: Debug>(
    context: &str,
    faulty: &'a Result<Outcome<T>, Error<E>>,
    settled: &'a Outcome<T>,
    redeliveries: u32,
    before: i64,
    after: i64,
    counts: &str,
) -> Option<&'a T> {
    let executed = match (faulty, settled) {
        (Ok(Outcome::Executed(first)), Outcome::Executed(again)) => panic!(
            "{context}: executed twice: the faulty delivery returned Executed({first:?}) and \
             clean redelivery {redeliveries} returned Executed({again:?}); {counts}"
        ),
        (Ok(Outcome::Executed(value)), Outcome::Duplicate(_)) => Some(value),
        (_, Outcome::Executed(value)) => Some(value),
        (_, Outcome::Duplicate(_)) => None,
    };
    assert!(
        after == before + 1,
        "{context}: expected exactly one more effect in the end, after the faulty delivery \
         returned {:?} and the clean redelivery {:?}; {counts}{}",
        Brief(faulty),
        Brief(settled),
        super::assertions::missing_effect_hint(before, after)
    );
    if let (Ok(Outcome::Executed(value)), Outcome::Duplicate(_)) = (faulty, settled) {
        assert_outcome_replays(
            &format!("{context}: the clean redelivery after Executed; {counts}"),
            Some(value),
            settled,
        );
    }
    executed
}
