//! How often deliveries of a scope turn out to be duplicates, recently: it decides which
//! of two equally correct claim orders a delivery takes.
//!
//! - **Claim first** (the usual case): the transaction opens and the key is inserted; a
//!   duplicate finds the row in the way. A new message pays nothing extra, a duplicate
//!   pays for the transaction around a read (`BEGIN`, the insert's conflict check, the
//!   `ROLLBACK`).
//! - **Read first**: one plain read of the key's row, outside any transaction, answers a
//!   duplicate (or a parked key) with no transaction, no lock and no write. A key without a
//!   final row goes on to the claim, which decides as before: the read only ever saves
//!   work, since a `success` or `parked` row is final. A new message pays the read.
//!
//! A stream of new messages keeps the rate near 0 and every delivery claims first; a
//! redelivery storm (a consumer replaying a partition, a producer retrying) drives it up
//! and duplicates are answered by the read. The rate is an exponentially weighted average
//! over the last few dozen deliveries, kept per scope in a fixed table of counters (two
//! scopes that land on one counter share their rate; either order stays correct).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

/// Counters of the fixed table.
const SLOTS: usize = 64;
/// Fixed-point scale of a rate: `ONE` is every delivery a duplicate.
const ONE: u32 = 1 << 16;
/// Weight of the newest delivery: 1/16.
const SHIFT: u32 = 4;
/// The rate from which a delivery reads first: one delivery in four a duplicate. Below
/// it, the read that a new message would pay costs more than the transactions that
/// duplicates would save.
const READ_FIRST_FROM: u32 = ONE / 4;

/// The recent duplicate rate of each scope.
#[derive(Debug)]
pub(crate) struct DuplicateRates {
    slots: [AtomicU32; SLOTS],
}

impl Default for DuplicateRates {
    fn default() -> Self {
        DuplicateRates {
            slots: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

impl DuplicateRates {
    /// Whether a delivery in `scope` should read the key's row before it claims the key.
    pub(crate) fn read_first(&self, scope: &str) -> bool {
        self.slot(scope).load(Ordering::Relaxed) >= READ_FIRST_FROM
    }

    /// Counts a delivery in `scope` whose key turned out final already (`duplicate`), or
    /// not.
    pub(crate) fn observe(&self, scope: &str, duplicate: bool) {
        let slot = self.slot(scope);
        let rate = slot.load(Ordering::Relaxed);
        let target = if duplicate { ONE } else { 0 };
        // Concurrent updates may overwrite one another: the rate is a hint.
        let next = rate - (rate >> SHIFT) + (target >> SHIFT);
        if next != rate {
            slot.store(next, Ordering::Relaxed);
        }
    }

    fn slot(&self, scope: &str) -> &AtomicU32 {
        let mut hasher = DefaultHasher::new();
        scope.hash(&mut hasher);
        &self.slots[(hasher.finish() % SLOTS as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_messages_claim_first() {
        let rates = DuplicateRates::default();
        for _ in 0..1000 {
            rates.observe("orders::apply", false);
        }
        assert!(!rates.read_first("orders::apply"));
    }

    #[test]
    fn a_run_of_duplicates_turns_to_reading_first_and_new_messages_turn_it_back() {
        let rates = DuplicateRates::default();
        let mut deliveries = 0;
        while !rates.read_first("orders::apply") {
            rates.observe("orders::apply", true);
            deliveries += 1;
        }
        assert!(
            deliveries <= 8,
            "{deliveries} duplicates before reading first"
        );
        for _ in 0..64 {
            rates.observe("orders::apply", true);
        }
        let mut deliveries = 0;
        while rates.read_first("orders::apply") {
            rates.observe("orders::apply", false);
            deliveries += 1;
        }
        assert!(
            deliveries <= 32,
            "{deliveries} new messages before claiming first"
        );
    }

    #[test]
    fn one_duplicate_in_ten_claims_first() {
        let rates = DuplicateRates::default();
        for delivery in 0..1000 {
            rates.observe("orders::apply", delivery % 10 == 0);
            assert!(!rates.read_first("orders::apply"), "at delivery {delivery}");
        }
    }
}
