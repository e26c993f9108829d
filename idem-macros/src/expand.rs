//! Code generation of `#[idempotent]`: the rewritten handler derives its key and calls
//! `idem_runtime::__private::run_transactional` (or `run_lease`) with its body as a closure.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, PatType, ReturnType, Signature, Type};

use crate::attr::{Args, CacheArg, FieldList, FieldPath, Mode};

/// The handler's parts that the expansion needs, once checked.
struct Handler<'a> {
    /// The connection (transaction mode) or the lease guard (lease mode, optional).
    context: Option<&'a PatType>,
    /// The message parameter and its name.
    message_param: &'a PatType,
    message: Ident,
    output: &'a Type,
    /// A batch handler (message parameter `&[&M]`): the message type `M`.
    batch_of: Option<&'a Type>,
}

/// Expands the attribute; every problem found is returned together.
pub fn expand(mut args: Args, item: &ItemFn) -> Result<TokenStream, Vec<syn::Error>> {
    let mode = args.mode();
    let batch = args.batch(mode);
    let cache = args.cache();
    let shared_scope = args.shared_scope();
    // With an unknown mode, the signature cannot be checked against either one.
    let handler = if args.mode_unknown {
        None
    } else {
        check_signature(item, mode, &mut args.errors)
    };
    if handler
        .as_ref()
        .is_some_and(|handler| handler.batch_of.is_some())
    {
        args.check_batch_handler();
    }
    if args.key.is_none() {
        args.errors.push(syn::Error::new(
            Span::call_site(),
            "missing `key`: name the message fields that identify the business fact, e.g. `#[idempotent(key = \"order_id, event_type\")]`",
        ));
    }
    let (Some(handler), Some(key), true) = (handler, args.key.as_ref(), args.errors.is_empty())
    else {
        return Err(std::mem::take(&mut args.errors));
    };

    let krate = args
        .krate
        .as_ref()
        .map_or_else(|| quote!(::idem_runtime), ToTokens::to_token_stream);
    let private = quote!(#krate::__private);
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

/// A batch handler: its message parameter is a slice `&[&M]`, and the generated function
/// takes `(&Idem, &[M], ...)` and runs the body once for all the new messages.
struct BatchHandler<'a> {
    handler: &'a Handler<'a>,
    /// The message type `M`.
    element: &'a Type,
    krate: &'a TokenStream,
    spec: Ident,
    /// `let SPEC: HandlerSpec = ...;`
    spec_item: TokenStream,
    /// The closure that derives one message's key and fingerprint.
    derive: TokenStream,
    /// The first token of the return type, where the runner's bounds are reported.
    first: Span,
}

impl BatchHandler<'_> {
    fn expand(self, item: &ItemFn) -> TokenStream {
        let BatchHandler {
            handler,
            element,
            krate,
            spec,
            spec_item,
            derive,
            first,
        } = self;
        let ItemFn {
            attrs,
            vis,
            sig,
            block,
        } = item;
        let private = quote!(#krate::__private);
        let output = handler.output;
        let [idem, messages, new, transaction, result] = [
            "idem",
            "messages",
            "__idem_new_messages",
            "__idem_transaction",
            "__idem_result",
        ]
        .map(|name| Ident::new(name, Span::mixed_site()));
        let context = handler
            .context
            .expect("checked: transaction handlers take a connection");
        let (connection_pat, connection_ty) = (&context.pat, &context.ty);
        let message_pat = &handler.message_param.pat;
        let is_context = |typed: &PatType| std::ptr::eq(typed, context);
        let is_message = |typed: &PatType| std::ptr::eq(typed, handler.message_param);
        let inputs = sig.inputs.iter().map(|input| match input {
            FnArg::Typed(typed) if is_context(typed) => quote!(#idem: &#krate::Idem),
            FnArg::Typed(typed) if is_message(typed) => quote!(#messages: &[#element]),
            other => other.to_token_stream(),
        });
        // The body may run again (one message at a time after a failure, or after a
        // transient error): each run gets its own copy of the owned parameters.
        let clone_owned = sig.inputs.iter().filter_map(|input| match input {
            FnArg::Typed(typed) if !is_context(typed) && !is_message(typed) => {
                clone_if_owned(&private, typed)
            }
            _ => None,
        });
        let run_args = quote! {
            #idem,
            &#spec,
            #messages,
            #derive,
            move |mut #transaction, #new| {
                #(#clone_owned)*
                async move {
                    let #result = {
                        let #connection_pat: #connection_ty = &mut *#transaction;
                        let #message_pat: &[&_] = &#new;
                        #private::handler_body::<#output, _>(async #block).await
                    };
                    (#transaction, #result)
                }
            },
        };
        let call = call_at(&quote!(#private::run_batch_handler), run_args, first);
        let signature = rewritten_signature(
            sig,
            &sig.ident,
            inputs,
            quote!(::std::vec::Vec<#private::Handled<#output>>),
        );
        quote! {
            #(#attrs)*
            #vis #signature
            {
                #spec_item
                #call
            }
        }
    }
}

/// `runner(args).await` with `runner`, the parentheses and the `.await` spanned on `span`:
/// a bound of the runner, required by both the call and the `.await`, fails once, there.
/// The generated function's signature: the handler's qualifiers and generics with the
/// given name, parameters and return type.
fn rewritten_signature(
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

fn call_at(runner: &TokenStream, args: TokenStream, span: Span) -> TokenStream {
    let runner = respan(runner, span);
    let mut args = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, args);
    args.set_span(span);
    quote_spanned!(span=> #runner #args .await)
}

/// `tokens` with every span set to `span`, so that an error about them points there.
fn respan(tokens: &TokenStream, span: Span) -> TokenStream {
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
/// `idem_runtime::key::identifies`), spanned on the key's fields.
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

/// Checks that the handler is an `async fn (conn: &mut PgConnection, message, ...) -> R`
/// (transaction mode) or an `async fn ([lease: &Lease,] message, ...) -> R` (lease mode).
fn check_signature<'a>(
    item: &'a ItemFn,
    mode: Mode,
    errors: &mut Vec<syn::Error>,
) -> Option<Handler<'a>> {
    let sig = &item.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[idempotent] handlers must be `async fn`: the body runs inside a database transaction",
        ));
    }
    let output = match &sig.output {
        ReturnType::Type(_, ty) if is_not_result(ty) => {
            errors.push(syn::Error::new_spanned(
                ty,
                format!(
                    "an #[idempotent] handler must return a `Result`, not `{}`: declare it as `-> Result<T, E>`; an error rolls the body's writes back and records the failure",
                    ty.to_token_stream().to_string().replace(' ', "")
                ),
            ));
            None
        }
        ReturnType::Type(_, ty) => Some(&**ty),
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                "#[idempotent] handlers must return a `Result`: add `-> Result<T, E>`; an error rolls the body's writes back and records the failure",
            ));
            None
        }
    };

    let mut typed = sig.inputs.iter().filter_map(|input| match input {
        FnArg::Typed(typed) => Some(typed),
        FnArg::Receiver(_) => None,
    });
    if mode == Mode::Lease {
        return check_lease_signature(sig, typed, output, errors);
    }
    check_no_exclusive_borrows(sig, errors);
    let connection = match typed.next() {
        Some(lease) if is_reference_to(&lease.ty, "Lease") => {
            errors.push(syn::Error::new_spanned(
                &lease.ty,
                "a lease guard is only given to lease-mode handlers: add `mode = \"lease\"`, or take the transaction's connection `tx: &mut PgConnection`",
            ));
            None
        }
        Some(connection) if is_connection(&connection.ty) => Some(connection),
        Some(other) => {
            errors.push(syn::Error::new_spanned(
                &other.ty,
                "the first parameter of an #[idempotent] handler must be the transaction's connection: `tx: &mut PgConnection`",
            ));
            None
        }
        None => {
            errors.push(syn::Error::new(
                sig.paren_token.span.join(),
                "an #[idempotent] handler takes the transaction's connection and the message: `(tx: &mut PgConnection, message: &Message)`",
            ));
            None
        }
    };
    let message_param = typed.next();
    let batch_of = match message_param.map(|param| slice_message(param)) {
        Some(Slice::Batch(element)) => Some(element),
        Some(Slice::Wrong(error)) => {
            errors.push(error);
            None
        }
        Some(Slice::No) | None => None,
    };
    let message = match message_param {
        Some(message) => match &*message.pat {
            Pat::Ident(pat) if pat.subpat.is_none() => Some(pat.ident.clone()),
            other => {
                errors.push(syn::Error::new_spanned(
                    other,
                    "bind the message to a name (e.g. `event: &OrderEvent`): the key is read from its fields",
                ));
                None
            }
        },
        None if connection.is_some() => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                "an #[idempotent] handler needs the message after the connection: `(tx: &mut PgConnection, message: &Message)`",
            ));
            None
        }
        None => None,
    };
    Some(Handler {
        context: Some(connection?),
        message_param: message_param?,
        message: message?,
        output: output?,
        batch_of,
    })
}

