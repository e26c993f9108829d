//! Validation of `#[idempotent]`: the handler's signature against its arguments (mode,
//! batch), giving the parts of the handler that code generation needs.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, PatType, ReturnType, Type};

mod types;

use crate::args::{Args, Mode};
use types::{Slice, is_connection, is_not_result, is_reference_to, slice_message};

/// The handler's parts that the expansion needs, once checked.
pub(crate) struct Handler<'a> {
    /// The connection (transaction mode) or the lease guard (lease mode, optional).
    pub(crate) context: Option<&'a PatType>,
    /// The message parameter and its name.
    pub(crate) message_param: &'a PatType,
    pub(crate) message: Ident,
    pub(crate) output: &'a Type,
    /// A batch handler (message parameter `&[&M]`): the message type `M`.
    pub(crate) batch_of: Option<&'a Type>,
}

/// Checks the arguments against the handler's signature; every problem found is returned
/// together.
pub(crate) fn validate<'a>(
    args: &mut Args,
    item: &'a ItemFn,
    mode: Mode,
) -> Result<Handler<'a>, Vec<syn::Error>> {
    // With an unknown mode, the signature cannot be checked against either one.
    let handler = if args.mode_unknown {
        None
    } else {
        check_signature(item, mode, &mut args.errors)
    };
    if handler
        .as_ref()
        .is_some_and(|handler| handler.batch_of.is_some())
    {
        args.check_batch_handler();
    }
    if args.key.is_none() {
        args.errors.push(syn::Error::new(
            Span::call_site(),
            "missing `key`: name the message fields that identify the business fact, e.g. `#[idempotent(key = \"order_id, event_type\")]`",
        ));
    }
    match handler {
        Some(handler) if args.key.is_some() && args.errors.is_empty() => Ok(handler),
        _ => Err(std::mem::take(&mut args.errors)),
    }
}

/// Checks that the handler is an `async fn (conn: &mut PgConnection, message, ...) -> R`
/// (transaction mode) or an `async fn ([lease: &Lease,] message, ...) -> R` (lease mode).
fn check_signature<'a>(
    item: &'a ItemFn,
    mode: Mode,
    errors: &mut Vec<syn::Error>,
) -> Option<Handler<'a>> {
    let sig = &item.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[idempotent] handlers must be `async fn`: the body runs inside a database transaction",
        ));
    }
    let output = check_output(sig, errors);
    let mut typed = sig.inputs.iter().filter_map(|input| match input {
        FnArg::Typed(typed) => Some(typed),
        FnArg::Receiver(_) => None,
    });
    if mode == Mode::Lease {
        return check_lease_signature(sig, typed, output, errors);
    }
    check_no_exclusive_borrows(sig, errors);
    let connection = check_connection(sig, typed.next(), errors);
    let message_param = typed.next();
    let batch_of = match message_param.map(|param| slice_message(param)) {
        Some(Slice::Batch(element)) => Some(element),
        Some(Slice::Wrong(error)) => {
            errors.push(error);
            None
        }
        Some(Slice::No) | None => None,
    };
    let message = match message_param {
        Some(message) => message_name(message, errors),
        None if connection.is_some() => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                "an #[idempotent] handler needs the message after the connection: `(tx: &mut PgConnection, message: &Message)`",
            ));
            None
        }
        None => None,
    };
    Some(Handler {
        context: Some(connection?),
        message_param: message_param?,
        message: message?,
        output: output?,
        batch_of,
    })
}

/// The return type, if it may be a `Result`.
fn check_output<'a>(sig: &'a syn::Signature, errors: &mut Vec<syn::Error>) -> Option<&'a Type> {
    match &sig.output {
        ReturnType::Type(_, ty) if is_not_result(ty) => {
            errors.push(syn::Error::new_spanned(
                ty,
                format!(
                    "an #[idempotent] handler must return a `Result`, not `{}`: declare it as `-> Result<T, E>`; an error rolls the body's writes back and records the failure",
                    ty.to_token_stream().to_string().replace(' ', "")
                ),
            ));
            None
        }
        ReturnType::Type(_, ty) => Some(&**ty),
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                "#[idempotent] handlers must return a `Result`: add `-> Result<T, E>`; an error rolls the body's writes back and records the failure",
            ));
            None
        }
    }
}

