//! `#[idempotent]` and `#[derive(KeyPart)]` accept the handlers they should and reject the
//! others with errors that point at the user's code (trybuild snapshots in `tests/ui`).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
