//! The arguments of `#[idempotent(...)]`: each one parsed on its own (`name = value`,
//! recorded with its span, or an error), then the checks between arguments.
//!
//! Field lists (`key`, `fingerprint`) are parsed in `fields`, durations (`lease`,
//! `cache_ttl`, `retention`) in `duration`, and the "did you mean" of an unknown argument
//! comes from `suggest`.

mod checks;
mod duration;
mod fields;
mod suggest;

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::{Ident, LitBool, LitInt, LitStr, Path};

pub(crate) use fields::{FieldList, FieldPath};

/// Every argument the attribute accepts, for the "unknown argument" message.
const VALID: &str = "`key`, `event_time`, `previous_key`, `previous_event_time`, `scope`, `shared_scope`, `fingerprint`, `max_attempts`, `store_result`, `mode`, `lease`, `batch`, `cache`, `cache_ttl`, `retention`, `key_fn`, `crate`";

/// The longest scope, in bytes, and the character a scope cannot hold: the limits that
/// the runtime checks at a handler's first run (`idem_runtime::scope`), here at compile
/// time for a scope that is written out.
const MAX_SCOPE: usize = 200;

/// How a handler's key is held while its body runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// In the body's own database transaction (the default).
    Transaction,
    /// Under a lease committed on its own, for effects outside the database.
    Lease,
}

/// `key_fn`: what the key function of the handler is called, if there is one.
#[derive(Clone)]
pub(crate) enum KeyFn {
    /// `key_fn = true`, or no `key_fn`: `<handler>_key`.
    Default,
    /// `key_fn = "name"`: the name, spanned on the string.
    Named(Ident),
    /// `key_fn = false`: no key function (a method of a trait impl, where the trait has
    /// no such item; or no caller needs it).
    Omitted,
}

/// A handler-level Redis cache argument, with the span of its value.
#[derive(Clone, Copy)]
pub(crate) enum CacheArg {
    /// `cache = true | false`.
    Switch(bool, Span),
    /// `cache_ttl = "..."`, in milliseconds.
    Ttl(u64, Span),
}

/// The parsed arguments.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<FieldList>,
    /// `previous_key = "..."`: the fields the scope's keys were derived from before `key`.
    pub(crate) previous_key: Option<FieldList>,
    /// `event_time = "..."`: the key field that holds the fact's time, which buckets the
    /// handler's keys.
    pub(crate) event_time: Option<FieldList>,
    /// `previous_event_time = "..."`: the field that held the fact's time under the
    /// previous key definition, whose keys are then in the time buckets too.
    pub(crate) previous_event_time: Option<FieldList>,
    pub(crate) scope: Option<LitStr>,
    /// `shared_scope = true`: other handlers may use the same (explicit) scope.
    pub(crate) shared_scope: Option<LitBool>,
    pub(crate) fingerprint: Option<FieldList>,
    pub(crate) max_attempts: Option<LitInt>,
    pub(crate) store_result: Option<LitBool>,
    /// `batch = true`: also generate `<handler>_batch` over a slice of messages.
    pub(crate) batch: Option<LitBool>,
    pub(crate) krate: Option<Path>,
    pub(crate) mode: Option<(Mode, LitStr)>,
    /// `mode` named no known mode: the signature is not checked against either.
    pub(crate) mode_unknown: bool,
    /// `lease = "45s"`, in milliseconds. Without it the runtime's default lease applies.
    pub(crate) lease: Option<(u64, LitStr)>,
    /// `cache = false`: this handler neither reads nor writes the Redis cache.
    pub(crate) cache: Option<LitBool>,
    /// `cache_ttl = "30m"`: the TTL of this handler's Redis cache entries, in milliseconds.
    pub(crate) cache_ttl: Option<(u64, LitStr)>,
    /// `retention = "30d"`: how long the handler's `success` keys are kept, in milliseconds.
    pub(crate) retention: Option<(u64, LitStr)>,
    /// `key_fn = "name" | true | false`.
    pub(crate) key_fn: Option<KeyFn>,
    /// Errors found so far; they are all reported together.
    pub(crate) errors: Vec<syn::Error>,
}

