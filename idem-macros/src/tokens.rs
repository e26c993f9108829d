//! Spans of generated tokens: where the compiler reports an error about generated code.

use proc_macro2::{Span, TokenStream};
use quote::quote_spanned;

/// `tokens` with every span set to `span`, so that an error about them points there.
pub(crate) fn respan(tokens: &TokenStream, span: Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|mut token| {
            if let proc_macro2::TokenTree::Group(group) = &token {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(&group.stream(), span));
                inner.set_span(span);
                token = proc_macro2::TokenTree::Group(inner);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// `runner(args).await` with `runner`, the parentheses and the `.await` spanned on `span`:
/// a bound of the runner, required by both the call and the `.await`, fails once, there.
pub(crate) fn call_at(runner: &TokenStream, args: TokenStream, span: Span) -> TokenStream {
    let runner = respan(runner, span);
    let mut args = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, args);
    args.set_span(span);
    quote_spanned!(span=> #runner #args .await)
}
