//! idem-kafka against a real Kafka-API broker and PostgreSQL, in one test binary.
//!
//! Needs the `tansu` broker (`cargo install tansu --version 0.6.0 --locked --features
//! libsql`, or `scripts/services.sh up kafka`) or a broker in `KAFKA_BROKERS`, and
//! PostgreSQL at `DATABASE_URL`. The scenarios that run consumers take turns. With
//! `IDEM_TEST_DATABASE_ROUND_TRIP_MS` set (e.g. `1`), the members reach PostgreSQL over a
//! link that adds that round trip.

#![allow(dead_code)]

mod batch_handler_positions;
mod batch_positions;
mod batches;
mod broker_restart;
mod database_outage;
mod database_went_back;
mod dead_letter_reasons;
mod dead_member;
mod end_to_end;
mod examples_start_together;
mod lease_mode;
mod ledger_under_faults;
mod outbox_chain;
mod outbox_lock_timeout;
mod outbox_relay_faults;
mod outbox_savepoints;
mod partitions_in_parallel;
mod per_message;
mod rebalance_gives_up_its_worker;
mod spans;
mod stalled_member_gives_up;
mod support;
mod watchdog_ends_a_hung_test;