/// The first parameter of a transaction-mode handler, if it is the connection.
fn check_connection<'a>(
    sig: &syn::Signature,
    first: Option<&'a PatType>,
    errors: &mut Vec<syn::Error>,
) -> Option<&'a PatType> {
    match first {
        Some(lease) if is_reference_to(&lease.ty, "Lease") => {
            errors.push(syn::Error::new_spanned(
                &lease.ty,
                "a lease guard is only given to lease-mode handlers: add `mode = \"lease\"`, or take the transaction's connection `tx: &mut PgConnection`",
            ));
            None
        }
        Some(connection) if is_connection(&connection.ty) => Some(connection),
        Some(other) => {
            errors.push(syn::Error::new_spanned(
                &other.ty,
                "the first parameter of an #[idempotent] handler must be the transaction's connection: `tx: &mut PgConnection`",
            ));
            None
        }
        None => {
            errors.push(syn::Error::new(
                sig.paren_token.span.join(),
                "an #[idempotent] handler takes the transaction's connection and the message: `(tx: &mut PgConnection, message: &Message)`",
            ));
            None
        }
    }
}

/// The name the message parameter is bound to, which the key is read from.
fn message_name(message: &PatType, errors: &mut Vec<syn::Error>) -> Option<Ident> {
    match &*message.pat {
        Pat::Ident(pat) if pat.subpat.is_none() => Some(pat.ident.clone()),
        other => {
            errors.push(syn::Error::new_spanned(
                other,
                "bind the message to a name (e.g. `event: &OrderEvent`): the key is read from its fields",
            ));
            None
        }
    }
}

/// A transactional body may run again after a serialization failure or a deadlock, so it
/// is a closure that can use shared borrows only: `&mut self` or a `&mut` parameter other
/// than the connection would fail deep in the expansion; say why on the user's token.
fn check_no_exclusive_borrows(sig: &syn::Signature, errors: &mut Vec<syn::Error>) {
    let exclusive =
        |ty: &Type| matches!(ty, Type::Reference(reference) if reference.mutability.is_some());
    let mut typed_seen = 0;
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) if exclusive(&receiver.ty) => {
                errors.push(syn::Error::new_spanned(
                    receiver,
                    "a transactional #[idempotent] handler cannot take `&mut self`: its body may run again after a serialization failure or a deadlock, so it only borrows what it is given; take `&self` and keep mutable state behind a `Mutex` or an atomic",
                ));
            }
            FnArg::Typed(typed) => {
                // The first typed parameter is the connection, the one `&mut` allowed.
                typed_seen += 1;
                if typed_seen > 1 && exclusive(&typed.ty) {
                    errors.push(syn::Error::new_spanned(
                        &typed.ty,
                        "a transactional #[idempotent] handler cannot take a `&mut` parameter besides the connection: its body may run again after a serialization failure or a deadlock, so it only borrows what it is given; take `&T` and keep mutable state behind a `Mutex` or an atomic",
                    ));
                }
            }
            FnArg::Receiver(_) => {}
        }
    }
}

/// The lease-mode signature: an optional `&Lease` guard, then the message.
fn check_lease_signature<'a>(
    sig: &'a syn::Signature,
    mut typed: impl Iterator<Item = &'a PatType>,
    output: Option<&'a Type>,
    errors: &mut Vec<syn::Error>,
) -> Option<Handler<'a>> {
    let mut first = typed.next();
    if let Some(connection) = first.filter(|first| is_connection(&first.ty)) {
        errors.push(syn::Error::new_spanned(
            &connection.ty,
            "a lease-mode handler runs outside any database transaction, so it receives no connection: take the lease guard `lease: &Lease` (or nothing) before the message, or use the default transaction mode",
        ));
        return None;
    }
    let guard = first.filter(|first| is_reference_to(&first.ty, "Lease"));
    if guard.is_some() {
        first = typed.next();
    }
    let message = match first.map(|message| &*message.pat) {
        Some(Pat::Ident(pat)) if pat.subpat.is_none() => Some(pat.ident.clone()),
        Some(other) => {
            errors.push(syn::Error::new(
                other.span(),
                "bind the message to a name (e.g. `event: &OrderEvent`): the key is read from its fields",
            ));
            None
        }
        None => {
            errors.push(syn::Error::new(
                sig.paren_token.span.join(),
                "a lease-mode handler takes the message: `(lease: &Lease, message: &Message)` or `(message: &Message)`",
            ));
            None
        }
    };
    if let Some(param) = first
        && !matches!(slice_message(param), Slice::No)
    {
        errors.push(syn::Error::new_spanned(
            &param.ty,
            "a lease-mode handler takes one message: a slice of messages makes a batch handler, whose body runs in one database transaction for all of them; take `message: &Message`, or remove `mode = \"lease\"`",
        ));
        return None;
    }
    Some(Handler {
        context: guard,
        message_param: first?,
        message: message?,
        output: output?,
        batch_of: None,
    })
}
