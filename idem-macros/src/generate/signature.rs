//! The signatures of the generated functions and what they do with the handler's own
//! parameters.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Pat, PatType, Signature, Type};

use crate::tokens::respan;

/// The generated function's signature: the handler's qualifiers and generics with the
/// given name, parameters and return type.
pub(super) fn rewritten_signature(
    sig: &Signature,
    name: &Ident,
    inputs: impl Iterator<Item = TokenStream>,
    output: TokenStream,
) -> TokenStream {
    let Signature {
        constness,
        asyncness,
        unsafety,
        abi,
        fn_token,
        generics,
        ..
    } = sig;
    let where_clause = &generics.where_clause;
    quote! {
        #constness #asyncness #unsafety #abi #fn_token #name #generics (#(#inputs),*)
            -> #output #where_clause
    }
}

/// `let name = clone_for_run(&name);` for a parameter bound to a name and not a
/// reference: spanned on its type, where a type that is not `Clone` is reported with the
/// reason (the runtime's `ClonedForEachRun`).
pub(super) fn clone_if_owned(private: &TokenStream, typed: &PatType) -> Option<TokenStream> {
    match (&*typed.pat, &*typed.ty) {
        (Pat::Ident(pat), ty) if !matches!(ty, Type::Reference(_)) => {
            let ident = &pat.ident;
            let span = ty.span();
            let private = respan(private, span);
            Some(quote_spanned!(span=> let #ident = #private::clone_for_run(&#ident);))
        }
        _ => None,
    }
}

/// The message type without its reference: `M` of `&M`, or the owned type itself.
pub(super) fn unreferenced(ty: &Type) -> &Type {
    match ty {
        Type::Reference(reference) => &reference.elem,
        other => other,
    }
}
