//! How idem's statements reach the server: prepared, with their values bound (the
//! default), or, behind a transaction pooler, as simple queries with their values written
//! into the text as literals.
//!
//! A transaction pooler (PgBouncer with `pool_mode = transaction`, RDS Proxy, Supavisor)
//! hands each transaction to whichever server connection is free. A prepared statement
//! lives on the server connection that parsed it, and sqlx parses a statement in one
//! round trip and binds it in the next: outside a transaction, the two can reach different
//! server connections, and the bind then finds no statement, or another client's. A
//! simple query is one message: it needs nothing from an earlier one, and leaves nothing
//! behind. Every value is written in a form that cannot be read as SQL, whatever it holds:
//! text and bytes as hexadecimal digits, numbers from their decimal digits, UUIDs from
//! their canonical text; each typed as the prepared statement's parameter would be.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow};
use sqlx::{Arguments, Executor, FromRow, Postgres};
use uuid::Uuid;

/// How statements travel to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Prepared statements with bound values (sqlx's statement cache): a direct
    /// connection, or a pooler in session pooling.
    Prepared,
    /// Simple queries with the values written in: a pooler in transaction pooling.
    Inline,
}

/// The value of one parameter of a statement (`$1`, `$2`, ...), typed as PostgreSQL
/// receives it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'a> {
    Text(Option<&'a str>),
    Uuid(Option<Uuid>),
    Bytea(Option<&'a [u8]>),
    Int4(i32),
    Int8(Option<i64>),
    Bool(bool),
    Texts(Option<&'a [String]>),
    Int8s(&'a [i64]),
    Uuids(&'a [Uuid]),
    Byteas(&'a [Option<Vec<u8>>]),
    Jsons(&'a [serde_json::Value]),
    Time(DateTime<Utc>),
    Times(&'a [DateTime<Utc>]),
}

impl From<DateTime<Utc>> for Value<'_> {
    fn from(value: DateTime<Utc>) -> Self {
        Value::Time(value)
    }
}

impl<'a> From<&'a [DateTime<Utc>]> for Value<'a> {
    fn from(value: &'a [DateTime<Utc>]) -> Self {
        Value::Times(value)
    }
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(value: &'a str) -> Self {
        Value::Text(Some(value))
    }
}

impl<'a> From<&'a String> for Value<'a> {
    fn from(value: &'a String) -> Self {
        Value::Text(Some(value))
    }
}

impl<'a> From<Option<&'a str>> for Value<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Value::Text(value)
    }
}

impl From<Uuid> for Value<'_> {
    fn from(value: Uuid) -> Self {
        Value::Uuid(Some(value))
    }
}

impl From<Option<Uuid>> for Value<'_> {
    fn from(value: Option<Uuid>) -> Self {
        Value::Uuid(value)
    }
}

impl<'a> From<Option<&'a [u8]>> for Value<'a> {
    fn from(value: Option<&'a [u8]>) -> Self {
        Value::Bytea(value)
    }
}

impl From<i32> for Value<'_> {
    fn from(value: i32) -> Self {
        Value::Int4(value)
    }
}

impl From<i64> for Value<'_> {
    fn from(value: i64) -> Self {
        Value::Int8(Some(value))
    }
}

impl From<Option<i64>> for Value<'_> {
    fn from(value: Option<i64>) -> Self {
        Value::Int8(value)
    }
}

impl From<bool> for Value<'_> {
    fn from(value: bool) -> Self {
        Value::Bool(value)
    }
}

impl<'a> From<&'a [String]> for Value<'a> {
    fn from(value: &'a [String]) -> Self {
        Value::Texts(Some(value))
    }
}

impl<'a> From<Option<&'a [String]>> for Value<'a> {
    fn from(value: Option<&'a [String]>) -> Self {
        Value::Texts(value)
    }
}

impl<'a> From<&'a [i64]> for Value<'a> {
    fn from(value: &'a [i64]) -> Self {
        Value::Int8s(value)
    }
}

impl<'a> From<&'a [Uuid]> for Value<'a> {
    fn from(value: &'a [Uuid]) -> Self {
        Value::Uuids(value)
    }
}

impl<'a> From<&'a [Option<Vec<u8>>]> for Value<'a> {
    fn from(value: &'a [Option<Vec<u8>>]) -> Self {
        Value::Byteas(value)
    }
}

impl<'a> From<&'a [serde_json::Value]> for Value<'a> {
    fn from(value: &'a [serde_json::Value]) -> Self {
        Value::Jsons(value)
    }
}

/// A statement with its values, ready to send.
#[derive(Debug)]
pub(crate) enum Query<'q> {
    Prepared(&'q str, PgArguments),
    Inline(String),
}

