//! Code generation of `#[idempotent]`. The arguments come parsed (`args`) and checked
//! against the signature (`validate`); what every generated function of a handler shares
//! (its spec, its key derivation, the runtime's paths) is gathered in `expansion`. Then
//! each module emits one thing:
//!
//! - `single`: the handler of one message, calling the runner of its mode
//!   (`run_transactional` or `run_lease` of the runtime's private module) with its body
//!   as a closure;
//! - `batch_handler`: a handler of a slice of messages (`&[&M]`), calling `run_batch_handler`;
//! - `batch_variant`: `<handler>_batch` of a handler of one message (`batch = true`),
//!   calling `run_batch`;
//! - `key_fn`: `<handler>_key` (or the name `key_fn` gives), the key the handler derives
//!   from a message, for callers.

mod batch_handler;
mod batch_variant;
mod expansion;
mod key;
mod key_fn;
mod signature;
mod single;
mod spec;

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

use crate::args::Args;
use crate::validate::validate;
use expansion::Expansion;

/// Expands the attribute; every problem found is returned together.
pub(crate) fn expand(mut args: Args, item: &ItemFn) -> Result<TokenStream, Vec<syn::Error>> {
    let mode = args.mode();
    let batch = args.batch(mode);
    let cache = args.cache();
    let shared_scope = args.shared_scope();
    args.check_previous_key(mode);
    let key_fn_name = key_fn::name(&mut args, item, batch);
    let handler = validate(&mut args, item, mode)?;
    let batch_of = handler.batch_of;
    let event_time = args.event_time();
    let previous_event_time = args.previous_event_time(event_time.as_ref());
    if !args.errors.is_empty() {
        return Err(std::mem::take(&mut args.errors));
    }
    let expansion = Expansion::new(
        &args,
        item,
        handler,
        cache,
        shared_scope,
        (event_time, previous_event_time),
    );
    let key_fn = key_fn_name.map(|name| key_fn::expand(&expansion, &name));
    if let Some(element) = batch_of {
        let handler = batch_handler::expand(&expansion, element);
        return Ok(quote!(#handler #key_fn));
    }
    let variant = batch.then(|| batch_variant::expand(&expansion));
    let handler = single::expand(&expansion, mode);
    Ok(quote!(#variant #handler #key_fn))
}
