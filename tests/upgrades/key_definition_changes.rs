//! A deploy that changes a scope's key definition: a key field added, removed, the fields
//! reordered, or a part's type changed to one that encodes differently (`order_ref` a
//! `Uuid` in place of the UUID's text). Each derives other keys for the facts already
//! applied, so without the recorded key definition every body would run again; with it,
//! the first delivery (and every one after it) is refused with `Disposition::Halt`, the
//! error showing the recorded definition and the new one. A part whose type encodes alike
//! (`order_no` an `i64` in place of an `i32`: integers of every width encode alike) keeps
//! the keys: duplicates.

use crate::harness::{Tally, assert_tally, current};
use crate::{FACTS, deployed, redeliver};

/// The base build's key definition, as the scope records it: the fields in order, each
/// with the shape of its encoding (`s` a string, `i` an integer, `u` a UUID).
const RECORDED: &str = "key(order_ref s, order_no i)";

fn is_refused_showing_both_definitions(variant: &'static str, new: &str) {
    let database = deployed(&variant.replace('-', "_"));
    let summary = redeliver(&database, &current(variant));
    assert_tally(&summary, "apply", Tally::halted(FACTS.end as u64));
    let text = summary.handler("apply").halt_text();
    assert!(
        text.contains(RECORDED),
        "the refusal does not show the recorded definition {RECORDED}: {text}"
    );
    assert!(
        text.contains(new),
        "the refusal does not show the new definition {new}: {text}"
    );
}

#[test]
fn an_added_key_field_is_refused_at_the_first_delivery() {
    is_refused_showing_both_definitions(
        "key-field-added",
        "key(order_ref s, order_no i, region s)",
    );
}

#[test]
fn a_removed_key_field_is_refused_at_the_first_delivery() {
    is_refused_showing_both_definitions("key-field-removed", "key(order_ref s)");
}

#[test]
fn reordered_key_fields_are_refused_at_the_first_delivery() {
    is_refused_showing_both_definitions("key-fields-reordered", "key(order_no i, order_ref s)");
}

#[test]
fn a_key_part_whose_new_type_encodes_differently_is_refused_at_the_first_delivery() {
    is_refused_showing_both_definitions("order-ref-uuid", "key(order_ref u, order_no i)");
}

#[test]
fn a_key_part_whose_new_type_encodes_alike_finds_its_facts_as_duplicates() {
    let database = deployed("order_no_i64");
    let summary = redeliver(&database, &current("order-no-i64"));
    assert_tally(&summary, "apply", Tally::duplicates(FACTS.end as u64));
}
