//! How often deliveries of a scope turn out to be duplicates, recently: it decides which
//! of two equally correct claim orders a delivery takes.
//!
//! - **Claim first** (the usual case): the transaction opens and the key is inserted; a
//!   duplicate finds the row in the way. A new message pays nothing extra, a duplicate
//!   pays for the transaction around a read (`BEGIN`, the insert's conflict check, the
//!   `ROLLBACK`). While duplicates are rare, the claim is the insert alone, and a
//!   duplicate reads the row in the way with a statement of its own; from one delivery in
//!   eight a duplicate, the claim reads that row in its own statement (a new message pays
//!   a few per cent more for the larger statement, a duplicate saves a statement and its
//!   round trip).
//! - **Read first**: one plain read of the key's row, outside any transaction, answers a
//!   duplicate (or a parked key) with no transaction, no lock and no write. A key without a
//!   final row goes on to the claim, which decides as before: the read only ever saves
//!   work, since a `success` or `parked` row is final. A new message pays the read.
//!
//! Counted in round trips, a duplicate read first saves two (the claim's transaction and
//! its rollback) and a new message read first pays two (the read and the acquisition of a
//! second connection), so reading first pays once about half of the deliveries are
//! duplicates. A stream of new messages, or one with a steady share of duplicates below
//! that (a producer's retries, a topic where three facts in ten are sent twice), keeps
//! claiming first; a redelivery storm (a consumer replaying a partition) drives the rate up
//! and duplicates are answered by the read. The rate is an exponentially weighted average
//! over the last few dozen deliveries, kept per scope in a fixed table of counters (two
//! scopes that land on one counter share their rate; either order stays correct). A scope
//! turns to reading first at half its deliveries duplicates and back below three in eight:
//! a rate that wavers around one bound does not switch the order at every delivery.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

/// Counters of the fixed table.
const SLOTS: usize = 64;
/// Fixed-point scale of a rate: `ONE` is every delivery a duplicate.
const ONE: u32 = 1 << 16;
/// Weight of the newest delivery: 1/16.
const SHIFT: u32 = 4;
/// The rate from which a scope claiming first turns to reading first: one delivery in two
/// a duplicate. Below it, what new messages would pay for the read costs more than the
/// transactions that duplicates would save.
const READ_FIRST_FROM: u32 = ONE / 2;
/// The rate below which a scope reading first turns back to claiming first: three
/// deliveries in eight duplicates.
const CLAIM_FIRST_BELOW: u32 = ONE * 3 / 8;
/// The rate from which the claim reads the row in the way in its own statement: one
/// delivery in eight a duplicate.
const READ_IN_CLAIM_FROM: u32 = ONE / 8;
/// The bit of a counter that says its scope reads first (the rate takes the bits below).
const READING_FIRST: u32 = 1 << 31;

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
        self.slot(scope).load(Ordering::Relaxed) & READING_FIRST != 0
    }

    /// Whether the claim of a delivery in `scope` should read the row in its way in the same
    /// statement (duplicates are not rare) rather than insert alone.
    pub(crate) fn read_in_claim(&self, scope: &str) -> bool {
        self.slot(scope).load(Ordering::Relaxed) & !READING_FIRST >= READ_IN_CLAIM_FROM
    }

    /// Counts a delivery in `scope` whose key turned out final already (`duplicate`), or
    /// not.
    pub(crate) fn observe(&self, scope: &str, duplicate: bool) {
        let slot = self.slot(scope);
        let current = slot.load(Ordering::Relaxed);
        let reading_first = current & READING_FIRST != 0;
        let rate = current & !READING_FIRST;
        let target = if duplicate { ONE } else { 0 };
        let rate = rate - (rate >> SHIFT) + (target >> SHIFT);
        let reading_first = if reading_first {
            rate >= CLAIM_FIRST_BELOW
        } else {
            rate >= READ_FIRST_FROM
        };
        let next = rate | if reading_first { READING_FIRST } else { 0 };
        // Concurrent updates may overwrite one another: the rate is a hint.
        if next != current {
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
            deliveries <= 12,
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
    fn the_claim_reads_the_row_in_its_way_once_duplicates_are_not_rare() {
        let rates = DuplicateRates::default();
        for _ in 0..1000 {
            rates.observe("orders::apply", false);
        }
        assert!(!rates.read_in_claim("orders::apply"));
        for delivery in 0..1000 {
            rates.observe("orders::apply", delivery % 10 < 3);
        }
        assert!(rates.read_in_claim("orders::apply"));
        assert!(!rates.read_first("orders::apply"));
    }

    #[test]
    fn one_duplicate_in_ten_claims_first() {
        let rates = DuplicateRates::default();
        for delivery in 0..1000 {
            rates.observe("orders::apply", delivery % 10 == 0);
            assert!(!rates.read_first("orders::apply"), "at delivery {delivery}");
        }
    }

    #[test]
    fn three_duplicates_in_ten_claim_first() {
        let rates = DuplicateRates::default();
        // Evenly spread, and in runs of three duplicates after seven new messages.
        for delivery in 0..1000 {
            rates.observe(
                "orders::apply",
                delivery % 10 == 3 || delivery % 10 == 6 || delivery % 10 == 9,
            );
            assert!(!rates.read_first("orders::apply"), "at delivery {delivery}");
            rates.observe("orders::other", delivery % 10 >= 7);
            assert!(!rates.read_first("orders::other"), "at delivery {delivery}");
        }
    }

    #[test]
    fn a_rate_between_the_bounds_keeps_the_order_it_has() {
        let rates = DuplicateRates::default();
        // Up to reading first with a storm, then duplicates and new messages in turn (a
        // rate near one half): it keeps reading first.
        for _ in 0..64 {
            rates.observe("orders::apply", true);
        }
        for delivery in 0..1000 {
            rates.observe("orders::apply", delivery % 2 == 0);
            assert!(rates.read_first("orders::apply"), "at delivery {delivery}");
        }
        // Two duplicates in five, above three in eight: a scope claiming first keeps
        // claiming first.
        let rates = DuplicateRates::default();
        for delivery in 0..1000 {
            rates.observe("orders::apply", delivery % 5 == 1 || delivery % 5 == 3);
            assert!(!rates.read_first("orders::apply"), "at delivery {delivery}");
        }
    }
}
