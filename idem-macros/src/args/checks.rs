//! The checks between arguments, each recording what is wrong in `Args::errors`: `lease`
//! without the lease mode, `batch` in lease mode, `cache_ttl` with `cache = false`,
//! `shared_scope` without `scope`, `previous_key` in lease mode or equal to `key`, an
//! `event_time` that is not one key field (or that this release does not combine), and
//! what a batch handler does not take.

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
        if self
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
    /// error for a list that is not one field of `key`, and for the arguments that do not
    /// combine with it yet (lease mode, `previous_key`). Batches (`batch = true` and batch
    /// handlers) claim each key in its fact's bucket.
    pub(crate) fn event_time(&mut self, mode: Mode) -> Option<FieldPath> {
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
            self.errors.push(syn::Error::new(
                path.span,
                format!(
                    "`event_time` must be one of the `key` fields ({fields}): a time outside the key would let a re-send of the same fact with another time run again; add `{}` to `key`",
                    path.text
                ),
            ));
            return None;
        }
        let unsupported = if mode == Mode::Lease {
            Some(
                "lease mode: a lease is committed on its own, and its keys are kept in the status table",
            )
        } else if self.previous_key.is_some() {
            Some("`previous_key`: the keys of the previous definition are kept in the status table")
        } else {
            None
        };
        if let Some(what) = unsupported {
            self.errors.push(syn::Error::new(
                path.span,
                format!(
                    "`event_time` does not combine with {what} in this release; remove `event_time` to keep this handler's keys in the status table"
                ),
            ));
            return None;
        }
        // The same field as the key's, spanned on `event_time`'s own text: a type that
        // is not a time is reported there.
        Some(path.clone())
    }
}
