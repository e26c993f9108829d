//! What the rebalance callback hands over to the member's loop.
//!
//! librdkafka calls the callback synchronously, from inside the loop's poll: it cannot wait
//! for the deliveries that the member's [lanes](crate::lanes) have in flight. So it looks
//! at which partitions are busy (a delivery of theirs in flight): partitions revoked with
//! none in flight are saved and given up at once, as before; a revocation that touches a
//! busy partition is handed over to the loop, which finishes those deliveries, saves the
//! partitions' progress and only then gives them up (librdkafka waits for that unassign
//! call, and holds the revoked partitions' fetches meanwhile). Every change of the
//! assignment is handed over too, in order, so that the loop drops what it queued of
//! partitions it no longer holds before it routes the next message.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use crate::stats::lock;

/// A partition: topic and number.
pub(crate) type Key = (String, i32);

/// A change of the member's assignment, as the callback saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Handed {
    /// Partitions assigned (already given to the client).
    Assigned(Vec<Key>),
    /// Partitions revoked with nothing of theirs in flight: saved and given up already.
    Revoked(Vec<Key>),
    /// Partitions revoked while deliveries of theirs were in flight: the loop finishes
    /// those, saves the partitions' progress, then gives them up (`cooperative`: with an
    /// incremental unassign).
    Revoking {
        partitions: Vec<Key>,
        cooperative: bool,
    },
    /// The assignment was dropped (a failed rebalance): everything held is forgotten.
    Dropped,
}

/// Shared by the rebalance callback and the member's loop.
#[derive(Debug, Default)]
pub(crate) struct Handover {
    /// The partitions with a delivery in flight (kept by the loop).
    busy: Mutex<HashSet<Key>>,
    handed: Mutex<VecDeque<Handed>>,
    notify: Notify,
    /// The loop is polling the consumer: a callback now runs inside its poll, and the loop
    /// will see what it hands over. Not while the consumer is dropped or closed (then
    /// librdkafka's close waits for the unassign call, which must be made at once).
    polling: AtomicBool,
}

impl Handover {
    /// A delivery of `key` is in flight (`true`), or none is any more.
    pub fn set_busy(&self, key: &Key, busy: bool) {
        let mut set = lock(&self.busy);
        if busy {
            set.insert(key.clone());
        } else {
            set.remove(key);
        }
    }

    /// Whether any of `keys` has a delivery in flight.
    pub fn any_busy(&self, keys: &[Key]) -> bool {
        let set = lock(&self.busy);
        keys.iter().any(|key| set.contains(key))
    }

    /// Whether a revocation of `keys` is handed over to the loop rather than done at once:
    /// the loop polls the consumer, and a delivery of one of them is in flight.
    pub fn defers(&self, keys: &[Key]) -> bool {
        self.polling.load(Ordering::SeqCst) && self.any_busy(keys)
    }

    /// `poll`, the consumer's poll of the loop, marked as such while it runs.
    pub async fn polling<F: Future>(&self, poll: F) -> F::Output {
        let mut poll = pin!(poll);
        std::future::poll_fn(|cx| {
            self.polling.store(true, Ordering::SeqCst);
            let polled = poll.as_mut().poll(cx);
            self.polling.store(false, Ordering::SeqCst);
            polled
        })
        .await
    }

    /// Hands `change` over to the loop, and wakes it.
    pub fn hand(&self, change: Handed) {
        lock(&self.handed).push_back(change);
        self.notify.notify_one();
    }

    /// The changes handed over since the last call, in order.
    pub fn take(&self) -> Vec<Handed> {
        lock(&self.handed).drain(..).collect()
    }

    /// Completes when something was handed over (at once if it was since the last wait).
    pub async fn handed(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::{Handed, Handover};

    #[tokio::test]
    async fn a_revocation_is_deferred_only_from_inside_the_loops_poll() {
        let handover = Handover::default();
        let p0 = ("t".to_owned(), 0);
        handover.set_busy(&p0, true);
        assert!(!handover.defers(std::slice::from_ref(&p0)), "not polling");
        let inside = handover
            .polling(async { handover.defers(std::slice::from_ref(&p0)) })
            .await;
        assert!(inside);
        assert!(!handover.defers(std::slice::from_ref(&p0)));
    }

    #[test]
    fn changes_are_taken_in_order_and_busy_partitions_are_known() {
        let handover = Handover::default();
        let p0 = ("t".to_owned(), 0);
        let p1 = ("t".to_owned(), 1);
        handover.set_busy(&p0, true);
        assert!(handover.any_busy(&[p1.clone(), p0.clone()]));
        assert!(!handover.any_busy(std::slice::from_ref(&p1)));
        handover.set_busy(&p0, false);
        assert!(!handover.any_busy(std::slice::from_ref(&p0)));
        handover.hand(Handed::Revoked(vec![p0.clone()]));
        handover.hand(Handed::Assigned(vec![p0.clone()]));
        assert_eq!(
            handover.take(),
            vec![
                Handed::Revoked(vec![p0.clone()]),
                Handed::Assigned(vec![p0])
            ]
        );
        assert!(handover.take().is_empty());
    }
}
