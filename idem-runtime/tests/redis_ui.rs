//! `cache` and `cache_ttl` in `#[idempotent]` compile with the `redis` feature, and without it are a compile error that names the feature (trybuild: the error case runs without `--features redis`, the pass case with it).

#[test]
fn redis_cache_arguments_follow_the_feature() {
    let cases = trybuild::TestCases::new();
    #[cfg(feature = "redis")]
    cases.pass("tests/ui/redis/pass/*.rs");
    #[cfg(not(feature = "redis"))]
    cases.compile_fail("tests/ui/redis/fail/*.rs");
}
