//! What `#[idempotent]` tells the runtime about a handler: its spec, how its result is
//! kept, and the bounds its generated code puts on the handler's types.
//!
//! A leaf of the crate: nothing here reads or writes the database. Generated code reaches
//! these items through the private module (see `private.rs`); none is a public API.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::outcome::HandlerResult;

/// The static description of one idempotent handler: what `#[idempotent]` passes to the
/// runners (a `const` built with [`HandlerSpec::new`] and the setters).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct HandlerSpec {
    /// The handler's stable identity in the status table.
    pub scope: &'static str,
    /// Overrides [`Config::max_attempts`](crate::config::Config::max_attempts).
    pub max_attempts: Option<u32>,
    /// How the handler uses the handle's Redis cache (feature `redis`).
    pub cache: CachePolicy,
    /// Lease mode: how long a claim holds the key; `None`: [`DEFAULT_LEASE`].
    pub lease: Option<Duration>,
    /// Whether other handlers may use the same scope on purpose (`shared_scope = true`).
    /// Without it, two handlers using one scope are refused with
    /// [`Error::ScopeConflict`](crate::Error::ScopeConflict).
    pub shared_scope: bool,
    /// The module that declares the handler (`module_path!()`): its crate is recorded as
    /// the scope's owner in the database, so that another service cannot use the scope
    /// unknowingly.
    pub declared_in: Option<&'static str>,
    /// How long the handler's `success` keys are kept before the retention cleanup may
    /// delete them (`retention = "30d"`), instead of the cleanup's default window: see
    /// [`retention`](crate::retention).
    pub retention: Option<Duration>,
    /// Whether the scope is the default one (the handler's module path and name), which
    /// renaming or moving the handler changes: see [`scope`](crate::scope).
    pub default_scope: bool,
}

impl HandlerSpec {
    /// A handler with scope `scope` and the handle's defaults for everything else.
    pub const fn new(scope: &'static str) -> Self {
        HandlerSpec {
            scope,
            max_attempts: None,
            cache: CachePolicy::Inherit,
            lease: None,
            shared_scope: false,
            declared_in: None,
            retention: None,
            default_scope: false,
        }
    }

    /// The scope is the default one, derived from the handler's module path and name.
    pub const fn default_scope(mut self) -> Self {
        self.default_scope = true;
        self
    }

    /// Failed attempts before the key is parked, instead of the handle's setting.
    pub const fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// The handler's use of the Redis cache.
    pub const fn cache(mut self, cache: CachePolicy) -> Self {
        self.cache = cache;
        self
    }

    /// Lease mode: the lease a claim takes on its key.
    pub const fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Lets other handlers that also declare it share this scope.
    pub const fn shared_scope(mut self) -> Self {
        self.shared_scope = true;
        self
    }

    /// The module that declares the handler, as `module_path!()` gives it.
    pub const fn declared_in(mut self, module_path: &'static str) -> Self {
        self.declared_in = Some(module_path);
        self
    }

    /// The retention window of the handler's `success` keys. Recorded with the scope in
    /// the database when the handler first runs, where every cleaner reads it.
    pub const fn retention(mut self, window: Duration) -> Self {
        self.retention = Some(window);
        self
    }

    /// The lease of a lease-mode claim.
    pub(crate) fn lease_or_default(&self) -> Duration {
        self.lease.unwrap_or(DEFAULT_LEASE)
    }
}

/// The lease of a lease-mode handler that does not set one (`lease = "..."`). The one
/// default: the attribute passes no lease when none is written.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How one handler uses the runtime handle's Redis cache.
///
/// `#[idempotent]` leaves the spec at [`CachePolicy::Inherit`] unless the handler says
/// otherwise with `cache = false` ([`CachePolicy::Off`]) or `cache_ttl = "..."`
/// ([`CachePolicy::Ttl`]). Without a cache on the handle, every policy means "no cache".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Use the handle's cache, with its TTL.
    #[default]
    Inherit,
    /// Neither read nor write the cache for this handler.
    Off,
    /// Use the handle's cache, with this TTL for this handler's entries.
    Ttl(Duration),
}

/// A handler-level cache argument of `#[idempotent]`. Implemented only with the `redis`
/// feature, so that using such an argument without it is a compile error naming it.
#[diagnostic::on_unimplemented(
    message = "`cache` and `cache_ttl` in #[idempotent] need the `redis` feature of idem-runtime",
    label = "this argument configures the Redis cache of duplicates",
    note = "enable the feature in Cargo.toml: `idem-runtime = {{ version = \"0.1\", features = [\"redis\"] }}`, or remove the argument"
)]
pub trait HandlerCacheOption {
    /// The policy the argument stands for.
    fn policy(self) -> CachePolicy;
}

/// `cache = true | false`.
#[derive(Debug, Clone, Copy)]
pub struct CacheSwitch(pub bool);

/// `cache_ttl = "..."`, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct CacheTtlMillis(pub u64);

#[cfg(feature = "redis")]
impl HandlerCacheOption for CacheSwitch {
    fn policy(self) -> CachePolicy {
        if self.0 {
            CachePolicy::Inherit
        } else {
            CachePolicy::Off
        }
    }
}

#[cfg(feature = "redis")]
impl HandlerCacheOption for CacheTtlMillis {
    fn policy(self) -> CachePolicy {
        CachePolicy::Ttl(Duration::from_millis(self.0))
    }
}

/// The policy of a handler-level cache argument (what `#[idempotent]` generates a call of).
pub fn handler_cache<O: HandlerCacheOption>(option: O) -> CachePolicy {
    option.policy()
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

/// An owned parameter of a transactional handler (`event: OrderEvent`, `limits: Limits`):
/// each run of the body gets its own clone.
///
/// The body of a transactional handler may run more than once: again after a
/// serialization failure or a deadlock rolled the earlier run back, and, in a batch, once
/// in the batch and again on its own after another message failed. Each run takes a
/// fresh clone of the owned parameters, so the body may move out of its copy. (The
/// `<handler>_batch` of `batch = true` borrows its messages from a slice, so a message
/// taken by value is cloned for each run too.) A lease-mode body runs once and takes its
/// parameters as they are.
#[diagnostic::on_unimplemented(
    message = "the owned parameter `{Self}` of a transactional handler must implement `Clone`",
    label = "each run of the body gets its own clone of this parameter",
    note = "the body runs again after a serialization failure or a deadlock rolled the earlier run back (and a batch runs it again one message at a time after a failure), so every run takes a fresh clone of the parameters taken by value",
    note = "derive or implement `Clone` for `{Self}`, or take the parameter by reference (`&{Self}`)"
)]
pub trait ClonedForEachRun: Clone {}

#[diagnostic::do_not_recommend]
impl<T: Clone> ClonedForEachRun for T {}

/// The copy of an owned parameter that one run of the body takes.
pub fn clone_for_run<T: ClonedForEachRun>(value: &T) -> T {
    value.clone()
}
