//! Idempotency keys: the canonical encoding of a message's key fields and its digest.
//!
//! A key identifies one business fact. It is derived from an ordered list of *parts* (the
//! values of the fields named in `#[idempotent(key = "...")]`), each encoded canonically,
//! and digested to a UUID. The handler's scope is not part of the digest: the status table
//! stores `(scope, key)`, so a producer can stamp one key on an event and every handler
//! that consumes it derives the same key and still keeps its own record.
//!
//! # Encoding, version 1
//!
//! ```text
//! encoding = "idem:v1" count part*
//! count    = u32, big-endian: the number of parts
//! part     = tag len bytes
//! tag      = one ASCII byte, below
//! len      = u32, big-endian: the length of bytes
//! ```
//!
//! | tag | Rust types | bytes |
//! |-----|------------|-------|
//! | `s` | `str`, `String`, `char`, unit enums deriving [`KeyPart`] (the variant's name) | UTF-8 |
//! | `i` | every integer type | ASCII decimal, `-` for negatives, no leading zeros (`0`, `42`, `-7`) |
//! | `b` | `bool` | one byte, `0x00` or `0x01` |
//! | `u` | [`uuid::Uuid`] | the 16 bytes |
//! | `t` | `chrono::DateTime<Tz>`, `chrono::NaiveDateTime` (read as UTC), `std::time::SystemTime` | ASCII decimal nanoseconds since 1970-01-01T00:00:00Z, `-` for earlier instants |
//! | `d` | `chrono::NaiveDate` | ASCII `YYYY-MM-DD` |
//! | `l` | `[T]`, `[T; N]`, `Vec<T>`; structs deriving [`KeyPart`] with several fields (in declaration order); enum variants deriving it that have fields (the variant's name as an `s` part, then the fields) | `count part*` of the elements |
//! | `n` | `None` of an `Option`, in a payload fingerprint only | none (`len` is 0) |
//!
//! The digest is the first 16 bytes of SHA-256 over the encoding, stamped as an
//! [RFC 9562](https://www.rfc-editor.org/rfc/rfc9562#section-5.8) version 8 UUID.
//! Integers of every width encode alike, so a producer holding an `i64` and a consumer
//! holding an `i32` of the same value agree. Field names are not encoded: only the values
//! and their order count. A struct deriving [`KeyPart`] with one field encodes as that
//! field.
//!
//! What derives [`KeyPart`] encodes its Rust names and order, not its serde form: renaming
//! an enum's variant (a `#[serde(rename)]` does not count) or reordering a struct's fields
//! changes the keys of every message that holds one, and their redeliveries run again.
//!
//! The test vectors below are checked by this crate's tests; another implementation
//! (a producer in another language) can check itself against them.
//!
//! | parts | key |
//! |-------|-----|
//! | `"order-1"`, `"paid"` | `804192a5-97d2-8f62-9aa5-941e1b1f8c6f` |
//! | `42` | `1b2737e7-042d-8386-a0ca-ba27dd08e7ce` |
//! | `-7`, `true` | `fe903395-f82a-858b-8557-c7929c9b2104` |
//! | `Uuid 67e55044-10b1-426f-9247-bb680e5fe0c8` | `1bec8415-b00e-8060-8dbe-924fb9dc4bd1` |
//! | `"order-1"`, `2024-05-01T12:00:00Z` | `2118130b-707b-8234-abd6-fd25a4c6adf1` |
//! | `vec!["a", "b"]` | `15ea568c-a614-86dd-aa31-6f678aeac200` |
//!
//! The same derivation in Python, for producers outside Rust:
//!
//! ```text
//! import hashlib, struct, uuid
//! def part(tag, data): return tag + struct.pack(">I", len(data)) + data
//! def key(parts):
//!     digest = bytearray(hashlib.sha256(b"idem:v1" + struct.pack(">I", len(parts)) + b"".join(parts)).digest()[:16])
//!     digest[6] = (digest[6] & 0x0F) | 0x80   # version 8
//!     digest[8] = (digest[8] & 0x3F) | 0x80   # RFC 9562 variant
//!     return uuid.UUID(bytes=bytes(digest))
//! key([part(b"s", b"order-1"), part(b"s", b"paid")])  # 804192a5-97d2-8f62-9aa5-941e1b1f8c6f
//! ```
//!
//! A record that a handler sends through an outbox (idem-kafka's `outbox::send`) carries
//! its own key in the header `idem-key`, as the UUID's text: the key of the parts
//! `"idem:outgoing"`, the handler's scope, the handled fact's key (a UUID part) and the
//! record's name ([`CurrentDelivery::derived_key`](crate::CurrentDelivery::derived_key)).
//! The same in Python, and read back from a record:
//!
//! ```text
//! fact = key([part(b"s", b"order-1"), part(b"s", b"paid")])
//! key([part(b"s", b"idem:outgoing"), part(b"s", b"billing::apply"), part(b"u", fact.bytes),
//!      part(b"s", b"receipt")])                 # 1d505c2b-b185-8558-a667-85fa14342073
//! idem_key = uuid.UUID(dict(message.headers())["idem-key"].decode())  # confluent-kafka
//! ```
//!
//! An `Option` encodes as its value when it is `Some`. In a key, `None` is an error
//! ([`KeyError::MissingValue`]), never a part: many messages without the field would
//! otherwise share one key. A payload fingerprint (`fingerprint = "..."`, built with
//! [`KeyBuilder::fingerprint`]) has the same encoding but compares values rather than
//! identifying facts, so there `None` is a part of its own: tag `n` with no bytes. It
//! differs from the encoding of every `Some` (no other type uses the tag) and from a
//! fingerprint without the field (the part is counted). `Some(None)` of an
//! `Option<Option<T>>` encodes as `None`.
//!
//! A fixed-size array (`[u8; 16]`) encodes as the slice or the `Vec` of its elements, so a
//! producer holding a `Vec<u8>` derives the same key.
//!
//! Floats, hash maps and sets have no canonical encoding and do not implement [`KeyPart`]:
//! `0.1 + 0.2 != 0.3`, `-0.0 == 0.0` and a set's iteration order is unstable, so two
//! deliveries of the same fact could derive different keys.
//!
//! # Keys made only of timestamps
//!
//! A key must hold at least one part that is not an instant in time: two facts can happen
//! at the same instant and one fact can be stamped twice, so a key of timestamps alone
//! does not identify a business fact. `#[idempotent]` checks it at compile time. The
//! instants are `DateTime<Tz>` and `NaiveDateTime`, and what holds only instants: an
//! `Option`, a reference, a `Box`, a slice, an array or a `Vec` of them, and a type
//! deriving [`KeyPart`] with one field that is an instant (a newtype). So `key =
//! "created_at"`, `key = "created_at, updated_at"`, a `Vec<DateTime<Utc>>` alone and a
//! `struct Stamp(DateTime<Utc>)` alone are refused; `key = "order_id, created_at"` is
//! not. A `NaiveDate` names a business period (a daily report) and counts as identifying,
//! as do every other key part, a type deriving [`KeyPart`] with several fields and an
//! enum deriving it. The types that count as identifying implement [`SoleKeyPart`].
//!
//! # Deriving a key without the macro
//!
//! ```
//! use idem_runtime::key::KeyBuilder;
//!
//! let key = KeyBuilder::new()
//!     .part("order_id", "order-1")?
//!     .part("event_type", "paid")?
//!     .finish();
//! assert_eq!(key.to_string(), idem_runtime::key::key_of(&[&"order-1", &"paid"])?.to_string());
//! # Ok::<(), idem_runtime::KeyError>(())
//! ```

