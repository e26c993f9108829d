//! What idem stores and logs: with `ErrorTexts::KindOnly` a handler error's text (which
//! can carry personal data) never reaches the status table, and no password of a
//! PostgreSQL or Redis URL appears in idem's logs or errors, on any path.
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use idem_runtime::{ErrorTexts, Idem, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};
use support::orders::OrderEvent;
use support::testing;

#[derive(Debug, thiserror::Error)]
enum SignupError {
    #[error("customer alice@example.com (born 1990-01-01) was refused")]
    Refused,
}

#[idempotent(key = "order_id", scope = "signup")]
async fn signup(_tx: &mut PgConnection, event: &OrderEvent) -> Result<(), SignupError> {
    let _ = event;
    Err(SignupError::Refused)
}

#[idempotent(key = "order_id", scope = "logged_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn with_kind_only_no_error_text_is_stored(pool: PgPool) {
    let idem = Idem::builder(pool.clone())
        .error_texts(ErrorTexts::KindOnly)
        .build()
        .unwrap();
    let idem = testing::setup_with(idem).await;
    let event = testing::paid("o-private", 1);
    assert!(signup(&idem, &event).await.is_err());
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let stored = idem
        .record("signup", key)
        .await
        .unwrap()
        .unwrap()
        .last_error
        .unwrap();
    assert!(!stored.contains("alice"), "{stored}");
    assert!(stored.ends_with("SignupError"), "{stored}");
}

/// Everything idem logs, at every level.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[sqlx::test(migrations = false)]
async fn no_password_appears_in_logs_or_errors(pool: PgPool) {
    const PASSWORD: &str = "s3cr3t-pa55word";
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // Trust authentication ignores the password; the URL still carries it.
    let options = pool.connect_options().as_ref().clone().password(PASSWORD);
    let with_password = PgPool::connect_with(options).await.unwrap();
    let mut errors = Vec::new();
    let builder = Idem::builder(with_password);
    // A Redis that does not answer, reached with a password: its errors are logged.
    #[cfg(feature = "redis")]
    let builder = builder.redis(
        idem_runtime::cache::RedisCache::from_url(&format!("redis://:{PASSWORD}@127.0.0.1:1/"))
            .unwrap(),
    );
    let idem = testing::setup_with(builder.build().unwrap()).await;
    errors.push(format!("{idem:?}"));
    let event = testing::paid("o-logged", 1);
    pay(&idem, &event).await.unwrap();
    pay(&idem, &event).await.unwrap();
    errors.push(format!("{:?}", signup(&idem, &event).await.unwrap_err()));
    errors.push(signup(&idem, &event).await.unwrap_err().to_string());

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    // The unreachable Redis's errors are logged; without the feature, nothing may be.
    #[cfg(feature = "redis")]
    assert!(!logs.is_empty(), "the subscriber captured idem's logs");
    assert!(!logs.contains(PASSWORD), "a password in the logs:\n{logs}");
    for error in errors {
        assert!(!error.contains(PASSWORD), "a password in {error}");
    }
}
