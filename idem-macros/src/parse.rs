//! The arguments of `#[idempotent(...)]` and their parser.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::parse::ParseStream;
use syn::{Ident, LitBool, LitInt, LitStr, Member, Path, Token};

/// Every argument the attribute accepts, for the "unknown argument" message.
const VALID: &str = "`key`, `scope`, `shared_scope`, `fingerprint`, `max_attempts`, `store_result`, `mode`, `lease`, `batch`, `cache`, `cache_ttl`, `retention`, `crate`";

/// How a handler's key is held while its body runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// In the body's own database transaction (the default).
    Transaction,
    /// Under a lease committed on its own, for effects outside the database.
    Lease,
}

/// A handler-level Redis cache argument, with the span of its value.
#[derive(Clone, Copy)]
pub enum CacheArg {
    /// `cache = true | false`.
    Switch(bool, Span),
    /// `cache_ttl = "..."`, in milliseconds.
    Ttl(u64, Span),
}

/// The lease of a lease-mode handler without `lease = "..."`.
const DEFAULT_LEASE_MILLIS: u64 = 30_000;

/// A field path of the message, such as `order.id`.
pub struct FieldPath {
    /// The path, for error messages and key part names (`type`, not `r#type`).
    pub text: String,
    /// Its components, spanned for the generated access of the field (see `members`).
    pub members: Vec<Member>,
    /// Where errors about this path point: the identifiers of `key(order.id)`, the path's
    /// own text inside the literal of `key = "order.id"` where the compiler can point
    /// there (nightly), or else the whole literal.
    pub span: Span,
}

/// A list of field paths, as written in `key = "..."`, `key(...)` or the same forms of
/// `fingerprint`.
pub struct FieldList {
    /// The literal, or the parentheses of the identifier form.
    pub span: Span,
    pub paths: Vec<FieldPath>,
}

/// The parsed arguments.
#[derive(Default)]
pub struct Args {
    pub key: Option<FieldList>,
    pub scope: Option<LitStr>,
    /// `shared_scope = true`: other handlers may use the same (explicit) scope.
    pub shared_scope: Option<LitBool>,
    pub fingerprint: Option<FieldList>,
    pub max_attempts: Option<LitInt>,
    pub store_result: Option<LitBool>,
    /// `batch = true`: also generate `<handler>_batch` over a slice of messages.
    pub batch: Option<LitBool>,
    pub krate: Option<Path>,
    pub mode: Option<(Mode, LitStr)>,
    /// `mode` named no known mode: the signature is not checked against either.
    pub mode_unknown: bool,
    pub lease: Option<(u64, LitStr)>,
    /// `cache = false`: this handler neither reads nor writes the Redis cache.
    pub cache: Option<LitBool>,
    /// `cache_ttl = "30m"`: the TTL of this handler's Redis cache entries, in milliseconds.
    pub cache_ttl: Option<(u64, LitStr)>,
    /// `retention = "30d"`: how long the handler's `success` keys are kept, in milliseconds.
    pub retention: Option<(u64, LitStr)>,
    /// Errors found so far; they are all reported together.
    pub errors: Vec<syn::Error>,
}

