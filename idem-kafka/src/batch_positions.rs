//! The positions of a batch, stored by the batch transaction itself.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use idem_runtime::{CurrentDelivery, HandlerKey, Idem, IdempotencyKey};
use sqlx::PgConnection;

use crate::position::Position;
use crate::position_behind::PositionBehind;
use crate::progress::PositionRow;
use crate::stats::lock;

/// The positions of a batch (offsets in PostgreSQL), for a batch handler to store in its
/// transaction with [`store_once`](Self::store_once).
///
/// Storing the last message's position would not do. The body runs only for the new
/// messages, so the last message of a partition (a duplicate) may run none; and the batch
/// transaction commits before the consumer routes the fates, so a message in the middle
/// that is to be dead-lettered (a payload mismatch, a parked key, a missing key) or
/// retried (a key in progress elsewhere) is not done when it commits. A position past it
/// would lose it after a crash.
///
/// So the first body that runs in a transaction stores each partition's position *up to
/// the first message of the batch that is not done* as that transaction sees the keys
/// ([`Idem::done_keys`], or [`Idem::done_handler_keys`] for the keys of
/// [`of_handler_keys`](Self::of_handler_keys)): done are the messages whose key is `success` with their
/// own payload fingerprint, the ones this transaction claimed as well as duplicates of
/// keys committed before. If the batch commits, every message below the stored position
/// is done; if it rolls back, nothing was stored. Positions only move forward. In a batch
/// handler's body, the keys that its transaction claimed and the duplicates its claim
/// found are known ([`CurrentDelivery::batch_keys`](idem_runtime::CurrentDelivery::batch_keys),
/// [`CurrentDelivery::batch_duplicates`](idem_runtime::CurrentDelivery::batch_duplicates)):
/// only the other messages are looked up (parked keys, payload mismatches, keys another
/// delivery held), in no round trip at all when there are none.
///
/// The later bodies of the same transaction do not store again. A body that fails calls
/// [`forget`](Self::forget): the batch is rolled back and run again one message per
/// transaction, and the first of those transactions stores the positions again.
///
/// Call [`store_once`](Self::store_once) first in the body, before its own work: when the
/// stored position went back ([`PositionBehind`]: the database lost commits), every
/// transaction of the batch fails at once, without running the rest of the body, and the
/// consumer reads the partitions again from the stored positions.
///
/// ```no_run
/// use idem_kafka::{BatchPositions, Fate, Position};
/// use idem_runtime::{Idem, idempotent};
/// use sqlx::PgConnection;
///
/// #[derive(serde::Deserialize)]
/// struct Payment { payment_id: String, amount_cents: i64 }
///
/// #[idempotent(key = "payment_id", scope = "payments", batch = true)]
/// async fn record_payment(
///     tx: &mut PgConnection,
///     payment: &Payment,
///     positions: &BatchPositions,
/// ) -> Result<(), sqlx::Error> {
///     let stored = async {
///         positions.store_once(&mut *tx).await?;
///         sqlx::query("INSERT INTO payments (payment_id, amount_cents) VALUES ($1, $2)")
///             .bind(&payment.payment_id)
///             .bind(payment.amount_cents)
///             .execute(&mut *tx)
///             .await
///             .map(|_| ())
///     };
///     let result = stored.await;
///     if result.is_err() {
///         positions.forget();
///     }
///     result
/// }
///
/// // In `Handler::handle_batch`, with the consumer's positions: the keys as the handler
/// // derives them (its generated `<handler>_key` function), then the generated batch
/// // function.
/// async fn handle_batch(idem: &Idem, payments: &[Payment], positions: &[Position]) -> Vec<Fate> {
///     let keys = payments.iter().map(|payment| {
///         record_payment_key(payment).ok().map(|key| (key.key(), key.fingerprint()))
///     });
///     let positions = BatchPositions::new(idem, "payments", positions, keys);
///     record_payment_batch(idem, payments, &positions)
///         .await
///         .into_iter()
///         .map(Fate::of)
///         .collect()
/// }
/// ```
#[derive(Debug)]
pub struct BatchPositions {
    idem: Idem,
    positions: Vec<Position>,
    keys: Keys,
    stored: AtomicBool,
    /// Identifies what this batch's transactions note they stored.
    token: u64,
    /// A stored position went back: the error every later store returns at once.
    behind: Mutex<Option<PositionBehind>>,
}

/// The keys of a batch's messages, in message order (`None`: the message has no key).
#[derive(Debug)]
enum Keys {
    /// Keys and fingerprints of one scope, in the status table.
    OfScope {
        scope: String,
        keys: Vec<Option<(IdempotencyKey, Option<[u8; 32]>)>>,
    },
    /// Keys as the handler derives them: each with its scope, and its fact's time where
    /// the handler keeps its keys by it.
    OfHandler(Vec<Option<HandlerKey>>),
}

