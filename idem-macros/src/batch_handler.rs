//! Code generation of a batch handler, whose message parameter is a slice `&[&M]`: the
//! generated function takes `(&Idem, &[M], ...)` and runs the body once for all the new
//! messages.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{FnArg, Ident, ItemFn, PatType, Type};

use crate::generate::{call_at, clone_if_owned, rewritten_signature};
use crate::validate::Handler;

/// A batch handler: its message parameter is a slice `&[&M]`, and the generated function
/// takes `(&Idem, &[M], ...)` and runs the body once for all the new messages.
pub(crate) struct BatchHandler<'a> {
    pub(crate) handler: &'a Handler<'a>,
    /// The message type `M`.
    pub(crate) element: &'a Type,
    pub(crate) krate: &'a TokenStream,
    /// The runtime's private module (`private_module`).
    pub(crate) private: &'a TokenStream,
    pub(crate) spec: Ident,
    /// `let SPEC: HandlerSpec = ...;`
    pub(crate) spec_item: TokenStream,
    /// The closure that derives one message's key and fingerprint.
    pub(crate) derive: TokenStream,
    /// The first token of the return type, where the runner's bounds are reported.
    pub(crate) first: Span,
}

impl BatchHandler<'_> {
    pub(crate) fn expand(self, item: &ItemFn) -> TokenStream {
        let BatchHandler {
            handler,
            element,
            krate,
            private,
            spec,
            spec_item,
            derive,
            first,
        } = self;
        let ItemFn {
            attrs,
            vis,
            sig,
            block,
        } = item;
        let output = handler.output;
        let [idem, messages, new, transaction, result] = [
            "idem",
            "messages",
            "__idem_new_messages",
            "__idem_transaction",
            "__idem_result",
        ]
        .map(|name| Ident::new(name, Span::mixed_site()));
        let context = handler
            .context
            .expect("checked: transaction handlers take a connection");
        let (connection_pat, connection_ty) = (&context.pat, &context.ty);
        let message_pat = &handler.message_param.pat;
        let is_context = |typed: &PatType| std::ptr::eq(typed, context);
        let is_message = |typed: &PatType| std::ptr::eq(typed, handler.message_param);
        let inputs = sig.inputs.iter().map(|input| match input {
            FnArg::Typed(typed) if is_context(typed) => quote!(#idem: &#krate::Idem),
            FnArg::Typed(typed) if is_message(typed) => quote!(#messages: &[#element]),
            other => other.to_token_stream(),
        });
        // The body may run again (one message at a time after a failure, or after a
        // transient error): each run gets its own copy of the owned parameters.
        let clone_owned = sig.inputs.iter().filter_map(|input| match input {
            FnArg::Typed(typed) if !is_context(typed) && !is_message(typed) => {
                clone_if_owned(&private, typed)
            }
            _ => None,
        });
        let run_args = quote! {
            #idem,
            &#spec,
            #messages,
            #derive,
            move |mut #transaction, #new| {
                #(#clone_owned)*
                async move {
                    let #result = {
                        let #connection_pat: #connection_ty = &mut *#transaction;
                        let #message_pat: &[&_] = &#new;
                        #private::handler_body::<#output, _>(async #block).await
                    };
                    (#transaction, #result)
                }
            },
        };
        let call = call_at(&quote!(#private::run_batch_handler), run_args, first);
        let signature = rewritten_signature(
            sig,
            &sig.ident,
            inputs,
            quote!(::std::vec::Vec<#private::Handled<#output>>),
        );
        quote! {
            #(#attrs)*
            #vis #signature
            {
                #spec_item
                #call
            }
        }
    }
}
