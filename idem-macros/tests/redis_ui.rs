//! Without the runtime's `redis` feature, `cache` and `cache_ttl` in `#[idempotent]` are a
//! compile error that names the feature (the case with the feature compiles in
//! `tests/redis_cache_arguments.rs`).
//!
//! trybuild builds its cases against this package's dev-dependency on idem-runtime, which
//! does not enable `redis`, whatever features the test run itself enables: the error case
//! runs in every build.

#[test]
fn redis_cache_arguments_need_the_feature() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/redis/fail/*.rs");
}
