//! The guide of idem, as doc tests: every chapter of the book (`src/*.md`, built with
//! `mdbook build guide`) is the documentation of a module below, so that `cargo test -p
//! idem-guide` compiles each of its Rust code blocks, and runs those that need nothing but
//! PostgreSQL (`DATABASE_URL`), each on a database of its own ([`support`]). Blocks that
//! need a Kafka broker or Redis are compiled only (`no_run`).
//!
//! Not published: the crate exists for its tests.

pub mod support;

/// Declares one module per chapter, documented by the chapter's text.
macro_rules! chapters {
    ($($module:ident => $file:literal),* $(,)?) => {
        $(
            #[doc = include_str!(concat!("src/", $file))]
            pub mod $module {}
        )*
    };
}

chapters! {
    introduction => "introduction.md",
    getting_started => "getting-started.md",
    keys => "keys.md",
    failures => "failures.md",
    kafka => "kafka.md",
    batches => "batches.md",
    lease_mode => "lease-mode.md",
    outbox => "outbox.md",
    poolers => "poolers.md",
    deploying => "deploying.md",
    security => "security.md",
    operating => "operating.md",
    failovers => "failovers.md",
    redis => "redis.md",
    testing => "testing.md",
    guarantees => "guarantees.md",
    costs => "costs.md",
    contributing => "contributing.md",
}
