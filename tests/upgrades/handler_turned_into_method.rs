//! A deployed handler turned into a method of a type of the same module
//! (`impl Handlers { async fn apply(&self, tx, event) }`): the default scope of a method
//! is its module path and name, `scenario::handlers::apply`, as the function's was, so
//! the facts are found: duplicates, nothing refused, no body runs again.

use crate::harness::{Tally, assert_tally, current};
use crate::{FACTS, deployed, redeliver};

#[test]
fn a_handler_turned_into_a_method_of_its_module_finds_its_facts_as_duplicates() {
    let database = deployed("method");
    let summary = redeliver(&database, &current("method"));
    assert_tally(&summary, "apply", Tally::duplicates(FACTS.end as u64));
}
