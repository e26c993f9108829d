//! A key from field values as a producer gives them, derived as `#[idempotent]` derives
//! it.

use chrono::DateTime;
use uuid::Uuid;

use super::AdminError;
use crate::key::{IdempotencyKey, KeyPart, key_of};

/// One key field value as a producer gives it: `name=value` (a string),
/// `name:type=value` with type `str`, `int`, `bool`, `uuid`, `date` (`YYYY-MM-DD`) or
/// `time` (RFC 3339), or a bare `value` (a string).
///
/// Only the values, their types and their order make the key (names are for reading):
/// give them in the order of the handler's `key = "..."`.
///
/// ```
/// use idem_runtime::admin::{KeyField, key_from_fields};
/// use idem_runtime::key::KeyBuilder;
///
/// let fields = ["order_id=order-1", "seq:int=42"].map(|f| KeyField::parse(f).unwrap());
/// let expected = KeyBuilder::new().part("order_id", "order-1")?.part("seq", &42_i64)?.finish();
/// assert_eq!(key_from_fields(&fields)?, expected);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct KeyField {
    /// The field's name, as given (not part of the key).
    pub name: String,
    /// The typed value.
    pub value: FieldValue,
}

/// A typed key field value (see [`KeyField`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FieldValue {
    /// A string (`str`, `String`, `char`, a unit enum deriving `KeyPart`: its variant's name).
    Str(String),
    /// An integer of any width.
    Int(i128),
    /// A boolean.
    Bool(bool),
    /// A UUID.
    Uuid(Uuid),
    /// A calendar date.
    Date(chrono::NaiveDate),
    /// An instant.
    Time(DateTime<chrono::FixedOffset>),
}

impl KeyField {
    /// Parses `name=value`, `name:type=value` or `value`.
    pub fn parse(text: &str) -> Result<Self, AdminError> {
        let (head, value) = match text.split_once('=') {
            Some((head, value)) => (head, value),
            None => ("", text),
        };
        let (name, kind) = head.split_once(':').unwrap_or((head, "str"));
        let invalid = |what: &str| AdminError::KeyField(format!("{text:?}: {what}"));
        let value = match kind {
            "str" | "string" => FieldValue::Str(value.to_owned()),
            "int" => FieldValue::Int(value.parse().map_err(|_| invalid("not an integer"))?),
            "bool" => FieldValue::Bool(value.parse().map_err(|_| invalid("not true or false"))?),
            "uuid" => FieldValue::Uuid(value.parse().map_err(|_| invalid("not a UUID"))?),
            "date" => FieldValue::Date(
                value
                    .parse()
                    .map_err(|_| invalid("not a date (YYYY-MM-DD)"))?,
            ),
            "time" => FieldValue::Time(
                DateTime::parse_from_rfc3339(value)
                    .map_err(|_| invalid("not an RFC 3339 instant"))?,
            ),
            other => {
                return Err(invalid(&format!(
                    "unknown type `{other}`: use str, int, bool, uuid, date or time"
                )));
            }
        };
        Ok(KeyField {
            name: name.to_owned(),
            value,
        })
    }
}

/// The key of `fields`, in order: what `#[idempotent(key = "...")]` derives from a message
/// with these values (see [`key`](crate::key)).
pub fn key_from_fields(fields: &[KeyField]) -> Result<IdempotencyKey, AdminError> {
    if fields.is_empty() {
        return Err(AdminError::KeyField("no field given".to_owned()));
    }
    let parts: Vec<&dyn KeyPart> = fields
        .iter()
        .map(|field| match &field.value {
            FieldValue::Str(value) => value as &dyn KeyPart,
            FieldValue::Int(value) => value,
            FieldValue::Bool(value) => value,
            FieldValue::Uuid(value) => value,
            FieldValue::Date(value) => value,
            FieldValue::Time(value) => value,
        })
        .collect();
    Ok(key_of(&parts)?)
}