impl Args {
    /// Parses one `name = value` argument (the callback of [`syn::meta::parser`]). An
    /// argument in error is recorded and skipped, so that the others are still checked.
    pub fn parse(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        if let Err(error) = self.parse_argument(&meta) {
            self.errors.push(error);
            // A `key` written wrongly is not missing as well.
            if meta.path.is_ident("key") && self.key.is_none() {
                self.key = Some(FieldList {
                    span: Span::call_site(),
                    paths: Vec::new(),
                });
            }
            while !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
                meta.input.parse::<proc_macro2::TokenTree>()?;
            }
        }
        Ok(())
    }

    fn parse_argument(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(name) = meta.path.get_ident().map(Ident::to_string) else {
            return Err(meta.error(format!("unknown argument; expected one of {VALID}")));
        };
        let span = meta.path.segments[0].ident.span();
        match name.as_str() {
            "key" => {
                let list = self.field_list(meta, "key")?;
                set(&mut self.key, list, span, &name, &mut self.errors);
            }
            "fingerprint" => {
                let list = self.field_list(meta, "fingerprint")?;
                set(&mut self.fingerprint, list, span, &name, &mut self.errors);
            }
            "shared_scope" => {
                let literal: LitBool = meta.value()?.parse()?;
                set(
                    &mut self.shared_scope,
                    literal,
                    span,
                    &name,
                    &mut self.errors,
                );
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
                    Ok(0) => self.errors.push(syn::Error::new(
                        literal.span(),
                        "`max_attempts` must be at least 1: it counts the failed attempts after which a key is parked, and the first delivery is one",
                    )),
                    Err(_) => self.errors.push(syn::Error::new(
                        literal.span(),
                        "`max_attempts` must be a whole number from 1 to 4294967295",
                    )),
                    Ok(_) => {}
                }
                set(
                    &mut self.max_attempts,
                    literal,
                    span,
                    &name,
                    &mut self.errors,
                );
            }
            "batch" => {
                let literal: LitBool = meta.value()?.parse()?;
                set(&mut self.batch, literal, span, &name, &mut self.errors);
            }
            "store_result" => {
                let literal: LitBool = meta.value()?.parse()?;
                set(
                    &mut self.store_result,
                    literal,
                    span,
                    &name,
                    &mut self.errors,
                );
            }
            "mode" => {
                let literal: LitStr = meta.value()?.parse()?;
                let mode = match literal.value().as_str() {
                    "transaction" => Mode::Transaction,
                    "lease" => Mode::Lease,
                    other => {
                        self.mode_unknown = true;
                        return Err(syn::Error::new(
                            literal.span(),
                            format!(
                                "unknown mode {other:?}; expected \"transaction\" (the default: the body runs in the claim's database transaction) or \"lease\" (for effects outside the database)"
                            ),
                        ));
                    }
                };
                set(
                    &mut self.mode,
                    (mode, literal),
                    span,
                    &name,
                    &mut self.errors,
                );
            }
            "lease" => {
                let literal = duration_literal(meta, "lease")?;
                let Some(millis) = parse_duration_millis(&literal.value()) else {
                    return Err(syn::Error::new(
                        literal.span(),
                        "`lease` must be a duration such as \"500ms\", \"30s\", \"5m\" or \"1h\", greater than zero",
                    ));
                };
                set(
                    &mut self.lease,
                    (millis, literal),
                    span,
                    &name,
                    &mut self.errors,
                );
            }
            "cache" => {
                let literal: LitBool = meta.value()?.parse()?;
                set(&mut self.cache, literal, span, &name, &mut self.errors);
            }
            "cache_ttl" => {
                let literal = duration_literal(meta, "cache_ttl")?;
                let Some(millis) = parse_duration_millis(&literal.value()) else {
                    return Err(syn::Error::new(
                        literal.span(),
                        "`cache_ttl` must be a duration such as \"90s\", \"10m\" or \"1h\", greater than zero",
                    ));
                };
                set(
                    &mut self.cache_ttl,
                    (millis, literal),
                    span,
                    &name,
                    &mut self.errors,
                );
            }
            "retention" => {
                let literal = duration_literal(meta, "retention")?;
                let Some(millis) = parse_duration_millis(&literal.value()) else {
                    return Err(syn::Error::new(
                        literal.span(),
                        "`retention` must be a duration such as \"36h\", \"7d\" or \"90d\", greater than zero: how long the handler's `success` keys are kept",
                    ));
                };
                set(
                    &mut self.retention,
                    (millis, literal),
                    span,
                    &name,
                    &mut self.errors,
                );
            }
            "crate" => {
                let literal: LitStr = meta.value()?.parse()?;
                let path = literal.parse_with(Path::parse_mod_style)?;
                set(&mut self.krate, path, span, &name, &mut self.errors);
            }
            _ => {
                return Err(meta.error(format!(
                    "unknown argument `{name}`; {}expected one of {VALID}",
                    did_you_mean(&name)
                )));
            }
        }
        Ok(())
    }

    /// The handler's mode; records an error for a `lease` without `mode = "lease"`.
    pub fn mode(&mut self) -> Mode {
        let mode = self
            .mode
            .as_ref()
            .map_or(Mode::Transaction, |(mode, _)| *mode);
        if let (Mode::Transaction, Some((_, literal))) = (mode, &self.lease) {
            self.errors.push(syn::Error::new(
                literal.span(),
                "`lease` applies to lease-mode handlers only: add `mode = \"lease\"`",
            ));
        }
        mode
    }

    /// Whether to generate the batch variant; records an error for a lease-mode batch.
    pub fn batch(&mut self, mode: Mode) -> bool {
        let Some(flag) = &self.batch else {
            return false;
        };
        if flag.value && mode == Mode::Lease {
            self.errors.push(syn::Error::new(
                flag.span,
                "`batch` applies to transaction-mode handlers only: a batch shares one database transaction",
            ));
        }
        flag.value
    }

    /// Records an error for each argument that has no meaning for a batch handler (one
    /// whose message parameter is a slice): `batch = true`, `store_result`, `cache` and
    /// `cache_ttl`.
    pub fn check_batch_handler(&mut self) {
        if let Some(flag) = self.batch.as_ref().filter(|flag| flag.value) {
            self.errors.push(syn::Error::new(
                flag.span,
                "this handler takes a slice of messages, so it is a batch handler already: remove `batch = true` (which generates `<handler>_batch` for a handler of one message)",
            ));
        }
        if let Some(flag) = &self.store_result {
            self.errors.push(syn::Error::new(
                flag.span,
                "a batch handler stores no result: its body runs once for all the new messages of a batch and returns `Result<(), E>`; remove `store_result`",
            ));
        }
        let cache = match (&self.cache, &self.cache_ttl) {
            (Some(flag), None) => Some((flag.span, "`cache`")),
            (Some(flag), Some(_)) => Some((flag.span, "`cache` and `cache_ttl`")),
            (None, Some((_, literal))) => Some((literal.span(), "`cache_ttl`")),
            (None, None) => None,
        };
        if let Some((span, arguments)) = cache {
            self.errors.push(syn::Error::new(
                span,
                format!("a batch handler does not use the Redis cache: one statement decides all the keys of a batch in PostgreSQL; remove {arguments}"),
            ));
        }
    }

    /// The handler's own use of the Redis cache, if it says anything about it. Records an
    /// error for `cache_ttl` with `cache = false`.
    pub fn cache(&mut self) -> Option<CacheArg> {
        match (&self.cache, &self.cache_ttl) {
            (Some(flag), Some((_, literal))) if !flag.value => {
                self.errors.push(syn::Error::new(
                    literal.span(),
                    "`cache_ttl` has no effect with `cache = false`: remove one of them",
                ));
                None
            }
            (_, Some((millis, literal))) => Some(CacheArg::Ttl(*millis, literal.span())),
            (Some(flag), None) => Some(CacheArg::Switch(flag.value, flag.span)),
            (None, None) => None,
        }
    }

    /// Whether the handler declares its scope shared; records an error for
    /// `shared_scope = true` without an explicit `scope`.
    pub fn shared_scope(&mut self) -> bool {
        let Some(flag) = self.shared_scope.as_ref().filter(|flag| flag.value) else {
            return false;
        };
        if self.scope.is_none() {
            self.errors.push(syn::Error::new(
                flag.span,
                "`shared_scope = true` needs an explicit `scope = \"...\"`: the default scope (the handler's module path and name) belongs to this handler alone; name the scope that the handlers share, e.g. `scope = \"payments\", shared_scope = true`",
            ));
        }
        true
    }

    /// The lease duration of a lease-mode handler, in milliseconds.
    pub fn lease_millis(&self) -> u64 {
        self.lease
            .as_ref()
            .map_or(DEFAULT_LEASE_MILLIS, |(millis, _)| *millis)
    }

    /// Parses the fields of `key` or `fingerprint`, as a string (`key = "a, b.c"`) or as
    /// identifiers (`key(a, b.c)`), recording what is wrong with them.
    fn field_list(&mut self, meta: &ParseNestedMeta<'_>, argument: &str) -> syn::Result<FieldList> {
        if meta.input.peek(syn::token::Paren) {
            let content;
            let parens = syn::parenthesized!(content in meta.input);
            return Ok(self.ident_list(&content, parens.span.join(), argument));
        }
        let value = meta.value()?;
        if !value.peek(LitStr) {
            // `key = order_id`: say how to write what was meant.
            let fork = value.fork();
            let written: proc_macro2::TokenStream = std::iter::from_fn(|| {
                (!fork.is_empty() && !fork.peek(Token![,]))
                    .then(|| fork.parse::<proc_macro2::TokenTree>().ok())
                    .flatten()
            })
            .collect();
            let written = written.to_string().replace(' ', "");
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
        Ok(self.string_list(&literal, argument))
    }

    /// `key(order_id, order.customer.id, r#type, 0)`: each component keeps its span, so
    /// that errors and the compiler's suggestions point at the field at fault.
    fn ident_list(&mut self, content: ParseStream<'_>, span: Span, argument: &str) -> FieldList {
        let mut paths: Vec<FieldPath> = Vec::new();
        if content.is_empty() {
            self.errors.push(syn::Error::new(
                span,
                format!("`{argument}` is empty; name the message fields, e.g. `{argument}(order_id, event_type)`"),
            ));
        }
        while !content.is_empty() {
            let path = match parse_ident_path(content) {
                Ok(path) => path,
                Err(error) => {
                    self.errors.push(error);
                    // Skip to the next field.
                    while !content.is_empty() && !content.peek(Token![,]) {
                        let _ = content.parse::<proc_macro2::TokenTree>();
                    }
                    None
                }
            };
            if let Some(path) = path {
                self.push_path(&mut paths, path, argument);
            }
            if content.is_empty() {
                break;
            }
            if !content.peek(Token![,]) {
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
                self.errors.push(syn::Error::new(span, message));
                // Go on with the next field, if any.
                if content.is_empty() {
                    break;
                }
            }
            content.parse::<Token![,]>().expect("peeked");
        }
        FieldList { span, paths }
    }

    /// `key = "order_id, order.customer.id"`.
    fn string_list(&mut self, literal: &LitStr, argument: &str) -> FieldList {
        let span = literal.span();
        let value = literal.value();
        // Byte offsets of the value inside the literal's source, when they match (no
        // escapes, not a raw string): where the compiler can point inside the literal.
        let plain = literal.token().to_string() == format!("\"{value}\"");
        let at = |start: usize, text: &str| -> Option<Span> {
            let start = start + 1;
            plain
                .then(|| literal.token().subspan(start..start + text.len()))
                .flatten()
        };
        let mut paths: Vec<FieldPath> = Vec::new();
        if value.trim().is_empty() {
            self.errors.push(syn::Error::new(
                span,
                format!("`{argument}` is empty; name the message fields, e.g. `{argument} = \"order_id, event_type\"`"),
            ));
        }
        let mut offset = 0;
        for (index, segment) in value.split(',').enumerate() {
            let segment_start = offset;
            offset += segment.len() + 1;
            let text = segment.trim();
            let start = segment_start + (segment.len() - segment.trim_start().len());
            let sub = at(start, text);
            if text.is_empty() {
                if !value.trim().is_empty() {
                    self.errors.push(syn::Error::new(
                        sub.unwrap_or(span),
                        format!("`{argument}` has an empty field at position {}; remove the extra comma", index + 1),
                    ));
                }
                continue;
            }
            let error_span = sub.unwrap_or(span);
            match parse_string_path(text, argument) {
                Ok(components) => {
                    let mut members = Vec::new();
                    let mut names = Vec::new();
                    let mut component_start = start;
                    for (component, member) in text.split('.').zip(components) {
                        // A component of the literal: its own span where the compiler
                        // can point there; otherwise the literal, in the macro's own
                        // context, so that the compiler does not offer to replace the
                        // whole literal with the field's name.
                        let leading = component.len() - component.trim_start().len();
                        let member_span = at(component_start + leading, component.trim())
                            .unwrap_or_else(|| Span::mixed_site().located_at(span));
                        component_start += component.len() + 1;
                        names.push(member_text(&member));
                        members.push(respan_member(member, member_span));
                    }
                    let path = FieldPath {
                        text: names.join("."),
                        members,
                        span: error_span,
                    };
                    self.push_path(&mut paths, path, argument);
                }
                Err(message) => self.errors.push(syn::Error::new(error_span, message)),
            }
        }
        FieldList { span, paths }
    }

    /// Adds `path` to `paths`, or records that it is there already.
    fn push_path(&mut self, paths: &mut Vec<FieldPath>, path: FieldPath, argument: &str) {
        if paths.iter().any(|other| other.text == path.text) {
            self.errors.push(syn::Error::new(
                path.span,
                format!("field `{}` appears twice in `{argument}`", path.text),
            ));
        } else {
            paths.push(path);
        }
    }
}

