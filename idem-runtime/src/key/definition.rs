//! A scope's key definition: what its keys are made of, as the status table records it.
//!
//! The text names the encoding's version, the key's field paths in order with each part's
//! [shape](super::shape), and the payload fingerprint's fields likewise:
//!
//! ```text
//! idem:v1 key(order_id s, event_type s) fingerprint(amount_cents i)
//! ```
//!
//! A handler whose keys are kept by the fact's time (`event_time = "created_at"`) adds
//! the field that buckets them, ` time(created_at)`: its keys live in another table, so
//! declaring or removing `event_time` on a scope with keys is a change like any other.
//!
//! Two definitions that differ derive other keys (or other fingerprints) for the same
//! facts, with two exceptions that keep the keys: a field renamed with its type and
//! position kept, and a part whose type changes to one of the same shape (`i32` to
//! `i64`, `String` to an enum of unit variants). The first is refused like any change
//! (the field's name is what tells a reader what the key is made of); the second passes.

use std::fmt;

use super::ENCODING_V1;

/// One part of a key or fingerprint: the field path as written in the attribute, and the
/// function that writes its shape.
pub type DefinedPart = (&'static str, fn(&mut String));

/// The parts of a handler's key, previous key and fingerprint, and its message type, as
/// generated code describes them (without a message's values).
#[derive(Clone, Copy)]
pub struct KeyLayout<'a> {
    /// The key's parts, in order.
    pub key: &'a [DefinedPart],
    /// The fingerprint's parts, where the handler declares one.
    pub fingerprint: Option<&'a [DefinedPart]>,
    /// The parts of the key the handler's keys were derived with before
    /// (`previous_key = "..."`), where it declares one.
    pub previous_key: Option<&'a [DefinedPart]>,
    /// The message type's name, as `std::any::type_name` gives it.
    pub message_type: fn() -> &'static str,
    /// The key field that holds the fact's time (`event_time = "..."`), where the handler
    /// declares one: its keys are kept in time buckets.
    pub event_time: Option<&'static str>,
    /// The field that held the fact's time under the previous key definition
    /// (`previous_event_time = "..."`), where the handler declares one: the previous keys
    /// are in the time buckets too, in the bucket of the same time. Without it, the
    /// previous keys are in the status table (a handler that moved its keys into the
    /// time buckets).
    pub previous_event_time: Option<&'static str>,
}

impl KeyLayout<'_> {
    /// The handler's key definition.
    pub(crate) fn current(&self) -> KeyDefinition {
        KeyDefinition::new(self.key, self.fingerprint).timed(self.event_time)
    }

    /// The definition its keys were derived with before (`previous_key`), with the same
    /// fingerprint, and the time part where those keys are in the time buckets too
    /// (`previous_event_time`).
    pub(crate) fn previous(&self) -> Option<KeyDefinition> {
        self.previous_key.map(|previous| {
            KeyDefinition::new(previous, self.fingerprint).timed(self.previous_event_time)
        })
    }

    /// Whether the previous definition's keys are in the time buckets
    /// (`previous_event_time`); without it, in the status table.
    pub(crate) fn previous_timed(&self) -> bool {
        self.previous_event_time.is_some()
    }
}

impl fmt::Debug for KeyLayout<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLayout")
            .field("current", &self.current())
            .field("previous", &self.previous())
            .field("message_type", &(self.message_type)())
            .field("event_time", &self.event_time)
            .field("previous_event_time", &self.previous_event_time)
            .finish()
    }
}

/// The recorded form of a key's layout (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct KeyDefinition(String);

impl KeyDefinition {
    /// The definition of a key of parts `key` with the fingerprint `fingerprint`.
    pub(crate) fn new(key: &[DefinedPart], fingerprint: Option<&[DefinedPart]>) -> Self {
        let mut text = String::from_utf8_lossy(ENCODING_V1).into_owned();
        text.push_str(" key");
        parts(&mut text, key);
        if let Some(fingerprint) = fingerprint {
            text.push_str(" fingerprint");
            parts(&mut text, fingerprint);
        }
        KeyDefinition(text)
    }

    /// The definition with the time part ` time(field)` where `event_time` names one.
    fn timed(mut self, event_time: Option<&str>) -> Self {
        if let Some(field) = event_time {
            self.0.push_str(" time(");
            self.0.push_str(field);
            self.0.push(')');
        }
        self
    }

    /// The text, as the status table records it.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyDefinition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn parts(text: &mut String, parts: &[DefinedPart]) {
    text.push('(');
    for (index, (path, shape)) in parts.iter().enumerate() {
        if index > 0 {
            text.push_str(", ");
        }
        text.push_str(path);
        text.push(' ');
        shape(text);
    }
    text.push(')');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_the_version_fields_and_shapes() {
        let key: [DefinedPart; 2] = [
            ("order_id", |shape| shape.push('s')),
            ("event.no", |shape| shape.push('i')),
        ];
        let fingerprint: [DefinedPart; 1] = [("amount_cents", |shape| shape.push('i'))];
        let previous: [DefinedPart; 1] = [("order_id", |shape| shape.push('s'))];
        let layout = KeyLayout {
            key: &key,
            fingerprint: Some(&fingerprint),
            previous_key: Some(&previous),
            message_type: std::any::type_name::<u8>,
            event_time: None,
            previous_event_time: None,
        };
        assert_eq!(
            layout.current().as_str(),
            "idem:v1 key(order_id s, event.no i) fingerprint(amount_cents i)"
        );
        assert_eq!(
            layout.previous().unwrap().as_str(),
            "idem:v1 key(order_id s) fingerprint(amount_cents i)"
        );
        assert_eq!(
            KeyDefinition::new(&key, None).as_str(),
            "idem:v1 key(order_id s, event.no i)"
        );
    }
}
