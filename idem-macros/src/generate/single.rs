//! The handler of one message, rewritten: it takes the runtime handle instead of its
//! connection (or lease guard), derives the message's key and calls the runner of its
//! mode with its body as a closure.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{FnArg, Ident, ItemFn};

use super::expansion::Expansion;
use crate::args::Mode;
use crate::tokens::call_at;

/// The rewritten handler.
pub(super) fn expand(x: &Expansion<'_>, mode: Mode) -> TokenStream {
    let ItemFn {
        attrs, vis, sig, ..
    } = x.item;
    let (private, output) = (&x.private, x.output());
    // The connection or lease guard becomes the runtime handle; without a lease guard, the
    // handle goes before the message.
    let inputs = sig.inputs.iter().flat_map(|input| match input {
        FnArg::Typed(typed) if x.is_context(typed) => vec![x.idem_param()],
        FnArg::Typed(typed) if x.handler.context.is_none() && x.is_message(typed) => {
            vec![x.idem_param(), typed.to_token_stream()]
        }
        other => vec![other.to_token_stream()],
    });
    let signature = x.signature(&sig.ident, inputs, quote!(#private::Handled<#output>));
    // Locals of the generated code, invisible to the user's body.
    let [derived, keys, layout, error] = [
        "__idem_derived",
        "__idem_keys",
        "__idem_layout",
        "__idem_error",
    ]
    .map(|name| Ident::new(name, Span::mixed_site()));
    let call = match mode {
        Mode::Transaction => transactional_call(x, &layout, &keys),
        Mode::Lease => lease_call(x, &layout, &keys),
    };
    let (spec_item, register, identifies) = (&x.spec.item, &x.spec.register, &x.key.identifies);
    let (spec, lease) = (&x.spec.ident, mode == Mode::Lease);
    let message_keys = x.key.message_keys(private);
    let layout_items = x.key.layout(private, &x.handler.message, None, &layout);
    quote! {
        #(#attrs)*
        #vis #signature
        {
            #register
            #spec_item
            #identifies
            let #derived = (|| -> ::core::result::Result<_, #private::KeyError> {
                ::core::result::Result::Ok(#message_keys)
            })();
            let #keys = match #derived {
                ::core::result::Result::Ok(#derived) => #derived,
                ::core::result::Result::Err(#error) => {
                    return ::core::result::Result::Err(#private::key_error(&#spec, #lease, #error));
                }
            };
            #layout_items
            #call
        }
    }
}

/// The call of `run_transactional` (see `call_runner`). The body may
/// run again after a transient failure: each run gets its own clone of the owned
/// parameters, which it may move out of.
fn transactional_call(x: &Expansion<'_>, layout: &Ident, keys: &Ident) -> TokenStream {
    let private = &x.private;
    let transaction = Ident::new("__idem_transaction", Span::mixed_site());
    let clone_owned = x.item.sig.inputs.iter().filter_map(|input| match input {
        FnArg::Typed(typed) if !x.is_context(typed) => x.clone_if_owned(typed),
        _ => None,
    });
    let body = x.body_in(&transaction, TokenStream::new());
    let closure = quote! {
        move |mut #transaction| {
            #(#clone_owned)*
            async move {
                #body
            }
        }
    };
    let runner = quote!(#private::run_transactional);
    call_runner(x, &runner, layout, keys, closure)
}

/// The call of `run_lease` (see `call_runner`). A lease body runs once
/// and takes the parameters as they are.
fn lease_call(x: &Expansion<'_>, layout: &Ident, keys: &Ident) -> TokenStream {
    let private = &x.private;
    let (output, block) = (x.output(), &x.item.block);
    let guard_local = Ident::new("__idem_lease", Span::mixed_site());
    let guard = x.handler.context.map(|context| {
        let (lease_pat, lease_ty) = (&context.pat, &context.ty);
        quote!(let #lease_pat: #lease_ty = &#guard_local;)
    });
    let closure = quote! {
        move |#guard_local| async move {
            #guard
            #private::handler_body::<#output, _>(async #block).await
        }
    };
    call_runner(x, &quote!(#private::run_lease), layout, keys, closure)
}

/// `runner(idem, &spec, &layout, keys, codec, body).await`, spanned on the return type
/// (see `call_at`).
fn call_runner(
    x: &Expansion<'_>,
    runner: &TokenStream,
    layout: &Ident,
    keys: &Ident,
    body: TokenStream,
) -> TokenStream {
    let (idem, spec, codec) = (&x.idem, &x.spec.ident, &x.codec);
    let run_args = quote!(#idem, &#spec, &#layout, #keys, #codec, #body,);
    call_at(runner, run_args, x.first)
}
