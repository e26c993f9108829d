//! The field lists of `key` and `fingerprint`, in both forms: a string (`key = "a, b.c"`)
//! and identifiers (`key(a, b.c)`). Each field path keeps the span that errors about it
//! point at; one path is parsed in `path`.

mod path;

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::parse::ParseStream;
use syn::{LitStr, Member, Token};

pub(crate) use path::FieldPath;
use path::{member_text, parse_ident_path, parse_string_path, respan_member};

/// A list of field paths, as written in `key = "..."`, `key(...)` or the same forms of
/// `fingerprint`.
pub(crate) struct FieldList {
    /// The literal, or the parentheses of the identifier form.
    pub(crate) span: Span,
    pub(crate) paths: Vec<FieldPath>,
}

/// Parses the fields of `key` or `fingerprint` (`argument`), as a string (`key = "a,
/// b.c"`) or as identifiers (`key(a, b.c)`), recording in `errors` what is wrong with
/// them; an error returned is one that leaves nothing to parse.
pub(super) fn field_list(
    meta: &ParseNestedMeta<'_>,
    argument: &str,
    errors: &mut Vec<syn::Error>,
) -> syn::Result<FieldList> {
    if meta.input.peek(syn::token::Paren) {
        let content;
        let parens = syn::parenthesized!(content in meta.input);
        return Ok(ident_list(&content, parens.span.join(), argument, errors));
    }
    let value = meta.value()?;
    if !value.peek(LitStr) {
        // `key = order_id`: say how to write what was meant.
        let written = rest_of_argument(value).to_string().replace(' ', "");
        let fields = if written.is_empty() {
            "order_id, event_type".to_owned()
        } else {
            written
        };
        return Err(syn::Error::new(
            value.span(),
            format!(
                "`{argument}` names the message's fields in a string or in parentheses: `{argument} = \"{fields}\"` or `{argument}({fields})`"
            ),
        ));
    }
    let literal: LitStr = value.parse()?;
    Ok(string_list(&literal, argument, errors))
}

/// The tokens up to the next `,` (not consumed: read from a fork).
fn rest_of_argument(input: ParseStream<'_>) -> proc_macro2::TokenStream {
    let fork = input.fork();
    std::iter::from_fn(|| {
        (!fork.is_empty() && !fork.peek(Token![,]))
            .then(|| fork.parse::<proc_macro2::TokenTree>().ok())
            .flatten()
    })
    .collect()
}

/// The error of an empty list, with an example in the argument's form (`written`: the
/// example's fields as the form writes them): the times name one key field, the other
/// lists the message fields.
fn empty(argument: &str, written: impl Fn(&str) -> String) -> String {
    if argument.ends_with("event_time") {
        format!(
            "`{argument}` is empty; name the one key field that holds the fact's own time, e.g. `{}`",
            written("occurred_at")
        )
    } else {
        format!(
            "`{argument}` is empty; name the message fields, e.g. `{}`",
            written("order_id, event_type")
        )
    }
}

/// `key(order_id, order.customer.id, r#type, 0)`: each component keeps its span, so
/// that errors and the compiler's suggestions point at the field at fault.
fn ident_list(
    content: ParseStream<'_>,
    span: Span,
    argument: &str,
    errors: &mut Vec<syn::Error>,
) -> FieldList {
    let mut paths: Vec<FieldPath> = Vec::new();
    if content.is_empty() {
        errors.push(syn::Error::new(
            span,
            empty(argument, |example| format!("{argument}({example})")),
        ));
    }
    while !content.is_empty() {
        match parse_ident_path(content) {
            Ok(path) => push_path(&mut paths, path, argument, errors),
            Err(error) => {
                errors.push(error);
                // Skip to the next field.
                while !content.is_empty() && !content.peek(Token![,]) {
                    let _ = content.parse::<proc_macro2::TokenTree>();
                }
            }
        }
        if content.is_empty() {
            break;
        }
        if !content.peek(Token![,]) {
            errors.push(missing_comma(content, &paths, argument));
            // Go on with the next field, if any.
            if content.is_empty() {
                break;
            }
        }
        content.parse::<Token![,]>().expect("peeked");
    }
    FieldList { span, paths }
}

