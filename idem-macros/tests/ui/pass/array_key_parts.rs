//! Fixed-size arrays are key parts, as slices and vectors are: a 16-byte id alone, or a
//! 32-byte digest next to another field.
use idem_runtime::key::KeyBuilder;
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct Event {
    id: [u8; 16],
    digest: [u8; 32],
    source: String,
    tags: [&'static str; 2],
}

#[idempotent(key = "id")]
async fn by_id(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "source, digest", fingerprint = "tags")]
async fn by_digest(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

async fn deliver(idem: &Idem, event: &Event) {
    let _ = by_id(idem, event).await;
    let _ = by_digest(idem, event).await;
    // An array keys like the `Vec` of the same bytes.
    let array = KeyBuilder::new().part("id", &event.id).unwrap().finish();
    let vec = KeyBuilder::new().part("id", &event.id.to_vec()).unwrap().finish();
    assert_eq!(array, vec);
}

fn main() {
    let _ = deliver;
}
