//! What became of a message: the one vocabulary of the consumer, for handlers and for its
//! counters alike.

use std::fmt;

use idem_runtime::{Disposition, ErrorChain, Outcome};

/// What became of one message, as its handler decides and as the consumer routes it.
///
/// A handler returns it ([`Fate::of`] turns an `#[idempotent]` handler's result into one);
/// the consumer then commits the message's offset ([`Executed`](Fate::Executed),
/// [`Duplicate`](Fate::Duplicate), [`Skipped`](Fate::Skipped)), writes it to the
/// dead-letter table and commits ([`DeadLetter`](Fate::DeadLetter)), or handles it again
/// after a back-off without committing past it ([`Retry`](Fate::Retry)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fate {
    /// The handler ran and its effects are committed.
    Executed,
    /// The message's key had already been handled: nothing ran.
    Duplicate,
    /// The handler has nothing to do for this message (an event it does not act on).
    Skipped,
    /// Retrying cannot help: the message goes to the dead-letter table.
    DeadLetter {
        /// Why.
        reason: Reason,
        /// The error, with its sources.
        error: String,
    },
    /// The failure can pass: the message is handled again after a back-off, and no
    /// offset at or after it is committed meanwhile.
    Retry {
        /// The error, with its sources.
        error: String,
        /// Whether another delivery holds the key ([`idem_runtime::Error::InProgress`]).
        in_progress: bool,
    },
}

impl Fate {
    /// The fate of a message from what an `#[idempotent]` handler returned: outcomes are
    /// executed or duplicates, errors go by their [`Disposition`].
    ///
    /// A deployment error ([`Disposition::Halt`]: two handlers on one scope, a key changed,
    /// a handler renamed away from its keys) is retried and logged at every attempt:
    /// nothing is committed past the message until the deployment is fixed.
    pub fn of<T, E>(result: Result<Outcome<T>, idem_runtime::Error<E>>) -> Self
    where
        E: std::error::Error + 'static,
    {
        match result {
            Ok(Outcome::Executed(_)) => Fate::Executed,
            Ok(Outcome::Duplicate(_)) => Fate::Duplicate,
            Err(error) => match error.disposition() {
                Disposition::DeadLetter => Fate::DeadLetter {
                    reason: Reason::of(&error),
                    error: ErrorChain(&error).to_string(),
                },
                Disposition::Retry => Fate::Retry {
                    in_progress: matches!(error, idem_runtime::Error::InProgress { .. }),
                    error: ErrorChain(&error).to_string(),
                },
                _ => {
                    tracing::error!(error = %ErrorChain(&error), "the handler cannot run: fix the deployment");
                    Fate::Retry {
                        in_progress: false,
                        error: ErrorChain(&error).to_string(),
                    }
                }
            },
        }
    }

    /// A fate for a message to retry, with `error` as the reason.
    pub fn retry(error: impl fmt::Display) -> Self {
        Fate::Retry {
            error: error.to_string(),
            in_progress: false,
        }
    }

    /// A fate for a message to dead-letter as [`Reason::Unrecoverable`], with `error`.
    pub fn dead_letter(error: impl fmt::Display) -> Self {
        Fate::DeadLetter {
            reason: Reason::Unrecoverable,
            error: error.to_string(),
        }
    }

    /// The fate's name, as on the consumer's spans (`idem.outcome`): `executed`,
    /// `duplicate`, `skipped`, `dead_letter` or `retry`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Fate::Executed => "executed",
            Fate::Duplicate => "duplicate",
            Fate::Skipped => "skipped",
            Fate::DeadLetter { .. } => "dead_letter",
            Fate::Retry { .. } => "retry",
        }
    }

    /// Whether the message is done with (everything but [`Fate::Retry`]).
    pub fn is_final(&self) -> bool {
        !matches!(self, Fate::Retry { .. })
    }
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a message was dead-lettered (the `reason` column of the dead-letter table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The payload cannot be decoded (or there is none).
    Undecodable,
    /// The idempotency key cannot be derived: a key field is missing
    /// ([`idem_runtime::Error::Key`]).
    MissingKey,
    /// The key was first applied with another payload
    /// ([`idem_runtime::Error::PayloadMismatch`]).
    PayloadMismatch,
    /// The handler failed `max_attempts` times and the key is parked
    /// ([`idem_runtime::Error::Parked`], or the failure that parked it).
    Parked,
    /// Any other error that retrying cannot fix.
    Unrecoverable,
}

impl Reason {
    const ALL: [Reason; 5] = [
        Reason::Undecodable,
        Reason::MissingKey,
        Reason::PayloadMismatch,
        Reason::Parked,
        Reason::Unrecoverable,
    ];

    /// The reason stored as `text` in the `reason` column ([`as_str`](Self::as_str)).
    pub(crate) fn from_column(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|reason| reason.as_str() == text)
    }

    /// The reason as stored in the `reason` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Undecodable => "undecodable",
            Reason::MissingKey => "missing_key",
            Reason::PayloadMismatch => "payload_mismatch",
            Reason::Parked => "parked",
            Reason::Unrecoverable => "unrecoverable",
        }
    }

    /// The reason for an error of idem whose disposition is dead-letter.
    pub fn of<E>(error: &idem_runtime::Error<E>) -> Self {
        use idem_runtime::Error;
        match error {
            Error::Key(_) => Reason::MissingKey,
            Error::PayloadMismatch { .. } => Reason::PayloadMismatch,
            Error::Parked { .. } | Error::Handler { parked: true, .. } => Reason::Parked,
            _ => Reason::Unrecoverable,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn every_reason_reads_back_from_its_column() {
        for reason in Reason::ALL {
            assert_eq!(Reason::from_column(reason.as_str()), Some(reason));
        }
        assert_eq!(Reason::from_column("lost"), None);
    }
}
