//! Support code shared by idem's examples, integration tests and benchmarks.

pub mod kafka;
pub mod orders;
pub mod testing;
