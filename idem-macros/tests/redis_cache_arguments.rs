//! With the runtime's `redis` feature, `cache` and `cache_ttl` are accepted in both modes
//! (without it they are a compile error that names the feature: `tests/redis_ui.rs`).
//!
//! An ordinary test rather than a trybuild pass case: trybuild builds the runtime with the
//! features of this package's dev-dependency, which leaves `redis` off.
use idem_runtime::{Idem, Outcome, idempotent, lease::Lease};
use sqlx::PgConnection;

struct Event {
    order_id: String,
}

#[idempotent(key = "order_id", cache = false)]
async fn uncached(_tx: &mut PgConnection, _event: &Event) -> Result<(), sqlx::Error> {
    Ok(())
}

#[idempotent(key = "order_id", cache = true, cache_ttl = "90s")]
async fn short_lived(_tx: &mut PgConnection, _event: &Event) -> Result<u32, sqlx::Error> {
    Ok(7)
}

#[idempotent(key = "order_id", mode = "lease", cache_ttl = "1h")]
async fn notify(_lease: &Lease, _event: &Event) -> Result<(), std::io::Error> {
    Ok(())
}

#[idempotent(key = "order_id", mode = "lease", cache = false)]
async fn notify_uncached(_event: &Event) -> Result<(), std::io::Error> {
    Ok(())
}

async fn deliver(idem: &Idem, event: &Event) {
    let _: Outcome<()> = uncached(idem, event).await.unwrap();
    let _: Outcome<u32> = short_lived(idem, event).await.unwrap();
    let _: Outcome<()> = notify(idem, event).await.unwrap();
    let _: Outcome<()> = notify_uncached(idem, event).await.unwrap();
}

#[test]
fn cache_arguments_compile_with_the_feature() {
    // Compiling the handlers is the test; their calls type-check in `deliver`.
    let _ = deliver;
}
