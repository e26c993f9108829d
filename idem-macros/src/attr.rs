//! The arguments of `#[idempotent(...)]` and their parser.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::{Ident, LitBool, LitInt, LitStr, Path};

/// Every argument the attribute accepts, for the "unknown argument" message.
const VALID: &str = "`key`, `scope`, `fingerprint`, `max_attempts`, `store_result`, `mode`, `lease`, `batch`, `cache`, `cache_ttl`, `crate`";

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
                    literal: LitStr::new("", Span::call_site()),
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
                let literal: LitStr = meta.value()?.parse()?;
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
                let literal: LitStr = meta.value()?.parse()?;
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

    /// The lease duration of a lease-mode handler, in milliseconds.
    pub fn lease_millis(&self) -> u64 {
        self.lease
            .as_ref()
            .map_or(DEFAULT_LEASE_MILLIS, |(millis, _)| *millis)
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
            let text = idents
                .iter()
                .map(Ident::to_string)
                .collect::<Vec<_>>()
                .join(".");
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

/// `"500ms"`, `"30s"`, `"5m"`, `"1h"` as milliseconds; `None` if malformed or zero.
fn parse_duration_millis(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .filter(|millis| *millis > 0)
}
