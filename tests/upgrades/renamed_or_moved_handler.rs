//! A deployed handler without `scope`, renamed (`apply` to `apply_order`) or moved to
//! another module (`handlers::billing::apply`): its default scope changes with its name,
//! and none of its facts are recorded under the new one. Without the detection of a
//! renamed or moved handler, every fact's body would run a second time; with it, every
//! delivery is refused with `Disposition::Halt`, and the error names the old scope and the
//! fix, `scope = "<old scope>"`. Renamed with that `scope` (the documented way), the
//! handler finds its facts: duplicates, nothing refused; and so does the build before the
//! rename, rolled back to.

use crate::harness::{Tally, assert_tally, current};
use crate::{FACTS, deployed, redeliver};

const OLD_SCOPE: &str = "scenario::handlers::apply";

fn is_refused_naming_its_old_scope(variant: &'static str) {
    let database = deployed(variant);
    let summary = redeliver(&database, &current(variant));
    assert_tally(&summary, "apply", Tally::halted(FACTS.end as u64));
    let text = summary.handler("apply").halt_text();
    assert!(
        text.contains(OLD_SCOPE),
        "the refusal does not name the old scope {OLD_SCOPE}: {text}"
    );
    let fix = format!("scope = \"{OLD_SCOPE}\"");
    assert!(
        text.contains(&fix),
        "the refusal does not say {fix}: {text}"
    );
}

#[test]
fn a_renamed_handler_without_scope_is_refused_naming_its_old_scope() {
    is_refused_naming_its_old_scope("renamed");
}

#[test]
fn a_moved_handler_without_scope_is_refused_naming_its_old_scope() {
    is_refused_naming_its_old_scope("moved");
}

#[test]
fn a_renamed_handler_given_its_old_scope_finds_its_facts_as_duplicates() {
    let database = deployed("renamed_with_old_scope");
    let summary = redeliver(&database, &current("renamed-with-old-scope"));
    assert_tally(&summary, "apply", Tally::duplicates(FACTS.end as u64));
    // Rolled back to the build before the rename, which owned the scope first: its
    // facts, and the renamed build's, are its own.
    let summary = redeliver(&database, &current("base"));
    assert_tally(&summary, "apply", Tally::duplicates(FACTS.end as u64));
}