/// A field path of the identifier form: `order.customer.id`, `r#type`, `type`, `pair.0`.
fn parse_ident_path(input: ParseStream<'_>) -> syn::Result<Option<FieldPath>> {
    let mut members = Vec::new();
    let mut first_span: Option<Span> = None;
    let mut last_span: Option<Span> = None;
    // `self.id`: the rest of the path is parsed first, to suggest it.
    let mut starts_with_self: Option<Ident> = None;
    loop {
        if input.peek(syn::LitFloat) {
            // `pair.0.1` is lexed as `pair`, `.`, `0.1`.
            let float: syn::LitFloat = input.parse()?;
            let text = float.to_string();
            let indices: Option<Vec<u32>> = text.split('.').map(tuple_index).collect();
            match indices {
                Some(indices) if indices.len() == 2 => {
                    for index in indices {
                        members.push(Member::Unnamed(syn::Index {
                            index,
                            span: float.span(),
                        }));
                    }
                }
                _ => {
                    return Err(syn::Error::new(
                        float.span(),
                        format!(
                            "`{text}` is not a field: a field is a name or the index of a tuple field, such as `0`"
                        ),
                    ));
                }
            }
            first_span.get_or_insert(float.span());
            last_span = Some(float.span());
        } else if input.peek(syn::LitInt) {
            let int: LitInt = input.parse()?;
            let Some(index) = tuple_index(&int.to_string()) else {
                return Err(syn::Error::new(
                    int.span(),
                    format!(
                        "`{int}` is not a field: the index of a tuple field is written without a suffix or leading zeros, such as `0`"
                    ),
                ));
            };
            first_span.get_or_insert(int.span());
            last_span = Some(int.span());
            members.push(Member::Unnamed(syn::Index {
                index,
                span: int.span(),
            }));
        } else if input.peek(Ident::peek_any) {
            let ident = input.call(Ident::parse_any)?;
            let name = ident.unraw().to_string();
            let first = members.is_empty() && starts_with_self.is_none();
            if first && (name == "self" || name == "Self") {
                starts_with_self = Some(ident);
                if !input.peek(Token![.]) {
                    break;
                }
                input.parse::<Token![.]>()?;
                continue;
            }
            if let Some(message) = not_a_field(&name) {
                return Err(syn::Error::new(ident.span(), message));
            }
            first_span.get_or_insert(ident.span());
            last_span = Some(ident.span());
            members.push(Member::Named(field_ident(&name, ident.span())));
        } else if input.peek(LitStr) {
            let literal: LitStr = input.parse()?;
            return Err(syn::Error::new(
                literal.span(),
                format!(
                    "inside the parentheses the fields are identifiers: write `{}` without quotes",
                    literal.value()
                ),
            ));
        } else {
            return Err(input.error(
                "expected a field of the message: a name (`order_id`), a path (`order.id`) or the index of a tuple field (`0`)",
            ));
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
    let (Some(first), Some(last)) = (first_span, last_span) else {
        unreachable!("a path has a component");
    };
    let span = first.join(last).unwrap_or(last);
    Ok(Some(FieldPath {
        text: rest,
        members,
        span,
    }))
}

/// The components of a path of the string form (`order.id`, `r#type`, `type`, `pair.0`),
/// or what is wrong with it.
fn parse_string_path(text: &str, argument: &str) -> Result<Vec<Member>, String> {
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
        .map(|component| {
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
                String::from("; a field name is a Rust identifier (letters, digits and `_`, or a raw identifier such as `r#type`), a path joins names with `.` (`order.id`), and a tuple field is its index (`0`)")
            };
            Err(format!("`{component}` in `{argument}` is not a field name{hint}"))
        })
        .collect()
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
fn member_text(member: &Member) -> String {
    match member {
        Member::Named(ident) => ident.unraw().to_string(),
        Member::Unnamed(index) => index.index.to_string(),
    }
}

/// `member` with its span set to `span`.
fn respan_member(member: Member, span: Span) -> Member {
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

/// `did you mean `x`? ` for a valid argument within two edits of `name`, or nothing.
fn did_you_mean(name: &str) -> String {
    VALID
        .split(", ")
        .map(|valid| valid.trim_matches('`'))
        .map(|valid| (edit_distance(name, valid), valid))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map_or_else(String::new, |(_, valid)| {
            format!("did you mean `{valid}`? ")
        })
}

/// The Levenshtein distance between `a` and `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substituted = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substituted.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// Stores an argument, or records that it was given twice.
fn set<T>(slot: &mut Option<T>, value: T, span: Span, name: &str, errors: &mut Vec<syn::Error>) {
    if slot.is_some() {
        errors.push(syn::Error::new(
            span,
            format!("`{name}` is given more than once"),
        ));
    } else {
        *slot = Some(value);
    }
}

/// `"500ms"`, `"30s"`, `"5m"`, `"1h"`, `"7d"` as milliseconds; `None` if malformed or zero.
/// The string of a duration argument (`lease`, `cache_ttl`, `retention`); a bare number
/// is refused with the unit it lacks.
fn duration_literal(meta: &ParseNestedMeta<'_>, name: &str) -> syn::Result<LitStr> {
    let value = meta.value()?;
    if value.peek(LitInt) || value.peek(syn::LitFloat) {
        let number: syn::Lit = value.parse()?;
        return Err(syn::Error::new(
            number.span(),
            format!(
                "`{name}` is a duration in a string, with its unit: `{name} = \"{}\"`; a bare number has no unit",
                number_with_unit(&number, if name == "retention" { "d" } else { "s" })
            ),
        ));
    }
    value.parse()
}

/// `30` with a unit, for the error's example.
fn number_with_unit(number: &syn::Lit, unit: &str) -> String {
    match number {
        syn::Lit::Int(int) => format!("{}{unit}", int.base10_digits()),
        _ => format!("30{unit}"),
    }
}

fn parse_duration_millis(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .filter(|millis| *millis > 0)
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
