//! What `#[idempotent]` tells the runtime about a handler.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::outcome::HandlerResult;

/// The static description of one idempotent handler.
#[derive(Debug, Clone, Copy)]
pub struct HandlerSpec {
    /// The handler's stable identity in the status table.
    pub scope: &'static str,
    /// Overrides [`Config::max_attempts`](crate::config::Config::max_attempts).
    pub max_attempts: Option<u32>,
}

/// How a handler's result is kept for replay to duplicates.
#[diagnostic::on_unimplemented(
    message = "the handler's result `{T}` cannot be stored for replay to duplicates",
    label = "duplicates of this handler receive the stored result",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{T}`, or add `store_result = false` to `#[idempotent(...)]` so duplicates get `Outcome::Duplicate(None)`"
)]
pub trait ResultCodec<T> {
    /// The JSON to store, or `None` to store nothing.
    fn encode(&self, value: &T) -> Result<Option<serde_json::Value>, serde_json::Error>;
    /// The value for a duplicate from the stored JSON (`None` if nothing was stored).
    fn decode(&self, stored: Option<serde_json::Value>) -> Result<Option<T>, serde_json::Error>;
}

/// Stores the result as JSON (`jsonb`) and replays it.
#[derive(Debug, Clone, Copy)]
pub struct JsonResult;

// Errors name `ResultCodec` (and its hint about `store_result = false`), not serde's traits.
#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned> ResultCodec<T> for JsonResult {
    fn encode(&self, value: &T) -> Result<Option<serde_json::Value>, serde_json::Error> {
        // `()` and `None` store nothing, which saves the write.
        serde_json::to_value(value).map(|json| (!json.is_null()).then_some(json))
    }

    fn decode(&self, stored: Option<serde_json::Value>) -> Result<Option<T>, serde_json::Error> {
        serde_json::from_value(stored.unwrap_or(serde_json::Value::Null)).map(Some)
    }
}

/// Stores nothing; duplicates get no value.
#[derive(Debug, Clone, Copy)]
pub struct NoResult;

impl<T> ResultCodec<T> for NoResult {
    fn encode(&self, _: &T) -> Result<Option<serde_json::Value>, serde_json::Error> {
        Ok(None)
    }

    fn decode(&self, _: Option<serde_json::Value>) -> Result<Option<T>, serde_json::Error> {
        Ok(None)
    }
}

/// The return type of a batch handler (one whose message parameter is a slice):
/// `Result<(), E>`.
///
/// The body runs once for all the new messages of a batch, so it has no value per
/// message to return, store or replay to duplicates.
#[diagnostic::on_unimplemented(
    message = "a batch handler must return `Result<(), E>`, not `{Self}`",
    label = "the body runs once for all the new messages of a batch: it has no value per message to return or to store",
    note = "declare the handler as `-> Result<(), E>`; for a value per message, stored and replayed to duplicates, take one message (`event: &Message`) and add `batch = true`, which generates `<handler>_batch` over a slice"
)]
pub trait BatchResult: HandlerResult<Value = ()> {
    /// The body's result as a `Result`.
    fn into_result(self) -> Result<(), Self::Error>;
}

impl<E> BatchResult for Result<(), E> {
    fn into_result(self) -> Result<(), E> {
        self
    }
}
