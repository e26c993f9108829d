//! Code generation of `#[idempotent]`: the rewritten handler derives its key and calls
//! `run_transactional` of the runtime's private module (`private_module`) (or `run_lease`, `run_batch`) with its body
//! as a closure. The arguments come parsed (`parse`) and checked against the signature
//! (`validate`).

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, PatType, Signature, Type};

use crate::batch_handler::BatchHandler;
use crate::parse::{Args, CacheArg, FieldList, FieldPath, Mode};
use crate::validate::validate;

/// Expands the attribute; every problem found is returned together.
pub fn expand(mut args: Args, item: &ItemFn) -> Result<TokenStream, Vec<syn::Error>> {
    let mode = args.mode();
    let batch = args.batch(mode);
    let cache = args.cache();
    let shared_scope = args.shared_scope();
    let handler = validate(&mut args, item, mode)?;
    let key = args.key.as_ref().expect("validated: the key is given");
    let krate = args
        .krate
        .as_ref()
        .map_or_else(|| quote!(::idem_runtime), ToTokens::to_token_stream);
    let private = crate::private_module(args.krate.as_ref());
    let idem = Ident::new("idem", Span::mixed_site());
    let message = &handler.message;

    // The default scope names the handler by its module path, so that handlers of the
    // same name in other modules or crates keep apart.
    let scope = match &args.scope {
        Some(scope) => quote!(#scope),
        None => {
            let name = syn::ext::IdentExt::unraw(&item.sig.ident).to_string();
            quote!(::core::concat!(::core::module_path!(), "::", #name))
        }
    };
    let shared_scope = shared_scope.then(|| quote!(.shared_scope()));
    let max_attempts = args
        .max_attempts
        .as_ref()
        .map(|n| quote!(.max_attempts(#n)));
    let codec = match &args.store_result {
        Some(flag) if !flag.value => quote!(#private::NoResult),
        _ => quote!(#private::JsonResult),
    };

    let key_builder = builder(&private, message, key, Built::Key);
    let identifies = identifies_check(&private, message, key);
    let fingerprint_expr = match &args.fingerprint {
        Some(list) => {
            let fingerprint_builder = builder(&private, message, list, Built::Fingerprint);
            quote!(::core::option::Option::Some(#fingerprint_builder.digest()))
        }
        None => quote!(::core::option::Option::None),
    };

    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = item;
    let output = handler.output;
    // The first token of the return type, where errors about it are reported.
    let first = output
        .to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |token| token.span());
    // A handler-level cache argument goes into the spec. The policy is built through a
    // trait that the runtime implements only with its `redis` feature: spanned on the
    // argument, so that the error names the feature there.
    let cache_policy = cache.map(|argument| match argument {
        CacheArg::Switch(on, span) => {
            let private = respan(&private, span);
            quote_spanned!(span=> .cache(#private::handler_cache(#private::CacheSwitch(#on))))
        }
        CacheArg::Ttl(millis, span) => {
            let private = respan(&private, span);
            quote_spanned!(span=> .cache(#private::handler_cache(#private::CacheTtlMillis(#millis))))
        }
    });
    let retention = args.retention.as_ref().map(|(millis, literal)| {
        quote_spanned!(literal.span()=> .retention(::core::time::Duration::from_millis(#millis)))
    });
    let lease = (mode == Mode::Lease).then(|| {
        let lease_millis = args.lease_millis();
        quote!(.lease(::core::time::Duration::from_millis(#lease_millis)))
    });
    // The generated locals are named apart from anything the user may have in scope: a
    // `let` pattern naming a constant or a unit struct in scope would match against it.
    let spec = Ident::new("__idem_spec", Span::mixed_site());
    let spec_item = quote! {
        let #spec: #private::HandlerSpec = #private::HandlerSpec::new(#scope)
            .declared_in(::core::module_path!())
            #shared_scope
            #max_attempts
            #cache_policy
            #retention
            #lease;
    };
    if let Some(element) = handler.batch_of {
        let derive = quote! {
            |#message| -> ::core::result::Result<_, #private::KeyError> {
                #identifies
                ::core::result::Result::Ok((#key_builder.finish(), #fingerprint_expr))
            }
        };
        let generated = BatchHandler {
            handler: &handler,
            element,
            krate: &krate,
            private: &private,
            spec,
            spec_item,
            derive,
            first,
        };
        return Ok(generated.expand(item));
    }
    let is_context = |typed: &PatType| {
        handler
            .context
            .is_some_and(|context| std::ptr::eq(typed, context))
    };
    // The connection or lease guard becomes the runtime handle; without a lease guard, the
    // handle goes before the message.
    let inputs = sig.inputs.iter().flat_map(|input| match input {
        FnArg::Typed(typed) if is_context(typed) => vec![quote!(#idem: &#krate::Idem)],
        FnArg::Typed(typed)
            if handler.context.is_none() && std::ptr::eq(typed, handler.message_param) =>
        {
            vec![quote!(#idem: &#krate::Idem), typed.to_token_stream()]
        }
        other => vec![other.to_token_stream()],
    });
    let signature =
        rewritten_signature(sig, &sig.ident, inputs, quote!(#private::Handled<#output>));
    // Locals of the generated code, invisible to the user's body.
    let [derived, key, fingerprint, error, transaction, result] = [
        "__idem_derived",
        "__idem_key",
        "__idem_fingerprint",
        "__idem_error",
        "__idem_transaction",
        "__idem_result",
    ]
    .map(|name| Ident::new(name, Span::mixed_site()));
    // A transactional body may run again after a transient failure: each run gets its own
    // clone of the owned parameters, which it may move out of. A lease body runs once and
    // takes them as they are.
    let clone_owned: Vec<TokenStream> = sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Typed(typed) if mode == Mode::Transaction && !is_context(typed) => {
                clone_if_owned(&private, typed)
            }
            _ => None,
        })
        .collect();
    // The runner's bounds on the result and the error (a `Result`, a `std::error::Error`,
    // storable) are checked by its call, spanned on the return type's first token with
    // the codec argument and the `.await` (see `call_at`): the compiler reports a failed
    // bound there, once. (A span over the whole type cannot be given to `.await`.)
    let codec_arg = respan(&codec, first);

    let (run_transactional, run_lease) = (
        quote!(#private::run_transactional),
        quote!(#private::run_lease),
    );

    let call = match mode {
        Mode::Transaction => {
            let context = handler
                .context
                .expect("checked: transaction handlers take a connection");
            let (connection_pat, connection_ty) = (&context.pat, &context.ty);
            let run_args = quote! {
                    #idem,
                    &#spec,
                    #key,
                    #fingerprint,
                    #codec_arg,
                    move |mut #transaction| {
                        #(#clone_owned)*
                        async move {
                            let #result = {
                                let #connection_pat: #connection_ty = &mut *#transaction;
                                #private::handler_body::<#output, _>(async #block).await
                            };
                            (#transaction, #result)
                        }
                    },
            };
            call_at(&run_transactional, run_args, first)
        }
        Mode::Lease => {
            let guard = handler.context.map(|context| {
                let (lease_pat, lease_ty) = (&context.pat, &context.ty);
                quote!(let #lease_pat: #lease_ty = &#transaction;)
            });
            let run_args = quote! {
                    #idem,
                    &#spec,
                    #key,
                    #fingerprint,
                    #codec_arg,
                    move |#transaction| async move {
                        #guard
                        #private::handler_body::<#output, _>(async #block).await
                    },
            };
            call_at(&run_lease, run_args, first)
        }
    };

    let batch_fn = batch.then(|| {
        let context = handler.context.expect("checked: transaction handlers take a connection");
        let (connection_pat, connection_ty) = (&context.pat, &context.ty);
        let messages = Ident::new("messages", Span::mixed_site());
        let message_ty = match &*handler.message_param.ty {
            Type::Reference(reference) => &*reference.elem,
            other => other,
        };
        let inputs = sig.inputs.iter().map(|input| match input {
            FnArg::Typed(typed) if is_context(typed) => quote!(#idem: &#krate::Idem),
            FnArg::Typed(typed) if std::ptr::eq(typed, handler.message_param) => {
                quote!(#messages: &[#message_ty])
            }
            other => other.to_token_stream(),
        });
        // The message is borrowed from the slice: an owned message parameter gets a clone.
        let clone_per_message = sig.inputs.iter().filter_map(|input| match input {
            FnArg::Typed(typed) if std::ptr::eq(typed, handler.message_param) => {
                let ty = &typed.ty;
                (!matches!(&**ty, Type::Reference(_))).then(|| {
                    let private = respan(&private, ty.span());
                    // Spanned as the handler's own clone of the parameter, so that a
                    // message that is not `Clone` gets one error, not one per function.
                    quote_spanned!(ty.span()=> let #message: #ty = #private::clone_for_run(&*#message);)
                })
            }
            FnArg::Typed(typed) if !is_context(typed) => clone_if_owned(&private, typed),
            _ => None,
        });
        // `r#type` gives `type_batch`.
        let name = format_ident!("{}_batch", sig.ident);
        let signature = rewritten_signature(
            sig,
            &name,
            inputs,
            quote!(::std::vec::Vec<#private::Handled<#output>>),
        );
        let handler_name = syn::ext::IdentExt::unraw(&sig.ident);
        let link = if sig.ident.to_string().starts_with("r#") {
            format!("`{handler_name}`")
        } else {
            format!("[`{handler_name}`]")
        };
        let doc = format!(
            "The batch variant of {link}: claims the keys of all `messages` in one statement, runs the body for the new ones and commits once. Returns one outcome per message, in order.",
        );
        let run_batch_args = quote! {
            #idem,
            &#spec,
            #messages,
            |#message| -> ::core::result::Result<_, #private::KeyError> {
                #identifies
                ::core::result::Result::Ok((#key_builder.finish(), #fingerprint_expr))
            },
            #codec_arg,
            move |mut #transaction, #message| {
                #(#clone_per_message)*
                // The message is used: its key was derived from it.
                let _ = &#message;
                async move {
                    let #result = {
                        let #connection_pat: #connection_ty = &mut *#transaction;
                        #private::handler_body::<#output, _>(async #block).await
                    };
                    (#transaction, #result)
                }
            },
        };
        let run_batch_call = call_at(&quote!(#private::run_batch), run_batch_args, first);
        quote! {
            #[doc = #doc]
            #vis #signature
            {
                #spec_item
                #run_batch_call
            }
        }
    });

    Ok(quote! {
        #batch_fn

        #(#attrs)*
        #vis #signature
        {
            #spec_item
            #identifies
            let #derived = (|| -> ::core::result::Result<_, #private::KeyError> {
                ::core::result::Result::Ok((#key_builder.finish(), #fingerprint_expr))
            })();
            let (#key, #fingerprint) = match #derived {
                ::core::result::Result::Ok(#derived) => #derived,
                ::core::result::Result::Err(#error) => {
                    return ::core::result::Result::Err(#private::Error::Key(#error));
                }
            };
            #call
        }
    })
}

/// The generated function's signature: the handler's qualifiers and generics with the
/// given name, parameters and return type.
pub(crate) fn rewritten_signature(
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

/// `runner(args).await` with `runner`, the parentheses and the `.await` spanned on `span`:
/// a bound of the runner, required by both the call and the `.await`, fails once, there.
pub(crate) fn call_at(runner: &TokenStream, args: TokenStream, span: Span) -> TokenStream {
    let runner = respan(runner, span);
    let mut args = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, args);
    args.set_span(span);
    quote_spanned!(span=> #runner #args .await)
}

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

/// What a list of fields builds.
#[derive(Clone, Copy)]
pub(crate) enum Built {
    /// The key: an absent value (`None`) is an error.
    Key,
    /// The payload fingerprint: an absent value is a value.
    Fingerprint,
}

/// `KeyBuilder::new().part("a", &msg.a)?.part(...)?`, each part spanned on the field that
/// names it.
pub(crate) fn builder(
    private: &TokenStream,
    message: &Ident,
    list: &FieldList,
    built: Built,
) -> TokenStream {
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
/// `idem_runtime::key::identifies`), spanned on the key's fields.
pub(crate) fn identifies_check(
    private: &TokenStream,
    message: &Ident,
    key: &FieldList,
) -> TokenStream {
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
pub(crate) fn field_access(message: &Ident, path: &FieldPath) -> TokenStream {
    let span = path.span;
    let mut message = message.clone();
    message.set_span(span);
    let members = &path.members;
    let field = Ident::new("__idem_key_field", span);
    quote_spanned!(span=> { let #field = &#message #(.#members)*; #field })
}

/// `let name = clone_for_run(&name);` for a parameter bound to a name and not a
/// reference: spanned on its type, where a type that is not `Clone` is reported with the
/// reason (`idem_runtime::handler::ClonedForEachRun`).
pub(crate) fn clone_if_owned(private: &TokenStream, typed: &PatType) -> Option<TokenStream> {
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
