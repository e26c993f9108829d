-- The handler that owns each scope, besides its crate: two handlers of one crate (methods
-- of the same name in two `impl` blocks, two instantiations of a generic handler, two
-- functions given the same `scope`) that run in different processes are refused too.
-- The identity is the handler's path as the compiler names it (`crate::module::Type::handle`).
ALTER TABLE idem_scopes ADD COLUMN handler text;
