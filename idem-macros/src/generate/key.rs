//! The derivation of a message's key and payload fingerprint, as generated code writes
//! it: `KeyBuilder::new().part("a", &message.a)?...`, each part spanned on the field that
//! names it, the key under the previous definition (`previous_key`), the compile-time
//! check that the key is not made of timestamps alone, and the key's layout (its field
//! paths and each part's shape), which the runtime records with the scope.

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
    /// `Option<IdempotencyKey>`: the key under the previous definition, or `None` without
    /// `previous_key` (or when the message has no value for it).
    pub(super) previous: TokenStream,
    /// The arrays of the layout's parts and the message type, from the message bound to
    /// the derivation's name: `([DefinedPart; K], [DefinedPart; F], [DefinedPart; P], fn)`.
    layout_parts: TokenStream,
    /// `Option<DateTime<Utc>>`: the fact's time, or `None` without `event_time`.
    pub(super) fact_time: TokenStream,
    /// `Option<&'static str>`: the field `event_time` names, for the layout.
    event_time_field: TokenStream,
    /// `Option<&'static str>`: the field `previous_event_time` names, for the layout.
    previous_event_time_field: TokenStream,
    /// Whether the handler declares a fingerprint and a previous key.
    has_fingerprint: bool,
    has_previous: bool,
}

impl KeyDerivation {
    pub(super) fn new(
        private: &TokenStream,
        message: &Ident,
        key: &FieldList,
        fingerprint: Option<&FieldList>,
        previous_key: Option<&FieldList>,
        event_time: Option<&FieldPath>,
        previous_event_time: Option<&FieldPath>,
    ) -> Self {
        let fingerprint_digest = match fingerprint {
            Some(list) => {
                let builder = builder(private, message, list, Built::Fingerprint);
                quote!(::core::option::Option::Some(#builder.digest()))
            }
            None => quote!(::core::option::Option::None),
        };
        // A message without a value for the previous key (a field that became optional)
        // cannot have succeeded under it: it has no previous key.
        let previous = match previous_key {
            Some(list) => {
                let builder = builder(private, message, list, Built::Key);
                quote! {
                    (|| -> ::core::result::Result<_, #private::KeyError> {
                        ::core::result::Result::Ok(#builder.finish())
                    })().ok()
                }
            }
            None => quote!(::core::option::Option::None),
        };
        let parts = |list: Option<&FieldList>| layout_array(private, message, list);
        let (key_parts, fingerprint_parts, previous_parts) =
            (parts(Some(key)), parts(fingerprint), parts(previous_key));
        // Spanned on `event_time`'s field: a type that is not a time is reported there.
        let (fact_time, event_time_field) = match event_time {
            Some(path) => {
                let field = field_access(message, path);
                let span = path.span;
                let text = &path.text;
                let private = respan(private, span);
                (
                    quote_spanned!(span=> #private::fact_time(#field)),
                    quote!(::core::option::Option::Some(#text)),
                )
            }
            None => (
                quote!(::core::option::Option::None),
                quote!(::core::option::Option::None),
            ),
        };
        // The previous key's time is the fact's (the same field): the layout says only
        // that the previous keys are in the time buckets too.
        let previous_event_time_field = match previous_event_time {
            Some(path) => {
                let text = &path.text;
                quote!(::core::option::Option::Some(#text))
            }
            None => quote!(::core::option::Option::None),
        };
        KeyDerivation {
            identifies: identifies_check(private, message, key),
            key: builder(private, message, key, Built::Key),
            fingerprint: fingerprint_digest,
            previous,
            layout_parts: quote! {
                (#key_parts, #fingerprint_parts, #previous_parts, #private::message_type_of(&#message))
            },
            fact_time,
            event_time_field,
            previous_event_time_field,
            has_fingerprint: fingerprint.is_some(),
            has_previous: previous_key.is_some(),
        }
    }

    /// `MessageKeys { key, fingerprint, previous }` of the message bound to the
    /// derivation's name; `?` on a `KeyError`.
    pub(super) fn message_keys(&self, private: &TokenStream) -> TokenStream {
        let KeyDerivation {
            key,
            fingerprint,
            previous,
            fact_time,
            ..
        } = self;
        quote! {
            #private::MessageKeys {
                key: #key.finish(),
                fingerprint: #fingerprint,
                previous: #previous,
                fact_time: #fact_time,
            }
        }
    }

    /// The statements that bind `layout` to the handler's `KeyLayout`, from the message
    /// bound to the derivation's name (`one_of`: `None`) or from the first message of the
    /// slice `one_of` (returning no outcomes from the generated function for an empty one).
    pub(super) fn layout(
        &self,
        private: &TokenStream,
        message: &Ident,
        one_of: Option<&Ident>,
        layout: &Ident,
    ) -> TokenStream {
        let parts = Ident::new("__idem_layout_parts", proc_macro2::Span::mixed_site());
        let layout_parts = &self.layout_parts;
        let bind = match one_of {
            None => quote!(let #parts = #layout_parts;),
            Some(messages) => quote! {
                let #parts = match #messages.first() {
                    ::core::option::Option::Some(#message) => #layout_parts,
                    ::core::option::Option::None => return ::std::vec::Vec::new(),
                };
            },
        };
        let some = |present: bool, index: syn::Index| {
            if present {
                quote!(::core::option::Option::Some(&#parts.#index))
            } else {
                quote!(::core::option::Option::None)
            }
        };
        let fingerprint = some(self.has_fingerprint, syn::Index::from(1));
        let previous = some(self.has_previous, syn::Index::from(2));
        let event_time = &self.event_time_field;
        let previous_event_time = &self.previous_event_time_field;
        quote! {
            #bind
            let #layout = #private::KeyLayout {
                key: &#parts.0,
                fingerprint: #fingerprint,
                previous_key: #previous,
                message_type: #parts.3,
                event_time: #event_time,
                previous_event_time: #previous_event_time,
            };
        }
    }

    /// `|message| -> Result<MessageKeys, KeyError>`, for the runners of batches.
    pub(super) fn closure(&self, private: &TokenStream, message: &Ident) -> TokenStream {
        let identifies = &self.identifies;
        let keys = self.message_keys(private);
        quote! {
            |#message| -> ::core::result::Result<_, #private::KeyError> {
                #identifies
                ::core::result::Result::Ok(#keys)
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

/// `[(path, shape), ...]`: the parts of a key, fingerprint or previous key as the layout
/// describes them, each part's shape found from its field's type (see the runtime's
/// `ShapeProbe`); `[]` for a list the handler does not declare.
fn layout_array(private: &TokenStream, message: &Ident, list: Option<&FieldList>) -> TokenStream {
    let paths = list.map_or(&[][..], |list| list.paths.as_slice());
    let count = paths.len();
    let parts = paths.iter().map(|path| {
        let text = &path.text;
        let field = field_access(message, path);
        quote! {
            (#text, {
                #[allow(unused_imports)]
                use #private::{ShapeKnown as _, ShapeUnknown as _};
                (&&#private::ShapeProbe(#field)).shape_of()
            })
        }
    });
    let local = Ident::new("__idem_parts", proc_macro2::Span::mixed_site());
    quote!({
        let #local: [#private::DefinedPart; #count] = [#(#parts),*];
        #local
    })
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
