//! One field path of a `key` or `fingerprint` list, in either form, and what is wrong
//! with it: `order.customer.id`, `r#type`, `type`, `pair.0`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::{Ident, LitInt, LitStr, Member, Token};

/// A field path of the message, such as `order.id`.
#[derive(Clone)]
pub(crate) struct FieldPath {
    /// The path, for error messages and key part names (`type`, not `r#type`).
    pub(crate) text: String,
    /// Its components, spanned for the generated access of the field (see `members`).
    pub(crate) members: Vec<Member>,
    /// Where errors about this path point: the identifiers of `key(order.id)`, the path's
    /// own text inside the literal of `key = "order.id"` where the compiler can point
    /// there (nightly), or else the whole literal.
    pub(crate) span: Span,
}

/// A component of a path of the identifier form.
enum Component {
    /// One field, or two for `0.1` (lexed as one float), with the span of the token.
    Fields(Vec<Member>, Span),
    /// `self` or `Self`: not a field, but the start of a path that is advised against
    /// with its rest.
    SelfWord(Ident),
}

/// A field path of the identifier form: `order.customer.id`, `r#type`, `type`, `pair.0`.
pub(super) fn parse_ident_path(input: ParseStream<'_>) -> syn::Result<FieldPath> {
    let mut members = Vec::new();
    let mut spans: Option<(Span, Span)> = None;
    // `self.id`: the rest of the path is parsed first, to suggest it.
    let mut starts_with_self: Option<Ident> = None;
    loop {
        match parse_component(input)? {
            Component::SelfWord(ident) if members.is_empty() && starts_with_self.is_none() => {
                starts_with_self = Some(ident);
            }
            Component::SelfWord(ident) => {
                let message = not_a_field(&ident.unraw().to_string()).expect("`self` is a word");
                return Err(syn::Error::new(ident.span(), message));
            }
            Component::Fields(fields, span) => {
                spans = Some(spans.map_or((span, span), |(first, _)| (first, span)));
                members.extend(fields);
            }
        }
        if !input.peek(Token![.]) {
            break;
        }
        input.parse::<Token![.]>()?;
    }
    let rest = members
        .iter()
        .map(member_text)
        .collect::<Vec<_>>()
        .join(".");
    if let Some(ident) = starts_with_self {
        return Err(syn::Error::new(
            ident.span(),
            self_advice(&ident.to_string(), &rest),
        ));
    }
    // The whole path where the compiler can join spans (nightly), else its last
    // component: the field whose value is keyed.
    let (first, last) = spans.expect("a path has a component");
    Ok(FieldPath {
        text: rest,
        members,
        span: first.join(last).unwrap_or(last),
    })
}

/// One component of a path of the identifier form: a name, a tuple index, or `0.1`.
fn parse_component(input: ParseStream<'_>) -> syn::Result<Component> {
    if input.peek(syn::LitFloat) {
        // `pair.0.1` is lexed as `pair`, `.`, `0.1`.
        let float: syn::LitFloat = input.parse()?;
        let text = float.to_string();
        let indices: Option<Vec<u32>> = text.split('.').map(tuple_index).collect();
        return match indices {
            Some(indices) if indices.len() == 2 => {
                let span = float.span();
                let members = indices
                    .into_iter()
                    .map(|index| Member::Unnamed(syn::Index { index, span }))
                    .collect();
                Ok(Component::Fields(members, span))
            }
            _ => Err(syn::Error::new(
                float.span(),
                format!(
                    "`{text}` is not a field: a field is a name or the index of a tuple field, such as `0`"
                ),
            )),
        };
    }
    if input.peek(LitInt) {
        let int: LitInt = input.parse()?;
        let Some(index) = tuple_index(&int.to_string()) else {
            return Err(syn::Error::new(
                int.span(),
                format!(
                    "`{int}` is not a field: the index of a tuple field is written without a suffix or leading zeros, such as `0`"
                ),
            ));
        };
        let span = int.span();
        return Ok(Component::Fields(
            vec![Member::Unnamed(syn::Index { index, span })],
            span,
        ));
    }
    if input.peek(Ident::peek_any) {
        let ident = input.call(Ident::parse_any)?;
        let name = ident.unraw().to_string();
        if name == "self" || name == "Self" {
            return Ok(Component::SelfWord(ident));
        }
        if let Some(message) = not_a_field(&name) {
            return Err(syn::Error::new(ident.span(), message));
        }
        let span = ident.span();
        return Ok(Component::Fields(
            vec![Member::Named(field_ident(&name, span))],
            span,
        ));
    }
    if input.peek(LitStr) {
        let literal: LitStr = input.parse()?;
        return Err(syn::Error::new(
            literal.span(),
            format!(
                "inside the parentheses the fields are identifiers: write `{}` without quotes",
                literal.value()
            ),
        ));
    }
    Err(input.error(
        "expected a field of the message: a name (`order_id`), a path (`order.id`) or the index of a tuple field (`0`)",
    ))
}