impl Args {
    /// Parses one `name = value` argument (the callback of [`syn::meta::parser`]). An
    /// argument in error is recorded and skipped, so that the others are still checked.
    pub(crate) fn parse(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
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

    /// Parses the argument `meta` names, by the kind of its value.
    fn parse_argument(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(name) = meta.path.get_ident().map(Ident::to_string) else {
            return Err(meta.error(format!("unknown argument; expected one of {VALID}")));
        };
        let span = meta.path.segments[0].ident.span();
        match name.as_str() {
            "key" | "previous_key" | "fingerprint" | "event_time" | "previous_event_time" => {
                self.parse_fields(meta, &name, span)
            }
            "shared_scope" | "batch" | "store_result" | "cache" => {
                self.parse_flag(meta, &name, span)
            }
            "lease" | "cache_ttl" | "retention" => self.parse_duration(meta, &name, span),
            "scope" => self.parse_scope(meta, span),
            "max_attempts" => self.parse_max_attempts(meta, span),
            "mode" => self.parse_mode(meta, span),
            "key_fn" => self.parse_key_fn(meta, span),
            "crate" => {
                let literal: LitStr = meta.value()?.parse()?;
                let path = literal.parse_with(Path::parse_mod_style)?;
                set(&mut self.krate, path, span, &name, &mut self.errors);
                Ok(())
            }
            _ => Err(meta.error(format!(
                "unknown argument `{name}`; {}expected one of {VALID}",
                suggest::did_you_mean(&name, VALID)
            ))),
        }
    }

    /// `key`, `previous_key`, `fingerprint`, `event_time` or `previous_event_time`: a list
    /// of the message's fields (the times: one of them, checked with the others in
    /// `checks`).
    fn parse_fields(
        &mut self,
        meta: &ParseNestedMeta<'_>,
        name: &str,
        span: Span,
    ) -> syn::Result<()> {
        let list = fields::field_list(meta, name, &mut self.errors)?;
        let slot = match name {
            "key" => &mut self.key,
            "previous_key" => &mut self.previous_key,
            "event_time" => &mut self.event_time,
            "previous_event_time" => &mut self.previous_event_time,
            _ => &mut self.fingerprint,
        };
        set(slot, list, span, name, &mut self.errors);
        Ok(())
    }

    /// `shared_scope`, `batch`, `store_result` or `cache`: a `bool`.
    fn parse_flag(
        &mut self,
        meta: &ParseNestedMeta<'_>,
        name: &str,
        span: Span,
    ) -> syn::Result<()> {
        let literal: LitBool = meta.value()?.parse()?;
        let slot = match name {
            "shared_scope" => &mut self.shared_scope,
            "batch" => &mut self.batch,
            "store_result" => &mut self.store_result,
            _ => &mut self.cache,
        };
        set(slot, literal, span, name, &mut self.errors);
        Ok(())
    }

    /// `lease`, `cache_ttl` or `retention`: a duration in a string (`"30s"`).
    fn parse_duration(
        &mut self,
        meta: &ParseNestedMeta<'_>,
        name: &str,
        span: Span,
    ) -> syn::Result<()> {
        let literal = duration::duration_literal(meta, name)?;
        let millis = duration::argument_millis(&literal, name)?;
        let slot = match name {
            "lease" => &mut self.lease,
            "cache_ttl" => &mut self.cache_ttl,
            _ => &mut self.retention,
        };
        set(slot, (millis, literal), span, name, &mut self.errors);
        Ok(())
    }

    /// `scope = "..."`: not empty, and one the runtime accepts (no NUL character, at most
    /// `MAX_SCOPE` bytes), in the runtime's words.
    fn parse_scope(&mut self, meta: &ParseNestedMeta<'_>, span: Span) -> syn::Result<()> {
        let literal: LitStr = meta.value()?.parse()?;
        let value = literal.value();
        let problem = if value.trim().is_empty() {
            Some("`scope` must not be empty".to_owned())
        } else if value.contains('\0') {
            Some("`scope` cannot be used: it contains a NUL character, which the status table cannot hold; give the handler a short, plain `scope = \"...\"`".to_owned())
        } else if value.len() > MAX_SCOPE {
            Some(format!(
                "`scope` cannot be used: it is longer than {MAX_SCOPE} bytes (it has {}), the most the status table holds; give the handler a short, plain `scope = \"...\"`",
                value.len()
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            self.errors.push(syn::Error::new(literal.span(), problem));
        }
        set(&mut self.scope, literal, span, "scope", &mut self.errors);
        Ok(())
    }

    /// `key_fn = "name"`, `key_fn = true` (the default) or `key_fn = false`.
    fn parse_key_fn(&mut self, meta: &ParseNestedMeta<'_>, span: Span) -> syn::Result<()> {
        let value = meta.value()?;
        let key_fn = if value.peek(LitStr) {
            KeyFn::Named(key_fn_name(&value.parse()?)?)
        } else if value.peek(LitBool) {
            if value.parse::<LitBool>()?.value {
                KeyFn::Default
            } else {
                KeyFn::Omitted
            }
        } else {
            return Err(value.error(
                "`key_fn` takes the name of the key function in a string, `key_fn = \"order_key\"`, or `false` for no key function (`true`, the default, names it `<handler>_key`)",
            ));
        };
        set(&mut self.key_fn, key_fn, span, "key_fn", &mut self.errors);
        Ok(())
    }

    /// `max_attempts = N`, from 1 to `u32::MAX`.
    fn parse_max_attempts(&mut self, meta: &ParseNestedMeta<'_>, span: Span) -> syn::Result<()> {
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
            "max_attempts",
            &mut self.errors,
        );
        Ok(())
    }

    /// `mode = "transaction" | "lease"`.
    fn parse_mode(&mut self, meta: &ParseNestedMeta<'_>, span: Span) -> syn::Result<()> {
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
            "mode",
            &mut self.errors,
        );
        Ok(())
    }
}

/// The identifier that `key_fn = "name"` gives, spanned on the string.
fn key_fn_name(literal: &LitStr) -> syn::Result<Ident> {
    let value = literal.value();
    literal.parse::<Ident>().map_err(|_| {
        let problem = if syn::parse_str::<Ident>(&format!("r#{value}")).is_ok() {
            format!("`{value}` is a keyword; write `key_fn = \"r#{value}\"`")
        } else {
            format!(
                "{value:?} is not an identifier; e.g. `key_fn = \"order_key\"`, or `key_fn = false` for no key function"
            )
        };
        syn::Error::new(
            literal.span(),
            format!("`key_fn` must be the name of a function: {problem}"),
        )
    })
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
