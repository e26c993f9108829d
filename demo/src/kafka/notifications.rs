//! The side-effect consumer: a notification for every paid order, sent to an external
//! notification service by a lease-mode handler.
//!
//! A notification cannot be rolled back, so it cannot run inside the database transaction
//! that marks its key. [`notify_payment`] runs in lease mode
//! (`#[idempotent(mode = "lease", lease = "10s")]`): its key is claimed with a lease that
//! is committed on its own, the body calls the service, and the key is marked `success`
//! only while the lease is still this worker's. What follows, and what the example and
//! the tests show:
//!
//! - **Concurrent duplicates** (two consumers holding the same fact at once) get
//!   [`idem_runtime::Error::InProgress`] while the lease is live: the consumer retries the
//!   message after a back-off, without committing its offset, and finds it done
//!   ([`Fate::Duplicate`]) once the other worker marked it.
//! - **A crash mid-effect** (after the service accepted the notification, before the key
//!   was marked) leaves the lease to expire. Until then every delivery of the fact gets
//!   `InProgress`; after it, the next delivery claims the key again and calls the service
//!   a second time. The effect is at-least-once: the service must deduplicate.
//! - **The service deduplicates** on the idempotency key it is handed, [`Lease::key`],
//!   the same for every attempt, and records the fencing token, [`Lease::token`], new for
//!   every claim, so that it can tell the attempts apart.
//!
//! [`NotificationService`] stands for that external system. It is honest about what it
//! does: it writes to its own table, `notifications_sent`, through its own connection
//! pool, outside any transaction of idem (a different database would do as well), one
//! row per idempotency key, with the number of calls and the first and last token.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_runtime::lease::Lease;
use idem_runtime::{Idem, IdempotencyKey, idempotent};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

use idem_kafka::{Fate, Handler, Position};

use super::handlers::decode_order_event;
use crate::orders::{EventType, OrderEvent};

/// The notification handler's scope in the status table.
pub const SCOPE: &str = "notify_payment";

/// The lease of [`notify_payment`] (its `lease = "10s"`): how long a crashed worker blocks
/// the key before another may send the notification again. A notification takes well
/// under a second; a body that may take longer would [`Lease::extend`] it.
pub const LEASE: Duration = Duration::from_secs(10);

/// Attempts after which a notification's key is parked (and the message dead-lettered).
/// A lease that expired under a crashed worker counts as an attempt.
pub const MAX_ATTEMPTS: u32 = 5;

/// The table of the stand-in notification service: what it delivered, once per
/// idempotency key, and how often it was called for it.
pub const CREATE_NOTIFICATIONS_SENT: &str = "CREATE TABLE IF NOT EXISTS notifications_sent (
    idempotency_key uuid PRIMARY KEY,
    order_id text NOT NULL,
    amount_cents bigint NOT NULL,
    message text NOT NULL,
    calls integer NOT NULL DEFAULT 1,
    first_token uuid NOT NULL,
    last_token uuid NOT NULL,
    first_call_at timestamptz NOT NULL DEFAULT now(),
    last_call_at timestamptz NOT NULL DEFAULT now()
)";

/// Why a notification was not sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The notification service could not be reached or refused the call.
    #[error("the notification service failed")]
    Service(#[from] sqlx::Error),
}

/// Sends "payment received" for a paid order event, at most once per lease and once to
/// success per fact (`event_key`), through `service`.
///
/// The service gets [`Lease::key`] as its idempotency key and [`Lease::token`] as the
/// fencing token of this attempt. The generated function is
/// `notify_payment(&idem, &event, &service)`.
#[idempotent(
    key = "event_key",
    fingerprint = "order_id, event_type, amount_cents",
    mode = "lease",
    lease = "10s",
    scope = "notify_payment",
    max_attempts = 5,
    store_result = false
)]
pub async fn notify_payment(
    lease: &Lease,
    event: &OrderEvent,
    service: &NotificationService,
) -> Result<(), NotifyError> {
    service.send(lease.key(), lease.token(), event).await?;
    Ok(())
}

/// What the service did with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// The first call with this idempotency key: the notification went out.
    Delivered,
    /// The key was delivered before: the call was absorbed.
    AlreadyDelivered,
}

/// How the service simulates a crash of its caller right after a notification went out,
/// before the caller could mark its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// The process aborts (the example: a real crash).
    Abort,
    /// The call never returns: the worker hangs holding its lease until its task is
    /// aborted (the tests).
    Hang,
}

/// The settings of a [`NotificationService`] client.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceSettings {
    /// The time a call takes besides its database write (network, provider).
    pub latency: Duration,
    /// Crash after this many notifications delivered by this client (`None`: never).
    pub crash_after: Option<(u64, Crash)>,
}

/// A client of the stand-in notification service: it deduplicates on the idempotency key
/// it is handed and records the fencing tokens. Clones share the connection pool and the
/// counters.
#[derive(Debug, Clone)]
pub struct NotificationService {
    inner: Arc<ServiceInner>,
}