use std::fmt;

use sha2::{Digest, Sha256};
use uuid::Uuid;

pub(crate) mod definition;
pub(crate) mod event_time;
pub(crate) mod handler_key;
pub(crate) mod shape;
pub use event_time::EventTime;
pub use handler_key::HandlerKey;
pub use shape::{KeyPartShape, UNKNOWN_SHAPE};

/// The prefix that versions the encoding.
pub const ENCODING_V1: &[u8] = b"idem:v1";

/// An idempotency key: the digest of a message's key parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Uuid);

impl IdempotencyKey {
    /// Wraps a UUID computed elsewhere (for example a key stamped by a producer).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The key as a UUID, as it is stored in the status table.
    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<IdempotencyKey> for Uuid {
    fn from(key: IdempotencyKey) -> Self {
        key.0
    }
}

/// Why a key could not be derived from a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A key field held no value (an `Option` that was `None`). Fingerprints encode
    /// `None` instead (see [`KeyBuilder::fingerprint`]), so only key fields fail this way.
    #[error(
        "key field `{field}` is missing: it is None, and a missing value would merge unrelated messages into one key"
    )]
    MissingValue {
        /// The key field, as written in the attribute.
        field: &'static str,
    },
    /// A part's encoding does not fit the format (over 4 GiB, or over 2^32 elements).
    #[error("key field `{field}` is too large to encode")]
    TooLarge {
        /// The key field, as written in the attribute.
        field: &'static str,
    },
}

