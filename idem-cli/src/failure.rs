//! The error a command ends with, and its exit code (the table in the crate docs).

use idem_runtime::admin::AdminError;

/// An error with its exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// The error's kind, as `--json` names it (`unknown_key`, `usage`, ...).
    pub kind: &'static str,
    /// What went wrong (passwords are redacted before it is shown).
    pub message: String,
}

impl Failure {
    /// An error of `kind` (as `--json` names it) that exits with `code`.
    pub fn new(code: u8, kind: &'static str, message: impl Into<String>) -> Self {
        Failure {
            code,
            kind,
            message: message.into(),
        }
    }

    /// A URL that does not parse.
    pub fn bad_url(message: String) -> Self {
        Failure::new(3, "bad_url", message)
    }

    /// A database that cannot be reached.
    pub fn connect(message: String) -> Self {
        Failure::new(4, "connect", message)
    }

    /// Bad arguments.
    pub fn usage(message: impl Into<String>) -> Self {
        Failure::new(2, "usage", message)
    }
}

impl From<AdminError> for Failure {
    fn from(error: AdminError) -> Self {
        let (code, kind) = match &error {
            AdminError::NotMigrated { .. } => (5, "not_migrated"),
            AdminError::UnknownKey { .. } => (6, "unknown_key"),
            AdminError::WrongStatus { .. } => (7, "wrong_status"),
            AdminError::InvalidSelection(_) | AdminError::KeyField(_) | AdminError::Key(_) => {
                (2, "usage")
            }
            _ => (1, "database"),
        };
        Failure::new(code, kind, error.to_string())
    }
}

impl From<sqlx::Error> for Failure {
    fn from(error: sqlx::Error) -> Self {
        Failure::new(1, "database", format!("database error: {error}"))
    }
}
