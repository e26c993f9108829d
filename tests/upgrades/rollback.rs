//! A rollback: on a database that the current release migrated and used, the previous
//! release's build migrates (its `migrate` tolerates the newer migrations) and delivers
//! the facts the current build applied and new ones: the old facts are duplicates, the
//! new ones take effect once. Rolled forward again, the current build finds them all.

use crate::harness::{Database, Deliver, Tally, assert_tally, current, previous};

const APPLIED_BY_CURRENT: std::ops::Range<i64> = 0..500;
const ALL: std::ops::Range<i64> = 0..1000;

#[test]
fn the_previous_release_on_the_current_ones_database_applies_only_new_facts() {
    let database = Database::create("rollback");
    let summary =
        current("base").deliver(&database, &Deliver::facts(APPLIED_BY_CURRENT).migrating());
    assert_tally(
        &summary,
        "apply",
        Tally::executed(APPLIED_BY_CURRENT.end as u64),
    );

    let rolled_back = previous("base").deliver(&database, &Deliver::facts(ALL).migrating());
    assert_tally(
        &rolled_back,
        "apply",
        Tally {
            executed: (ALL.end - APPLIED_BY_CURRENT.end) as u64,
            duplicate: APPLIED_BY_CURRENT.end as u64,
            halt: 0,
            failed: 0,
        },
    );
    database.assert_one_effect_per_fact("apply", ALL);

    let rolled_forward = current("base").deliver(&database, &Deliver::facts(ALL).migrating());
    assert_tally(&rolled_forward, "apply", Tally::duplicates(ALL.end as u64));
    database.assert_one_effect_per_fact("apply", ALL);
}