/// Marker error of [`KeyPart::encode_key_part`]: the value is absent.
///
/// [`KeyBuilder`] turns it into [`KeyError::MissingValue`] naming the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingValue;

/// A value that may be part of an idempotency key: it has one canonical encoding.
///
/// Implemented for strings, integers, `bool`, `char`, [`Uuid`], chrono's `DateTime`,
/// `NaiveDateTime` and `NaiveDate`, slices, arrays and vectors of key parts, references,
/// `Box` and `Option` (where `None` is an error in a key, and a value of its own in a
/// payload fingerprint). Derive it for your own enums and structs with
/// `#[derive(idem_runtime::KeyPart)]`, which also implements [`KeyPartShape`]: the shape
/// of the encoding that a scope records, so that a changed type is noticed (see
/// [`scope`](crate::scope)). A `KeyPart` written by hand may implement [`KeyPartShape`]
/// as well.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "this key field has no canonical key encoding",
    note = "a key part must encode the same way on every delivery of the same fact: strings, integers, bool, char, Uuid, chrono dates and times, and types deriving `idem_runtime::KeyPart` can",
    note = "floats (rounding, -0.0, NaN) and hash maps or sets (unstable order) cannot; key on an integer amount in minor units, or on an id"
)]
pub trait KeyPart {
    /// Appends this value's canonical encoding (one part) to `encoder`.
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue>;
}

/// A key part that identifies something: every key part but an instant in time and what
/// holds only instants.
///
/// A key needs at least one such part: timestamps alone do not identify a business fact
/// (two facts can share an instant, one fact can be stamped twice), so `#[idempotent]`
/// refuses a key whose every part lacks this trait, at compile time (the rule and the
/// list of instants are in the [module docs](crate::key#keys-made-only-of-timestamps)).
///
/// Implemented by every [`KeyPart`] of this crate except `DateTime<Tz>` and
/// `NaiveDateTime`, and by `Option<T>`, `&T`, `Box<T>`, `[T]`, `[T; N]` and `Vec<T>` when
/// `T` implements it. `#[derive(KeyPart)]` implements it for an enum, for a struct with
/// several fields, and for a struct with one field when that field's type implements it.
/// Implement it for your own `KeyPart` types that are not instants.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is an instant in time, which does not identify a business fact on its own",
    label = "a key needs a part that is not a timestamp",
    note = "two facts can happen at the same instant and one fact can be stamped twice: key on the business id, e.g. `key = \"order_id, created_at\"`"
)]
pub trait SoleKeyPart: KeyPart {}

/// The bytes an encoder reserves at its first part: a key of a few ids and names.
const PARTS_CAPACITY: usize = 128;

/// Writes parts in the canonical encoding. See the [module docs](self) for the format.
#[derive(Debug, Default)]
pub struct KeyEncoder {
    bytes: Vec<u8>,
    count: u32,
    too_large: bool,
    /// Encoding a payload fingerprint: an absent value is a part (tag `n`), not an error.
    fingerprint: bool,
}

impl KeyEncoder {
    fn push_part(&mut self, tag: u8, bytes: &[u8]) {
        let Ok(len) = u32::try_from(bytes.len()) else {
            self.too_large = true;
            return;
        };
        if self.bytes.capacity() == 0 {
            // Room for a key of a few parts at once, instead of growing part by part.
            self.bytes.reserve(PARTS_CAPACITY.max(5 + bytes.len()));
        }
        self.bytes.push(tag);
        self.bytes.extend_from_slice(&len.to_be_bytes());
        self.bytes.extend_from_slice(bytes);
        self.count += 1;
    }

    /// Appends a string part (tag `s`).
    pub fn string(&mut self, value: &str) {
        self.push_part(b's', value.as_bytes());
    }

    /// Appends an integer part (tag `i`).
    pub fn integer(&mut self, value: i128) {
        self.push_part(b'i', itoa::Buffer::new().format(value).as_bytes());
    }