impl Keys {
    fn len(&self) -> usize {
        match self {
            Keys::OfScope { keys, .. } => keys.len(),
            Keys::OfHandler(keys) => keys.len(),
        }
    }

    /// Message `index`'s scope, key and payload fingerprint, if it has a key.
    fn message(&self, index: usize) -> Option<(&str, IdempotencyKey, Option<[u8; 32]>)> {
        match self {
            Keys::OfScope { scope, keys } => keys[index]
                .as_ref()
                .map(|(key, fingerprint)| (scope.as_str(), *key, *fingerprint)),
            Keys::OfHandler(keys) => keys[index]
                .as_ref()
                .map(|key| (key.scope(), key.key(), key.fingerprint())),
        }
    }

    /// Whether each message is done, in message order: `false` for one without a key.
    /// `claimed`: what the transaction claimed, done when it commits; the other messages'
    /// keys are looked up.
    async fn done(
        &self,
        idem: &Idem,
        conn: &mut PgConnection,
        claimed: Option<&Claimed>,
    ) -> Result<Vec<bool>, sqlx::Error> {
        let mut done: Vec<Option<bool>> = (0..self.len())
            .map(|index| match self.message(index) {
                None => Some(false),
                Some((scope, key, fingerprint)) => {
                    claimed.and_then(|claimed| claimed.done(scope, key, fingerprint))
                }
            })
            .collect();
        let unknown = |done: &[Option<bool>]| -> Vec<usize> {
            (0..done.len())
                .filter(|&index| done[index].is_none())
                .collect()
        };
        let asked = unknown(&done);
        if asked.is_empty() {
            return Ok(done.into_iter().map(|done| done == Some(true)).collect());
        }
        let answers = match self {
            Keys::OfScope { scope, keys } => {
                let derived: Vec<_> = asked.iter().filter_map(|&index| keys[index]).collect();
                idem.done_keys(&mut *conn, scope, &derived).await?
            }
            Keys::OfHandler(keys) => {
                let derived: Vec<HandlerKey> =
                    asked.iter().filter_map(|&index| keys[index]).collect();
                idem.done_handler_keys(&mut *conn, &derived).await?
            }
        };
        let mut answers = answers.into_iter();
        for index in asked {
            done[index] = Some(answers.next().unwrap_or(false));
        }
        Ok(done.into_iter().map(|done| done == Some(true)).collect())
    }

    /// In a batch handler's body: each key that its transaction claimed (in the body's
    /// scope), and each its claim found already succeeded with the message's payload,
    /// with the payload fingerprint of the batch's first message of that key (the one it
    /// was claimed or found for). `None` elsewhere (the body of one message), or when the
    /// body's keys are not all among this batch's.
    fn claimed_here(&self) -> Option<Claimed> {
        let current = CurrentDelivery::get()?;
        let claimed = current.batch_keys()?;
        let duplicates = current.batch_duplicates().unwrap_or_default();
        let mut known: HashSet<IdempotencyKey> =
            HashSet::with_capacity(claimed.len() + duplicates.len());
        known.extend(claimed.iter().chain(duplicates).copied());
        let mut first = HashMap::with_capacity(known.len());
        for index in 0..self.len() {
            if let Some((scope, key, fingerprint)) = self.message(index)
                && scope == current.scope()
                && known.contains(&key)
            {
                first.entry(key).or_insert(fingerprint);
            }
        }
        (first.len() == known.len()).then(|| Claimed {
            scope: current.scope().to_owned(),
            first,
        })
    }
}

/// The keys that a batch handler's transaction claimed or found already succeeded, each
/// with the payload fingerprint of the first message of the batch with that key.
#[derive(Debug)]
struct Claimed {
    scope: String,
    first: HashMap<IdempotencyKey, Option<[u8; 32]>>,
}

impl Claimed {
    /// Whether a message of `key` in `scope` is done once the transaction commits: `None`
    /// for a key it neither claimed nor found succeeded. A later message of such a key is
    /// done with the payload of the first, as the batch decides it: it is a payload
    /// mismatch where both fingerprints are known and differ, and shares the first
    /// message's outcome otherwise.
    fn done(
        &self,
        scope: &str,
        key: IdempotencyKey,
        fingerprint: Option<[u8; 32]>,
    ) -> Option<bool> {
        if scope != self.scope {
            return None;
        }
        let first = self.first.get(&key)?;
        Some(match (first, fingerprint) {
            (Some(first), Some(later)) => *first == later,
            _ => true,
        })
    }
}

