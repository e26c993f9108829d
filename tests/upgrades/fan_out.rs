//! Fan-out: a second handler of the same message (`notify`, another name, the same key
//! fields, no `scope`) is a handler of its own, not the first one renamed: from scratch,
//! both run once per fact; deployed beside a base build's `apply` that already applied
//! the facts, `apply` finds them as duplicates and `notify` runs once per fact. Nothing is
//! refused, although `notify` finds no keys under its scope while a scope of its crate
//! with the same message type and key fields has them.

use crate::harness::{Database, Deliver, Tally, assert_tally, current};
use crate::{FACTS, deployed, redeliver};

#[test]
fn two_handlers_of_one_message_from_scratch_each_run_once_per_fact() {
    let database = Database::create("fan_out_from_scratch");
    let fan_out = current("fan-out");
    let summary = fan_out.deliver(&database, &Deliver::facts(FACTS).migrating());
    assert_tally(&summary, "apply", Tally::executed(FACTS.end as u64));
    assert_tally(&summary, "notify", Tally::executed(FACTS.end as u64));
    let summary = fan_out.deliver(&database, &Deliver::facts(FACTS));
    assert_tally(&summary, "apply", Tally::duplicates(FACTS.end as u64));
    assert_tally(&summary, "notify", Tally::duplicates(FACTS.end as u64));
    database.assert_one_effect_per_fact("apply", FACTS);
    database.assert_one_effect_per_fact("notify", FACTS);
}

#[test]
fn a_handler_added_beside_a_deployed_one_runs_once_per_fact() {
    let database = deployed("fan_out_added");
    let summary = redeliver(&database, &current("fan-out"));
    assert_tally(&summary, "apply", Tally::duplicates(FACTS.end as u64));
    assert_tally(&summary, "notify", Tally::executed(FACTS.end as u64));
    database.assert_one_effect_per_fact("notify", FACTS);
}
