//! The `#[idempotent]` attribute and `#[derive(KeyPart)]` of idem.
//!
//! Use them through `idem_runtime`, which re-exports both and documents them; this crate
//! only parses the arguments (`args`), checks them against the handler (`validate`) and
//! generates code (`generate`, `derive`) that calls the runtime's versioned private
//! module (`runtime::private_module`). The modules depend one way: `args` and `tokens`
//! on nothing of this crate, `validate` on `args`, `generate` and `derive` on those and
//! on `runtime`.

mod args;
mod derive;
mod generate;
mod runtime;
mod tokens;
mod validate;

use proc_macro::TokenStream;
use quote::ToTokens;

/// Makes an async handler idempotent over PostgreSQL. See `idem_runtime` for the arguments,
/// the generated code and the guarantees.
///
/// A handler whose message parameter is a slice of references (`events: &[&Message]`) is
/// a batch handler: the generated function takes `(&Idem, &[Message], ...)`, claims all
/// keys at once and runs the body once with the new messages (`idem_runtime`'s "Batch
/// handlers"). `batch = true` instead adds `<handler>_batch` to a handler of one message,
/// running its body once per new message.
///
/// Next to every handler, `<handler>_key(&message)` (with the handler's visibility)
/// returns the `idem_runtime::HandlerKey` that the handler derives from a message: its
/// scope, the message's key and payload fingerprint, or `KeyError` for a key field that
/// is `None`; for callers that need the key without running the handler (`idem_runtime`'s
/// "The key of a message, for callers").
///
/// `key_fn = "other_name"` names that function otherwise (when `<handler>_key` clashes
/// with an item of yours); `key_fn = false` generates none, as a method of a trait impl
/// needs (the trait does not declare the key function); `key_fn = true` is the default.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut parsed = args::Args::default();
    let parser = syn::meta::parser(|meta| parsed.parse(meta));
    if let Err(error) = syn::parse::Parser::parse(parser, args) {
        parsed.errors.push(error);
    }
    let item_tokens = proc_macro2::TokenStream::from(item.clone());
    let function = match syn::parse::<syn::ItemFn>(item) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new_spanned(
                &item_tokens,
                "#[idempotent] applies to an `async fn` handler",
            );
            return with_errors(item_tokens, vec![error]);
        }
    };
    match generate::expand(parsed, &function) {
        Ok(expanded) => expanded.into(),
        // The function is kept as written, so that its own errors and uses still resolve.
        Err(errors) => with_errors(function.into_token_stream(), errors),
    }
}

/// Implements `idem_runtime::key::KeyPart` (and `SoleKeyPart`) for a struct or an enum.
///
/// A struct with one field encodes as that field; a struct with several fields as the
/// list of its fields in declaration order; an enum as its variant's name (followed by
/// its fields, for variants that have some).
///
/// `SoleKeyPart` (the part identifies something, it is not only a timestamp) is
/// implemented for enums, for structs of several fields, and for a struct of one field
/// when that field's type implements it: a newtype around a timestamp is a timestamp.
///
/// Where the `idem_runtime` dependency is renamed, say so with
/// `#[key_part(crate = "renamed")]`, as with `#[idempotent(crate = "renamed")]`.
#[proc_macro_derive(KeyPart, attributes(key_part))]
pub fn derive_key_part(item: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(item as syn::DeriveInput);
    derive::key_part(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

fn with_errors(item: proc_macro2::TokenStream, errors: Vec<syn::Error>) -> TokenStream {
    let errors = errors.into_iter().map(syn::Error::into_compile_error);
    quote::quote!(#(#errors)* #item).into()
}