impl BatchPositions {
    /// The positions of a batch handled by the handler of `scope`: each message's position
    /// after it, and its key and payload fingerprint as the handler derives them (`None`
    /// when the key cannot be derived: the message is not done), in message order. The
    /// keys are looked up in the status table: for a handler that keeps its keys by the
    /// fact's time (`event_time`), use [`of_handler_keys`](Self::of_handler_keys).
    ///
    /// # Panics
    ///
    /// If `positions` and `keys` differ in length.
    pub fn new(
        idem: &Idem,
        scope: impl Into<String>,
        positions: &[Position],
        keys: impl IntoIterator<Item = Option<(IdempotencyKey, Option<[u8; 32]>)>>,
    ) -> Self {
        let keys = Keys::OfScope {
            scope: scope.into(),
            keys: keys.into_iter().collect(),
        };
        Self::with_keys(idem, positions, keys)
    }

    /// The positions of a batch: each message's position after it, and its key as the
    /// handler's generated `<handler>_key` function gives it (`None` when the key cannot
    /// be derived: the message is not done), in message order. Each key is looked up
    /// where its handler keeps it ([`Idem::done_handler_keys`]): in its scope, and in its
    /// fact's time bucket for a handler with `event_time`.
    ///
    /// ```no_run
    /// # use idem_kafka::{BatchPositions, Position};
    /// # use idem_runtime::{HandlerKey, Idem, KeyError};
    /// # fn f(idem: &Idem, positions: &[Position], key_of: impl Fn(usize) -> Result<HandlerKey, KeyError>) {
    /// let keys = (0..positions.len()).map(|i| key_of(i).ok());
    /// let positions = BatchPositions::of_handler_keys(idem, positions, keys);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// If `positions` and `keys` differ in length.
    pub fn of_handler_keys(
        idem: &Idem,
        positions: &[Position],
        keys: impl IntoIterator<Item = Option<HandlerKey>>,
    ) -> Self {
        Self::with_keys(idem, positions, Keys::OfHandler(keys.into_iter().collect()))
    }

    fn with_keys(idem: &Idem, positions: &[Position], keys: Keys) -> Self {
        assert_eq!(positions.len(), keys.len(), "one key per position");
        BatchPositions {
            idem: idem.clone(),
            positions: positions.to_vec(),
            keys,
            stored: AtomicBool::new(false),
            behind: Mutex::new(None),
            token: positions
                .first()
                .and_then(|first| first.receipts.0.as_ref())
                .map_or(0, |receipts| receipts.token()),
        }
    }

    /// Stores the positions (see above) unless a body of this transaction did already.
    pub async fn store_once(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        // The database went back: every transaction of this batch fails the same way, at
        // once (the consumer then reads the partitions again from the stored positions).
        if let Some(behind) = lock(&self.behind).clone() {
            return Err(behind.into_sqlx());
        }
        if self.stored.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let stored = self.store(conn).await;
        if let Err(error) = &stored
            && let Some(behind) = PositionBehind::of(error)
        {
            *lock(&self.behind) = Some(behind.clone());
        }
        stored
    }

    async fn store(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        for position in &self.positions {
            position.row()?;
        }
        let Some(first) = self.positions.first() else {
            return Ok(());
        };
        let claimed = self.keys.claimed_here();
        let done = self
            .keys
            .done(&self.idem, &mut *conn, claimed.as_ref())
            .await?;
        // Per partition: the position after the last message, or the first message's own
        // offset that is not done.
        let mut reached: BTreeMap<(&str, i32), (i64, bool)> = BTreeMap::new();
        for (position, is_done) in self.positions.iter().zip(done) {
            let entry = reached
                .entry((position.topic.as_str(), position.partition))
                .or_insert((position.next_offset - 1, false));
            let (next, stopped) = entry;
            if *stopped {
                continue;
            }
            if is_done {
                *next = (*next).max(position.next_offset);
            } else {
                *next = (*next).min(position.next_offset - 1);
                *stopped = true;
            }
        }
        // Each partition's floor: the lowest of its positions' (the consumer hands out
        // one floor per partition for a batch).
        let rows: Vec<PositionRow> = reached
            .into_iter()
            .map(|((topic, partition), (next, _))| {
                let floor = self
                    .positions
                    .iter()
                    .filter(|position| position.topic == topic && position.partition == partition)
                    .map(|position| position.floor)
                    .min()
                    .unwrap_or(-1);
                PositionRow {
                    topic: topic.to_owned(),
                    partition,
                    next_offset: next,
                    floor,
                }
            })
            .collect();
        crate::store::store_positions(conn, &first.schema, &first.group, &rows).await?;
        if let Some(receipts) = &first.receipts.0 {
            receipts.record(self.token, &rows);
        }
        Ok(())
    }

    /// A body failed and its transaction rolls back: the next transaction stores again.
    pub fn forget(&self) {
        self.stored.store(false, Ordering::SeqCst);
        if let Some(receipts) = self
            .positions
            .first()
            .and_then(|first| first.receipts.0.as_ref())
        {
            receipts.take_back(self.token);
        }
    }
}
