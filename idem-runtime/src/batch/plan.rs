//! The plan of a batch: each message's key, the duplicates inside the batch, the keys
//! another delivery of the process holds, and every message's outcome in the end.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::BatchOutcomes;
use crate::Idem;
use crate::handler::ResultCodec;
use crate::inflight::KeyTurn;
use crate::key::handler_key::MessageKeys;
use crate::key::{IdempotencyKey, KeyError};
use crate::outcome::{Error, Outcome};
use crate::scope;

/// A message's key, payload fingerprint and fact's time, as the handler derives them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Derived {
    pub(super) key: IdempotencyKey,
    pub(super) fingerprint: Option<[u8; 32]>,
    /// The fact's time, where the handler keeps its keys by it (`event_time`).
    pub(super) fact_time: Option<DateTime<Utc>>,
}

/// One message's outcome, with its index in the batch.
pub(super) type Indexed<T, E> = (usize, Result<Outcome<T>, Error<E>>);

/// What happens to one message of the batch.
enum Plan {
    /// Decided before the batch transaction (key error, payload mismatch inside the batch).
    Done,
    /// A duplicate of the message at this earlier index of the batch.
    SameAs(usize),
    /// A later message of the key of the message at this earlier index, with another
    /// payload: a payload mismatch, unless the first was a payload mismatch itself (the
    /// key was recorded with a third payload, or with this one's). Then it is decided on
    /// its own, after the batch, as it would be one message at a time. A first message
    /// that is to be retried keeps its key's turn: the later one is a mismatch, as it
    /// would be once the first one runs.
    Differs(usize),
    /// Claimed, or to be decided by the claim.
    Claim,
}

/// The messages of a batch with their keys, and the outcomes decided so far.
pub(super) struct Planned<T, E> {
    outcomes: Vec<Option<Result<Outcome<T>, Error<E>>>>,
    derived: Vec<Option<Derived>>,
    /// Each message's key under the handler's previous key definition.
    previous: Vec<Option<IdempotencyKey>>,
    plans: Vec<Plan>,
}

/// Every message refused for the same reason (the handler's scope is not its own).
pub(super) fn refuse_all<M, T, E>(messages: &[M], error: scope::Error) -> BatchOutcomes<T, E> {
    match error {
        scope::Error::Refused(refusal) => messages
            .iter()
            .map(|_| Err(refusal.clone().into()))
            .collect(),
        scope::Error::Database(error) => {
            let text = error.to_string();
            messages
                .iter()
                .map(|_| Err(Error::Database(sqlx::Error::Protocol(text.clone()))))
                .collect()
        }
    }
}

impl<T, E> Planned<T, E> {
    /// Derives every message's key; decides key errors and duplicates inside the batch.
    /// `event_time`: the field that holds the fact's time, where the handler keeps its
    /// keys by it (a message without a time has no key there).
    pub(super) fn new<'m, M>(
        messages: &'m [M],
        event_time: Option<&'static str>,
        mut derive: impl FnMut(&'m M) -> Result<MessageKeys, KeyError>,
    ) -> Self {
        let mut planned = Planned {
            outcomes: messages.iter().map(|_| None).collect(),
            derived: Vec::with_capacity(messages.len()),
            previous: Vec::with_capacity(messages.len()),
            plans: Vec::with_capacity(messages.len()),
        };
        let mut first_of_key: HashMap<IdempotencyKey, usize, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(messages.len(), Default::default());
        for (index, message) in messages.iter().enumerate() {
            let derived = derive(message).and_then(|keys| match (event_time, keys.fact_time) {
                (Some(field), None) => Err(KeyError::MissingValue { field }),
                _ => Ok(keys),
            });
            match derived {
                Err(error) => {
                    planned.outcomes[index] = Some(Err(Error::Key(error)));
                    planned.derived.push(None);
                    planned.previous.push(None);
                    planned.plans.push(Plan::Done);
                }
                // A key is one fact's: its time is one of the key's fields, so a duplicate
                // inside the batch has the first one's time.
                Ok(MessageKeys {
                    key,
                    fingerprint,
                    previous,
                    fact_time,
                }) => {
                    planned.previous.push(previous);
                    match first_of_key.get(&key) {
                        Some(&first) => {
                            let theirs = planned.derived[first].and_then(|first| first.fingerprint);
                            let same_payload = match (theirs, fingerprint) {
                                (Some(theirs), Some(ours)) => theirs == ours,
                                _ => true,
                            };
                            planned.plans.push(if same_payload {
                                Plan::SameAs(first)
                            } else {
                                Plan::Differs(first)
                            });
                        }
                        None => {
                            first_of_key.insert(key, index);
                            planned.plans.push(Plan::Claim);
                        }
                    }
                    planned.derived.push(Some(Derived {
                        key,
                        fingerprint,
                        fact_time,
                    }));
                }
            }
        }
        planned
    }

