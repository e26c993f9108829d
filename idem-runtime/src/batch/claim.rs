//! The claim of a batch's keys: one statement for all of them, the rows in the way
//! decided, the `failed` keys among them taken over in one more.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::pass::Fallback;
use super::plan::{Derived, Indexed};
use crate::Idem;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key_transaction::KeyTransaction;
use crate::outcome::Error;
use crate::store::{Existing, Status};
use crate::transactional;

/// The batch transaction after the claim of its keys.
pub(super) struct Claim<T, E> {
    pub(super) tx: KeyTransaction,
    /// The transaction's id, checked by the commit (`None` while nothing is owned).
    pub(super) xid: Option<i64>,
    /// The messages whose keys this transaction holds, in message order.
    pub(super) owned: Vec<usize>,
    /// The messages decided by the rows in the way (duplicates, parked keys, payload
    /// mismatches).
    pub(super) decided: Vec<Indexed<T, E>>,
}

/// The keys and fingerprints of the messages `indices`, as the statements take them.
fn keys_of(
    indices: &[usize],
    keyed: &impl Fn(usize) -> Derived,
) -> (Vec<Uuid>, Vec<Option<Vec<u8>>>) {
    indices
        .iter()
        .map(|&i| {
            let (key, fingerprint) = keyed(i);
            (key.as_uuid(), fingerprint.map(|f| f.to_vec()))
        })
        .unzip()
}

/// Opens the batch transaction and claims the keys of the messages `to_claim` in one
/// statement; `failed` keys in the way are taken over in one more. `None` when there is
/// nothing to claim (no transaction is opened then).
pub(super) async fn claim<T, E, C: ResultCodec<T>>(
    idem: &Idem,
    spec: &HandlerSpec,
    to_claim: &[usize],
    keyed: &impl Fn(usize) -> Derived,
    codec: &C,
) -> Result<Option<Claim<T, E>>, Fallback> {
    if to_claim.is_empty() {
        return Ok(None);
    }
    let (keys, fingerprints) = keys_of(to_claim, keyed);
    let body_lock_timeout = idem.session_lock_timeout().await?;
    let mut tx = idem.key_transaction().await?;
    let claimed = idem
        .statements()
        .claim_batch(&mut tx, spec.scope, &keys, &fingerprints, body_lock_timeout)
        .await?;
    let mut xid = claimed.xid;
    let in_the_way = InTheWay::decide(to_claim, keyed, claimed.in_the_way, codec)?;
    let mut owned: Vec<usize> = to_claim
        .iter()
        .copied()
        .filter(|index| !in_the_way.indices.contains(index))
        .collect();
    if !in_the_way.failed.is_empty() {
        let retaken = retake(
            idem,
            spec,
            &mut tx,
            &in_the_way.failed,
            keyed,
            body_lock_timeout,
        )
        .await?;
        xid = xid.or(retaken);
        owned.extend(in_the_way.failed);
    }
    owned.sort_unstable();
    Ok(Some(Claim {
        tx,
        xid,
        owned,
        decided: in_the_way.decided,
    }))
}

/// The messages whose keys the claim ran into, decided by their rows.
struct InTheWay<T, E> {
    /// Every message in the way.
    indices: HashSet<usize>,
    /// Those whose key is `failed` with the same payload: to take over.
    failed: Vec<usize>,
    /// The others: duplicates, parked keys, payload mismatches.
    decided: Vec<Indexed<T, E>>,
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
        };
        // The common case, a batch of new keys: nothing to look up.
        if rows.is_empty() {
            return Ok(in_the_way);
        }
        let position: HashMap<Uuid, usize> = to_claim
            .iter()
            .map(|&index| (keyed(index).0.as_uuid(), index))
            .collect();
        for (key, existing) in rows {
            let index = position[&key];
            in_the_way.indices.insert(index);
            let (idempotency_key, fingerprint) = keyed(index);
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
                in_the_way.decided.push((
                    index,
                    transactional::decide(idempotency_key, existing, codec),
                ));
            }
        }
        Ok(in_the_way)
    }
}

/// Takes over the `failed` keys of the messages `failed` in the batch transaction: the
/// transaction's id, when it wrote nothing before.
async fn retake(
    idem: &Idem,
    spec: &HandlerSpec,
    tx: &mut KeyTransaction,
    failed: &[usize],
    keyed: &impl Fn(usize) -> Derived,
    body_lock_timeout: &str,
) -> Result<Option<i64>, Fallback> {
    let statements = idem.statements();
    let (keys, fingerprints) = keys_of(failed, keyed);
    let retaken = statements
        .retake_batch(tx, spec.scope, &keys, &fingerprints)
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
