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
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(sqlx::Error::Database(db)) = error.downcast_ref::<sqlx::Error>()
            && let Some(code) = db.code()
        {
            return format!("{type_name} (SQLSTATE {code})");
        }
        current = error.source();
    }
    type_name.to_owned()
}

/// `text` as it can be stored in a `text` column: without NUL, bounded in length.
pub(crate) fn storable_text(text: &str) -> String {
    const MARK: &str = " [truncated]";
    let mut text = text.replace('\0', "\u{fffd}");
    if text.len() > MAX_ERROR_TEXT {
        let mut cut = MAX_ERROR_TEXT - MARK.len();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(MARK);
    }
    text
}

/// An error and its sources on one line, `: `-separated: the one way idem and idem-kafka
/// flatten an error's chain into a text (a key's `last_error`, a dead letter's `error`).
///
/// A source whose text the error before it already ends with is written once: sqlx's
/// database errors, and wrappers such as `#[error("insert failed: {0}")]`, show their
/// source's text themselves.
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
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut source = self.0.source();
        while let Some(error) = source {
            let text = error.to_string();
            if !shown.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            shown = text;
            source = error.source();
        }
        Ok(())
    }
}

/// Whether `error` or one of its sources is a PostgreSQL serialization failure (`40001`)
/// or deadlock (`40P01`): the transaction can be retried as a whole.
pub(crate) fn is_transient(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(sqlx::Error::Database(db)) = error.downcast_ref::<sqlx::Error>()
            && matches!(db.code().as_deref(), Some("40001" | "40P01"))
        {
            return true;
        }
        current = error.source();
    }
    false
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
}