/// The error for what follows a field of the identifier form where a `,` belongs
/// (`order-id`, `order id`); consumes it, up to the next `,`.
fn missing_comma(content: ParseStream<'_>, paths: &[FieldPath], argument: &str) -> syn::Error {
    let span = content.span();
    let dashed = content.peek(Token![-]);
    let rest: proc_macro2::TokenStream = std::iter::from_fn(|| {
        (!content.is_empty() && !content.peek(Token![,]))
            .then(|| content.parse::<proc_macro2::TokenTree>().ok())
            .flatten()
    })
    .collect();
    let written = format!(
        "{}{}",
        paths.last().map_or("", |path| path.text.as_str()),
        rest.to_string().replace(' ', "")
    );
    let message = if dashed {
        format!(
            "`{written}` is not a field name; did you mean `{}`?",
            written.replace('-', "_")
        )
    } else {
        format!(
            "expected `,` between the fields of `{argument}` (or `.` inside a path): a field name is a Rust identifier, e.g. `{argument}(order_id, customer.id)`"
        )
    };
    syn::Error::new(span, message)
}

/// `key = "order_id, order.customer.id"`.
fn string_list(literal: &LitStr, argument: &str, errors: &mut Vec<syn::Error>) -> FieldList {
    let span = literal.span();
    let value = literal.value();
    let mut paths: Vec<FieldPath> = Vec::new();
    if value.trim().is_empty() {
        errors.push(syn::Error::new(
            span,
            empty(argument, |example| format!("{argument} = \"{example}\"")),
        ));
    }
    let mut offset = 0;
    for (index, segment) in value.split(',').enumerate() {
        let segment_start = offset;
        offset += segment.len() + 1;
        let text = segment.trim();
        let start = segment_start + (segment.len() - segment.trim_start().len());
        let sub = subspan(literal, start, text);
        if text.is_empty() {
            if !value.trim().is_empty() {
                errors.push(syn::Error::new(
                    sub.unwrap_or(span),
                    format!(
                        "`{argument}` has an empty field at position {}; remove the extra comma",
                        index + 1
                    ),
                ));
            }
            continue;
        }
        let error_span = sub.unwrap_or(span);
        match parse_string_path(text, argument) {
            Ok(components) => {
                let path = string_path(literal, text, start, components, error_span);
                push_path(&mut paths, path, argument, errors);
            }
            Err(message) => errors.push(syn::Error::new(error_span, message)),
        }
    }
    FieldList { span, paths }
}

/// The path `text` of a string list, found at byte `start` of the literal's value, with
/// its components spanned: each on its own text where the compiler can point inside the
/// literal; otherwise on the literal, in the macro's own context, so that the compiler
/// does not offer to replace the whole literal with the field's name.
fn string_path(
    literal: &LitStr,
    text: &str,
    start: usize,
    components: Vec<Member>,
    span: Span,
) -> FieldPath {
    let mut members = Vec::new();
    let mut names = Vec::new();
    let mut component_start = start;
    for (component, member) in text.split('.').zip(components) {
        let leading = component.len() - component.trim_start().len();
        let member_span = subspan(literal, component_start + leading, component.trim())
            .unwrap_or_else(|| Span::mixed_site().located_at(literal.span()));
        component_start += component.len() + 1;
        names.push(member_text(&member));
        members.push(respan_member(member, member_span));
    }
    FieldPath {
        text: names.join("."),
        members,
        span,
    }
}

/// The span of `text`, found at byte `start` of the literal's value, where the compiler
/// can point inside the literal: its source must be the value itself (no escapes, not a
/// raw string).
fn subspan(literal: &LitStr, start: usize, text: &str) -> Option<Span> {
    let plain = literal.token().to_string() == format!("\"{}\"", literal.value());
    let start = start + 1;
    plain
        .then(|| literal.token().subspan(start..start + text.len()))
        .flatten()
}

/// Adds `path` to `paths`, or records that it is there already.
fn push_path(
    paths: &mut Vec<FieldPath>,
    path: FieldPath,
    argument: &str,
    errors: &mut Vec<syn::Error>,
) {
    if paths.iter().any(|other| other.text == path.text) {
        errors.push(syn::Error::new(
            path.span,
            format!("field `{}` appears twice in `{argument}`", path.text),
        ));
    } else {
        paths.push(path);
    }
}
