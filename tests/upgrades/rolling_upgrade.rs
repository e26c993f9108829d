//! A rolling upgrade: the previous release's build migrates and delivers facts again and
//! again; meanwhile the current release's build migrates (applying the migrations newer
//! than the previous release) and delivers the same facts; then the previous build is
//! restarted, migrating again on the newer schema, and delivers every fact again. No
//! delivery fails (no error but bounded retries of `Disposition::Retry`), and each fact
//! takes effect exactly once. In both orders of migration: the previous release first (an
//! upgrade), the current one first (an instance of the previous release started late).

use crate::harness::{Database, Deliver, Tally, assert_tally, current, previous};

const ROLLED: std::ops::Range<i64> = 0..1000;

fn previous_and_current_deliver_side_by_side(current_migrates_first: bool, scenario: &str) {
    let database = Database::create(scenario);
    let (old, new) = (previous("base"), current("base"));
    if current_migrates_first {
        new.migrate(&database);
    }
    let mut running = old.start(
        &database,
        &Deliver::facts(ROLLED)
            .migrating()
            .waiting()
            .repeating()
            .labelled("before the upgrade"),
    );
    running.ready();
    running.go();
    if !current_migrates_first {
        new.migrate(&database);
    }
    let upgraded = new.deliver(&database, &Deliver::facts(ROLLED).shuffled(1));
    let before = running.finish();
    before.assert_no_failed_delivery();
    upgraded.assert_no_failed_delivery();
    let executed = before.handler("apply").executed + upgraded.handler("apply").executed;
    assert_eq!(
        executed, ROLLED.end as u64,
        "executions across the two releases"
    );
    database.assert_one_effect_per_fact("apply", ROLLED);

    let restarted = old.deliver(
        &database,
        &Deliver::facts(ROLLED)
            .migrating()
            .labelled("restarted after the upgrade"),
    );
    assert_tally(&restarted, "apply", Tally::duplicates(ROLLED.end as u64));
    database.assert_one_effect_per_fact("apply", ROLLED);
}

#[test]
fn the_previous_release_migrating_first_then_the_current_one_apply_each_fact_once() {
    previous_and_current_deliver_side_by_side(false, "rolling_previous_first");
}

#[test]
fn the_current_release_migrating_first_then_the_previous_one_apply_each_fact_once() {
    previous_and_current_deliver_side_by_side(true, "rolling_current_first");
}
