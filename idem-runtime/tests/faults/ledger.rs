//! The ledger workload: payments applied by `#[idempotent]` handlers, its tables, and the
//! faults its bodies inject on purpose.
//!
//! - [`apply_payment`] (transaction mode, also as `apply_payment_batch`): one ledger entry
//!   and the account's balance, in the claim's transaction;
//! - [`notify_payment`] (lease mode): a call of an "external" service, a table written on
//!   connections of its own, outside any claim's transaction, which deduplicates on the
//!   lease key as an external system would on its idempotency key;
//! - [`record_receipt`] (transaction mode): one receipt row, on the scope whose keys the
//!   retention cleanup deletes while duplicates still arrive.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::idempotent;
use idem_runtime::lease::Lease;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

use crate::fault_counts::FaultCounts;

/// The scope of [`apply_payment`].
pub const LEDGER_SCOPE: &str = "faults.apply_payment";
/// The scope of [`notify_payment`].
pub const EXTERNAL_SCOPE: &str = "faults.notify_payment";
/// The scope of [`record_receipt`], whose keys the retention cleanup deletes.
pub const RECEIPT_SCOPE: &str = "faults.record_receipt";
/// The lease of [`notify_payment`] (its attribute says the same).
pub const LEASE: Duration = Duration::from_secs(1);
/// Failed attempts before a key of the transaction-mode handlers is parked.
pub const MAX_ATTEMPTS: u32 = 3;

/// A payment as producers send it (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Payment {
    /// The business key. A payment without one (missing or `null`) is refused.
    pub payment_id: Option<String>,
    /// The account credited.
    pub account: String,
    /// The amount, in cents.
    pub amount_cents: i64,
    /// Free text from the payer.
    pub memo: String,
    /// How the handler treats this payment: the faults a body injects on purpose.
    #[serde(default)]
    pub behaviour: Behaviour,
    /// [`Behaviour::LockOrder`]: the account locked after this payment's own.
    #[serde(default)]
    pub partner: Option<String>,
}

/// The faults a body injects for its payment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Behaviour {
    /// Applied at once.
    #[default]
    Plain,
    /// The first attempt fails with a handler error; the retry applies it.
    FailsFirstAttempt,
    /// Every attempt fails with a handler error: the key ends parked.
    AlwaysFails,
    /// Transaction mode: the body holds its key longer than the lock timeout. Lease mode:
    /// the first claim's body outlives its lease.
    Slow,
    /// Locks its own account, then the partner's (the partner payment does the opposite):
    /// started together, the two deadlock.
    LockOrder,
}

/// Why a body failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The bank refuses the payment; every attempt fails alike. The memo is in the text on
    /// purpose: error texts are stored, hostile bytes and all.
    #[error("payment {payment_id} refused by the bank: {memo}")]
    Refused {
        /// The payment.
        payment_id: String,
        /// Its memo.
        memo: String,
    },
    /// The bank did not answer this time.
    #[error("the bank is unavailable for payment {0}; try again")]
    Unavailable(String),
    /// A statement failed.
    #[error("writing the ledger failed")]
    Database(#[from] sqlx::Error),
}

/// What the bodies share: the faults they inject and count, and the external service.
pub struct Hooks {
    failed_once: Mutex<HashSet<String>>,
    /// The counters of injected faults.
    pub counts: Arc<FaultCounts>,
    /// The external service's connections (outside every claim's transaction).
    pub external: PgPool,
    /// How long a [`Behaviour::Slow`] transaction-mode body holds its key.
    pub slow_body: Duration,
}

impl Hooks {
    /// Hooks counting into `counts`, calling the external service on `external`.
    pub fn new(counts: Arc<FaultCounts>, external: PgPool, slow_body: Duration) -> Self {
        Hooks {
            failed_once: Mutex::new(HashSet::new()),
            counts,
            external,
            slow_body,
        }
    }

