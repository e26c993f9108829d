//! A batch handler, whose message parameter is a slice `&[&M]`: the generated function
//! takes `(&Idem, &[M], ...)` and runs the body once for all the new messages.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{FnArg, Ident, ItemFn, Type};

use super::expansion::Expansion;
use crate::tokens::call_at;

/// The rewritten batch handler; `element` is the message type `M`.
pub(super) fn expand(x: &Expansion<'_>, element: &Type) -> TokenStream {
    let ItemFn {
        attrs, vis, sig, ..
    } = x.item;
    let (private, idem, spec) = (&x.private, &x.idem, &x.spec.ident);
    let output = x.output();
    let [messages, new, transaction, layout] = [
        "messages",
        "__idem_new_messages",
        "__idem_transaction",
        "__idem_layout",
    ]
    .map(|name| Ident::new(name, Span::mixed_site()));
    let message_pat = &x.handler.message_param.pat;
    let inputs = sig.inputs.iter().map(|input| match input {
        FnArg::Typed(typed) if x.is_context(typed) => x.idem_param(),
        FnArg::Typed(typed) if x.is_message(typed) => quote!(#messages: &[#element]),
        other => other.to_token_stream(),
    });
    // The body may run again (one message at a time after a failure, or after a
    // transient error): each run gets its own copy of the owned parameters.
    let clone_owned = sig.inputs.iter().filter_map(|input| match input {
        FnArg::Typed(typed) if !x.is_context(typed) && !x.is_message(typed) => {
            x.clone_if_owned(typed)
        }
        _ => None,
    });
    let derive = x.key.closure(private, &x.handler.message);
    let body = x.body_in(&transaction, quote!(let #message_pat: &[&_] = &#new;));
    let layout_items = x
        .key
        .layout(private, &x.handler.message, Some(&messages), &layout);
    let run_args = quote! {
        #idem,
        &#spec,
        &#layout,
        #messages,
        #derive,
        move |mut #transaction, #new| {
            #(#clone_owned)*
            async move {
                #body
            }
        },
    };
    let call = call_at(&quote!(#private::run_batch_handler), run_args, x.first);
    let signature = x.signature(
        &sig.ident,
        inputs,
        quote!(::std::vec::Vec<#private::Handled<#output>>),
    );
    let (spec_item, register) = (&x.spec.item, &x.spec.register);
    quote! {
        #(#attrs)*
        #vis #signature
        {
            #register
            #spec_item
            #layout_items
            #call
        }
    }
}
