//! The shared queue of deliveries and the fate of every message: a message is settled
//! once a delivery applied it (or found it applied) or dead-lettered it; until then every
//! failure that may pass sends it back to the queue, after a pause.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::deliveries::Fate;

/// The queue and the fates.
pub struct Settlement {
    fates: Mutex<Vec<Option<Fate>>>,
    unsettled: AtomicUsize,
    queue: Mutex<VecDeque<usize>>,
    initial: usize,
    taken: AtomicUsize,
    /// Deliveries made: calls of a handler for one message (each message of a batch
    /// counts), retries and injected duplicates included.
    pub deliveries: AtomicU64,
    /// Messages that were given two different fates.
    conflicts: Mutex<Vec<String>>,
}

impl Settlement {
    /// `messages` messages, none settled; the queue holds `queue`.
    pub fn new(messages: usize, queue: &[usize]) -> Self {
        Settlement {
            fates: Mutex::new(vec![None; messages]),
            unsettled: AtomicUsize::new(messages),
            queue: Mutex::new(queue.iter().copied().collect()),
            initial: queue.len(),
            taken: AtomicUsize::new(0),
            deliveries: AtomicU64::new(0),
            conflicts: Mutex::new(Vec::new()),
        }
    }

    /// Records the fate of message `id`. The first one counts; a different later one is a
    /// conflict, reported by the invariants.
    pub fn settle(&self, id: usize, fate: Fate) {
        let mut fates = self.fates.lock().unwrap();
        match &fates[id] {
            None => {
                fates[id] = Some(fate);
                self.unsettled.fetch_sub(1, Ordering::SeqCst);
            }
            Some(first) if *first == fate => {}
            Some(first) => self
                .conflicts
                .lock()
                .unwrap()
                .push(format!("message {id}: first {first:?}, then {fate:?}")),
        }
    }

    /// The fate of message `id`, if settled.
    pub fn fate(&self, id: usize) -> Option<Fate> {
        self.fates.lock().unwrap()[id].clone()
    }

    /// Whether message `id` is settled.
    pub fn is_settled(&self, id: usize) -> bool {
        self.fates.lock().unwrap()[id].is_some()
    }

    /// The messages given two fates.
    pub fn conflicts(&self) -> Vec<String> {
        self.conflicts.lock().unwrap().clone()
    }

    /// The messages not settled yet.
    pub fn unsettled(&self) -> Vec<usize> {
        let fates = self.fates.lock().unwrap();
        (0..fates.len()).filter(|&id| fates[id].is_none()).collect()
    }

    /// The next delivery to make, if any is waiting.
    pub fn take(&self) -> Option<usize> {
        let id = self.queue.lock().unwrap().pop_front()?;
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(id)
    }

    /// Puts message `id` back at the end of the queue after `pause`, unless it settles
    /// meanwhile.
    pub fn retry_later(self: &Arc<Self>, id: usize, pause: Duration) {
        let settlement = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            if !settlement.is_settled(id) {
                settlement.queue.lock().unwrap().push_back(id);
            }
        });
    }

    /// Every message settled (the queue may still hold duplicates of settled ones, which
    /// are not needed).
    pub fn all_settled(&self) -> bool {
        self.unsettled.load(Ordering::SeqCst) == 0
    }

    /// Nothing left to deliver: every message settled and the queue empty.
    pub fn finished(&self) -> bool {
        self.all_settled() && self.queue.lock().unwrap().is_empty()
    }

    /// The share of the queue's first deliveries taken so far (retries count too).
    pub fn progress(&self) -> f64 {
        self.taken.load(Ordering::Relaxed) as f64 / self.initial.max(1) as f64
    }
}
