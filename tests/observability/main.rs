//! The operators' files in `ops/` against real servers: the alerting rules pass
//! `promtool check rules` and their unit tests (`promtool test rules`), and a private
//! Prometheus (Debian's package, started by `scripts/services.sh up prometheus`) that
//! scrapes a running idem-kafka consumer and outbox relay answers every query of the
//! Grafana dashboard and every rule's query with data.
//!
//! Needs PostgreSQL (`DATABASE_URL`) and the Kafka-API broker, as the Kafka suite does;
//! `scripts/services.sh` installs Prometheus when it is missing.

mod prometheus;
mod promtool;
mod queries;
mod scrape;

// The Kafka suite's harness: a broker, a fresh topic and group, a migrated database.
#[allow(dead_code)]
#[path = "../kafka/support.rs"]
mod support;
