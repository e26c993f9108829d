//! `key_fn = "name"` names the key function (next to an item called `<handler>_key`),
//! in a module and in an `impl`; `key_fn = true` is the default name; `key_fn = false`
//! generates none, so `<handler>_key` stays free for the user's own item.
use idem_runtime::{HandlerKey, idempotent};
use sqlx::PgConnection;

struct KeyRotation {
    key_id: String,
}

/// The user's own function, unrelated to idem.
fn rotate_key(rotation: &KeyRotation) -> &str {
    &rotation.key_id
}

#[idempotent(key = "key_id", scope = "rotate", key_fn = "rotation_key")]
async fn rotate(tx: &mut PgConnection, rotation: &KeyRotation) -> Result<(), sqlx::Error> {
    let _ = (tx, rotate_key(rotation));
    Ok(())
}

#[idempotent(key = "key_id", scope = "revoke", key_fn = true)]
async fn revoke(tx: &mut PgConnection, rotation: &KeyRotation) -> Result<(), sqlx::Error> {
    let _ = (tx, rotation);
    Ok(())
}

#[idempotent(key = "key_id", scope = "expire", key_fn = false)]
async fn expire(tx: &mut PgConnection, rotation: &KeyRotation) -> Result<(), sqlx::Error> {
    let _ = (tx, rotation);
    Ok(())
}

/// The user's own, where `expire`'s key function would be.
fn expire_key() -> u8 {
    7
}

struct Keys;

impl Keys {
    #[idempotent(key = "key_id", scope = "keys", key_fn = "r#match")]
    async fn rotate(&self, tx: &mut PgConnection, rotation: &KeyRotation) -> Result<(), sqlx::Error> {
        let _ = (tx, rotation);
        Ok(())
    }

    /// The user's own, where the method's key function would be.
    fn rotate_key(&self) -> &'static str {
        "mine"
    }
}

fn main() {
    let rotation = KeyRotation {
        key_id: "k-1".to_owned(),
    };
    let key: HandlerKey = rotation_key(&rotation).unwrap();
    assert_eq!(key.scope(), "rotate");
    assert_eq!(rotate_key(&rotation), "k-1");
    assert_eq!(revoke_key(&rotation).unwrap().scope(), "revoke");
    assert_eq!(expire_key(), 7);
    assert_eq!(Keys::r#match(&rotation).unwrap().scope(), "keys");
    assert_eq!(Keys.rotate_key(), "mine");
    let _ = (rotate, revoke, expire, Keys::rotate);
}
