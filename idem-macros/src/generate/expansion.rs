//! What the functions generated for one handler share: the handler's checked parts, the
//! runtime's paths, its spec, its key derivation and the body as a transaction runs it.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{Ident, ItemFn, PatType, Type};

use super::key::KeyDerivation;
use super::signature::{clone_if_owned, rewritten_signature};
use super::spec::Spec;
use crate::args::{Args, CacheArg, FieldPath};
use crate::runtime::private_module;
use crate::tokens::respan;
use crate::validate::Handler;

/// One handler being expanded.
pub(super) struct Expansion<'a> {
    pub(super) item: &'a ItemFn,
    pub(super) handler: Handler<'a>,
    /// The runtime's path, for the public types of the signatures.
    pub(super) krate: TokenStream,
    /// The runtime's private module (`private_module`), for everything else.
    pub(super) private: TokenStream,
    /// The `&Idem` parameter of the generated functions.
    pub(super) idem: Ident,
    pub(super) spec: Spec,
    pub(super) key: KeyDerivation,
    /// The result codec (`JsonResult` or `NoResult`), spanned on `first`.
    pub(super) codec: TokenStream,
    /// The first token of the return type, where the runner's bounds on the result and
    /// the error (a `Result`, a `std::error::Error`, storable) are reported, once (see
    /// `call_at`; a span over the whole type cannot be given to `.await`).
    pub(super) first: Span,
}

impl<'a> Expansion<'a> {
    /// `cache` and `shared_scope` as `Args::cache` and `Args::shared_scope` gave them.
    pub(super) fn new(
        args: &Args,
        item: &'a ItemFn,
        handler: Handler<'a>,
        cache: Option<CacheArg>,
        shared_scope: bool,
        (event_time, previous_event_time): (Option<FieldPath>, Option<FieldPath>),
    ) -> Self {
        let key = args.key.as_ref().expect("validated: the key is given");
        let krate = args
            .krate
            .as_ref()
            .map_or_else(|| quote!(::idem_runtime), ToTokens::to_token_stream);
        let private = private_module(args.krate.as_ref());
        let first = handler
            .output
            .to_token_stream()
            .into_iter()
            .next()
            .map_or_else(Span::call_site, |token| token.span());
        let codec = match &args.store_result {
            Some(flag) if !flag.value => quote!(#private::NoResult),
            _ => quote!(#private::JsonResult),
        };
        Expansion {
            item,
            spec: Spec::new(args, item, &private, cache, shared_scope),
            key: KeyDerivation::new(
                &private,
                &handler.message,
                key,
                args.fingerprint.as_ref(),
                args.previous_key.as_ref(),
                event_time.as_ref(),
                previous_event_time.as_ref(),
            ),
            codec: respan(&codec, first),
            handler,
            krate,
            private,
            idem: Ident::new("idem", Span::mixed_site()),
            first,
        }
    }

    /// The handler's return type.
    pub(super) fn output(&self) -> &'a Type {
        self.handler.output
    }

    /// Whether `typed` is the connection or the lease guard parameter.
    pub(super) fn is_context(&self, typed: &PatType) -> bool {
        self.handler
            .context
            .is_some_and(|context| std::ptr::eq(typed, context))
    }

    /// Whether `typed` is the message parameter.
    pub(super) fn is_message(&self, typed: &PatType) -> bool {
        std::ptr::eq(typed, self.handler.message_param)
    }

    /// The `&Idem` parameter.
    pub(super) fn idem_param(&self) -> TokenStream {
        let (idem, krate) = (&self.idem, &self.krate);
        quote!(#idem: &#krate::Idem)
    }

    /// The handler's signature with the name `name`, the parameters `inputs` and the
    /// return type `output`.
    pub(super) fn signature(
        &self,
        name: &Ident,
        inputs: impl Iterator<Item = TokenStream>,
        output: TokenStream,
    ) -> TokenStream {
        rewritten_signature(&self.item.sig, name, inputs, output)
    }

    /// `let name = clone_for_run(&name);` for an owned parameter (see `clone_if_owned`).
    pub(super) fn clone_if_owned(&self, typed: &PatType) -> Option<TokenStream> {
        clone_if_owned(&self.private, typed)
    }

    /// The body of a transaction-mode handler, run in the transaction bound to
    /// `transaction` with the connection parameter borrowing it and `bindings` before it;
    /// gives `(transaction, result)` back to the runner.
    pub(super) fn body_in(&self, transaction: &Ident, bindings: TokenStream) -> TokenStream {
        let context = self
            .handler
            .context
            .expect("checked: transaction handlers take a connection");
        let (connection_pat, connection_ty) = (&context.pat, &context.ty);
        let (private, output, block) = (&self.private, self.output(), &self.item.block);
        let result = Ident::new("__idem_result", Span::mixed_site());
        quote! {
            let #result = {
                let #connection_pat: #connection_ty = &mut *#transaction;
                #bindings
                #private::handler_body::<#output, _>(async #block).await
            };
            (#transaction, #result)
        }
    }
}
