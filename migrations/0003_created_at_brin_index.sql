-- Retention needs `created_at` indexed, but a B-tree on it costs every claim an index
-- insert and about 22 MB per million keys. Keys are inserted in time order, which is
-- what a BRIN index summarises best: a few pages for millions of rows, and no per-row
-- cost on insert. `DELETE ... WHERE created_at < $cutoff` still finds its page ranges.
DROP INDEX idem_keys_created_at_idx;
CREATE INDEX idem_keys_created_at_brin ON idem_keys USING brin (created_at) WITH (autosummarize = on);
