//! The delivery whose body runs in the current task, for code that a handler's body calls
//! and that derives keys of its own from the fact being handled: an outbox stamping each
//! outgoing record with a key that every run of the same fact derives alike.
//!
//! The runtime sets it around each run of a transactional body (`#[idempotent]` without
//! `lease`, the per-message bodies of `batch = true`, and a batch handler's body, which
//! holds the keys of all its messages), in the task that runs the body. Outside a body,
//! and in a task the body spawns, there is none.
//!
//! ```
//! use idem_runtime::CurrentDelivery;
//!
//! // Not in a handler's body here.
//! assert!(CurrentDelivery::get().is_none());
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;

use uuid::Uuid;

use crate::key::{IdempotencyKey, KeyBuilder, KeyError};
use crate::runtime::Idem;

tokio::task_local! {
    static CURRENT: CurrentDelivery;
}

/// The delivery whose body runs in this task: its handle, its scope and its key (a batch
/// handler's body: the keys of its messages, in the order of its slice).
#[derive(Debug, Clone)]
pub struct CurrentDelivery {
    idem: Idem,
    scope: &'static str,
    keys: Keys,
    /// What the body left for its commit's round trip.
    at_commit: Arc<Mutex<Vec<Box<dyn AtCommit>>>>,
}

/// A write that a body leaves for its commit (see [`CurrentDelivery::at_commit`]): one
/// value per type and delivery, which the body's calls add to, and which gives the
/// commit one statement.
pub trait AtCommit: std::any::Any + Send + std::fmt::Debug {
    /// The statement to send in the commit's round trip, or `None` for nothing: one
    /// statement of a simple query (PostgreSQL's simple protocol), with no parameters and
    /// every value written into its text in a form that cannot be read as SQL.
    fn statement(&self) -> Option<String>;
}

#[derive(Debug, Clone)]
enum Keys {
    One(IdempotencyKey),
    /// A batch handler's body: the keys its transaction claimed, and the duplicates its
    /// claim found.
    Many {
        claimed: Arc<[IdempotencyKey]>,
        duplicates: Arc<[IdempotencyKey]>,
    },
}

/// The text that tells an outgoing key's encoding apart from every message's key.
const OUTGOING: &str = "idem:outgoing";

impl CurrentDelivery {
    /// The delivery whose body runs in this task, if any.
    pub fn get() -> Option<CurrentDelivery> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// The handle the delivery runs on.
    pub fn idem(&self) -> &Idem {
        &self.idem
    }

    /// The handler's scope.
    pub fn scope(&self) -> &str {
        self.scope
    }

    /// The keys of the delivery's messages: one, or a batch handler's, in the order of
    /// the slice its body received.
    pub fn keys(&self) -> &[IdempotencyKey] {
        match &self.keys {
            Keys::One(key) => std::slice::from_ref(key),
            Keys::Many { claimed, .. } => claimed,
        }
    }

    /// The keys that a batch handler's body holds, in the order of its slice: the keys its
    /// transaction claimed (a body runs only for the messages whose keys its transaction
    /// claimed). `None` for the body of one message (a handler of one message, and each
    /// body of `batch = true`), whose transaction claimed that message's key alone.
    pub fn batch_keys(&self) -> Option<&[IdempotencyKey]> {
        match &self.keys {
            Keys::One(_) => None,
            Keys::Many { claimed, .. } => Some(claimed),
        }
    }

    /// In a batch handler's body: the keys of the batch's other messages that its claim
    /// found already succeeded with the message's payload (duplicates of facts committed
    /// before, which the body does not receive), in message order; each key once, as the
    /// claim saw it. They stay done whatever this transaction does. `None` for the body
    /// of one message, as for [`batch_keys`](Self::batch_keys).
    ///
    /// With [`batch_keys`](Self::batch_keys), this tells a body which of its batch's
    /// messages are done once it commits without asking the database again.
    pub fn batch_duplicates(&self) -> Option<&[IdempotencyKey]> {
        match &self.keys {
            Keys::One(_) => None,
            Keys::Many { duplicates, .. } => Some(duplicates),
        }
    }

