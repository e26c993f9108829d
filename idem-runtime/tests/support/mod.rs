//! Fixtures of the runtime's integration tests: the order events their handlers take, a
//! migrated runtime over each test's fresh database, and the Redis and batch helpers.

// Each test binary includes this module and uses a part of it.
#![allow(dead_code)]

pub mod batch;
pub mod orders;
#[cfg(feature = "redis")]
pub mod redis;
pub mod testing;