    /// Appends an unsigned integer part (tag `i`); the same encoding as [`Self::integer`].
    pub fn unsigned(&mut self, value: u128) {
        self.push_part(b'i', itoa::Buffer::new().format(value).as_bytes());
    }

    /// Appends a boolean part (tag `b`).
    pub fn boolean(&mut self, value: bool) {
        self.push_part(b'b', &[u8::from(value)]);
    }

    /// Appends a UUID part (tag `u`).
    pub fn uuid(&mut self, value: &Uuid) {
        self.push_part(b'u', value.as_bytes());
    }

    /// Appends an instant part (tag `t`): nanoseconds since the Unix epoch, UTC.
    pub fn instant_nanos(&mut self, nanos_since_epoch: i128) {
        self.push_part(
            b't',
            itoa::Buffer::new().format(nanos_since_epoch).as_bytes(),
        );
    }

    /// Appends a calendar date part (tag `d`).
    pub fn date(&mut self, year: i32, month: u32, day: u32) {
        self.push_part(b'd', format!("{year:04}-{month:02}-{day:02}").as_bytes());
    }

    /// Appends an absent value (`None`): in a payload fingerprint, a part with tag `n` and
    /// no bytes; in a key, the error [`MissingValue`], since many messages without the
    /// value would otherwise share one key.
    pub fn absent(&mut self) -> Result<(), MissingValue> {
        if !self.fingerprint {
            return Err(MissingValue);
        }
        self.push_part(b'n', &[]);
        Ok(())
    }

    /// Appends a list part (tag `l`) whose elements `encode` writes into a nested encoder.
    pub fn list(
        &mut self,
        encode: impl FnOnce(&mut KeyEncoder) -> Result<(), MissingValue>,
    ) -> Result<(), MissingValue> {
        let mut nested = KeyEncoder {
            fingerprint: self.fingerprint,
            ..KeyEncoder::default()
        };
        encode(&mut nested)?;
        self.too_large |= nested.too_large;
        let mut bytes = Vec::with_capacity(4 + nested.bytes.len());
        bytes.extend_from_slice(&nested.count.to_be_bytes());
        bytes.extend_from_slice(&nested.bytes);
        self.push_part(b'l', &bytes);
        Ok(())
    }
}

/// Derives an [`IdempotencyKey`] from named parts, in order.
///
/// This is what `#[idempotent(key = "...")]` generates; producers and tools call it to
/// compute the same key.
#[derive(Debug, Default)]
pub struct KeyBuilder {
    encoder: KeyEncoder,
}

impl KeyBuilder {
    /// Starts an empty key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts an empty payload fingerprint (`fingerprint = "..."`): the key encoding,
    /// except that an absent value (`None`) is a part of its own (tag `n`, see the
    /// [module docs](self)) instead of [`KeyError::MissingValue`]. A fingerprint compares
    /// payloads, so "no value" is one of the values it compares.
    ///
    /// ```
    /// use idem_runtime::key::KeyBuilder;
    ///
    /// let none: Option<i64> = None;
    /// let absent = KeyBuilder::fingerprint().part("discount", &none)?.digest();
    /// let zero = KeyBuilder::fingerprint().part("discount", &Some(0_i64))?.digest();
    /// assert_ne!(absent, zero);
    /// assert!(KeyBuilder::new().part("discount", &none).is_err());
    /// # Ok::<(), idem_runtime::KeyError>(())
    /// ```
    pub fn fingerprint() -> Self {
        KeyBuilder {
            encoder: KeyEncoder {
                fingerprint: true,
                ..KeyEncoder::default()
            },
        }
    }

    /// Appends the part `value`; `field` names it in errors only (it is not encoded).
    pub fn part<P: KeyPart + ?Sized>(
        mut self,
        field: &'static str,
        value: &P,
    ) -> Result<Self, KeyError> {
        value
            .encode_key_part(&mut self.encoder)
            .map_err(|MissingValue| KeyError::MissingValue { field })?;
        if self.encoder.too_large {
            return Err(KeyError::TooLarge { field });
        }
        Ok(self)
    }

    /// The canonical encoding of the parts so far (see the [module docs](self)).
    pub fn encoding(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(ENCODING_V1.len() + 4 + self.encoder.bytes.len());
        bytes.extend_from_slice(ENCODING_V1);
        bytes.extend_from_slice(&self.encoder.count.to_be_bytes());
        bytes.extend_from_slice(&self.encoder.bytes);
        bytes
    }

