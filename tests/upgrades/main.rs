//! A service's life across deploys: the previous release beside the current one, and the
//! changes a team makes to a deployed handler. One module per scenario.
//!
//! The scenario applications are real processes that share no memory: variants of one
//! application (`tests/compat/variants/`, each the crate `scenario` of a binary
//! `scenario-<variant>`, over the delivery loop `tests/compat/driver.rs`), built at test
//! time into `<target>/tests/idem-compat/` against the working tree's `idem-runtime` (the
//! current release) and against the previous release's (`git archive` of the commit that
//! `tests/compat/previous-release` names: the one line to change at the next release).
//! Each scenario runs them on a database of its own on `DATABASE_URL`'s server, and counts
//! the business effects (rows of `scenario_effects`, written through the handler's
//! connection) per fact: exactly once means one row per fact.
//!
//! The base application, the deployed build, has one handler without `scope`,
//! `scenario::handlers::apply`, keyed on `order_ref` (a UUID's text) and `order_no`. The
//! scenarios deliver facts with it, then redeliver them with a variant:
//!
//! - [`renamed_or_moved_handler`]: renamed or moved without `scope`, it is refused, naming
//!   the old scope and the fix; renamed with its old scope, it finds its facts;
//! - [`handler_turned_into_method`]: a method of the same module keeps the default scope;
//! - [`key_definition_changes`]: a key that derives other keys for the same facts is
//!   refused; a part whose type encodes alike is not;
//! - [`declared_key_change`]: `previous_key`, with old and new builds racing;
//! - [`fan_out`]: a second handler of the same message is a handler of its own;
//! - [`rolling_upgrade`] and [`rollback`]: the previous release and the current one on
//!   one database, in both orders of migration.
//!
//! Needs PostgreSQL at `DATABASE_URL`, the previous release's commit in the clone's history
//! (not a shallow clone), and the crates of both lock files in cargo's cache (the builds
//! are `--offline`).

mod builds;
mod harness;

mod declared_key_change;
mod fan_out;
mod handler_turned_into_method;
mod key_definition_changes;
mod renamed_or_moved_handler;
mod rollback;
mod rolling_upgrade;

use harness::{App, Database, Deliver, Tally, assert_tally};

/// The facts the base build applies before a variant redelivers them.
const FACTS: std::ops::Range<i64> = 0..500;

/// A database where the base build (of the current release) migrated and applied
/// [`FACTS`], once each.
fn deployed(scenario: &str) -> Database {
    let database = Database::create(scenario);
    let summary = harness::current("base").deliver(&database, &Deliver::facts(FACTS).migrating());
    assert_tally(&summary, "apply", Tally::executed(FACTS.end as u64));
    database.assert_one_effect_per_fact("apply", FACTS);
    database
}

/// Redelivers [`FACTS`] with `variant`: returns its summary, once the base build's
/// effects are checked untouched (one row per fact, however the variant's deliveries
/// ended).
fn redeliver(database: &Database, variant: &App) -> harness::Summary {
    let summary = variant.deliver(database, &Deliver::facts(FACTS));
    database.assert_one_effect_per_fact("apply", FACTS);
    summary
}