impl Protocol {
    /// `sql` with `values` for its parameters `$1`, `$2`, ..., in order.
    pub(crate) fn query<'q>(self, sql: &'q str, values: &[Value<'_>]) -> Query<'q> {
        match self {
            Protocol::Prepared => {
                let mut arguments = PgArguments::default();
                for value in values {
                    bind(&mut arguments, *value);
                }
                Query::Prepared(sql, arguments)
            }
            Protocol::Inline => Query::Inline(inline(sql, values)),
        }
    }
}

impl Query<'_> {
    /// Runs the statement: the rows it affected.
    pub(crate) async fn execute<'c, E>(self, executor: E) -> Result<PgQueryResult, sqlx::Error>
    where
        E: Executor<'c, Database = Postgres>,
    {
        match self {
            Query::Prepared(sql, arguments) => {
                executor.execute(sqlx::query_with(sql, arguments)).await
            }
            Query::Inline(sql) => executor.execute(sqlx::raw_sql(&sql)).await,
        }
    }

    /// Runs the statement: its first row, if any.
    pub(crate) async fn fetch_optional<'c, E>(
        self,
        executor: E,
    ) -> Result<Option<PgRow>, sqlx::Error>
    where
        E: Executor<'c, Database = Postgres>,
    {
        match self {
            Query::Prepared(sql, arguments) => {
                executor
                    .fetch_optional(sqlx::query_with(sql, arguments))
                    .await
            }
            Query::Inline(sql) => executor.fetch_optional(sqlx::raw_sql(&sql)).await,
        }
    }

    /// Runs the statement: its one row.
    pub(crate) async fn fetch_one<'c, E>(self, executor: E) -> Result<PgRow, sqlx::Error>
    where
        E: Executor<'c, Database = Postgres>,
    {
        self.fetch_optional(executor)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Runs the statement: all its rows.
    pub(crate) async fn fetch_all<'c, E>(self, executor: E) -> Result<Vec<PgRow>, sqlx::Error>
    where
        E: Executor<'c, Database = Postgres>,
    {
        match self {
            Query::Prepared(sql, arguments) => {
                executor.fetch_all(sqlx::query_with(sql, arguments)).await
            }
            Query::Inline(sql) => executor.fetch_all(sqlx::raw_sql(&sql)).await,
        }
    }

    /// Runs the statement: all its rows, each read as a `T`.
    pub(crate) async fn fetch_all_as<'c, T, E>(self, executor: E) -> Result<Vec<T>, sqlx::Error>
    where
        E: Executor<'c, Database = Postgres>,
        T: for<'r> FromRow<'r, PgRow>,
    {
        self.fetch_all(executor)
            .await?
            .iter()
            .map(T::from_row)
            .collect()
    }

    /// Runs the statement: its first row, if any, read as a `T`.
    pub(crate) async fn fetch_optional_as<'c, T, E>(
        self,
        executor: E,
    ) -> Result<Option<T>, sqlx::Error>
    where
        E: Executor<'c, Database = Postgres>,
        T: for<'r> FromRow<'r, PgRow>,
    {
        self.fetch_optional(executor)
            .await?
            .as_ref()
            .map(T::from_row)
            .transpose()
    }
}

fn bind(arguments: &mut PgArguments, value: Value<'_>) {
    // Encoding these types into the argument buffer cannot fail; an error would be a
    // value too large for the protocol, which the server reports when it is sent.
    let _ = match value {
        Value::Text(text) => arguments.add(text),
        Value::Uuid(uuid) => arguments.add(uuid),
        Value::Bytea(bytes) => arguments.add(bytes),
        Value::Int4(number) => arguments.add(number),
        Value::Int8(number) => arguments.add(number),
        Value::Bool(flag) => arguments.add(flag),
        Value::Texts(texts) => arguments.add(texts),
        Value::Int8s(numbers) => arguments.add(numbers),
        Value::Uuids(uuids) => arguments.add(uuids),
        Value::Byteas(bytes) => arguments.add(bytes),
        Value::Jsons(values) => arguments.add(values),
        Value::Time(time) => arguments.add(time),
        Value::Times(times) => arguments.add(times),
    };
}

