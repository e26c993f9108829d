//! Deliveries dropped at each point where they wait: a cancelled task, a timeout, a lost
//! `select!`.

use std::fmt::Debug;
use std::future::Future;
use std::pin::{Pin, pin};
use std::task::Poll;

use super::brief::Brief;
use super::database::{Effects, wait_until_lease_settles};
use super::deliveries::until_settled;
use super::keys::{KeySnapshot, assert_all_succeeded};
use crate::store::Status;
use crate::{Error, Idem, Outcome};

/// The most deliveries [`assert_survives_drops`] drops before it gives up.
const MOST_SUSPENSIONS: u32 = 500;

/// What [`assert_survives_drops`] saw.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # async fn ship(idem: &Idem, order: String) -> Result<Outcome<()>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem) {
/// use idem_runtime::testing::{self, Effects};
///
/// let shipments = Effects::query("SELECT count(*) FROM shipments");
/// let idem = &idem;
/// let drops = testing::assert_survives_drops(idem, &shipments, |n| ship(idem, format!("o-{n}"))).await;
/// println!("{} drops, {} after the commit", drops.dropped, drops.committed_before_drop);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drops {
    /// The deliveries dropped: the n-th at its n-th suspension, until a delivery ran to
    /// its end with fewer suspensions.
    pub dropped: u32,
    /// Dropped deliveries whose effects were committed before the drop (the clean
    /// delivery after them was a duplicate).
    pub committed_before_drop: u32,
}

/// Drops a delivery at each point where it waits, one after the other, and checks that
/// nothing is lost or applied twice.
///
/// For n = 1, 2, 3, ..., `deliver(n)` makes a delivery that is dropped when it is
/// suspended for the n-th time (waiting for PostgreSQL, a lock, a timer), as a cancelled
/// task or a timeout drops it. Then the same message is delivered again cleanly
/// (`deliver(n)` once more, until it ends in an outcome): its effects must have risen by
/// exactly one, its key must be `success` (a dropped transaction-mode delivery leaves no
/// claim behind; a lease-mode one holds its lease until it expires, which the check
/// waits for). It stops when a delivery runs to its end before its n-th suspension:
/// every point was tried.
///
/// `deliver(n)` must deliver a message of its own for each `n` (a key new to the status
/// table), the same message for the same `n`.
///
/// The points are those where the delivery waits in this run: a statement whose answer
/// is already there when the delivery looks for it costs no suspension, so on a fast
/// local database some points of a run may differ from the next run's. So a lease-mode
/// effect sent without the lease's key goes unnoticed in a run where no drop lands
/// between the effect and `success`: check lease handlers with
/// [`assert_survives`](super::assert_survives) and
/// [`Fault::AbandonLeaseAfterBody`](super::Fault::AbandonLeaseAfterBody) as well, which
/// always catches it.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # struct OrderEvent { order_id: String }
/// # async fn apply_payment(idem: &Idem, event: &OrderEvent) -> Result<Outcome<i64>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem) {
/// use idem_runtime::testing::{self, Effects};
///
/// let payments = Effects::query("SELECT count(*) FROM payments");
/// let idem = &idem;
/// let drops = testing::assert_survives_drops(idem, &payments, |n| async move {
///     let event = OrderEvent { order_id: format!("o-{n}") };
///     apply_payment(idem, &event).await
/// })
/// .await;
/// assert!(drops.dropped > 0);
/// # }
/// ```
///
/// # Panics
///
/// When a check fails (the message names the drop, what the deliveries returned and
/// the effect counts), or deliveries still wait after 500 drops.
pub async fn assert_survives_drops<T, E, F, Fut>(
    idem: &Idem,
    effects: &Effects,
    mut deliver: F,
) -> Drops
where
    T: Debug + PartialEq,
    E: Debug,
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    let pool = idem.pool();
    let mut drops = Drops {
        dropped: 0,
        committed_before_drop: 0,
    };
    for n in 1..=MOST_SUSPENSIONS {
        let context = format!("assert_survives_drops: delivery {n}, dropped at suspension {n}");
        let keys = KeySnapshot::take(idem).await;
        let before = effects.count(pool).await;

        let completed = {
            let delivery = pin!(deliver(n));
            until_suspended(delivery, n).await
        };
        let after_drop = effects.count(pool).await;
        if let Some(delivered) = completed {
            let context = format!(
                "assert_survives_drops: delivery {n} ran to its end; effects: {before} before, \
                 {after_drop} after"
            );
            assert_executed_once(&context, &delivered, before, after_drop);
            assert_all_succeeded(idem, &keys, &context).await;
            return drops;
        }
        drops.dropped += 1;
        assert!(
            after_drop <= before + 1,
            "{context}: the effects went from {before} to {after_drop}"
        );

        wait_for_dropped_leases(idem, &keys, &context).await;

        let (settled, redeliveries) = until_settled(&context, || deliver(n)).await;
        let after = effects.count(pool).await;
        assert!(
            after == before + 1,
            "{context}: the clean redelivery returned {:?} (after {redeliveries} \
             deliveries); effects: {before} before, {after_drop} after the drop, {after} after \
             the clean delivery; expected exactly one more{}",
            Brief(&settled),
            if settled.is_duplicate() && after == before {
                " (does deliver(n) make a message new to the status table for each n?)"
            } else {
                ""
            }
        );
        if settled.is_duplicate() {
            drops.committed_before_drop += 1;
        }
        assert_all_succeeded(idem, &keys, &context).await;
    }
    panic!(
        "assert_survives_drops: deliveries were still suspended after {MOST_SUSPENSIONS} \
         suspensions"
    )
}

/// Checks that a delivery that ran to its end returned `Executed` with one more effect.
fn assert_executed_once<T: Debug, E: Debug>(
    context: &str,
    delivered: &Result<Outcome<T>, Error<E>>,
    before: i64,
    after: i64,
) {
    match delivered {
        Ok(Outcome::Executed(_)) => assert!(
            after == before + 1,
            "{context}: it returned {:?}; expected exactly one more effect",
            Brief(delivered)
        ),
        _ => panic!("{context}: expected Executed, got {:?}", Brief(delivered)),
    }
}

/// A dropped lease-mode delivery holds its lease until it expires: waits for the leases of
/// the keys written since `keys`; nothing else may be left (a `failed` or `parked` key).
async fn wait_for_dropped_leases(idem: &Idem, keys: &KeySnapshot, context: &str) {
    for key in KeySnapshot::take(idem).await.touched_since(keys) {
        match key.status {
            Status::Processing => wait_until_lease_settles(idem, &key.scope, key.key).await,
            Status::Success => {}
            Status::Failed | Status::Parked => {
                panic!("{context}: the dropped delivery left the key {key}")
            }
        }
    }
}

/// Polls `future` until it is done (its output), or until it was suspended `suspensions`
/// times (`None`): the caller then drops it, suspended.
async fn until_suspended<F: Future>(
    mut future: Pin<&mut F>,
    suspensions: u32,
) -> Option<F::Output> {
    let mut suspended = 0;
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending => {
            suspended += 1;
            if suspended >= suspensions {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        }
    })
    .await
}
