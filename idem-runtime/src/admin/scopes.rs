//! The scopes the status table records: who owns each, what its keys are made of, and
//! where a declared key change stands.

use super::AdminError;
use crate::Idem;
pub use crate::store::ScopeInfo;

/// Every scope of the configured schema, by name.
pub async fn scopes(idem: &Idem) -> Result<Vec<ScopeInfo>, AdminError> {
    Ok(idem.statements().scopes(idem.pool()).await?)
}

/// Forgets what the database records of `scope`: its owner and its key definition (see
/// [`Idem::release_scope`]). Whether the scope was recorded.
pub async fn release_scope(idem: &Idem, scope: &str) -> Result<bool, AdminError> {
    Ok(idem.release_scope(scope).await?)
}
