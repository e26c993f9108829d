//! A handler without `scope` that was renamed or moved: its default scope changed with its
//! name or module, and every fact delivered again would run again under the new one.

use super::{Checked, Error, HandlerMoved, Refusal};
use crate::store::MovedFrom;

/// Refuses a handler whose default scope has no keys while a scope of its crate with the
/// same message type or key definition has keys and no handler in the binary (see the
/// [module docs](super)).
pub(super) async fn refuse_if_moved(checked: &Checked<'_>) -> Result<(), Error> {
    let Checked {
        pool,
        statements,
        spec,
        identity,
        crate_name,
        ..
    } = *checked;
    let scope = spec.scope;
    let Some(moved) = statements
        .moved_from(
            pool,
            scope,
            crate_name,
            checked.definition.as_str(),
            checked.message_type,
            checked.registry.scopes(),
        )
        .await?
    else {
        return Ok(());
    };
    let MovedFrom {
        scope: previous,
        same_message,
        same_key,
    } = moved;
    let message_type = checked.message_type;
    let alike = match (same_message, same_key) {
        (true, true) => format!("the same message type ({message_type}) and key"),
        (true, false) => format!("the same message type ({message_type}) and another key"),
        _ => "the same key".to_owned(),
    };
    let key_changed = if same_key {
        ""
    } else {
        " (the key is not the one its keys were derived with, which that scope then refuses until the change is declared with `previous_key`)"
    };
    let message = format!(
        "handler `{identity}` runs with its default scope `{scope}`, which has no keys, while scope `{previous}` of crate `{crate_name}`, with {alike}, has keys and no handler in this build: `{identity}` looks like the handler of `{previous}` renamed or moved, and would run every fact of `{previous}` again. If it is, keep its keys: `#[idempotent(scope = \"{previous}\", ...)]`{key_changed}. If it is a new handler and the one of `{previous}` was retired, give this one a `scope = \"...\"` of its own, or forget `{previous}` with `Idem::release_scope(\"{previous}\")` (`idem scopes release {previous}`)",
    );
    Err(Error::Refused(Refusal::Moved(HandlerMoved::new(
        scope, &previous, message,
    ))))
}
