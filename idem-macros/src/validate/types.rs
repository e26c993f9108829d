//! What the types of a handler's signature say: a batch of messages (`&[&M]`) or a
//! collection meant as one, a type that cannot be a `Result`, the connection, a
//! reference to a named type.

use quote::ToTokens;
use syn::{Pat, PatType, Type};

/// What a message parameter's type says about batches.
pub(super) enum Slice<'a> {
    /// Not a collection of messages: a per-message handler.
    No,
    /// `&[&M]`: a batch handler of messages `M`.
    Batch(&'a Type),
    /// A collection of messages in another form than `&[&M]`.
    Wrong(syn::Error),
}

/// Recognizes the message parameter of a batch handler, `&[&M]`, and the collections
/// that were meant as one (`&[M]`, `Vec<M>`, `&Vec<&M>`, ...).
pub(super) fn slice_message(param: &PatType) -> Slice<'_> {
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
pub(super) fn is_not_result(ty: &Type) -> bool {
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
pub(super) fn is_reference_to(ty: &Type, name: &str) -> bool {
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
pub(super) fn is_connection(ty: &Type) -> bool {
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
