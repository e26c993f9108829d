//! Code generation of `#[derive(KeyPart)]`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, LitStr, Path, parse_quote};

use crate::tokens::respan;

/// The `KeyPart` and `SoleKeyPart` impls of the type `input`.
pub(crate) fn key_part(input: &DeriveInput) -> syn::Result<TokenStream> {
    let private = crate::runtime::private_module(krate(input)?.as_ref());
    let body = match &input.data {
        Data::Struct(data) => struct_body(&private, input, &data.fields)?,
        Data::Enum(data) => enum_body(&private, input, data)?,
        Data::Union(data) => {
            return Err(syn::Error::new(
                data.union_token.span,
                "a union has no canonical key encoding; derive `KeyPart` on a struct or an enum",
            ));
        }
    };

    let mut generics = input.generics.clone();
    for param in generics.type_params_mut() {
        param.bounds.push(parse_quote!(#private::KeyPart));
    }
    let (impl_generics, type_generics, where_clause) = generics.split_for_impl();
    let ident = &input.ident;
    // A newtype identifies what its field identifies: one around a timestamp is a
    // timestamp. (The bound is written under `for<'_>` so that a field type which is not
    // `SoleKeyPart` makes the impl not apply instead of failing to compile.) Enums and
    // structs of several fields identify, as documented on `SoleKeyPart`.
    let newtype_field = match &input.data {
        Data::Struct(data) if data.fields.len() == 1 => data.fields.iter().next(),
        _ => None,
    };
    let mut sole_generics = generics.clone();
    if let Some(field) = newtype_field {
        let ty = &field.ty;
        sole_generics
            .make_where_clause()
            .predicates
            .push(parse_quote!(for<'__idem_newtype> #ty: #private::SoleKeyPart));
    }
    let sole_where_clause = &sole_generics.where_clause;
    let shape = shape_body(&private, &input.data);
    Ok(quote! {
        impl #impl_generics #private::KeyPart for #ident #type_generics #where_clause {
            fn encode_key_part(
                &self,
                encoder: &mut #private::KeyEncoder,
            ) -> ::core::result::Result<(), #private::MissingValue> {
                #body
            }
        }
        impl #impl_generics #private::SoleKeyPart for #ident #type_generics #sole_where_clause {}
        impl #impl_generics #private::KeyPartShape for #ident #type_generics #where_clause {
            fn key_shape(shape: &mut ::std::string::String) {
                #shape
            }
        }
    })
}

/// The shape of the type's encoding (see the runtime's `key::shape`): a struct's one
/// field's, `l(a s,b i)` of several fields' names and shapes, `s` for an enum of unit
/// variants (its variant's name) and `e` for an enum with a variant that has fields.
fn shape_body(private: &TokenStream, data: &Data) -> TokenStream {
    let field_shape = |ty: &syn::Type| {
        quote! {{
            #[allow(unused_imports)]
            use #private::{ShapeKnown as _, ShapeUnknown as _};
            (&&#private::ShapeOfType::<#ty>::new()).shape_of()(shape);
        }}
    };
    match data {
        Data::Struct(data) if data.fields.len() == 1 => {
            let field = data
                .fields
                .iter()
                .next()
                .map(|field| field_shape(&field.ty));
            quote!(#field)
        }
        Data::Struct(data) => {
            // The fields' names too: the encoding holds them in order, so fields that
            // swap places (of one shape) derive other keys.
            let fields = data.fields.iter().enumerate().map(|(index, field)| {
                let shape = field_shape(&field.ty);
                let name = field.ident.as_ref().map_or_else(
                    || index.to_string(),
                    |ident| syn::ext::IdentExt::unraw(ident).to_string(),
                );
                let separator = if index > 0 { "," } else { "" };
                let named = format!("{separator}{name} ");
                quote!(shape.push_str(#named); #shape)
            });
            quote! {
                shape.push_str("l(");
                #(#fields)*
                shape.push(')');
            }
        }
        Data::Enum(data)
            if data
                .variants
                .iter()
                .all(|variant| variant.fields.is_empty()) =>
        {
            quote!(shape.push('s');)
        }
        Data::Enum(_) | Data::Union(_) => quote!(shape.push('e');),
    }
}

/// The encoding of a struct: its one field, or the list of its fields.
fn struct_body(
    private: &TokenStream,
    input: &DeriveInput,
    fields: &Fields,
) -> syn::Result<TokenStream> {
    let bindings = bindings(fields);
    let pattern = pattern(quote!(Self), fields, &bindings);
    let encode = encode(private, fields, &bindings);
    Ok(match bindings.as_slice() {
        [] => {
            return Err(syn::Error::new_spanned(
                &input.ident,
                "a struct without fields has no value to key on",
            ));
        }
        [_] => quote! {
            let #pattern = self;
            #(#encode)*
        },
        _ => quote! {
            let #pattern = self;
            encoder.list(|encoder| {
                #(#encode?;)*
                ::core::result::Result::Ok(())
            })
        },
    })
}

/// The encoding of an enum: its variant's name, followed by its fields for variants that
/// have some.
fn enum_body(
    private: &TokenStream,
    input: &DeriveInput,
    data: &syn::DataEnum,
) -> syn::Result<TokenStream> {
    if data.variants.is_empty() {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "an enum without variants has no value to key on",
        ));
    }
    let arms = data.variants.iter().map(|variant| {
        let ident = &variant.ident;
        let name = ident.to_string();
        let bindings = bindings(&variant.fields);
        let pattern = pattern(quote!(Self::#ident), &variant.fields, &bindings);
        if bindings.is_empty() {
            quote!(#pattern => { encoder.string(#name); ::core::result::Result::Ok(()) })
        } else {
            let encode = encode(private, &variant.fields, &bindings);
            quote!(#pattern => encoder.list(|encoder| {
                encoder.string(#name);
                #(#encode?;)*
                ::core::result::Result::Ok(())
            }),)
        }
    });
    Ok(quote!(match self { #(#arms)* }))
}

/// The path of `#[key_part(crate = "...")]`, for a renamed `idem_runtime` dependency.
fn krate(input: &DeriveInput) -> syn::Result<Option<Path>> {
    let mut krate = None;
    for attr in input
        .attrs
        .iter()
        .filter(|attr| attr.path().is_ident("key_part"))
    {
        attr.parse_nested_meta(|meta| {
            if !meta.path.is_ident("crate") {
                return Err(meta.error("unknown `key_part` argument; expected `crate = \"path\"`"));
            }
            if krate.is_some() {
                return Err(meta.error("`crate` is given more than once"));
            }
            let literal: LitStr = meta.value()?.parse()?;
            krate = Some(literal.parse_with(Path::parse_mod_style)?);
            Ok(())
        })?;
    }
    Ok(krate)
}

/// `KeyPart::encode_key_part(field, encoder)` for every field, each spanned on the field's
/// type, so that a field without a key encoding is the one an error points at.
fn encode(private: &TokenStream, fields: &Fields, bindings: &[syn::Ident]) -> Vec<TokenStream> {
    fields
        .iter()
        .zip(bindings)
        .map(|(field, binding)| {
            let span = field.ty.span();
            let call = respan(&quote!(#private::KeyPart::encode_key_part), span);
            let mut binding = binding.clone();
            binding.set_span(span);
            quote_spanned!(span=> #call(#binding, encoder))
        })
        .collect()
}

fn bindings(fields: &Fields) -> Vec<syn::Ident> {
    (0..fields.len())
        .map(|i| format_ident!("field_{}", i))
        .collect()
}

fn pattern(path: TokenStream, fields: &Fields, bindings: &[syn::Ident]) -> TokenStream {
    match fields {
        Fields::Named(named) => {
            let names = named.named.iter().map(|field| &field.ident);
            quote!(#path { #(#names: #bindings),* })
        }
        Fields::Unnamed(_) => quote!(#path(#(#bindings),*)),
        Fields::Unit => quote!(#path),
    }
}