/// A transactional body may run again after a serialization failure or a deadlock, so it
/// is a closure that can use shared borrows only: `&mut self` or a `&mut` parameter other
/// than the connection would fail deep in the expansion; say why on the user's token.
fn check_no_exclusive_borrows(sig: &syn::Signature, errors: &mut Vec<syn::Error>) {
    let exclusive =
        |ty: &Type| matches!(ty, Type::Reference(reference) if reference.mutability.is_some());
    let mut typed_seen = 0;
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) if exclusive(&receiver.ty) => {
                errors.push(syn::Error::new_spanned(
                    receiver,
                    "a transactional #[idempotent] handler cannot take `&mut self`: its body may run again after a serialization failure or a deadlock, so it only borrows what it is given; take `&self` and keep mutable state behind a `Mutex` or an atomic",
                ));
            }
            FnArg::Typed(typed) => {
                // The first typed parameter is the connection, the one `&mut` allowed.
                typed_seen += 1;
                if typed_seen > 1 && exclusive(&typed.ty) {
                    errors.push(syn::Error::new_spanned(
                        &typed.ty,
                        "a transactional #[idempotent] handler cannot take a `&mut` parameter besides the connection: its body may run again after a serialization failure or a deadlock, so it only borrows what it is given; take `&T` and keep mutable state behind a `Mutex` or an atomic",
                    ));
                }
            }
            FnArg::Receiver(_) => {}
        }
    }
}