/// `sql` with each `$n` replaced by the literal of `values[n - 1]`, in parentheses.
///
/// The statements are idem's own: `$` appears in them only as a parameter's sign.
fn inline(sql: &str, values: &[Value<'_>]) -> String {
    let mut out = String::with_capacity(sql.len() + 64 * values.len());
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let index: Option<usize> = rest[at + 1..at + 1 + digits].parse().ok();
        match index
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| values.get(i))
        {
            Some(value) => {
                out.push('(');
                literal(&mut out, *value);
                out.push(')');
            }
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// Writes the literal of `value`: digits, hexadecimal and UUIDs only, never a character
/// of the value itself.
fn literal(out: &mut String, value: Value<'_>) {
    match value {
        Value::Text(None) => out.push_str("NULL::text"),
        Value::Text(Some(text)) => text_literal(out, text),
        Value::Uuid(None) => out.push_str("NULL::uuid"),
        Value::Uuid(Some(uuid)) => {
            let _ = write!(out, "'{uuid}'::uuid");
        }
        Value::Bytea(None) => out.push_str("NULL::bytea"),
        Value::Bytea(Some(bytes)) => bytea_literal(out, bytes),
        Value::Int4(number) => {
            let _ = write!(out, "'{number}'::int4");
        }
        Value::Int8(None) => out.push_str("NULL::int8"),
        Value::Int8(Some(number)) => {
            let _ = write!(out, "'{number}'::int8");
        }
        Value::Bool(flag) => out.push_str(if flag { "true" } else { "false" }),
        Value::Texts(None) => out.push_str("NULL::text[]"),
        Value::Texts(Some(texts)) => array(out, texts, "text", |out, text| {
            text_literal(out, text);
        }),
        Value::Int8s(numbers) => array(out, numbers, "int8", |out, number| {
            let _ = write!(out, "'{number}'::int8");
        }),
        Value::Uuids(uuids) => array(out, uuids, "uuid", |out, uuid| {
            let _ = write!(out, "'{uuid}'::uuid");
        }),
        Value::Byteas(bytes) => array(out, bytes, "bytea", |out, bytes| match bytes {
            Some(bytes) => bytea_literal(out, bytes),
            None => out.push_str("NULL::bytea"),
        }),
        Value::Jsons(values) => array(out, values, "json", |out, value| {
            text_literal(out, &value.to_string());
            out.push_str("::json");
        }),
        Value::Time(time) => time_literal(out, time),
        Value::Times(times) => array(out, times, "timestamptz", |out, time| {
            time_literal(out, *time);
        }),
    }
}

/// Digits, `-`, `:`, `T`, `.` and `Z` only.
fn time_literal(out: &mut String, time: DateTime<Utc>) {
    let _ = write!(
        out,
        "'{}'::timestamptz",
        time.to_rfc3339_opts(SecondsFormat::Micros, true)
    );
}

fn text_literal(out: &mut String, text: &str) {
    out.push_str("convert_from(");
    bytea_literal(out, text.as_bytes());
    out.push_str(", 'UTF8')");
}

fn bytea_literal(out: &mut String, bytes: &[u8]) {
    out.push_str("decode('");
    out.push_str(&hex::encode(bytes));
    out.push_str("', 'hex')");
}

fn array<T>(out: &mut String, items: &[T], element: &str, mut write: impl FnMut(&mut String, &T)) {
    if items.is_empty() {
        let _ = write!(out, "'{{}}'::{element}[]");
        return;
    }
    out.push_str("ARRAY[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write(out, item);
    }
    let _ = write!(out, "]::{element}[]");
}

#[cfg(test)]
mod tests {
    use super::{Value, inline};
    use uuid::Uuid;

    #[test]
    fn values_are_written_as_digits_and_hexadecimal_only() {
        let key = Uuid::nil();
        let sql = inline(
            "SELECT $1, $2, $3, $10",
            &[
                Value::from("it's'; DROP TABLE x; --\\"),
                Value::from(key),
                Value::Bytea(None),
                Value::Int4(0),
                Value::Int4(0),
                Value::Int4(0),
                Value::Int4(0),
                Value::Int4(0),
                Value::Int4(0),
                Value::Int8(Some(-7)),
            ],
        );
        assert_eq!(
            sql,
            "SELECT (convert_from(decode('69742773273b2044524f50205441424c4520783b202d2d5c', 'hex'), 'UTF8')), \
             ('00000000-0000-0000-0000-000000000000'::uuid), (NULL::bytea), ('-7'::int8)"
        );
    }

    #[test]
    fn arrays_keep_their_element_type_when_empty() {
        let none: &[Uuid] = &[];
        assert_eq!(inline("$1", &[Value::from(none)]), "('{}'::uuid[])");
        let bytes = [Some(vec![0xab]), None];
        assert_eq!(
            inline("$1", &[Value::from(&bytes[..])]),
            "(ARRAY[decode('ab', 'hex'), NULL::bytea]::bytea[])"
        );
    }

    #[test]
    fn a_sign_without_a_value_is_left_alone() {
        assert_eq!(inline("SELECT $2, $", &[Value::Int4(1)]), "SELECT $2, $");
    }

    #[test]
    fn times_are_written_to_the_microsecond_in_utc() {
        let time = chrono::DateTime::from_timestamp_micros(1_765_000_000_123_456).unwrap();
        assert_eq!(
            inline("$1", &[Value::from(time)]),
            "('2025-12-06T05:46:40.123456Z'::timestamptz)"
        );
        assert_eq!(
            inline("$1", &[Value::from(&[time][..])]),
            "(ARRAY['2025-12-06T05:46:40.123456Z'::timestamptz]::timestamptz[])"
        );
    }
}
