//! Deliveries of one key in one process take turns without holding a connection.
//!
//! A duplicate of a key whose first delivery is still running would otherwise wait
//! inside its claim, on a pooled connection, for the first one's transaction: a hundred
//! duplicates of a key held by a slow body would take every connection of the pool and
//! stall every other key. So a delivery first takes the key's turn in the process: a
//! duplicate waits for it here, holding nothing, at most the lock timeout (then it gets
//! [`Error::InProgress`](crate::Error::InProgress)), and then finds the key decided.
//! Deliveries in other processes still meet at the claim's row lock, where the wait is
//! bounded by the same lock timeout.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Mutex as Turn, OwnedMutexGuard};
use uuid::Uuid;

type Slot = (&'static str, Uuid);

/// The keys being delivered in this process, per runtime handle.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    /// Taken twice by every delivery: a fast hash (the keys are digests, and the map
    /// lives in this process only).
    keys: Mutex<HashMap<Slot, Arc<Turn<()>>, foldhash::fast::RandomState>>,
}

/// The turn of one key: while it is held, other deliveries of the key in this process
/// wait. Released when dropped.
#[derive(Debug)]
pub(crate) struct KeyTurn<'a> {
    slot: Slot,
    guard: Option<OwnedMutexGuard<()>>,
    owner: &'a InFlight,
}

impl InFlight {
    /// Waits for the turn of `key` in `scope`, at most `timeout`; `None` if it is not
    /// free by then.
    pub(crate) async fn wait(
        &self,
        scope: &'static str,
        key: Uuid,
        timeout: Duration,
    ) -> Option<KeyTurn<'_>> {
        let slot = (scope, key);
        let turn = self.turn(slot);
        let guard = match turn.clone().try_lock_owned() {
            Ok(guard) => Some(guard),
            Err(_) => tokio::time::timeout(timeout, turn.lock_owned()).await.ok(),
        };
        let held = KeyTurn {
            slot,
            guard,
            owner: self,
        };
        held.guard.is_some().then_some(held)
    }

    /// The turn of `key` if it is free now, without waiting (the batch path skips keys
    /// that are being delivered).
    pub(crate) fn try_take(&self, scope: &'static str, key: Uuid) -> Option<KeyTurn<'_>> {
        let slot = (scope, key);
        let guard = self.turn(slot).try_lock_owned().ok();
        let held = KeyTurn {
            slot,
            guard,
            owner: self,
        };
        held.guard.is_some().then_some(held)
    }

    fn turn(&self, slot: Slot) -> Arc<Turn<()>> {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        keys.entry(slot).or_default().clone()
    }

    fn release(&self, slot: Slot) {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // The map's own reference is the last one: nobody waits or holds it.
        if let Entry::Occupied(turn) = keys.entry(slot)
            && Arc::strong_count(turn.get()) == 1
        {
            turn.remove();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.keys.lock().unwrap().len()
    }
}

impl Drop for KeyTurn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.owner.release(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_delivery_waits_for_the_first_and_the_map_empties() {
        let inflight = InFlight::default();
        let key = Uuid::from_u128(7);
        let first = inflight.wait("s", key, Duration::ZERO).await.expect("free");
        assert!(inflight.try_take("s", key).is_none());
        assert!(
            inflight
                .wait("s", key, Duration::from_millis(20))
                .await
                .is_none()
        );
        assert!(inflight.try_take("other", key).is_some());
        drop(first);
        let second = inflight
            .wait("s", key, Duration::ZERO)
            .await
            .expect("free again");
        drop(second);
        assert_eq!(inflight.len(), 0);
    }
}
