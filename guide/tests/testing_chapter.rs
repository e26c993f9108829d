//! The testing chapter's test file, as the guide shows it (copied from `src/testing.md` by
//! the build script): its `#[sqlx::test]` functions run against `DATABASE_URL`, with this
//! crate's `migrations/` (the chapter's `payments` table) applied.

include!(concat!(env!("OUT_DIR"), "/testing_chapter.rs"));
