//! The README's first code snippet compiles as written, with its own imports: only the
//! types it leaves to the reader (the event, the receipt, the error) and a function around
//! the consumer loop's statements are added (trybuild).

use std::path::PathBuf;

/// The first ```rust block of the README, split into its items (imports, the handler)
/// and the statements of the consumer loop that follow them.
fn first_snippet() -> (String, String) {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("read README.md");
    let start = readme.find("```rust\n").expect("a rust snippet") + "```rust\n".len();
    let end = start + readme[start..].find("\n```").expect("the snippet's end");
    let lines: Vec<&str> = readme[start..end].lines().collect();
    let mut split = lines
        .iter()
        .position(|line| line.starts_with("match ") || line.starts_with("let "))
        .expect("the consumer loop's statements");
    while split > 0 && lines[split - 1].starts_with("//") {
        split -= 1;
    }
    (lines[..split].join("\n"), lines[split..].join("\n"))
}

#[test]
fn readme_first_snippet_compiles() {
    let (items, statements) = first_snippet();
    let program = format!(
        r#"#![allow(dead_code, unused_variables)]

// What the snippet leaves to the reader.
struct OrderEvent {{
    order_id: String,
    event_type: String,
    amount_cents: i64,
}}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {{
    payment_id: i64,
}}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct PaymentError(#[from] sqlx::Error);

// The snippet.
{items}

async fn consume(idem: idem_runtime::Idem, event: OrderEvent) {{
{statements}
}}

fn main() {{
    let _ = consume;
}}
"#
    );
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("readme_first_snippet.rs");
    std::fs::write(&path, program).expect("write the snippet's program");
    trybuild::TestCases::new().pass(&path);
}
