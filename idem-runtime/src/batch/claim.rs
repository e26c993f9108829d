//! The claim of a batch's keys: one statement for all of them, the rows in the way
//! decided, the `failed` keys among them taken over in one more. Keys kept by their
//! facts' times are claimed each in its fact's bucket: a batch whose buckets are missing
//! makes them and claims again, and a fact outside its window is refused alone.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::pass::Fallback;
use super::plan::{Derived, Indexed};
use super::timed::{self, Window};
use crate::Idem;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key_transaction::KeyTransaction;
use crate::outcome::Error;
use crate::store::{Existing, Statements, Status};
use crate::transactional;

/// How many times a batch makes its missing buckets and claims again before its messages
/// go one by one (a bucket still missing then is one an operator detached by hand).
const BUCKET_ROUNDS: usize = 3;

/// The batch transaction after the claim of its keys.
pub(super) struct Claim<T, E> {
    /// The transaction; `None` when no key was left to claim (every fact outside its
    /// window).
    pub(super) tx: Option<KeyTransaction>,
    /// The transaction's id, checked by the commit (`None` while nothing is owned).
    pub(super) xid: Option<i64>,
    /// The messages whose keys this transaction holds, in message order.
    pub(super) owned: Vec<usize>,
    /// The messages decided by the rows in the way (duplicates, parked keys, payload
    /// mismatches) and the facts outside their window.
    pub(super) decided: Vec<Indexed<T, E>>,
    /// Among `decided`, the duplicates: the messages whose keys the claim found `success`
    /// with their payload, in message order.
    pub(super) succeeded: Vec<usize>,
}

/// The keys, fingerprints and facts' times of the messages `indices`, as the statements
/// take them (the times empty where the keys are not kept by them).
struct Keys {
    keys: Vec<Uuid>,
    fingerprints: Vec<Option<Vec<u8>>>,
    times: Vec<DateTime<Utc>>,
}

impl Keys {
    fn of(indices: &[usize], keyed: &impl Fn(usize) -> Derived) -> Self {
        let mut keys = Keys {
            keys: Vec::with_capacity(indices.len()),
            fingerprints: Vec::with_capacity(indices.len()),
            times: Vec::new(),
        };
        for &index in indices {
            let derived = keyed(index);
            keys.keys.push(derived.key.as_uuid());
            keys.fingerprints
                .push(derived.fingerprint.map(|digest| digest.to_vec()));
            keys.times.extend(derived.fact_time);
        }
        keys
    }
}

/// Opens the batch transaction and claims the keys of the messages `to_claim` in one
/// statement; `failed` keys in the way are taken over in one more. `window`: where the
/// keys are kept by their facts' times, the scope's window (the facts outside it are
/// decided, not claimed). `None` when there is nothing to claim (no transaction is
/// opened then).
pub(super) async fn claim<T, E, C: ResultCodec<T>>(
    idem: &Idem,
    spec: &HandlerSpec,
    to_claim: &[usize],
    keyed: &impl Fn(usize) -> Derived,
    window: Option<Window>,
    codec: &C,
) -> Result<Option<Claim<T, E>>, Fallback> {
    if to_claim.is_empty() {
        return Ok(None);
    }
    let mut to_claim = to_claim.to_vec();
    let mut decided = Vec::new();
    // A time PostgreSQL cannot hold is outside every window, and never sent.
    if window.is_some() {
        refuse(&mut to_claim, &mut decided, keyed, |at| {
            !timed::representable(at)
        });
    }
    let body_lock_timeout = idem.session_lock_timeout().await?;
    let mut rounds = 0;
    let (mut tx, claimed) = loop {
        if to_claim.is_empty() {
            return Ok(Some(Claim {
                tx: None,
                xid: None,
                owned: Vec::new(),
                decided,
                succeeded: Vec::new(),
            }));
        }
        let keys = Keys::of(&to_claim, keyed);
        let times = window.map(|window| (keys.times.as_slice(), window.window_ms, window.ahead_ms));
        let mut tx = idem.key_transaction().await?;
        let claimed = idem
            .statements()
            .claim_batch(
                &mut tx,
                spec.scope,
                &keys.keys,
                &keys.fingerprints,
                times,
                body_lock_timeout,
            )
            .await;
        match (claimed, window) {
            (Ok(claimed), _) => break (tx, claimed),
            (Err(error), Some(window))
                if Statements::is_missing_bucket(&error) && rounds < BUCKET_ROUNDS =>
            {
                // The transaction is aborted: it goes, and the claim starts again once
                // the buckets exist. The facts the database refuses are decided.
                drop(tx);
                rounds += 1;
                let refused = timed::make_buckets(idem, window, keys.times.iter().copied()).await?;
                refuse(&mut to_claim, &mut decided, keyed, |at| {
                    refused.contains(&at)
                });
            }
            (Err(error), _) => return Err(error.into()),
        }
    };
    let mut xid = claimed.xid;
    let outside: HashSet<Uuid> = claimed.outside.into_iter().collect();
    let mut in_the_way = InTheWay::decide(&to_claim, keyed, claimed.in_the_way, codec)?;
    decided.extend(in_the_way.decided);
    in_the_way.succeeded.sort_unstable();
    let mut owned = Vec::with_capacity(to_claim.len());
    for &index in &to_claim {
        let derived = keyed(index);
        if outside.contains(&derived.key.as_uuid()) {
            decided.push(timed::outside(
                index,
                derived.key,
                derived.fact_time.unwrap_or_default(),
            ));
        } else if !in_the_way.indices.contains(&index) {
            owned.push(index);
        }
    }
    if !in_the_way.failed.is_empty() {
        let retaken = retake(
            idem,
            spec,
            &mut tx,
            &in_the_way.failed,
            keyed,
            window.is_some(),
            body_lock_timeout,
        )
        .await?;
        xid = xid.or(retaken);
        owned.extend(in_the_way.failed);
    }
    owned.sort_unstable();
    Ok(Some(Claim {
        tx: Some(tx),
        xid,
        owned,
        decided,
        succeeded: in_the_way.succeeded,
    }))
}

