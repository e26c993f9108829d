//! Code generation of `#[derive(KeyPart)]`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Data, DeriveInput, Fields, parse_quote};

pub fn key_part(input: &DeriveInput) -> syn::Result<TokenStream> {
    let private = quote!(::idem_runtime::__private);
    let body = match &input.data {
        Data::Struct(data) => {
            let bindings = bindings(&data.fields);
            let pattern = pattern(quote!(Self), &data.fields, &bindings);
            match bindings.as_slice() {
                [] => {
                    return Err(syn::Error::new_spanned(
                        &input.ident,
                        "a struct without fields has no value to key on",
                    ));
                }
                [only] => quote! {
                    let #pattern = self;
                    #private::KeyPart::encode_key_part(#only, encoder)
                },
                _ => quote! {
                    let #pattern = self;
                    encoder.list(|encoder| {
                        #(#private::KeyPart::encode_key_part(#bindings, encoder)?;)*
                        ::core::result::Result::Ok(())
                    })
                },
            }
        }
        Data::Enum(data) => {
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
                    quote!(#pattern => encoder.list(|encoder| {
                        encoder.string(#name);
                        #(#private::KeyPart::encode_key_part(#bindings, encoder)?;)*
                        ::core::result::Result::Ok(())
                    }))
                }
            });
            quote!(match self { #(#arms)* })
        }
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
    Ok(quote! {
        impl #impl_generics #private::KeyPart for #ident #type_generics #where_clause {
            fn encode_key_part(
                &self,
                encoder: &mut #private::KeyEncoder,
            ) -> ::core::result::Result<(), #private::MissingValue> {
                #body
            }
        }
        impl #impl_generics #private::SoleKeyPart for #ident #type_generics #where_clause {}
    })
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
