//! The handlers compiled into the binary: the scope of every `#[idempotent]` handler,
//! registered by the code the attribute generates, whether or not it has run.
//!
//! The runtime asks it two things that a process cannot learn from the handlers that
//! happened to run so far:
//!
//! - whether a scope recorded in the database still has a handler here. A handler without
//!   `scope` whose default scope has no keys, while a scope of its crate with the same
//!   message type and key has keys and no handler in the binary, is that handler renamed
//!   or moved, and is refused (see [`scope`](crate::scope)); a second handler of the
//!   same message and key (a fan-out) finds the first one's scope here, and runs;
//! - how many handlers of the binary declare a scope: with one, a scope whose recorded
//!   handler is not this one belongs to a handler renamed or moved (its `scope` kept), and
//!   the renamed handler takes it over; with several, the recorded handler may be the
//!   other one, and the scope is refused as shared by accident.
//!
//! The entries are collected before `main` by `inventory` from every crate linked in. A
//! handler of a library that the binary never calls may be left out by the linker, with
//! its code: such a handler cannot run here either.

use std::collections::HashMap;
use std::sync::OnceLock;

/// One handler compiled into the binary, as `#[idempotent]` registers it.
#[derive(Debug)]
pub struct RegisteredHandler {
    scope: &'static str,
}

impl RegisteredHandler {
    /// The handler whose scope is `scope`.
    pub const fn new(scope: &'static str) -> Self {
        RegisteredHandler { scope }
    }
}

inventory::collect!(RegisteredHandler);

/// The scopes of the handlers compiled into the binary, with how many handlers declare
/// each (read once).
#[derive(Debug)]
pub(crate) struct Registry {
    scopes: HashMap<&'static str, usize>,
    names: Vec<String>,
}

impl Registry {
    /// The binary's registry.
    pub(crate) fn get() -> &'static Registry {
        static REGISTRY: OnceLock<Registry> = OnceLock::new();
        REGISTRY.get_or_init(|| {
            let mut scopes = HashMap::new();
            for handler in inventory::iter::<RegisteredHandler> {
                *scopes.entry(handler.scope).or_insert(0) += 1;
            }
            let mut names: Vec<String> = scopes.keys().map(|scope| (*scope).to_owned()).collect();
            names.sort();
            Registry { scopes, names }
        })
    }

    /// How many handlers of the binary declare `scope`.
    pub(crate) fn handlers_of(&self, scope: &str) -> usize {
        self.scopes.get(scope).copied().unwrap_or(0)
    }

    /// Every scope of the binary's handlers, sorted.
    pub(crate) fn scopes(&self) -> &[String] {
        &self.names
    }
}
