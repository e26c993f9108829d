//! The arguments of `#[idempotent(...)]` and their parser.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::{Ident, LitBool, LitInt, LitStr, Path};

/// Every argument the attribute accepts, for the "unknown argument" message.
const VALID: &str = "`key`, `scope`, `fingerprint`, `max_attempts`, `store_result`, `crate`";

/// A field path of the message, such as `order.id`.
pub struct FieldPath {
    /// The path as written, for error messages and key part names.
    pub text: String,
    /// Its components, spanned on the string literal that holds them.
    pub idents: Vec<Ident>,
}

/// A list of field paths, as written in `key = "..."` or `fingerprint = "..."`.
pub struct FieldList {
    pub literal: LitStr,
    pub paths: Vec<FieldPath>,
}

/// The parsed arguments.
#[derive(Default)]
pub struct Args {
    pub key: Option<FieldList>,
    pub scope: Option<LitStr>,
    pub fingerprint: Option<FieldList>,
    pub max_attempts: Option<LitInt>,
    pub store_result: Option<LitBool>,
    pub krate: Option<Path>,
    /// Errors found so far; they are all reported together.
    pub errors: Vec<syn::Error>,
}

impl Args {
    /// Parses one `name = value` argument (the callback of [`syn::meta::parser`]).
    pub fn parse(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(name) = meta.path.get_ident().map(Ident::to_string) else {
            return Err(meta.error(format!("unknown argument; expected one of {VALID}")));
        };
        let span = meta.path.segments[0].ident.span();
        match name.as_str() {
            "key" => {
                let literal: LitStr = meta.value()?.parse()?;
                let list = self.field_list(literal, "key");
                set(&mut self.key, list, span, &name, &mut self.errors);
            }
            "fingerprint" => {
                let literal: LitStr = meta.value()?.parse()?;
                let list = self.field_list(literal, "fingerprint");
                set(&mut self.fingerprint, list, span, &name, &mut self.errors);
            }
            "scope" => {
                let literal: LitStr = meta.value()?.parse()?;
                if literal.value().trim().is_empty() {
                    self.errors
                        .push(syn::Error::new(literal.span(), "`scope` must not be empty"));
                }
                set(&mut self.scope, literal, span, &name, &mut self.errors);
            }
            "max_attempts" => {
                let literal: LitInt = meta.value()?.parse()?;
                match literal.base10_parse::<u32>() {
                    Ok(0) | Err(_) => self.errors.push(syn::Error::new(
                        literal.span(),
                        "`max_attempts` must be a whole number from 1 to 4294967295",
                    )),
                    Ok(_) => {}
                }
                set(&mut self.max_attempts, literal, span, &name, &mut self.errors);
            }
            "store_result" => {
                let literal: LitBool = meta.value()?.parse()?;
                set(&mut self.store_result, literal, span, &name, &mut self.errors);
            }
            "crate" => {
                let literal: LitStr = meta.value()?.parse()?;
                let path = literal.parse_with(Path::parse_mod_style)?;
                set(&mut self.krate, path, span, &name, &mut self.errors);
            }
            _ => {
                return Err(meta.error(format!(
                    "unknown argument `{name}`; expected one of {VALID}"
                )));
            }
        }
        Ok(())
    }

    /// Parses a comma-separated list of field paths, recording what is wrong with it.
    fn field_list(&mut self, literal: LitStr, argument: &str) -> FieldList {
        let span = literal.span();
        let value = literal.value();
        let mut paths: Vec<FieldPath> = Vec::new();
        if value.trim().is_empty() {
            self.errors.push(syn::Error::new(
                span,
                format!("`{argument}` is empty; name the message fields, e.g. `{argument} = \"order_id, event_type\"`"),
            ));
        }
        for (index, segment) in value.split(',').enumerate() {
            let text = segment.trim();
            if text.is_empty() {
                if !value.trim().is_empty() {
                    self.errors.push(syn::Error::new(
                        span,
                        format!("`{argument}` has an empty field at position {}; remove the extra comma", index + 1),
                    ));
                }
                continue;
            }
            let Some(idents) = parse_path(text, span) else {
                self.errors.push(syn::Error::new(
                    span,
                    format!("`{text}` in `{argument}` is not a field path; write field names separated by `.`, e.g. `order.id`"),
                ));
                continue;
            };
            let text = idents.iter().map(Ident::to_string).collect::<Vec<_>>().join(".");
            if paths.iter().any(|path| path.text == text) {
                self.errors.push(syn::Error::new(
                    span,
                    format!("field `{text}` appears twice in `{argument}`"),
                ));
                continue;
            }
            paths.push(FieldPath { text, idents });
        }
        FieldList { literal, paths }
    }
}

/// Stores an argument, or records that it was given twice.
fn set<T>(slot: &mut Option<T>, value: T, span: Span, name: &str, errors: &mut Vec<syn::Error>) {
    if slot.is_some() {
        errors.push(syn::Error::new(span, format!("`{name}` is given more than once")));
    } else {
        *slot = Some(value);
    }
}

/// `a.b.c` as identifiers, or `None` if a component is not a Rust identifier.
fn parse_path(text: &str, span: Span) -> Option<Vec<Ident>> {
    text.split('.')
        .map(|component| {
            let component = component.trim();
            let valid = component
                .chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && component.chars().all(|c| c.is_alphanumeric() || c == '_')
                && component != "_";
            valid
                .then(|| syn::parse_str::<Ident>(component).ok())
                .flatten()
                .map(|mut ident| {
                    ident.set_span(span);
                    ident
                })
        })
        .collect()
}
