//! The texts of failures as the status table records them (`last_error`): the error's
//! chain ([`ErrorChain`], public: idem-kafka flattens its errors with it too) or only its
//! kind, without NUL characters and bounded in length; and which database errors are
//! transient.

use std::error::Error as StdError;
use std::fmt;

use crate::outcome::HandlerError;

/// The longest `last_error` recorded, in bytes; longer texts are cut at a character
/// boundary and marked.
pub(crate) const MAX_ERROR_TEXT: usize = 2048;

/// The error and its sources, `: `-separated, as recorded in `last_error`: NUL characters
/// (which PostgreSQL's text refuses) replaced by U+FFFD, and at most [`MAX_ERROR_TEXT`]
/// bytes.
pub(crate) fn error_chain(error: &(dyn StdError + 'static)) -> String {
    storable_text(&ErrorChain(error).to_string())
}

/// What `last_error` records of `error` under `texts`.
pub(crate) fn failure_text<E: HandlerError>(error: &E, texts: crate::config::ErrorTexts) -> String {
    match texts {
        crate::config::ErrorTexts::KindOnly => {
            error_kind(std::any::type_name::<E>(), error.as_std_error())
        }
        _ => error_chain(error.as_std_error()),
    }
}

/// The kind of an error: the type's name, and the SQLSTATE of a database error among its
/// sources.
pub(crate) fn error_kind(type_name: &str, error: &(dyn StdError + 'static)) -> String {
    for error in chain(error) {
        if let Some(sqlx::Error::Database(db)) = error.downcast_ref::<sqlx::Error>()
            && let Some(code) = db.code()
        {
            return format!("{type_name} (SQLSTATE {code})");
        }
    }
    type_name.to_owned()
}

/// `text` as `last_error` records it: see [`storable_text_of`].
pub(crate) fn storable_text(text: &str) -> String {
    storable_text_of(text, MAX_ERROR_TEXT)
}

/// `text` as a PostgreSQL `text` column can hold it, in at most `max_len` bytes: NUL
/// characters (which `text` refuses, failing the whole statement) replaced by U+FFFD, and
/// a longer text cut at a character boundary and marked ` [truncated]`. How idem stores a
/// key's `last_error` (2 KiB), and idem-kafka a dead letter's error (4 KiB).
///
/// ```
/// use idem_runtime::storable_text_of;
///
/// assert_eq!(storable_text_of("bad \0 byte", 100), "bad \u{fffd} byte");
/// assert_eq!(storable_text_of(&"é".repeat(100), 30), "ééééééééé [truncated]");
/// ```
pub fn storable_text_of(text: &str, max_len: usize) -> String {
    const MARK: &str = " [truncated]";
    let mut text = text.replace('\0', "\u{fffd}");
    if text.len() > max_len {
        let mark = if max_len >= MARK.len() { MARK } else { "" };
        let mut cut = max_len - mark.len();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(mark);
    }
    text
}

/// An error and its sources on one line, `: `-separated, as idem records a failure (a
/// key's `last_error`; idem-kafka's dead letters too).
///
/// A source whose text the error before it already ends with is written once: sqlx's
/// database errors, and wrappers such as `#[error("insert failed: {0}")]`, show their
/// source's text themselves. At most 32 errors of the chain are written, and no further
/// source once 16 KiB are: an error whose `source()` leads back to itself still gives a
/// finite text.
///
/// ```
/// # #[derive(Debug)] struct Wrapped(std::io::Error);
/// # impl std::fmt::Display for Wrapped {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("reading the file") }
/// # }
/// # impl std::error::Error for Wrapped {
/// #     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
/// # }
/// use idem_runtime::ErrorChain;
///
/// let error = Wrapped(std::io::Error::other("disk full"));
/// assert_eq!(ErrorChain(&error).to_string(), "reading the file: disk full");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn StdError + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut written = 0;
        let mut previous: Option<String> = None;
        let errors = std::iter::successors(Some(self.0), |&error| error.source());
        for (index, error) in errors.enumerate() {
            if index == MAX_CHAIN {
                return f.write_str(": [more sources left out]");
            }
            let text = error.to_string();
            if !previous
                .as_ref()
                .is_some_and(|shown| shown.ends_with(&text))
            {
                if written >= MAX_CHAIN_TEXT {
                    return f.write_str(": [more sources left out]");
                }
                if previous.is_some() {
                    f.write_str(": ")?;
                }
                f.write_str(&text)?;
                written += text.len();
            }
            previous = Some(text);
        }
        Ok(())
    }
}

