//! The handler's spec (`HandlerSpec`): its scope and the settings its arguments give.
//! Settings that are not written are left to the runtime's defaults (its default lease,
//! the handle's attempts and retention).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Ident, ItemFn};

use crate::args::{Args, CacheArg};
use crate::tokens::respan;

/// The spec of one handler, as generated code declares it.
pub(super) struct Spec {
    /// The local that holds the spec.
    pub(super) ident: Ident,
    /// `let SPEC: HandlerSpec = HandlerSpec::new(scope)...;`
    pub(super) item: TokenStream,
    /// The scope expression, a `&'static str`.
    pub(super) scope: TokenStream,
    /// The item that registers the handler with the runtime's registry of the handlers
    /// compiled into the binary.
    pub(super) register: TokenStream,
}

impl Spec {
    /// The spec of the handler `item` given its checked arguments: `cache` and
    /// `shared_scope` as `Args::cache` and `Args::shared_scope` gave them.
    pub(super) fn new(
        args: &Args,
        item: &ItemFn,
        private: &TokenStream,
        cache: Option<CacheArg>,
        shared_scope: bool,
    ) -> Self {
        let scope = scope(args, item);
        let default_scope = args.scope.is_none().then(|| quote!(.default_scope()));
        let shared_scope = shared_scope.then(|| quote!(.shared_scope()));
        let max_attempts = args
            .max_attempts
            .as_ref()
            .map(|n| quote!(.max_attempts(#n)));
        let cache_policy = cache.map(|argument| cache_policy(private, argument));
        let retention = args.retention.as_ref().map(|(millis, literal)| {
            quote_spanned!(literal.span()=> .retention(::core::time::Duration::from_millis(#millis)))
        });
        // Without `lease = "..."`, the runtime's default lease applies.
        let lease = args
            .lease
            .as_ref()
            .map(|(millis, _)| quote!(.lease(::core::time::Duration::from_millis(#millis))));
        // Named apart from anything the user may have in scope: a `let` pattern naming a
        // constant or a unit struct in scope would match against it.
        let ident = Ident::new("__idem_spec", Span::mixed_site());
        let item = quote! {
            let #ident: #private::HandlerSpec = #private::HandlerSpec::new(#scope)
                .declared_in(::core::module_path!())
                #default_scope
                #shared_scope
                #max_attempts
                #cache_policy
                #retention
                #lease;
        };
        // The handler is compiled into the binary: the runtime's registry of its
        // handlers has it before `main`, whether or not it ever runs.
        let register = quote! {
            #private::inventory::submit! { #private::RegisteredHandler::new(#scope) }
        };
        Spec {
            ident,
            item,
            scope,
            register,
        }
    }
}

/// The scope: the one given, or by default the handler's module path and name, so that
/// handlers of the same name in other modules or crates keep apart.
fn scope(args: &Args, item: &ItemFn) -> TokenStream {
    match &args.scope {
        Some(scope) => quote!(#scope),
        None => {
            let name = syn::ext::IdentExt::unraw(&item.sig.ident).to_string();
            quote!(::core::concat!(::core::module_path!(), "::", #name))
        }
    }
}

/// A handler-level cache argument, for the spec. The policy is built through a trait
/// that the runtime implements only with its `redis` feature: spanned on the argument,
/// so that the error names the feature there.
fn cache_policy(private: &TokenStream, argument: CacheArg) -> TokenStream {
    match argument {
        CacheArg::Switch(on, span) => {
            let private = respan(private, span);
            quote_spanned!(span=> .cache(#private::handler_cache(#private::CacheSwitch(#on))))
        }
        CacheArg::Ttl(millis, span) => {
            let private = respan(private, span);
            quote_spanned!(span=> .cache(#private::handler_cache(#private::CacheTtlMillis(#millis))))
        }
    }
}