    /// The messages whose keys the batch claims, in message order. A key that another
    /// delivery of this process is working on is not waited for: its message gets
    /// [`Error::InProgress`] and the rest of the batch goes on. The turns taken end when
    /// the batch transaction does (before a one-by-one pass, which takes them again).
    pub(super) fn take_turns<'i>(
        &mut self,
        idem: &'i Idem,
        scope: &'static str,
    ) -> (Vec<usize>, Vec<KeyTurn<'i>>) {
        let mut to_claim = Vec::with_capacity(self.plans.len());
        let mut turns = Vec::with_capacity(self.plans.len());
        for index in 0..self.plans.len() {
            if !matches!(self.plans[index], Plan::Claim) {
                continue;
            }
            let key = self.keyed(index).key;
            if let Some(turn) = idem.in_flight().try_take(scope, key.as_uuid()) {
                to_claim.push(index);
                turns.push(turn);
            } else {
                self.outcomes[index] = Some(Err(Error::InProgress { key }));
                self.plans[index] = Plan::Done;
            }
        }
        (to_claim, turns)
    }

    /// The keys of a message that has a key, as a delivery on its own claims them.
    pub(super) fn message_keys(&self, index: usize) -> MessageKeys {
        let Derived {
            key,
            fingerprint,
            fact_time,
        } = self.keyed(index);
        MessageKeys {
            key,
            fingerprint,
            previous: self.previous[index],
            fact_time,
        }
    }

    /// The key, fingerprint and fact's time of a message that has a key.
    pub(super) fn keyed(&self, index: usize) -> Derived {
        self.derived[index].expect("claimed messages have keys")
    }

    pub(super) fn decide(&mut self, decided: impl IntoIterator<Item = Indexed<T, E>>) {
        for (index, outcome) in decided {
            self.outcomes[index] = Some(outcome);
        }
    }

    /// Once the batch's messages are decided: the later messages of a key with another
    /// payload than its first message's, where the first one was a payload mismatch
    /// itself (the key is recorded with another payload than the first's, maybe theirs).
    /// Each is to be decided on its own.
    pub(super) fn alone(&self) -> Vec<usize> {
        (0..self.plans.len())
            .filter(|&index| match self.plans[index] {
                Plan::Differs(first) => {
                    matches!(
                        self.outcomes[first],
                        Some(Err(Error::PayloadMismatch { .. }))
                    )
                }
                _ => false,
            })
            .collect()
    }

    /// Every message's outcome, in order: duplicates inside the batch share the outcome
    /// of the first message with their key, and a later message with another payload
    /// than the first's is a payload mismatch unless it was decided on its own.
    pub(super) fn finish<C: ResultCodec<T>>(mut self, codec: &C) -> BatchOutcomes<T, E> {
        for index in 0..self.plans.len() {
            if let Plan::Differs(_) = self.plans[index]
                && self.outcomes[index].is_none()
            {
                let key = self.keyed(index).key;
                self.outcomes[index] = Some(Err(Error::PayloadMismatch { key }));
            }
            if let Plan::SameAs(first) = self.plans[index] {
                let key = self.keyed(index).key;
                self.outcomes[index] = Some(match &self.outcomes[first] {
                    Some(Ok(Outcome::Executed(value) | Outcome::Duplicate(Some(value)))) => {
                        replay(codec, key, value)
                    }
                    Some(Ok(Outcome::Duplicate(None))) | None => Ok(Outcome::Duplicate(None)),
                    Some(Err(error)) => Err(same_error(error, key)),
                });
            }
        }
        self.outcomes
            .into_iter()
            .map(|outcome| outcome.expect("every message has an outcome"))
            .collect()
    }
}

/// A duplicate's copy of a value, through the codec (as a duplicate from the table gets it).
pub(super) fn replay<T, E, C: ResultCodec<T>>(
    codec: &C,
    key: IdempotencyKey,
    value: &T,
) -> Result<Outcome<T>, Error<E>> {
    let stored = codec.encode(value).map_err(Error::ResultEncoding)?;
    codec
        .decode(stored)
        .map(Outcome::Duplicate)
        .map_err(|source| Error::StoredResult { key, source })
}

/// What a duplicate inside the batch is told when the first message with its key failed.
pub(super) fn same_error<E>(error: &Error<E>, key: IdempotencyKey) -> Error<E> {
    match error {
        Error::Parked {
            attempts,
            last_error,
            ..
        } => Error::Parked {
            key,
            attempts: *attempts,
            last_error: last_error.clone(),
        },
        Error::PayloadMismatch { .. } => Error::PayloadMismatch { key },
        // The first delivery failed or is in progress: this one may be retried later.
        _ => Error::InProgress { key },
    }
}
