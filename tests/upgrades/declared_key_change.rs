//! A declared key change, deployed as a rolling upgrade: the old build keys on
//! `order_ref, order_no`, the new one on `event_id` with `previous_key = "order_ref,
//! order_no"` (both one key per fact). The old build has been delivering (its definition
//! is the scope's); then four old and four new worker processes deliver the same facts at
//! once, each all of them in an order of its own, so that the two definitions race on
//! every fact: each fact still takes effect exactly once, and no delivery fails (members of
//! the old build are accepted during the transition the new one declared). Without
//! `previous_key`, the new build would apply again every fact the old one had. Once the
//! old workers are gone, the new build redelivering every fact, including those only the
//! old build ever saw, finds only duplicates.

use crate::harness::{Deliver, Tally, assert_tally, current};

/// Delivered by the old build alone, before the new one is deployed.
const BEFORE: std::ops::Range<i64> = 1000..1100;
/// Delivered by every worker of both builds at once.
const RACED: std::ops::Range<i64> = 0..1000;
const ALL: std::ops::Range<i64> = 0..1100;
const WORKERS_PER_BUILD: u64 = 4;

#[test]
fn old_and_new_key_definitions_racing_on_every_fact_apply_each_fact_once() {
    let database = crate::harness::Database::create("declared_key_change");
    let (old, new) = (current("base"), current("previous-key"));
    let deployed = old.deliver(&database, &Deliver::facts(BEFORE).migrating());
    assert_tally(&deployed, "apply", Tally::executed(BEFORE.count() as u64));

    let mut workers: Vec<_> = (0..2 * WORKERS_PER_BUILD)
        .map(|worker| {
            let build = if worker < WORKERS_PER_BUILD {
                &old
            } else {
                &new
            };
            let deliver = Deliver::facts(RACED)
                .shuffled(worker + 1)
                .waiting()
                .labelled(format!("worker {worker}"));
            build.start(&database, &deliver)
        })
        .collect();
    for worker in &mut workers {
        worker.ready();
    }
    for worker in &mut workers {
        worker.go();
    }
    let summaries: Vec<_> = workers.into_iter().map(|worker| worker.finish()).collect();
    database.assert_one_effect_per_fact("apply", ALL);
    for summary in &summaries {
        summary.assert_no_failed_delivery();
    }
    let executed: u64 = summaries
        .iter()
        .map(|summary| summary.handler("apply").executed)
        .sum();
    assert_eq!(executed, RACED.end as u64, "executions across the workers");

    // The old workers are gone: the new build alone redelivers every fact.
    let summary = new.deliver(&database, &Deliver::facts(ALL).labelled("after the old"));
    assert_tally(&summary, "apply", Tally::duplicates(ALL.end as u64));
    database.assert_one_effect_per_fact("apply", ALL);
}
