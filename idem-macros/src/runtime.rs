//! The runtime as generated code names it.

use quote::quote;

/// The path of the module of the runtime that generated code calls:
/// `<krate>::__private_v<version>`, with `krate` the runtime's path (`::idem_runtime`
/// unless renamed). idem-runtime's build.rs derives the same name from its version, and
/// the workspace pins this crate to that version with `=`: generated code never meets a
/// runtime of another version. The only place the name is written.
pub(crate) fn private_module(krate: Option<&syn::Path>) -> proc_macro2::TokenStream {
    let name: String = concat!("__private_v", env!("CARGO_PKG_VERSION"))
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let name = proc_macro2::Ident::new(&name, proc_macro2::Span::call_site());
    match krate {
        Some(krate) => quote!(#krate::#name),
        None => quote!(::idem_runtime::#name),
    }
}