    /// The handler errors of the payment's behaviour.
    fn fail_on_purpose(&self, payment: &Payment) -> Result<(), LedgerError> {
        let id = payment.payment_id.clone().unwrap_or_default();
        match payment.behaviour {
            Behaviour::AlwaysFails => {
                FaultCounts::bump(&self.counts.permanent_handler_errors);
                Err(LedgerError::Refused {
                    payment_id: id,
                    memo: payment.memo.clone(),
                })
            }
            Behaviour::FailsFirstAttempt if self.failed_once.lock().unwrap().insert(id.clone()) => {
                FaultCounts::bump(&self.counts.transient_handler_errors);
                Err(LedgerError::Unavailable(id))
            }
            _ => Ok(()),
        }
    }

    /// A statement's error, counted when PostgreSQL reports a deadlock or a
    /// serialization failure.
    fn observe(&self, error: sqlx::Error) -> LedgerError {
        match error
            .as_database_error()
            .and_then(|db| db.code())
            .as_deref()
        {
            Some("40P01") => FaultCounts::bump(&self.counts.deadlocks),
            Some("40001") => FaultCounts::bump(&self.counts.serialization_failures),
            _ => {}
        }
        LedgerError::Database(error)
    }
}

/// Creates the workload's tables (after idem's migrations): the accounts with their
/// balances, the ledger entries, the external service's table, the receipts, the keys
/// the retention cleanup deleted (by a trigger on the status table, in the order of one
/// clock with the receipts) and the dead letters the workload records.
pub const SCHEMA: &str = r#"
CREATE SEQUENCE fault_clock;
CREATE TABLE accounts (
    account text PRIMARY KEY CHECK (length(account) <= 64),
    balance bigint NOT NULL DEFAULT 0,
    entries integer NOT NULL DEFAULT 0
);
CREATE TABLE ledger_entries (
    id bigserial PRIMARY KEY,
    payment_id text NOT NULL CHECK (length(payment_id) <= 200),
    account text NOT NULL CHECK (length(account) <= 64),
    amount_cents bigint NOT NULL,
    memo text NOT NULL CHECK (length(memo) <= 500)
);
CREATE TABLE external_effects (
    idempotency_key uuid PRIMARY KEY,
    payment_id text NOT NULL CHECK (length(payment_id) <= 200),
    account text NOT NULL CHECK (length(account) <= 64),
    amount_cents bigint NOT NULL,
    memo text NOT NULL CHECK (length(memo) <= 500),
    calls integer NOT NULL,
    first_token uuid NOT NULL,
    last_token uuid NOT NULL
);
CREATE TABLE receipts (
    seq bigint NOT NULL DEFAULT nextval('fault_clock'),
    payment_id text NOT NULL CHECK (length(payment_id) <= 200),
    account text NOT NULL CHECK (length(account) <= 64),
    amount_cents bigint NOT NULL,
    memo text NOT NULL CHECK (length(memo) <= 500)
);
CREATE TABLE purged_keys (
    seq bigint NOT NULL DEFAULT nextval('fault_clock'),
    scope text NOT NULL,
    key uuid NOT NULL
);
CREATE FUNCTION record_purged_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO purged_keys (scope, key) VALUES (OLD.scope, OLD.key);
    RETURN OLD;
END $$;
CREATE TRIGGER record_purged_key AFTER DELETE ON idem.idem_keys
    FOR EACH ROW EXECUTE FUNCTION record_purged_key();
CREATE TABLE dead_letters (
    message integer PRIMARY KEY,
    reason text NOT NULL,
    payload bytea NOT NULL
);
"#;