#[derive(Debug)]
struct ServiceInner {
    pool: PgPool,
    settings: ServiceSettings,
    delivered: AtomicU64,
    crashed: AtomicBool,
    crashed_key: OnceLock<IdempotencyKey>,
}

impl NotificationService {
    /// Connects to the service's database with a pool of its own (not idem's: the
    /// service's write is no part of any idem transaction) and creates its table.
    pub async fn connect(
        options: PgConnectOptions,
        settings: ServiceSettings,
    ) -> Result<Self, sqlx::Error> {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idem-suite notifications_sent'))")
            .execute(&mut *tx)
            .await?;
        sqlx::query(CREATE_NOTIFICATIONS_SENT)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(NotificationService {
            inner: Arc::new(ServiceInner {
                pool,
                settings,
                delivered: AtomicU64::new(0),
                crashed: AtomicBool::new(false),
                crashed_key: OnceLock::new(),
            }),
        })
    }

    /// The service's connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// Whether the simulated crash happened.
    pub fn crashed(&self) -> bool {
        self.inner.crashed.load(Ordering::SeqCst)
    }

    /// The key whose notification went out right before the simulated crash.
    pub fn crashed_key(&self) -> Option<IdempotencyKey> {
        self.inner.crashed_key.get().copied()
    }

    /// Sends the "payment received" notification of `event`, once per `key`: a repeated
    /// call with the same key is counted and absorbed. `token` is recorded (first and
    /// last caller).
    pub async fn send(
        &self,
        key: IdempotencyKey,
        token: Uuid,
        event: &OrderEvent,
    ) -> Result<Sent, sqlx::Error> {
        let inner = &self.inner;
        if !inner.settings.latency.is_zero() {
            tokio::time::sleep(inner.settings.latency).await;
        }
        let calls: i32 = sqlx::query_scalar(
            "INSERT INTO notifications_sent
                (idempotency_key, order_id, amount_cents, message, first_token, last_token)
             VALUES ($1, $2, $3, $4, $5, $5)
             ON CONFLICT (idempotency_key) DO UPDATE SET
                calls = notifications_sent.calls + 1,
                last_token = EXCLUDED.last_token,
                last_call_at = now()
             RETURNING calls",
        )
        .bind(key.as_uuid())
        .bind(&event.order_id)
        .bind(event.amount_cents)
        .bind(format!(
            "order {}: payment of {} cents received",
            event.order_id, event.amount_cents
        ))
        .bind(token)
        .fetch_one(&inner.pool)
        .await?;
        let sent = if calls == 1 {
            Sent::Delivered
        } else {
            tracing::info!(%key, %token, calls, "notification already delivered; call absorbed");
            Sent::AlreadyDelivered
        };
        if sent == Sent::Delivered
            && let Some((after, crash)) = inner.settings.crash_after
            && inner.delivered.fetch_add(1, Ordering::SeqCst) + 1 == after
        {
            let _ = inner.crashed_key.set(key);
            inner.crashed.store(true, Ordering::SeqCst);
            tracing::error!(
                %key, order_id = %event.order_id, ?crash,
                "simulated crash: the notification went out, its key is not marked"
            );
            match crash {
                Crash::Abort => std::process::abort(),
                Crash::Hang => std::future::pending::<()>().await,
            }
        }
        Ok(sent)
    }
}

/// What the service's table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServiceSummary {
    /// Notifications delivered (distinct idempotency keys).
    pub delivered: i64,
    /// Calls received, repeated ones included.
    pub calls: i64,
    /// Keys called more than once (effects repeated after a crash, absorbed).
    pub repeated_keys: i64,
}

/// Counts what the service delivered and how often it was called.
pub async fn summary(pool: &PgPool) -> Result<ServiceSummary, sqlx::Error> {
    let (delivered, calls, repeated_keys): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(calls), 0)::bigint, count(*) FILTER (WHERE calls > 1)
         FROM notifications_sent",
    )
    .fetch_one(pool)
    .await?;
    Ok(ServiceSummary {
        delivered,
        calls,
        repeated_keys,
    })
}

/// The notification consumer's handling of a message: a JSON [`OrderEvent`]; a `paid`
/// one is notified through [`notify_payment`], the others are skipped.
#[derive(Debug, Clone)]
pub struct PaymentNotifications {
    service: NotificationService,
}

impl PaymentNotifications {
    /// Notifies through `service`.
    pub fn new(service: NotificationService) -> Self {
        PaymentNotifications { service }
    }
}

impl Handler for PaymentNotifications {
    type Message = OrderEvent;

    fn decode(&self, payload: &[u8]) -> Result<OrderEvent, String> {
        decode_order_event(payload)
    }

    async fn handle(&self, idem: &Idem, event: &OrderEvent, _position: Option<&Position>) -> Fate {
        if event.event_type != EventType::Paid {
            return Fate::Skipped;
        }
        Fate::of(notify_payment(idem, event, &self.service).await)
    }
}