    /// The SHA-256 digest of the encoding, used as a payload fingerprint.
    pub fn digest(&self) -> [u8; 32] {
        // The encoding, digested as it is laid out, without copying it first.
        let mut digest = Sha256::new();
        digest.update(ENCODING_V1);
        digest.update(self.encoder.count.to_be_bytes());
        digest.update(&self.encoder.bytes);
        digest.finalize().into()
    }

    /// Digests the parts into the key.
    pub fn finish(self) -> IdempotencyKey {
        let digest = self.digest();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        IdempotencyKey(uuid::Builder::from_custom_bytes(first).into_uuid())
    }
}

/// Derives the key of unnamed parts in one call.
///
/// ```
/// let key = idem_runtime::key::key_of(&[&"order-1", &42_i64])?;
/// # Ok::<(), idem_runtime::KeyError>(())
/// ```
pub fn key_of(parts: &[&dyn KeyPart]) -> Result<IdempotencyKey, KeyError> {
    parts
        .iter()
        .try_fold(KeyBuilder::new(), |builder, part| builder.part("", *part))
        .map(KeyBuilder::finish)
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        (**self).encode_key_part(encoder)
    }
}
impl<T: SoleKeyPart + ?Sized> SoleKeyPart for &T {}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        (**self).encode_key_part(encoder)
    }
}
impl<T: SoleKeyPart + ?Sized> SoleKeyPart for Box<T> {}

/// `Some` encodes as its value. `None` is an error in a key (many messages with a missing
/// field must not share a key) and a part of its own in a fingerprint: see
/// [`KeyEncoder::absent`].
impl<T: KeyPart> KeyPart for Option<T> {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        match self {
            Some(value) => value.encode_key_part(encoder),
            None => encoder.absent(),
        }
    }
}
impl<T: SoleKeyPart> SoleKeyPart for Option<T> {}

impl KeyPart for str {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.string(self);
        Ok(())
    }
}
impl SoleKeyPart for str {}

impl KeyPart for String {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.string(self);
        Ok(())
    }
}
impl SoleKeyPart for String {}

impl KeyPart for char {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.string(self.encode_utf8(&mut [0; 4]));
        Ok(())
    }
}
impl SoleKeyPart for char {}

impl KeyPart for bool {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.boolean(*self);
        Ok(())
    }
}
impl SoleKeyPart for bool {}

impl KeyPart for Uuid {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.uuid(self);
        Ok(())
    }
}
impl SoleKeyPart for Uuid {}

impl KeyPart for IdempotencyKey {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.uuid(&self.0);
        Ok(())
    }
}
impl SoleKeyPart for IdempotencyKey {}

macro_rules! integer_key_parts {
    ($method:ident as $wide:ty: $($int:ty),*) => {$(
        impl KeyPart for $int {
            fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
                encoder.$method(<$wide>::from(*self));
                Ok(())
            }
        }
        impl SoleKeyPart for $int {}
    )*};
}
integer_key_parts!(integer as i128: i8, i16, i32, i64, i128);
integer_key_parts!(unsigned as u128: u8, u16, u32, u64, u128);

impl KeyPart for isize {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.integer(*self as i128);
        Ok(())
    }
}
impl SoleKeyPart for isize {}

impl KeyPart for usize {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.unsigned(*self as u128);
        Ok(())
    }
}
impl SoleKeyPart for usize {}

impl<T: KeyPart> KeyPart for [T] {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.list(|nested| {
            self.iter()
                .try_for_each(|item| item.encode_key_part(nested))
        })
    }
}
impl<T: SoleKeyPart> SoleKeyPart for [T] {}

/// Encodes as the slice of its elements: `[u8; 16]` and the `Vec<u8>` of the same bytes
/// give one key.
impl<T: KeyPart, const N: usize> KeyPart for [T; N] {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        self.as_slice().encode_key_part(encoder)
    }
}
impl<T: SoleKeyPart, const N: usize> SoleKeyPart for [T; N] {}

impl<T: KeyPart> KeyPart for Vec<T> {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        self.as_slice().encode_key_part(encoder)
    }
}
impl<T: SoleKeyPart> SoleKeyPart for Vec<T> {}

