//! The checks between arguments, each recording what is wrong in `Args::errors`: `lease`
//! without the lease mode, `batch` in lease mode, `cache_ttl` with `cache = false`,
//! `shared_scope` without `scope`, `previous_key` in lease mode or equal to `key`, an
//! `event_time` that is not one key field, a
//! `previous_event_time` that is not `event_time`'s field in `previous_key`, and what a
//! batch handler does not take.

use super::{Args, CacheArg, FieldList, FieldPath, Mode};

impl Args {
    /// The handler's mode; records an error for a `lease` without `mode = "lease"`.
    pub(crate) fn mode(&mut self) -> Mode {
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
    pub(crate) fn batch(&mut self, mode: Mode) -> bool {
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
    pub(crate) fn check_batch_handler(&mut self) {
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
    pub(crate) fn cache(&mut self) -> Option<CacheArg> {
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

    /// The previous key's fields, for a transaction-mode handler; records an error for
    /// `previous_key` in lease mode, and for one that names the key's own fields.
    pub(crate) fn check_previous_key(&mut self, mode: Mode) {
        let Some(previous) = &self.previous_key else {
            return;
        };
        if mode == Mode::Lease {
            self.errors.push(syn::Error::new(
                previous.span,
                "`previous_key` applies to transaction-mode handlers only: a lease is committed on its own, so the keys of two definitions cannot be claimed together; keep the key, or give the changed handler a `scope` of its own",
            ));
            return;
        }
        let texts = |list: &FieldList| {
            list.paths
                .iter()
                .map(|path| path.text.clone())
                .collect::<Vec<_>>()
        };
        // With `event_time` and no `previous_event_time`, the same fields are the move of
        // the keys from the status table into the time buckets: the same keys, elsewhere.
        let moved_into_buckets = self.event_time.is_some() && self.previous_event_time.is_none();
        if !moved_into_buckets
            && self
                .key
                .as_ref()
                .is_some_and(|key| texts(key) == texts(previous))
        {
            self.errors.push(syn::Error::new(
                previous.span,
                "`previous_key` names the same fields as `key`: it declares the fields the keys were derived from before `key` changed; remove it, or name the old fields",
            ));
        }
    }

    /// Whether the handler declares its scope shared; records an error for
    /// `shared_scope = true` without an explicit `scope`.
    pub(crate) fn shared_scope(&mut self) -> bool {
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

    /// The key field that `event_time` names, where the handler declares one; records an
    /// error for a list that is not one field of `key`. Every mode and kind of handler
    /// takes it (a batch claims each key in its fact's bucket).
    pub(crate) fn event_time(&mut self) -> Option<FieldPath> {
        let list = self.event_time.as_ref()?;
        let [path] = list.paths.as_slice() else {
            self.errors.push(syn::Error::new(
                list.span,
                "`event_time` names one field: the key field that holds the fact's own time, e.g. `event_time = \"created_at\"`",
            ));
            return None;
        };
        let key = self.key.as_ref()?;
        if !key.paths.iter().any(|field| field.text == path.text) {
            let fields = key
                .paths
                .iter()
                .map(|field| field.text.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let written = &path.text;
            let listed = format!("`{}`", fields.replace(", ", "`, `"));
            let mean = super::suggest::did_you_mean(written, &listed);
            let remedy = if mean.is_empty() {
                format!(
                    "name the key field that holds the fact's time, or add `{written}` to `key`"
                )
            } else {
                format!("{mean}Otherwise add `{written}` to `key`")
            };
            self.errors.push(syn::Error::new(
                path.span,
                format!(
                    "`event_time` names `{written}`, which is not one of the `key` fields ({fields}): the fact's time must be part of the key, or a re-send of the same fact with another time would run again; {remedy}"
                ),
            ));
            return None;
        }
        // The same field as the key's, spanned on `event_time`'s own text: a type that
        // is not a time is reported there.
        Some(path.clone())
    }

    /// The field that held the fact's time under the previous key definition
    /// (`previous_event_time`: its keys are in the time buckets too), where the handler
    /// declares one; records an error unless it is one field of `previous_key` and the
    /// field `event_time` names. `event_time`: what [`Args::event_time`] gave.
    pub(crate) fn previous_event_time(
        &mut self,
        event_time: Option<&FieldPath>,
    ) -> Option<FieldPath> {
        let list = self.previous_event_time.as_ref()?;
        let [path] = list.paths.as_slice() else {
            self.errors.push(syn::Error::new(
                list.span,
                "`previous_event_time` names one field: the field that held the fact's time under the previous key definition, e.g. `previous_event_time = \"created_at\"`",
            ));
            return None;
        };
        let Some(previous) = &self.previous_key else {
            self.errors.push(syn::Error::new(
                path.span,
                "`previous_event_time` says that the keys of the previous definition are kept by the fact's time: it needs `previous_key`, the fields they were derived from",
            ));
            return None;
        };
        if self.event_time.is_none() {
            self.errors.push(syn::Error::new(
                path.span,
                "`previous_event_time` needs `event_time`: keys are moved into the time buckets (`event_time` with `previous_key`), not out of them; to keep this handler's keys in the status table, give it a `scope` of its own",
            ));
            return None;
        }
        if !previous.paths.iter().any(|field| field.text == path.text) {
            self.errors.push(syn::Error::new(
                path.span,
                format!(
                    "`previous_event_time` must be one of the `previous_key` fields: under the previous definition, `event_time` was one of its key's fields; add `{}` to `previous_key`",
                    path.text
                ),
            ));
            return None;
        }
        // An `event_time` refused already says what is wrong.
        let current = event_time?;
        if current.text != path.text {
            self.errors.push(syn::Error::new(
                path.span,
                format!(
                    "`previous_event_time` must name the field `event_time` names (`{}`): a fact keeps its time across the change, and both of its keys are in the bucket of that time",
                    current.text
                ),
            ));
            return None;
        }
        Some(path.clone())
    }
}
