//! Least privilege: what a consumer's database role needs, and nothing more.
//!
//! [`Idem::migrate`](crate::Idem::migrate) creates the schema, its tables and its indexes:
//! run it as the role that owns the schema (at deployment, or from one process at
//! start-up). Consumers can run under a role that holds only the privileges that
//! [`consumer_grants`] lists: reading and writing rows of the status table, recording
//! scope owners, and reading the cache namespace and secret. Nothing that idem does while
//! it delivers messages needs DDL.

use crate::config::Identifier;

/// The `GRANT` statements that let `role` run idempotent handlers on the status table in
/// `schema` (its business tables need their own grants).
///
/// ```
/// use idem_runtime::config::Identifier;
///
/// let schema = Identifier::new("idem").unwrap();
/// let sql = idem_runtime::privileges::consumer_grants(&schema, "billing consumer");
/// assert!(sql.starts_with(r#"GRANT USAGE ON SCHEMA idem TO "billing consumer";"#));
/// assert!(!sql.contains("CREATE"));
/// ```
pub fn consumer_grants(schema: &Identifier, role: &str) -> String {
    crate::store::consumer_grants(schema, &quote_identifier(role))
}

/// `name` as a quoted SQL identifier: in double quotes, inner double quotes doubled.
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_quoted() {
        let schema = Identifier::new("idem").unwrap();
        let sql = consumer_grants(&schema, r#"x"; DROP TABLE idem_keys; --"#);
        assert!(
            sql.contains(r#"TO "x""; DROP TABLE idem_keys; --";"#),
            "{sql}"
        );
        assert_eq!(sql.matches(';').count(), 7 * 3, "{sql}");
    }
}