/// The lease-mode signature: an optional `&Lease` guard, then the message.
fn check_lease_signature<'a>(
    sig: &'a syn::Signature,
    mut typed: impl Iterator<Item = &'a PatType>,
    output: Option<&'a Type>,
    errors: &mut Vec<syn::Error>,
) -> Option<Handler<'a>> {
    let mut first = typed.next();
    if let Some(connection) = first.filter(|first| is_connection(&first.ty)) {
        errors.push(syn::Error::new_spanned(
            &connection.ty,
            "a lease-mode handler runs outside any database transaction, so it receives no connection: take the lease guard `lease: &Lease` (or nothing) before the message, or use the default transaction mode",
        ));
        return None;
    }
    let guard = first.filter(|first| is_reference_to(&first.ty, "Lease"));
    if guard.is_some() {
        first = typed.next();
    }
    let message = match first.map(|message| &*message.pat) {
        Some(Pat::Ident(pat)) if pat.subpat.is_none() => Some(pat.ident.clone()),
        Some(other) => {
            errors.push(syn::Error::new(
                other.span(),
                "bind the message to a name (e.g. `event: &OrderEvent`): the key is read from its fields",
            ));
            None
        }
        None => {
            errors.push(syn::Error::new(
                sig.paren_token.span.join(),
                "a lease-mode handler takes the message: `(lease: &Lease, message: &Message)` or `(message: &Message)`",
            ));
            None
        }
    };
    if let Some(param) = first
        && !matches!(slice_message(param), Slice::No)
    {
        errors.push(syn::Error::new_spanned(
            &param.ty,
            "a lease-mode handler takes one message: a slice of messages makes a batch handler, whose body runs in one database transaction for all of them; take `message: &Message`, or remove `mode = \"lease\"`",
        ));
        return None;
    }
    Some(Handler {
        context: guard,
        message_param: first?,
        message: message?,
        output: output?,
        batch_of: None,
    })
}

/// What a message parameter's type says about batches.
enum Slice<'a> {
    /// Not a collection of messages: a per-message handler.
    No,
    /// `&[&M]`: a batch handler of messages `M`.
    Batch(&'a Type),
    /// A collection of messages in another form than `&[&M]`.
    Wrong(syn::Error),
}