/// Takes the messages whose fact's time `refused` holds out of `to_claim`, each decided
/// as outside its window.
fn refuse<T, E>(
    to_claim: &mut Vec<usize>,
    decided: &mut Vec<Indexed<T, E>>,
    keyed: &impl Fn(usize) -> Derived,
    refused: impl Fn(DateTime<Utc>) -> bool,
) {
    to_claim.retain(|&index| {
        let derived = keyed(index);
        match derived.fact_time {
            Some(at) if refused(at) => {
                decided.push(timed::outside(index, derived.key, at));
                false
            }
            _ => true,
        }
    });
}

/// The messages whose keys the claim ran into, decided by their rows.
struct InTheWay<T, E> {
    /// Every message in the way.
    indices: HashSet<usize>,
    /// Those whose key is `failed` with the same payload: to take over.
    failed: Vec<usize>,
    /// The others: duplicates, parked keys, payload mismatches.
    decided: Vec<Indexed<T, E>>,
    /// Among `decided`, the duplicates: keys `success` with the message's payload.
    succeeded: Vec<usize>,
}

impl<T, E> InTheWay<T, E> {
    fn decide<C: ResultCodec<T>>(
        to_claim: &[usize],
        keyed: &impl Fn(usize) -> Derived,
        rows: Vec<(Uuid, Option<Existing>)>,
        codec: &C,
    ) -> Result<Self, Fallback> {
        let mut in_the_way = InTheWay {
            indices: HashSet::with_capacity(rows.len()),
            failed: Vec::new(),
            decided: Vec::new(),
            succeeded: Vec::new(),
        };
        // The common case, a batch of new keys: nothing to look up.
        if rows.is_empty() {
            return Ok(in_the_way);
        }
        let position: HashMap<Uuid, usize> = to_claim
            .iter()
            .map(|&index| (keyed(index).key.as_uuid(), index))
            .collect();
        for (key, existing) in rows {
            let index = position[&key];
            in_the_way.indices.insert(index);
            let Derived {
                key: idempotency_key,
                fingerprint,
                ..
            } = keyed(index);
            let Some(existing) = existing else {
                // Committed by a transaction this claim waited for: decide it on its own.
                return Err(Fallback::Database(sqlx::Error::RowNotFound));
            };
            let mismatch =
                transactional::mismatched(fingerprint.as_ref().map(|f| f.as_slice()), &existing);
            if mismatch {
                in_the_way.decided.push((
                    index,
                    Err(Error::PayloadMismatch {
                        key: idempotency_key,
                    }),
                ));
            } else if existing.status == Status::Failed {
                in_the_way.failed.push(index);
            } else {
                if existing.status == Status::Success {
                    in_the_way.succeeded.push(index);
                }
                in_the_way.decided.push((
                    index,
                    transactional::decide(idempotency_key, existing, codec),
                ));
            }
        }
        Ok(in_the_way)
    }
}

/// Takes over the `failed` keys of the messages `failed` in the batch transaction (each
/// in its fact's bucket where `timed`): the transaction's id, when it wrote nothing before.
async fn retake(
    idem: &Idem,
    spec: &HandlerSpec,
    tx: &mut KeyTransaction,
    failed: &[usize],
    keyed: &impl Fn(usize) -> Derived,
    timed: bool,
    body_lock_timeout: &str,
) -> Result<Option<i64>, Fallback> {
    let statements = idem.statements();
    let keys = Keys::of(failed, keyed);
    let times = timed.then_some(keys.times.as_slice());
    let retaken = statements
        .retake_batch(tx, spec.scope, &keys.keys, &keys.fingerprints, times)
        .await?;
    // The claim left the lock timeout bounded for this takeover: the body runs with
    // the session's own.
    statements
        .restore_lock_timeout(tx, body_lock_timeout)
        .await?;
    if retaken.len() != failed.len() {
        // Another delivery finished one of them meanwhile: decide them one by one.
        return Err(Fallback::Database(sqlx::Error::RowNotFound));
    }
    Ok(retaken.first().map(|&(_, xid)| xid))
}
