//! The derivation of a message's key and payload fingerprint, as generated code writes
//! it: `KeyBuilder::new().part("a", &message.a)?...`, each part spanned on the field that
//! names it, and the compile-time check that the key is not made of timestamps alone.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::Ident;

use crate::args::{FieldList, FieldPath};
use crate::tokens::respan;

/// The expressions that derive one message's key and fingerprint, from the message
/// bound to `message`. Each is written where a function derives the key; an error in
/// them (an unknown field, a type without a key encoding) is the same diagnostic at the
/// same place in every copy, which the compiler reports once.
pub(super) struct KeyDerivation {
    /// The block that checks, at compile time, that a key field identifies a fact.
    pub(super) identifies: TokenStream,
    /// `KeyBuilder` with the key's parts: `.finish()` gives the key; `?` on a `KeyError`.
    pub(super) key: TokenStream,
    /// `Option<[u8; 32]>`: the fingerprint's digest, or `None` without `fingerprint`.
    pub(super) fingerprint: TokenStream,
}

impl KeyDerivation {
    pub(super) fn new(
        private: &TokenStream,
        message: &Ident,
        key: &FieldList,
        fingerprint: Option<&FieldList>,
    ) -> Self {
        let fingerprint = match fingerprint {
            Some(list) => {
                let builder = builder(private, message, list, Built::Fingerprint);
                quote!(::core::option::Option::Some(#builder.digest()))
            }
            None => quote!(::core::option::Option::None),
        };
        KeyDerivation {
            identifies: identifies_check(private, message, key),
            key: builder(private, message, key, Built::Key),
            fingerprint,
        }
    }

    /// `|message| -> Result<(IdempotencyKey, Option<[u8; 32]>), KeyError>`, for the
    /// runners of batches.
    pub(super) fn closure(&self, private: &TokenStream, message: &Ident) -> TokenStream {
        let KeyDerivation {
            identifies,
            key,
            fingerprint,
        } = self;
        quote! {
            |#message| -> ::core::result::Result<_, #private::KeyError> {
                #identifies
                ::core::result::Result::Ok((#key.finish(), #fingerprint))
            }
        }
    }
}

/// What a list of fields builds.
#[derive(Clone, Copy)]
enum Built {
    /// The key: an absent value (`None`) is an error.
    Key,
    /// The payload fingerprint: an absent value is a value.
    Fingerprint,
}

/// `KeyBuilder::new().part("a", &msg.a)?.part(...)?`, each part spanned on the field that
/// names it.
fn builder(private: &TokenStream, message: &Ident, list: &FieldList, built: Built) -> TokenStream {
    let start = match built {
        Built::Key => quote!(#private::KeyBuilder::new()),
        Built::Fingerprint => quote!(#private::KeyBuilder::fingerprint()),
    };
    let parts = list.paths.iter().map(|path| {
        let span = path.span;
        let text = &path.text;
        let field = field_access(message, path);
        quote_spanned!(span=> .part(#text, #field)?)
    });
    quote!(#start #(#parts)*)
}

/// The check that the key has a field that is not only a timestamp (see
/// the runtime's `identifies` probes, in its private module), spanned on the key's fields.
fn identifies_check(private: &TokenStream, message: &Ident, key: &FieldList) -> TokenStream {
    let span = key.span;
    let private = respan(private, span);
    let classes = key.paths.iter().map(|path| {
        let field = field_access(message, path);
        quote_spanned!(span=> (&&&#private::identifies::Probe(#field)).key_part_class())
    });
    let folded = classes
        .reduce(
            |folded, class| quote_spanned!(span=> #private::identifies::Or::or(#folded, #class)),
        )
        .unwrap_or_else(|| quote_spanned!(span=> #private::identifies::Identifies));
    quote_spanned! {span=>
        {
            #[allow(unused_imports)]
            use #private::identifies::{
                ClassifyInstant as _, ClassifyOther as _, ClassifySole as _,
            };
            #private::identifies::key_identifies_a_fact(#folded);
        }
    }
}

/// `&message.a.b`, spanned on the field path (its identifiers in `key(a.b)`, the literal
/// or the path's text inside it in `key = "a.b"`), so that errors about the field point
/// there rather than at the parameter.
///
/// The components carry the spans the parser gave them: the user's own identifiers, or
/// the path's text inside the literal, let the compiler suggest a similar field name for
/// an unknown one. A component that can only point at the whole literal is in the
/// macro's own (mixed-site) context instead: the compiler's "a field with a similar name
/// exists" would otherwise offer to replace the whole literal with a bare identifier. The
/// access is then bound to a local spanned on the path, so that an error about the
/// field's type (no key encoding) still points at the path, not at the attribute.
fn field_access(message: &Ident, path: &FieldPath) -> TokenStream {
    let span = path.span;
    let mut message = message.clone();
    message.set_span(span);
    let members = &path.members;
    let field = Ident::new("__idem_key_field", span);
    quote_spanned!(span=> { let #field = &#message #(.#members)*; #field })
}
