//! `<handler>_key(message)`: the key a handler derives from a message, for callers
//! (producers, consumers that track positions, tests, tools), from the same `key` and
//! `fingerprint` arguments as the handler. A function, so that it sits next to the
//! handler wherever a handler can be: in a module, in a function body, in an `impl`.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote};
use syn::{GenericParam, Generics, Ident, ItemFn, WherePredicate};

use super::expansion::Expansion;
use super::signature::unreferenced;

/// The key function of the handler.
pub(super) fn expand(x: &Expansion<'_>) -> TokenStream {
    let ItemFn {
        attrs, vis, sig, ..
    } = x.item;
    // The handler's own `#[cfg]`s (those written after the attribute): the function
    // exists where the handler does.
    let cfgs = attrs.iter().filter(|attr| attr.path().is_ident("cfg"));
    let private = &x.private;
    let message = &x.handler.message;
    // One message: the element of a batch handler's slice, or the message parameter's
    // type, borrowed.
    let (param, bind) = match x.handler.batch_of {
        Some(element) => {
            // The batch handler's parameter names the slice; the function's names one
            // message, bound to the slice's name for the derivation.
            let one = Ident::new("message", Span::call_site());
            (quote!(#one: &#element), Some(quote!(let #message = #one;)))
        }
        None => {
            let ty = &x.handler.message_param.ty;
            let ty = match &**ty {
                syn::Type::Reference(_) => ty.to_token_stream(),
                owned => {
                    let owned = unreferenced(owned);
                    quote!(&#owned)
                }
            };
            (quote!(#message: #ty), None)
        }
    };
    let generics = generics_of(&sig.generics, &param);
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    // `r#type` gives `type_key`.
    let name = format_ident!("{}_key", sig.ident);
    let handler = syn::ext::IdentExt::unraw(&sig.ident);
    let doc = format!(
        "The key that `{handler}` derives from a message: its scope, the message's idempotency key and payload fingerprint, as the status table records them. Fails when a key field has no value (`None`)."
    );
    let (scope, identifies) = (&x.spec.scope, &x.key.identifies);
    let (key, fingerprint) = (&x.key.key, &x.key.fingerprint);
    quote! {
        #(#cfgs)*
        #[doc = #doc]
        #[allow(dead_code)]
        #vis fn #name #impl_generics (#param)
            -> ::core::result::Result<#private::HandlerKey, #private::KeyError>
            #where_clause
        {
            #bind
            #identifies
            ::core::result::Result::Ok(#private::handler_key(#scope, #key.finish(), #fingerprint))
        }
    }
}

/// The handler's generics that the message parameter `param` needs: all lifetimes, the
/// type and const parameters it names, and the bounds that name nothing else. A handler
/// generic over its error or a ledger (`book::<Cash>`) has a key function that is not.
fn generics_of(generics: &Generics, param: &TokenStream) -> Generics {
    let named = idents(param.clone());
    let dropped: HashSet<String> = generics
        .params
        .iter()
        .filter_map(|param| match param {
            GenericParam::Type(ty) => Some(ty.ident.to_string()),
            GenericParam::Const(constant) => Some(constant.ident.to_string()),
            GenericParam::Lifetime(_) => None,
        })
        .filter(|ident| !named.contains(ident))
        .collect();
    let names_dropped =
        |tokens: TokenStream| idents(tokens).iter().any(|ident| dropped.contains(ident));
    let mut kept = generics.clone();
    kept.params = generics
        .params
        .iter()
        .filter(|param| match param {
            GenericParam::Type(ty) => !dropped.contains(&ty.ident.to_string()),
            GenericParam::Const(constant) => !dropped.contains(&constant.ident.to_string()),
            GenericParam::Lifetime(_) => true,
        })
        .cloned()
        .map(|mut param| {
            if let GenericParam::Type(ty) = &mut param {
                ty.bounds = std::mem::take(&mut ty.bounds)
                    .into_iter()
                    .filter(|bound| !names_dropped(bound.to_token_stream()))
                    .collect();
                ty.default = None;
            }
            param
        })
        .collect();
    if let Some(clause) = &mut kept.where_clause {
        clause.predicates = std::mem::take(&mut clause.predicates)
            .into_iter()
            .filter(|predicate: &WherePredicate| !names_dropped(predicate.to_token_stream()))
            .collect();
    }
    kept
}

/// Every identifier in `tokens`, as text.
fn idents(tokens: TokenStream) -> HashSet<String> {
    let mut found = HashSet::new();
    for token in tokens {
        match token {
            TokenTree::Ident(ident) => {
                found.insert(ident.to_string());
            }
            TokenTree::Group(group) => found.extend(idents(group.stream())),
            TokenTree::Punct(_) | TokenTree::Literal(_) => {}
        }
    }
    found
}