mod chrono_parts {
    use super::{KeyEncoder, KeyPart, MissingValue, SoleKeyPart};
    use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, TimeZone};

    fn nanos(seconds: i64, subsec_nanos: u32) -> i128 {
        i128::from(seconds) * 1_000_000_000 + i128::from(subsec_nanos)
    }

    /// An instant: equal instants in different time zones encode alike.
    impl<Tz: TimeZone> KeyPart for DateTime<Tz> {
        fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
            encoder.instant_nanos(nanos(self.timestamp(), self.timestamp_subsec_nanos()));
            Ok(())
        }
    }

    /// A wall-clock time read as UTC.
    impl KeyPart for NaiveDateTime {
        fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
            self.and_utc().encode_key_part(encoder)
        }
    }

    impl KeyPart for NaiveDate {
        fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
            encoder.date(self.year(), self.month(), self.day());
            Ok(())
        }
    }
    /// A calendar date names a business period (a daily report), unlike a bare instant.
    impl SoleKeyPart for NaiveDate {}
}

/// Whether two payload fingerprints tell different payloads apart: both known and not
/// equal. A side without a fingerprint (a handler that declares none) never differs.
pub(crate) fn fingerprints_differ(ours: Option<&[u8]>, theirs: Option<&[u8]>) -> bool {
    matches!((ours, theirs), (Some(ours), Some(theirs)) if ours != theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parts: &[&dyn KeyPart]) -> String {
        key_of(parts).unwrap().to_string()
    }

    #[test]
    fn encoding_is_length_prefixed_and_typed() {
        let builder = KeyBuilder::new()
            .part("a", "ab")
            .unwrap()
            .part("b", &7_u8)
            .unwrap();
        assert_eq!(
            builder.encoding(),
            b"idem:v1\x00\x00\x00\x02s\x00\x00\x00\x02abi\x00\x00\x00\x017".to_vec()
        );
    }

    #[test]
    fn separators_inside_values_do_not_collide() {
        assert_ne!(key(&[&"a_b", &"c"]), key(&[&"a", &"b_c"]));
        assert_ne!(key(&[&"ab"]), key(&[&"a", &"b"]));
        assert_ne!(key(&[&vec!["a", "b"]]), key(&[&"a", &"b"]));
    }

    #[test]
    fn types_are_tagged() {
        assert_ne!(key(&[&"1"]), key(&[&1_i32]));
        assert_ne!(key(&[&"true"]), key(&[&true]));
    }

    #[test]
    fn integer_widths_agree() {
        assert_eq!(key(&[&42_i32]), key(&[&42_u64]));
        assert_eq!(key(&[&-1_i8]), key(&[&-1_i128]));
        assert_eq!(key(&[&u128::MAX]), key(&[&u128::MAX]));
    }

    #[test]
    fn integers_and_instants_encode_as_their_decimal_text() {
        for value in [0, -1, i128::from(i64::MIN), i128::MIN, i128::MAX] {
            let mut encoder = KeyEncoder::default();
            encoder.integer(value);
            assert_eq!(encoder.bytes[5..], *value.to_string().as_bytes(), "{value}");
            let mut encoder = KeyEncoder::default();
            encoder.instant_nanos(value);
            assert_eq!(encoder.bytes[5..], *value.to_string().as_bytes(), "{value}");
        }
        let mut encoder = KeyEncoder::default();
        encoder.unsigned(u128::MAX);
        assert_eq!(encoder.bytes[5..], *u128::MAX.to_string().as_bytes());
    }

    #[test]
    fn the_digest_is_the_encodings() {
        let builder = KeyBuilder::fingerprint()
            .part("a", "ab")
            .unwrap()
            .part("b", &-7_i64)
            .unwrap();
        let digest: [u8; 32] = Sha256::digest(builder.encoding()).into();
        assert_eq!(builder.digest(), digest);
    }

    #[test]
    fn order_matters() {
        assert_ne!(key(&[&"a", &"b"]), key(&[&"b", &"a"]));
    }

    #[test]
    fn none_is_an_error_naming_the_field() {
        let missing: Option<&str> = None;
        let err = KeyBuilder::new().part("customer.id", &missing).unwrap_err();
        assert_eq!(
            err,
            KeyError::MissingValue {
                field: "customer.id"
            }
        );
        assert_eq!(key(&[&Some("x")]), key(&[&"x"]));
    }

    #[test]
    fn fingerprint_encodes_none_as_a_part_of_its_own() {
        let none: Option<i64> = None;
        let builder = KeyBuilder::fingerprint().part("discount", &none).unwrap();
        assert_eq!(
            builder.encoding(),
            b"idem:v1\x00\x00\x00\x01n\x00\x00\x00\x00".to_vec()
        );
        // A key still refuses it.
        assert_eq!(
            KeyBuilder::new().part("discount", &none).unwrap_err(),
            KeyError::MissingValue { field: "discount" }
        );
    }

    #[test]
    fn fingerprint_of_none_differs_from_every_value_and_from_an_absent_field() {
        fn fingerprint(parts: &[&dyn KeyPart]) -> [u8; 32] {
            parts
                .iter()
                .try_fold(KeyBuilder::fingerprint(), |builder, part| {
                    builder.part("", *part)
                })
                .unwrap()
                .digest()
        }
        let (none_int, none_str): (Option<i64>, Option<&str>) = (None, None);
        let none = fingerprint(&[&"eur", &none_int]);
        assert_ne!(none, fingerprint(&[&"eur", &Some(0_i64)]));
        assert_ne!(none, fingerprint(&[&"eur", &Some("")]));
        assert_ne!(none, fingerprint(&[&"eur", &Vec::<i64>::new()]));
        assert_ne!(
            none,
            fingerprint(&[&"eur"]),
            "a fingerprint without the field"
        );
        assert_eq!(none, fingerprint(&[&"eur", &none_str]), "None has no type");
        // `Some` encodes as its value, in a fingerprint as in a key.
        assert_eq!(
            fingerprint(&[&Some(5_i64)]),
            KeyBuilder::new().part("", &5_i64).unwrap().digest()
        );
        // Inside a list too.
        let list = vec![Some(1_i64), None];
        assert_ne!(fingerprint(&[&list]), fingerprint(&[&vec![Some(1_i64)]]));
        assert!(KeyBuilder::new().part("list", &list).is_err());
    }

    #[test]
    fn arrays_encode_as_their_slice_and_vec() {
        let bytes = [0xde_u8, 0xad, 0xbe, 0xef];
        assert_eq!(key(&[&bytes]), key(&[&bytes.to_vec()]));
        assert_eq!(key(&[&bytes]), key(&[&&bytes[..]]));
        let ids: [&str; 2] = ["a", "b"];
        assert_eq!(key(&[&ids]), "15ea568c-a614-86dd-aa31-6f678aeac200");
    }

    #[test]
    fn keys_are_version_8_uuids() {
        let uuid = key_of(&[&"order-1"]).unwrap().as_uuid();
        assert_eq!(uuid.get_version_num(), 8);
        assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122);
    }

    #[test]
    fn equal_instants_in_other_zones_agree() {
        use chrono::{FixedOffset, TimeZone, Utc};
        let utc = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        let plus2 = FixedOffset::east_opt(7200)
            .unwrap()
            .with_ymd_and_hms(2024, 5, 1, 14, 0, 0)
            .unwrap();
        assert_eq!(key(&[&utc]), key(&[&plus2]));
    }

    /// The vectors published in the module docs (and in the README).
    #[test]
    fn published_test_vectors() {
        use chrono::{TimeZone, Utc};
        let instant = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        let uuid = Uuid::parse_str("67e55044-10b1-426f-9247-bb680e5fe0c8").unwrap();
        let list = vec!["a", "b"];
        let vectors: &[(&[&dyn KeyPart], &str)] = &[
            (
                &[&"order-1", &"paid"],
                "804192a5-97d2-8f62-9aa5-941e1b1f8c6f",
            ),
            (&[&42_u16], "1b2737e7-042d-8386-a0ca-ba27dd08e7ce"),
            (&[&-7_i64, &true], "fe903395-f82a-858b-8557-c7929c9b2104"),
            (&[&uuid], "1bec8415-b00e-8060-8dbe-924fb9dc4bd1"),
            (
                &[&"order-1", &instant],
                "2118130b-707b-8234-abd6-fd25a4c6adf1",
            ),
            (&[&list], "15ea568c-a614-86dd-aa31-6f678aeac200"),
        ];
        for (parts, expected) in vectors {
            assert_eq!(key(parts), *expected);
        }
    }
}