    /// The key of something the body derives from its message number `message` (0 for a
    /// handler of one message) under `name`: the same for every run of the same fact in
    /// the same scope, and different for every other name, fact or scope. `None` when the
    /// delivery has no message `message`.
    ///
    /// It is the key of the parts `"idem:outgoing"`, the scope, the message's key (a
    /// UUID part) and `name`, as [`KeyBuilder`] derives every key (see
    /// [`key`](crate::key)), so that a producer outside Rust can derive it too.
    pub fn derived_key(&self, message: usize, name: &str) -> Option<Uuid> {
        let key = self.keys().get(message)?;
        Some(outgoing_key(self.scope, *key, name))
    }

    /// Adds to the write of type `W` that this delivery's commit sends: `add` changes
    /// this delivery's `W` (made with `W::default()` on the first call). The commit sends
    /// its [`statement`](AtCommit::statement) in its own round trip, in the body's
    /// transaction, after the check that the transaction is intact and before `COMMIT`,
    /// with idem's lock timeout bounding its waits (the body ran with the session's own),
    /// and only if the body returned `Ok`; a failed or retried run drops it. Its failure
    /// fails the commit, as the body's own statements would.
    ///
    /// A write that needs nothing back saves its round trip so, and all of one kind go in
    /// one statement: idem-kafka's outbox writes the records of a body this way, in one
    /// statement that takes its locks in one order.
    pub fn at_commit<W: AtCommit + Default>(&self, add: impl FnOnce(&mut W)) {
        let mut writes = self
            .at_commit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let index = match writes
            .iter()
            .position(|write| (&**write as &dyn std::any::Any).is::<W>())
        {
            Some(index) => index,
            None => {
                writes.push(Box::new(W::default()));
                writes.len() - 1
            }
        };
        let write: &mut dyn std::any::Any = &mut *writes[index];
        if let Some(write) = write.downcast_mut::<W>() {
            add(write);
        }
    }

    /// The statements the body left for its commit, in the order of their first use;
    /// empties the list.
    pub(crate) fn take_at_commit(&self) -> Vec<String> {
        let writes = std::mem::take(
            &mut *self
                .at_commit
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        writes
            .iter()
            .filter_map(|write| write.statement())
            .collect()
    }

    pub(crate) fn one(idem: &Idem, scope: &'static str, key: IdempotencyKey) -> Self {
        CurrentDelivery {
            idem: idem.clone(),
            scope,
            keys: Keys::One(key),
            at_commit: Arc::default(),
        }
    }

    pub(crate) fn many(
        idem: &Idem,
        scope: &'static str,
        claimed: Vec<IdempotencyKey>,
        duplicates: Vec<IdempotencyKey>,
    ) -> Self {
        CurrentDelivery {
            idem: idem.clone(),
            scope,
            keys: Keys::Many {
                claimed: claimed.into(),
                duplicates: duplicates.into(),
            },
            at_commit: Arc::default(),
        }
    }

    /// Runs `future` (a body) with this delivery as the task's current one.
    pub(crate) async fn run<F: Future>(self, future: F) -> F::Output {
        CURRENT.scope(self, future).await
    }
}

/// The key that a body handling the fact `key` in `scope` derives under `name` (see
/// [`CurrentDelivery::derived_key`]).
pub(crate) fn outgoing_key(scope: &str, key: IdempotencyKey, name: &str) -> Uuid {
    let derived = || -> Result<IdempotencyKey, KeyError> {
        Ok(KeyBuilder::new()
            .part("kind", OUTGOING)?
            .part("scope", scope)?
            .part("key", &key.as_uuid())?
            .part("name", name)?
            .finish())
    };
    // Strings and UUIDs always encode: the parts cannot fail.
    derived()
        .map(|key| key.as_uuid())
        .unwrap_or_else(|_| unreachable!("strings and UUIDs are key parts"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outgoing_key_is_the_key_of_its_parts() {
        let fact = crate::key::key_of(&[&"order-1", &"paid"]).unwrap();
        let derived = outgoing_key("billing::apply", fact, "receipt");
        let by_hand =
            crate::key::key_of(&[&OUTGOING, &"billing::apply", &fact.as_uuid(), &"receipt"])
                .unwrap();
        assert_eq!(derived, by_hand.as_uuid());
        assert_ne!(derived, outgoing_key("billing::apply", fact, "stock"));
        assert_ne!(derived, outgoing_key("billing::other", fact, "receipt"));
        // A vector for producers outside Rust (the key docs' Python reference).
        assert_eq!(derived.to_string(), "1d505c2b-b185-8558-a667-85fa14342073");
    }
}