/// The most errors of a chain that idem looks at: the error and its first sources. An
/// error type whose `source()` leads back to itself (a cycle) would otherwise keep a
/// delivery formatting its failure forever.
const MAX_CHAIN: usize = 32;

/// The length after which [`ErrorChain`] writes no further source: a deep chain of long
/// texts is cut well before anything stores it.
const MAX_CHAIN_TEXT: usize = 16 * 1024;

/// `error` and its sources, at most [`MAX_CHAIN`] of them.
pub(crate) fn chain<'a>(
    error: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |&error| error.source()).take(MAX_CHAIN)
}

/// Whether `error` or one of its sources is a PostgreSQL serialization failure (`40001`)
/// or deadlock (`40P01`): the transaction can be retried as a whole.
pub(crate) fn is_transient(error: &(dyn StdError + 'static)) -> bool {
    chain(error).any(|error| {
        matches!(error.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::Database(db)) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
    })
}

#[cfg(test)]
mod tests {
    use super::ErrorChain;
    use std::{error::Error as StdError, fmt};

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Layer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|layer| layer as _)
        }
    }

    fn full_chain(error: &(dyn StdError + 'static)) -> String {
        ErrorChain(error).to_string()
    }

    #[test]
    fn a_chain_shows_each_source_once() {
        let chain = Layer(
            "insert failed",
            Some(Box::new(Layer("deadlock detected", None))),
        );
        assert_eq!(full_chain(&chain), "insert failed: deadlock detected");
        // sqlx's database error shows its source's text itself.
        let repeated = Layer(
            "error returned from database: deadlock detected",
            Some(Box::new(Layer("deadlock detected", None))),
        );
        assert_eq!(
            full_chain(&repeated),
            "error returned from database: deadlock detected"
        );
    }

    /// An error whose source is itself, and two errors that are each other's source.
    #[derive(Debug)]
    struct Cycle(&'static str, Option<&'static Cycle>);

    impl fmt::Display for Cycle {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Cycle {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(self.1.unwrap_or(&SELF))
        }
    }

    static SELF: Cycle = Cycle("looping", None);
    static PING: Cycle = Cycle("ping", Some(&PONG));
    static PONG: Cycle = Cycle("pong", Some(&PING));

    #[test]
    fn a_cycle_of_sources_gives_a_finite_text() {
        assert_eq!(full_chain(&SELF), "looping: [more sources left out]");
        let text = full_chain(&PING);
        assert!(text.starts_with("ping: pong: ping"), "{text}");
        assert!(text.ends_with("pong: [more sources left out]"), "{text}");
        assert_eq!(text.matches(": ").count(), super::MAX_CHAIN);
        assert!(!super::is_transient(&PING));
    }

    #[test]
    fn a_deep_chain_of_long_texts_is_cut() {
        let long: &'static str = "a long error text ".repeat(100).leak();
        let mut error = Layer("bottom", None);
        for level in 0..20 {
            let text = if level % 2 == 0 { long } else { "a short one" };
            error = Layer(text, Some(Box::new(error)));
        }
        let text = full_chain(&error);
        assert!(
            text.len() < super::MAX_CHAIN_TEXT + long.len() + 64,
            "{}",
            text.len()
        );
        assert!(text.ends_with(": [more sources left out]"));
    }

    #[test]
    fn storable_texts_fit_their_bound() {
        use super::storable_text_of;
        assert_eq!(storable_text_of("a\0b", 10), "a\u{fffd}b");
        assert_eq!(storable_text_of("plain", 5), "plain");
        assert_eq!(storable_text_of("abcdef", 4), "abcd");
        for max in 0..40 {
            assert!(storable_text_of(&"é".repeat(30), max).len() <= max);
        }
    }
}