/// Applies a payment: a ledger entry and the account's balance, in the claim's
/// transaction.
#[idempotent(
    key = "payment_id",
    fingerprint = "account, amount_cents, memo",
    scope = "faults.apply_payment",
    max_attempts = 3,
    batch = true
)]
pub async fn apply_payment(
    tx: &mut PgConnection,
    payment: &Payment,
    hooks: &Hooks,
) -> Result<i64, LedgerError> {
    hooks.fail_on_purpose(payment)?;
    match payment.behaviour {
        Behaviour::Slow => {
            FaultCounts::bump(&hooks.counts.slow_bodies);
            tokio::time::sleep(hooks.slow_body).await;
        }
        Behaviour::LockOrder => lock_in_order(tx, payment, hooks).await?,
        _ => {}
    }
    sqlx::query_scalar(
        "WITH entry AS (
            INSERT INTO ledger_entries (payment_id, account, amount_cents, memo)
            VALUES ($1, $2, $3, $4) RETURNING id),
         balance AS (
            INSERT INTO accounts (account, balance, entries) VALUES ($2, $3, 1)
            ON CONFLICT (account) DO UPDATE SET
                balance = accounts.balance + EXCLUDED.balance,
                entries = accounts.entries + 1
            RETURNING 1)
         SELECT id FROM entry, balance",
    )
    .bind(payment.payment_id.as_deref())
    .bind(&payment.account)
    .bind(payment.amount_cents)
    .bind(&payment.memo)
    .fetch_one(&mut *tx)
    .await
    .map_err(|error| hooks.observe(error))
}

/// Locks the payment's account, waits, then locks the partner's: the partner payment,
/// started at the same time, takes them in the opposite order.
async fn lock_in_order(
    tx: &mut PgConnection,
    payment: &Payment,
    hooks: &Hooks,
) -> Result<(), LedgerError> {
    let lock = "UPDATE accounts SET balance = balance WHERE account = $1";
    sqlx::query(lock)
        .bind(&payment.account)
        .execute(&mut *tx)
        .await
        .map_err(|error| hooks.observe(error))?;
    tokio::time::sleep(Duration::from_millis(150)).await;
    sqlx::query(lock)
        .bind(payment.partner.as_deref().unwrap_or_default())
        .execute(&mut *tx)
        .await
        .map_err(|error| hooks.observe(error))?;
    Ok(())
}

/// Tells the external service about a payment, under a lease: the service deduplicates
/// on the lease key, and counts the calls. Parked after 8 failed attempts: an expired
/// lease counts as one, and restarts of PostgreSQL leave leases to expire.
#[idempotent(
    key = "payment_id",
    fingerprint = "account, amount_cents, memo",
    scope = "faults.notify_payment",
    mode = "lease",
    lease = "1s",
    max_attempts = 8
)]
pub async fn notify_payment(
    lease: &Lease,
    payment: &Payment,
    hooks: &Hooks,
) -> Result<(), LedgerError> {
    hooks.fail_on_purpose(payment)?;
    if payment.behaviour == Behaviour::Slow && lease.attempt() == 1 {
        // The lease runs out under this body; a duplicate may take the key over.
        FaultCounts::bump(&hooks.counts.leases_outlived);
        tokio::time::sleep(LEASE + Duration::from_millis(600)).await;
    }
    sqlx::query(
        "INSERT INTO external_effects
            (idempotency_key, payment_id, account, amount_cents, memo, calls, first_token, last_token)
         VALUES ($1, $2, $3, $4, $5, 1, $6, $6)
         ON CONFLICT (idempotency_key) DO UPDATE SET
            calls = external_effects.calls + 1,
            last_token = EXCLUDED.last_token",
    )
    .bind(lease.key().as_uuid())
    .bind(payment.payment_id.as_deref())
    .bind(&payment.account)
    .bind(payment.amount_cents)
    .bind(&payment.memo)
    .bind(lease.token())
    .execute(&hooks.external)
    .await?;
    Ok(())
}

/// Records a receipt of a payment, in the claim's transaction. Its keys are deleted by
/// the retention cleanup while duplicates still arrive.
#[idempotent(
    key = "payment_id",
    fingerprint = "account, amount_cents, memo",
    scope = "faults.record_receipt",
    max_attempts = 3
)]
pub async fn record_receipt(
    tx: &mut PgConnection,
    payment: &Payment,
    hooks: &Hooks,
) -> Result<(), LedgerError> {
    hooks.fail_on_purpose(payment)?;
    sqlx::query(
        "INSERT INTO receipts (payment_id, account, amount_cents, memo) VALUES ($1, $2, $3, $4)",
    )
    .bind(payment.payment_id.as_deref())
    .bind(&payment.account)
    .bind(payment.amount_cents)
    .bind(&payment.memo)
    .execute(&mut *tx)
    .await
    .map_err(|error| hooks.observe(error))?;
    Ok(())
}