/// The components of a path of the string form (`order.id`, `r#type`, `type`, `pair.0`),
/// or what is wrong with it.
pub(super) fn parse_string_path(text: &str, argument: &str) -> Result<Vec<Member>, String> {
    let components: Vec<&str> = text.split('.').map(str::trim).collect();
    if components.iter().any(|component| component.is_empty()) {
        let fixed = components
            .iter()
            .filter(|component| !component.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(".");
        return Err(if fixed.is_empty() {
            format!(
                "`{text}` in `{argument}` is not a field path: name a field of the message, e.g. `order_id`"
            )
        } else {
            format!(
                "`{text}` in `{argument}` has an empty name between two `.`; did you mean `{fixed}`?"
            )
        });
    }
    if components
        .iter()
        .any(|component| component.contains(char::is_whitespace))
    {
        let joined = text.split_whitespace().collect::<Vec<_>>().join("_");
        let listed = text.split_whitespace().collect::<Vec<_>>().join(", ");
        return Err(format!(
            "`{text}` in `{argument}` is not a field path: a field name has no spaces; write `{joined}` for one field, or `{listed}` for several"
        ));
    }
    if matches!(components[0], "self" | "Self") {
        return Err(format!(
            "`{text}` in `{argument}`: {}",
            self_advice(components[0], &components[1..].join("."))
        ));
    }
    components
        .iter()
        .map(|component| string_component(text, component, argument))
        .collect()
}

/// One component of a path of the string form, or what is wrong with it.
fn string_component(text: &str, component: &str, argument: &str) -> Result<Member, String> {
    if let Some(index) = tuple_index(component) {
        return Ok(Member::Unnamed(syn::Index {
            index,
            span: Span::call_site(),
        }));
    }
    let name = component.strip_prefix("r#").unwrap_or(component);
    if let Some(message) = not_a_field(name) {
        return Err(format!("`{text}` in `{argument}`: {message}"));
    }
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_alphanumeric() || c == '_')
        && syn::parse_str::<syn::Ident>(&format!("r#{name}")).is_ok();
    if valid {
        return Ok(Member::Named(field_ident(name, Span::call_site())));
    }
    let suggestion: String = name
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { '_' })
        .collect();
    let hint = if name.contains('-') && syn::parse_str::<syn::Ident>(&suggestion).is_ok() {
        format!("; did you mean `{suggestion}`?")
    } else {
        String::from(
            "; a field name is a Rust identifier (letters, digits and `_`, or a raw identifier such as `r#type`), a path joins names with `.` (`order.id`), and a tuple field is its index (`0`)",
        )
    };
    Err(format!(
        "`{component}` in `{argument}` is not a field name{hint}"
    ))
}

/// What is wrong with `name` as a component of a field path, if it is one of the words
/// that cannot be a field (`self`, `Self`, `super`, `crate`, `_`).
fn not_a_field(name: &str) -> Option<String> {
    matches!(name, "self" | "Self" | "super" | "crate" | "_").then(|| {
        format!("`{name}` is not a field name; name a field of the message, e.g. `order_id`")
    })
}

/// The advice for a path that starts at `self` (`self.id`), given the rest of it (`id`).
fn self_advice(word: &str, rest: &str) -> String {
    if rest.is_empty() {
        format!(
            "the key is read from the message's fields, not from `{word}`: name the fields of the message, e.g. `order_id`"
        )
    } else {
        format!(
            "the key is read from the message's fields, not from `{word}`: write `{rest}` for the message's `{rest}`"
        )
    }
}

/// A field name as an identifier: a raw identifier for a keyword (`r#type`).
fn field_ident(name: &str, span: Span) -> Ident {
    syn::parse_str::<Ident>(name).map_or_else(
        |_| Ident::new_raw(name, span),
        |mut ident| {
            ident.set_span(span);
            ident
        },
    )
}

/// `0`, `12`: the index of a tuple field (no leading zeros, no suffix).
fn tuple_index(text: &str) -> Option<u32> {
    let decimal = !text.is_empty()
        && text.chars().all(|c| c.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    decimal.then(|| text.parse().ok()).flatten()
}

/// The component as written in messages and key part names (`type`, not `r#type`).
pub(super) fn member_text(member: &Member) -> String {
    match member {
        Member::Named(ident) => ident.unraw().to_string(),
        Member::Unnamed(index) => index.index.to_string(),
    }
}

/// `member` with its span set to `span`.
pub(super) fn respan_member(member: Member, span: Span) -> Member {
    match member {
        Member::Named(mut ident) => {
            ident.set_span(span);
            Member::Named(ident)
        }
        Member::Unnamed(index) => Member::Unnamed(syn::Index {
            index: index.index,
            span,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Result<Vec<String>, String> {
        parse_string_path(text, "key").map(|members| members.iter().map(member_text).collect())
    }

    #[test]
    fn string_paths_accept_keywords_raw_identifiers_and_tuple_indices() {
        assert_eq!(names("order.id").unwrap(), ["order", "id"]);
        assert_eq!(names("type").unwrap(), ["type"]);
        assert_eq!(names("r#type").unwrap(), ["type"]);
        assert_eq!(names("pair.0.1").unwrap(), ["pair", "0", "1"]);
        assert_eq!(names(" order . id ").unwrap(), ["order", "id"]);
    }

    #[test]
    fn string_paths_explain_what_is_wrong() {
        let dashed = names("order-id").unwrap_err();
        assert!(dashed.contains("did you mean `order_id`"), "{dashed}");
        let dotted = names("order..id").unwrap_err();
        assert!(dotted.contains("did you mean `order.id`"), "{dotted}");
        let spaced = names("order id").unwrap_err();
        assert!(spaced.contains("write `order_id`"), "{spaced}");
        let this = names("self.id").unwrap_err();
        assert!(this.contains("write `id`"), "{this}");
        assert!(names("01").is_err());
        assert!(names("crate").is_err());
        assert!(names("_").is_err());
    }

    #[test]
    fn keywords_become_raw_identifiers() {
        assert_eq!(field_ident("type", Span::call_site()).to_string(), "r#type");
        assert_eq!(
            field_ident("order_id", Span::call_site()).to_string(),
            "order_id"
        );
    }

    #[test]
    fn tuple_indices_are_plain_decimals() {
        assert_eq!(tuple_index("0"), Some(0));
        assert_eq!(tuple_index("12"), Some(12));
        assert_eq!(tuple_index("012"), None);
        assert_eq!(tuple_index("1u8"), None);
        assert_eq!(tuple_index(""), None);
    }
}
