//! Rows of the status table, and the bulk retry and release of `failed` and `parked` keys.

use serde::Serialize;
use uuid::Uuid;

use super::AdminError;
use crate::Idem;
use crate::store::{KeyChange, KeyFilter, KeyRow, Status};

/// The row of `key` in `scope`, or [`AdminError::UnknownKey`].
pub async fn show_key(idem: &Idem, scope: &str, key: Uuid) -> Result<KeyRow, AdminError> {
    idem.statements()
        .key_row(idem.pool(), scope, key)
        .await?
        .ok_or_else(|| AdminError::UnknownKey {
            scope: scope.to_owned(),
            key,
        })
}

/// Where a page of [`list_keys`] starts: after this key, in `(scope, key)` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last scope of the previous page.
    pub scope: String,
    /// The last key of the previous page.
    pub key: Uuid,
}

impl Cursor {
    /// The cursor after `row`.
    pub fn after(row: &KeyRow) -> Self {
        Cursor {
            scope: row.scope.clone(),
            key: row.key,
        }
    }

    /// Parses `<scope>/<key>`, as [`Display`](std::fmt::Display) writes it.
    pub fn parse(text: &str) -> Option<Self> {
        let (scope, key) = text.rsplit_once('/')?;
        Some(Cursor {
            scope: scope.to_owned(),
            key: key.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.scope, self.key)
    }
}

/// Up to `limit` rows selected by `filter`, in `(scope, key)` order, after `after`.
/// The next page starts at [`Cursor::after`] the last row.
pub async fn list_keys(
    idem: &Idem,
    filter: &KeyFilter,
    after: Option<&Cursor>,
    limit: u32,
) -> Result<Vec<KeyRow>, AdminError> {
    Ok(idem
        .statements()
        .key_rows(
            idem.pool(),
            filter,
            after.map(|cursor| (cursor.scope.as_str(), cursor.key)),
            limit,
        )
        .await?)
}

/// What [`retry_keys`] or [`release_keys`] did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Change {
    /// The keys changed, as they were before the change.
    pub keys: Vec<KeyRow>,
    /// A dry run: nothing was changed.
    pub dry_run: bool,
}

/// The statuses a retry or a release may change: `failed` and `parked` (the default).
fn releasable(filter: &KeyFilter) -> Result<KeyFilter, AdminError> {
    let mut filter = filter.clone();
    if filter.key.is_some() && filter.scope.is_none() {
        return Err(AdminError::InvalidSelection(
            "a key is selected with its scope".to_owned(),
        ));
    }
    if filter.statuses.is_empty() {
        filter.statuses = vec![Status::Failed, Status::Parked];
    }
    if let Some(status) = filter
        .statuses
        .iter()
        .find(|status| !matches!(status, Status::Failed | Status::Parked))
    {
        return Err(AdminError::InvalidSelection(format!(
            "only `failed` and `parked` keys can be retried or released, not `{}` ones",
            status
        )));
    }
    Ok(filter)
}

async fn change(
    idem: &Idem,
    filter: &KeyFilter,
    dry_run: bool,
    change: KeyChange,
) -> Result<Change, AdminError> {
    let filter = releasable(filter)?;
    let mut tx = idem.bounded_transaction().await?;
    let keys = idem
        .statements()
        .change_keys(&mut tx, &filter, change, dry_run)
        .await?;
    tx.commit().await?;
    if keys.is_empty()
        && let (Some(scope), Some(key)) = (&filter.scope, filter.key)
    {
        // One key asked for, and not changed: say why.
        let row = show_key(idem, scope, key).await?;
        if !matches!(row.status.as_str(), "failed" | "parked") {
            return Err(AdminError::WrongStatus {
                scope: row.scope,
                key: row.key,
                status: row.status,
            });
        }
    }
    Ok(Change { keys, dry_run })
}

/// Gives the selected `failed` and `parked` keys a fresh count of attempts (status
/// `failed`, attempts 0), so that the next delivery runs the body again, up to
/// `max_attempts` more times. The recorded error and payload fingerprint stay.
///
/// The filter may only select `failed` and `parked` keys (none given: both). One key
/// asked for by scope and key that is unknown or not failed or parked is an error
/// ([`AdminError::UnknownKey`], [`AdminError::WrongStatus`]).
pub async fn retry_keys(
    idem: &Idem,
    filter: &KeyFilter,
    dry_run: bool,
) -> Result<Change, AdminError> {
    change(idem, filter, dry_run, KeyChange::Retry).await
}

/// Deletes the selected `failed` and `parked` keys: the next delivery of their messages is
/// a first delivery, with any payload (the recorded fingerprint is deleted too).
///
/// Selection and errors as for [`retry_keys`].
pub async fn release_keys(
    idem: &Idem,
    filter: &KeyFilter,
    dry_run: bool,
) -> Result<Change, AdminError> {
    change(idem, filter, dry_run, KeyChange::Release).await
}
