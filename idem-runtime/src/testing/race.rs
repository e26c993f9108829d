//! A race of concurrent deliveries of one message: exactly one executes.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio::sync::Barrier;

use super::database::Effects;
use super::deliveries::assert_replays;
use super::keys::{KeySnapshot, assert_all_succeeded};
use crate::{Error, Idem, Outcome};

/// The outcomes of a [`race`], one per racer, in the racers' order.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # async fn ship(idem: &Idem) -> Result<Outcome<()>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem) {
/// let report = idem_runtime::testing::race(4, |_| ship(&idem)).await;
/// assert_eq!(report.executed() + report.duplicates() + report.in_progress(), 4, "{report}");
/// assert_eq!(report.errors().count(), 0);
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct RaceReport<T, E> {
    /// What each delivery returned.
    pub outcomes: Vec<Result<Outcome<T>, Error<E>>>,
}

impl<T, E> RaceReport<T, E> {
    /// Deliveries that ran the body.
    pub fn executed(&self) -> usize {
        self.count(|outcome| matches!(outcome, Ok(Outcome::Executed(_))))
    }

    /// Deliveries that found the key done.
    pub fn duplicates(&self) -> usize {
        self.count(|outcome| matches!(outcome, Ok(Outcome::Duplicate(_))))
    }

    /// Deliveries that found another one working on the key ([`Error::InProgress`]): a
    /// valid answer to a racing delivery, which a consumer delivers again later.
    pub fn in_progress(&self) -> usize {
        self.count(|outcome| matches!(outcome, Err(Error::InProgress { .. })))
    }

    /// The other errors.
    pub fn errors(&self) -> impl Iterator<Item = &Error<E>> {
        self.outcomes.iter().filter_map(|outcome| match outcome {
            Err(Error::InProgress { .. }) | Ok(_) => None,
            Err(error) => Some(error),
        })
    }

    fn count(&self, matching: impl Fn(&Result<Outcome<T>, Error<E>>) -> bool) -> usize {
        self.outcomes
            .iter()
            .filter(|outcome| matching(outcome))
            .count()
    }
}

impl<T, E> std::fmt::Display for RaceReport<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} racers: {} executed, {} duplicates, {} in progress, {} other errors",
            self.outcomes.len(),
            self.executed(),
            self.duplicates(),
            self.in_progress(),
            self.errors().count()
        )
    }
}

/// Delivers one message `racers` times at once and reports the outcomes.
///
/// `deliver(i)` makes the delivery of racer `i` (from 0). The deliveries start together
/// (behind a barrier) and run concurrently on the test's task, each on a connection of
/// its own. Through one handle they take turns inside the process, as deliveries in one
/// consumer do; give each racer a handle of [`processes`](super::processes) to race them
/// in PostgreSQL, as consumers on several machines do.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # struct OrderEvent;
/// # async fn apply_payment(idem: &Idem, event: &OrderEvent) -> Result<Outcome<i64>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem, event: OrderEvent) {
/// let report = idem_runtime::testing::race(8, |_| apply_payment(&idem, &event)).await;
/// assert_eq!(report.executed(), 1, "{report}");
/// # }
/// ```
pub async fn race<T, E, F, Fut>(racers: usize, mut deliver: F) -> RaceReport<T, E>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    let start = Barrier::new(racers);
    let deliveries = (0..racers)
        .map(|racer| {
            let delivery = deliver(racer);
            let start = &start;
            async move {
                start.wait().await;
                delivery.await
            }
        })
        .collect();
    RaceReport {
        outcomes: join_all(deliveries).await,
    }
}

/// Races `racers` deliveries of one message ([`race`]) and checks that exactly one
/// executed and applied exactly one effect, that every other one is a duplicate that
/// replays its value or got [`Error::InProgress`], that the key ends `success`, and that
/// a delivery after the race is a duplicate. Returns the report.
///
/// `deliver(i)` makes the delivery of racer `i`; the delivery after the race is
/// `deliver(0)`. The message must be new to the status table.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # struct OrderEvent;
/// # async fn apply_payment(idem: &Idem, event: &OrderEvent) -> Result<Outcome<i64>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem, event: OrderEvent) {
/// use idem_runtime::testing::{self, Effects};
///
/// let payments = Effects::query("SELECT count(*) FROM payments");
/// let processes = testing::processes(&idem, 4);
/// let report = testing::assert_race_applies_once(&idem, &payments, 4, |i| {
///     apply_payment(&processes[i], &event)
/// })
/// .await;
/// println!("{report}");
/// # }
/// ```
///
/// # Panics
///
/// When a check fails; the message gives the report and the effect counts.
pub async fn assert_race_applies_once<T, E, F, Fut>(
    idem: &Idem,
    effects: &Effects,
    racers: usize,
    mut deliver: F,
) -> RaceReport<T, E>
where
    T: Debug + PartialEq,
    E: Debug,
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    assert!(racers > 0, "assert_race_applies_once: a race needs a racer");
    let pool = idem.pool();
    let keys = KeySnapshot::take(idem).await;
    let before = effects.count(pool).await;
    let report = race(racers, &mut deliver).await;
    let after = effects.count(pool).await;
    let context = format!(
        "assert_race_applies_once: {report}; effects: {before} before the race, {after} after"
    );
    let unexpected: Vec<&Error<E>> = report.errors().collect();
    assert!(
        unexpected.is_empty(),
        "{context}; unexpected errors: {unexpected:?}"
    );
    assert!(
        report.executed() == 1,
        "{context}; expected exactly one execution; outcomes: {:?}",
        report.outcomes
    );
    assert!(
        after == before + 1,
        "{context}; expected exactly one more effect{}",
        super::assertions::missing_effect_hint(before, after)
    );
    let executed = report.outcomes.iter().find_map(|outcome| match outcome {
        Ok(Outcome::Executed(value)) => Some(value),
        _ => None,
    });
    for (racer, outcome) in report.outcomes.iter().enumerate() {
        if matches!(outcome, Ok(Outcome::Duplicate(_))) {
            assert_replays(&format!("{context}; racer {racer}"), executed, outcome);
        }
    }
    assert_all_succeeded(idem, &keys, &context).await;
    let last = deliver(0).await;
    let after_last = effects.count(pool).await;
    let context = format!("{context}; the delivery after the race");
    assert_replays(&context, executed, &last);
    assert!(
        after_last == after,
        "{context} changed the effects from {after} to {after_last}"
    );
    report
}

/// Runs `futures` concurrently on the current task; their outputs in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future is done"))
        .collect()
}