/// Recognizes the message parameter of a batch handler, `&[&M]`, and the collections
/// that were meant as one (`&[M]`, `Vec<M>`, `&Vec<&M>`, ...).
fn slice_message(param: &PatType) -> Slice<'_> {
    let ty = &*param.ty;
    let wrong = |element: &Type, what: &str| {
        let element = element.to_token_stream().to_string().replace(' ', "");
        let name = match &*param.pat {
            Pat::Ident(pat) => pat.ident.to_string(),
            _ => "messages".to_owned(),
        };
        Slice::Wrong(syn::Error::new_spanned(
            ty,
            format!(
                "{what}: declare `{name}: &[&{element}]` (the generated function takes the whole batch as `&[{element}]`)"
            ),
        ))
    };
    let vec_element = |ty: &'_ Type| -> Option<Type> {
        let Type::Path(path) = ty else {
            return None;
        };
        let segment = path.path.segments.last()?;
        let syn::PathArguments::AngleBracketed(arguments) = &segment.arguments else {
            return None;
        };
        match (segment.ident == "Vec", arguments.args.first()) {
            (true, Some(syn::GenericArgument::Type(element))) if arguments.args.len() == 1 => {
                Some(element.clone())
            }
            _ => None,
        }
    };
    let unreferenced = |ty: &Type| -> Type {
        match ty {
            Type::Reference(reference) => (*reference.elem).clone(),
            other => other.clone(),
        }
    };
    match ty {
        // `&mut [..]` is refused as an exclusive borrow.
        Type::Reference(reference) if reference.mutability.is_none() => match &*reference.elem {
            Type::Slice(slice) => match &*slice.elem {
                Type::Reference(element) if element.mutability.is_none() => {
                    Slice::Batch(&element.elem)
                }
                Type::Reference(element) => wrong(
                    &element.elem,
                    "a batch handler cannot change its messages: its body gets shared references to the new messages of the batch",
                ),
                element => wrong(
                    element,
                    "the body of a batch handler receives references to the new messages of the batch, not the messages themselves",
                ),
            },
            other => match vec_element(other) {
                Some(element) => wrong(
                    &unreferenced(&element),
                    "a batch handler takes its messages as a slice of references",
                ),
                None => Slice::No,
            },
        },
        other => match vec_element(other) {
            Some(element) => wrong(
                &unreferenced(&element),
                "a batch handler takes its messages as a slice of references",
            ),
            None => Slice::No,
        },
    }
}

/// Whether `ty` is certainly not a `Result` (an alias of one can have any name, so only
/// primitives, tuples, references and the like, and a few well-known std types, are).
fn is_not_result(ty: &Type) -> bool {
    const NOT_RESULTS: &[&str] = &[
        "bool", "char", "str", "String", "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16",
        "u32", "u64", "u128", "usize", "f32", "f64", "Option", "Vec", "Box",
    ];
    match ty {
        Type::Paren(inner) => is_not_result(&inner.elem),
        Type::Group(inner) => is_not_result(&inner.elem),
        Type::Path(path) => {
            path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|segment| NOT_RESULTS.iter().any(|name| segment.ident == name))
        }
        Type::Array(_)
        | Type::BareFn(_)
        | Type::ImplTrait(_)
        | Type::Never(_)
        | Type::Ptr(_)
        | Type::Reference(_)
        | Type::Slice(_)
        | Type::TraitObject(_)
        | Type::Tuple(_) => true,
        _ => false,
    }
}

/// `&T` or `&mut T` where the last segment of `T`'s path is `name`.
fn is_reference_to(ty: &Type, name: &str) -> bool {
    let Type::Reference(reference) = ty else {
        return false;
    };
    let Type::Path(path) = &*reference.elem else {
        return false;
    };
    path.qself.is_none()
        && path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident == name && segment.arguments.is_none())
}

/// `&mut PgConnection`, with any path to it (`sqlx::PgConnection`, ...).
fn is_connection(ty: &Type) -> bool {
    let Type::Reference(reference) = ty else {
        return false;
    };
    let Type::Path(path) = &*reference.elem else {
        return false;
    };
    reference.mutability.is_some()
        && path.qself.is_none()
        && path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "PgConnection" && segment.arguments.is_none())
}

/// `let name = clone_for_run(&name);` for a parameter bound to a name and not a
/// reference: spanned on its type, where a type that is not `Clone` is reported with the
/// reason (`idem_runtime::handler::ClonedForEachRun`).
fn clone_if_owned(private: &TokenStream, typed: &PatType) -> Option<TokenStream> {
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
