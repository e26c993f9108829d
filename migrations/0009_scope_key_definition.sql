-- What each scope's keys are made of, and the handlers that were renamed or moved. Applied
-- by `Idem::migrate` with `search_path` set to the configured schema. Adds columns only:
-- the statements of the previous release (which write none of them) keep working.

-- The scope's key definition: the encoding's version, the key's field paths in order with
-- the shape of each part's encoding, and the payload fingerprint's fields likewise
-- (`idem:v1 key(order_id s, event_type s) fingerprint(amount_cents i)`). Recorded by the
-- first handler of the scope that runs; a handler whose definition differs is refused on
-- a scope that has keys (`Error::KeyChanged`), since it would derive other keys for the
-- same facts. NULL: recorded by a release that did not record it; the next handler that
-- runs records its own.
ALTER TABLE idem_scopes ADD COLUMN key_definition text;
-- When the current definition was recorded.
ALTER TABLE idem_scopes ADD COLUMN key_defined_at timestamptz;
-- A definition that the current one replaced by a declared transition
-- (`#[idempotent(previous_key = "...")]`): its keys still count as the scope's facts.
ALTER TABLE idem_scopes ADD COLUMN previous_key_definition text;
-- The last time a delivery was answered by a key of the previous definition alone (a fact
-- that succeeded under it only): the previous definition is still needed until this is
-- older than the longest redelivery, and the retention window has passed.
ALTER TABLE idem_scopes ADD COLUMN previous_key_seen_at timestamptz;
-- The type of the message the handler takes (its name, without the module path): a
-- handler without `scope` that finds no keys under its default scope, while a scope of
-- its crate with the same message type and key definition has keys and no handler in the
-- binary, was renamed or moved, and is refused (`Error::HandlerMoved`).
ALTER TABLE idem_scopes ADD COLUMN message_type text;
