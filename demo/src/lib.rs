//! The Kafka-to-PostgreSQL demo of idem (`scripts/demo.sh`): order events published with
//! duplicate sends and malformed messages, applied by `#[idempotent]` handlers through
//! [`idem_kafka`] consumers, and checked by SQL to be applied exactly once.
//!
//! The binaries are `demo` (the whole run) and `order_producer` (the producer alone, for
//! the examples). The cross-crate tests (`tests/`) run the same producer, handlers, broker
//! launcher and check; the benchmarks use the order events. Not published.

pub mod kafka;
pub mod orders;
