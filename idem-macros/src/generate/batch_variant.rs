//! `<handler>_batch` (`batch = true`): the handler of one message run over a slice of
//! messages in one transaction, its body once per new message.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Type};

use super::expansion::Expansion;
use super::signature::unreferenced;
use crate::tokens::{call_at, respan};

/// The batch variant of the handler of one message.
pub(super) fn expand(x: &Expansion<'_>) -> TokenStream {
    let ItemFn { vis, sig, .. } = x.item;
    let (private, idem, spec, codec) = (&x.private, &x.idem, &x.spec.ident, &x.codec);
    let output = x.output();
    let message = &x.handler.message;
    let messages = Ident::new("messages", Span::mixed_site());
    let transaction = Ident::new("__idem_transaction", Span::mixed_site());
    let layout = Ident::new("__idem_layout", Span::mixed_site());
    let message_ty = unreferenced(&x.handler.message_param.ty);
    let inputs = sig.inputs.iter().map(|input| match input {
        FnArg::Typed(typed) if x.is_context(typed) => x.idem_param(),
        FnArg::Typed(typed) if x.is_message(typed) => quote!(#messages: &[#message_ty]),
        other => other.to_token_stream(),
    });
    let clone_per_message = clones_per_message(x);
    // `r#type` gives `type_batch`.
    let name = format_ident!("{}_batch", sig.ident);
    let signature = x.signature(
        &name,
        inputs,
        quote!(::std::vec::Vec<#private::Handled<#output>>),
    );
    let doc = format!(
        "The batch variant of {}: claims the keys of all `messages` in one statement, runs the body for the new ones and commits once. Returns one outcome per message, in order.",
        doc_link(&sig.ident),
    );
    let derive = x.key.closure(private, message);
    let body = x.body_in(&transaction, TokenStream::new());
    let layout_items = x.key.layout(private, message, Some(&messages), &layout);
    let run_batch_args = quote! {
        #idem,
        &#spec,
        &#layout,
        #messages,
        #derive,
        #codec,
        move |mut #transaction, #message| {
            #(#clone_per_message)*
            // The message is used: its key was derived from it.
            let _ = &#message;
            async move {
                #body
            }
        },
    };
    let run_batch_call = call_at(&quote!(#private::run_batch), run_batch_args, x.first);
    let spec_item = &x.spec.item;
    quote! {
        #[doc = #doc]
        #vis #signature
        {
            #spec_item
            #layout_items
            #run_batch_call
        }
    }
}

/// The clones each run of the body gets: of the message, borrowed from the slice, when
/// the handler takes it owned, and of the other owned parameters.
fn clones_per_message(x: &Expansion<'_>) -> Vec<TokenStream> {
    let message = &x.handler.message;
    x.item
        .sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Typed(typed) if x.is_message(typed) => {
                let ty = &typed.ty;
                (!matches!(&**ty, Type::Reference(_))).then(|| {
                    let private = respan(&x.private, ty.span());
                    // Spanned as the handler's own clone of the parameter, so that a
                    // message that is not `Clone` gets one error, not one per function.
                    quote_spanned!(ty.span()=> let #message: #ty = #private::clone_for_run(&*#message);)
                })
            }
            FnArg::Typed(typed) if !x.is_context(typed) => x.clone_if_owned(typed),
            _ => None,
        })
        .collect()
}

/// The handler's name in a generated doc: a link, except for a raw identifier (which
/// rustdoc cannot link).
pub(super) fn doc_link(ident: &Ident) -> String {
    let name = syn::ext::IdentExt::unraw(ident);
    if ident.to_string().starts_with("r#") {
        format!("`{name}`")
    } else {
        format!("[`{name}`]")
    }
}
