//! The connection: from `--database-url`, `DATABASE_URL` or the libpq variables, and
//! error texts that never show a password.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::failure::Failure;

/// The connect options of `url`, or those of the libpq variables (`PGHOST`, `PGPORT`,
/// `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, ...) without one.
pub fn options(url: Option<&str>) -> Result<PgConnectOptions, Failure> {
    match url {
        Some(url) if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) => {
            Err(Failure::bad_url(format!(
                "invalid database URL {}: it must start with postgres:// or postgresql://",
                redact_url(url)
            )))
        }
        Some(url) => PgConnectOptions::from_str(url).map_err(|error| {
            Failure::bad_url(format!(
                "invalid database URL {}: {}",
                redact_url(url),
                redact(&error.to_string(), &secrets(Some(url)))
            ))
        }),
        None => Ok(PgConnectOptions::new()),
    }
}

/// A pool of two connections, after one connection checked the options (and gave the
/// server's own error when they do not work).
pub async fn pool(options: PgConnectOptions, url: Option<&str>) -> Result<PgPool, Failure> {
    let check = tokio::time::timeout(
        Duration::from_secs(15),
        PgConnection::connect_with(&options),
    )
    .await
    .unwrap_or_else(|_| Err(sqlx::Error::PoolTimedOut));
    match check {
        Ok(connection) => {
            let _ = connection.close().await;
        }
        Err(error) => {
            return Err(Failure::connect(format!(
                "cannot connect to the database: {}",
                redact(&error.to_string(), &secrets(url))
            )));
        }
    }
    Ok(PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(15))
        .connect_lazy_with(options))
}

/// The secrets that must not appear in output: the URL's password and `PGPASSWORD`.
pub fn secrets(url: Option<&str>) -> Vec<String> {
    let mut secrets = Vec::new();
    if let Some(password) = url.and_then(url_password) {
        secrets.push(password.to_owned());
        // As the URL encodes it, and decoded.
        if let Some(decoded) = percent_decode(password) {
            secrets.push(decoded);
        }
    }
    if let Ok(password) = std::env::var("PGPASSWORD") {
        secrets.push(password);
    }
    secrets.retain(|secret| !secret.is_empty());
    secrets
}

/// `text` with every secret replaced by `***`.
pub fn redact(text: &str, secrets: &[String]) -> String {
    secrets.iter().fold(text.to_owned(), |text, secret| {
        text.replace(secret.as_str(), "***")
    })
}

/// `url` with its password replaced by `***`.
pub fn redact_url(url: &str) -> String {
    match url_password(url) {
        Some(password) => {
            let start = password.as_ptr() as usize - url.as_ptr() as usize;
            format!("{}***{}", &url[..start], &url[start + password.len()..])
        }
        None => url.to_owned(),
    }
}

/// The password of a `scheme://user:password@host/...` URL, as written.
fn url_password(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    let (_, password) = userinfo.split_once(':')?;
    Some(password)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(
            redact_url("postgres://app:s3cr%40t@db:5432/app?sslmode=require"),
            "postgres://app:***@db:5432/app?sslmode=require"
        );
        assert_eq!(redact_url("postgres://app@db/app"), "postgres://app@db/app");
        assert_eq!(
            secrets(Some("postgres://app:s3cr%40t@db/app"))[..2],
            ["s3cr%40t".to_owned(), "s3cr@t".to_owned()]
        );
    }
}
