//! The privileges a consumer's role needs on idem's tables (see
//! [`privileges`](crate::privileges)).

use crate::config::Identifier;

/// The `GRANT` statements that let `role` (already quoted) run idempotent handlers on the
/// tables in `schema`.
pub(crate) fn consumer_grants(schema: &Identifier, role: &str) -> String {
    format!(
        "GRANT USAGE ON SCHEMA {schema} TO {role};\n\
         GRANT SELECT, INSERT, UPDATE ON {schema}.idem_keys TO {role};\n\
         GRANT SELECT, INSERT ON {schema}.idem_scopes TO {role};\n\
         GRANT UPDATE (retention_ms, key_definition, key_defined_at, previous_key_definition, \
                       previous_key_seen_at, message_type) ON {schema}.idem_scopes TO {role};\n\
         GRANT SELECT ON {schema}.idem_instance TO {role};\n\
         GRANT SELECT, INSERT, UPDATE ON {schema}.idem_timed_keys TO {role};\n\
         GRANT EXECUTE ON FUNCTION {schema}.idem_timed_bucket(timestamptz, interval, bigint, bigint) \
                                   TO {role};\n"
    )
}
