//! A cache entry as stored in Redis: its JSON encoding and its signature.

use serde::{Deserialize, Serialize};

use crate::key::IdempotencyKey;

use super::client::Instance;

/// An entry: the key succeeded, with this fingerprint and this stored result, signed.
///
/// JSON, readable with `redis-cli`: `{"v":2,"fp":"<hex>","r":<result>,"mac":"<hex>"}`;
/// `fp` and `r` are left out when there is none. `mac` is the HMAC-SHA256 of the
/// status table's identity, the scope, the key, the fingerprint and the result.
pub(super) struct Entry {
    pub fingerprint: Option<Vec<u8>>,
    pub result: Option<serde_json::Value>,
    pub signature: Vec<u8>,
}

const ENTRY_VERSION: u8 = 2;

#[derive(Serialize)]
struct EntryOut<'a> {
    v: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    fp: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    r: Option<&'a serde_json::Value>,
    mac: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryIn {
    v: u8,
    #[serde(default)]
    fp: Option<String>,
    #[serde(default)]
    r: Option<serde_json::Value>,
    #[serde(default)]
    mac: String,
}

impl Entry {
    pub(super) fn encode(
        instance: &Instance,
        scope: &str,
        key: IdempotencyKey,
        fingerprint: Option<&[u8]>,
        result: Option<&serde_json::Value>,
    ) -> Vec<u8> {
        let entry = EntryOut {
            v: ENTRY_VERSION,
            fp: fingerprint.map(hex::encode),
            r: result,
            mac: hex::encode(instance.sign(scope, key, fingerprint, result)),
        };
        serde_json::to_vec(&entry).expect("a JSON value always serializes")
    }

    /// The entry, or `None` for anything this version did not write. Its signature
    /// is checked by [`Instance::verifies`].
    pub(super) fn decode(bytes: &[u8]) -> Option<Entry> {
        let entry: EntryIn = serde_json::from_slice(bytes).ok()?;
        if entry.v != ENTRY_VERSION {
            return None;
        }
        let fingerprint = match entry.fp {
            Some(text) => Some(hex::decode(text).ok()?),
            None => None,
        };
        Some(Entry {
            fingerprint,
            result: entry.r,
            signature: hex::decode(entry.mac).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(secret: &[u8]) -> Instance {
        Instance::new("id:db:schema".to_owned(), secret.to_vec())
    }

    #[test]
    fn entries_round_trip_and_verify() {
        let signer = instance(b"secret");
        let key = IdempotencyKey::from_uuid(uuid::Uuid::from_u128(9));
        let fingerprint = [7u8; 32];
        let result = serde_json::json!({"payment_id": 42, "note": "nul \u{0}"});
        let bytes = Entry::encode(&signer, "pay", key, Some(&fingerprint), Some(&result));
        let entry = Entry::decode(&bytes).expect("decodes");
        assert_eq!(entry.fingerprint.as_deref(), Some(&fingerprint[..]));
        assert_eq!(entry.result, Some(result));
        assert!(signer.verifies("pay", key, &entry));

        let bare = Entry::decode(&Entry::encode(&signer, "pay", key, None, None)).expect("decodes");
        assert!(bare.fingerprint.is_none() && bare.result.is_none());
        assert!(signer.verifies("pay", key, &bare));
    }

    #[test]
    fn an_entry_verifies_only_for_its_table_scope_key_and_secret() {
        let signer = instance(b"secret");
        let key = IdempotencyKey::from_uuid(uuid::Uuid::from_u128(9));
        let other_key = IdempotencyKey::from_uuid(uuid::Uuid::from_u128(10));
        let entry = Entry::decode(&Entry::encode(&signer, "pay", key, None, None)).unwrap();
        assert!(!signer.verifies("refund", key, &entry));
        assert!(!signer.verifies("pay", other_key, &entry));
        assert!(!instance(b"rotated").verifies("pay", key, &entry));
        let elsewhere = Instance::new("other:db:schema".to_owned(), b"secret".to_vec());
        assert!(!elsewhere.verifies("pay", key, &entry));
        // The same claims with another result do not verify either.
        let mut changed = entry;
        changed.result = Some(serde_json::json!(1));
        assert!(!signer.verifies("pay", key, &changed));
    }

    #[test]
    fn garbage_is_not_an_entry() {
        for garbage in [
            &b"OK"[..],
            b"",
            b"{}",
            br#"{"v":1}"#,
            br#"{"v":2,"fp":"zz","mac":""}"#,
            br#"{"v":2,"fp":"abc","mac":""}"#,
            br#"{"v":2,"other":true}"#,
            br#"{"v":2,"mac":"xyz"}"#,
            b"\xff\xfe",
        ] {
            assert!(Entry::decode(garbage).is_none(), "{garbage:?}");
        }
    }
}
