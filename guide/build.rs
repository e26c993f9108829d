//! Copies the testing chapter's test (the ```rust block after the marker comment in
//! `src/testing.md`) into `OUT_DIR`, where `tests/testing_chapter.rs` includes it: a doc
//! test compiles it as a program, in which `#[sqlx::test]` functions do not exist, while
//! the test target compiles and runs them.

use std::path::PathBuf;

const MARKER: &str = "<!-- compiled and run as a test by guide/tests/testing_chapter.rs -->";

fn main() {
    let chapter = "src/testing.md";
    println!("cargo:rerun-if-changed={chapter}");
    let text = std::fs::read_to_string(chapter).expect("read src/testing.md");
    let after = &text[text.find(MARKER).expect("the marker in src/testing.md") + MARKER.len()..];
    let start = after
        .find("```rust\n")
        .expect("a ```rust block after the marker")
        + "```rust\n".len();
    let end = start + after[start..].find("\n```").expect("the block's end");
    let code: String = after[start..end]
        .lines()
        .map(|line| match line.trim_start().strip_prefix("# ") {
            Some(hidden) => hidden.to_owned(),
            None if line.trim() == "#" => String::new(),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("testing_chapter.rs");
    std::fs::write(out, code + "\n").expect("write the chapter's test");
}
