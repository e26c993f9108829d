//! The key function of `rotate` is `rotate_key`: an item of that name next to the handler
//! clashes with it. The compiler points at that item and at the handler's name; the way
//! out is `key_fn = "other_name"` (or `key_fn = false`).
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct KeyRotation {
    key_id: String,
}

/// The user's own function, unrelated to idem.
fn rotate_key(rotation: &KeyRotation) -> String {
    rotation.key_id.clone()
}

#[idempotent(key = "key_id")]
async fn rotate(tx: &mut PgConnection, rotation: &KeyRotation) -> Result<(), sqlx::Error> {
    let _ = (tx, rotate_key(rotation));
    Ok(())
}

/// A name given with `key_fn` that clashes is reported at that name.
#[idempotent(key = "key_id", scope = "revoke", key_fn = "rotate_key")]
async fn revoke(tx: &mut PgConnection, rotation: &KeyRotation) -> Result<(), sqlx::Error> {
    let _ = (tx, rotation);
    Ok(())
}

fn main() {}

mod keys {
    use super::KeyRotation;
    use idem_runtime::idempotent;
    use sqlx::PgConnection;

    pub fn expire_key() {}

    #[idempotent(key = "key_id")]
    #[cfg(all())]
    pub async fn expire(tx: &mut PgConnection, rotation: &KeyRotation) -> Result<(), sqlx::Error> {
        let _ = (tx, rotation);
        Ok(())
    }
}
