//! The invariants, checked by SQL once every message has settled:
//!
//! - every payment that must apply has exactly one effect (a ledger entry, an external
//!   effect, a receipt), with its own payload, and a `success` key; balances are the sums
//!   of the distinct payments applied to each account;
//! - every message is either a success or a dead letter, with the reason expected for it
//!   (input = successes + dead letters), and a dead letter has no effect;
//! - no `processing` row is older than its lease plus a grace period;
//! - retention: receipt keys are the only keys deleted, and a receipt applied again
//!   (a duplicate that arrived after its key was purged, as documented) always follows a
//!   deletion of its key: between two receipts of one payment there is a deletion of its
//!   key on the same clock. Nothing else may run twice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use idem_runtime::key::KeyBuilder;
use sqlx::PgPool;
use uuid::Uuid;

use crate::deliveries::{Fate, Message, Plan, Route};
use crate::ledger::{EXTERNAL_SCOPE, LEDGER_SCOPE, Payment, RECEIPT_SCOPE};
use crate::settlement::Settlement;

/// The grace period after a lease's expiry before a `processing` row is stale.
pub const LEASE_GRACE: Duration = Duration::from_secs(5);

/// What the checks found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Effect rows in the business tables (ledger entries, external effects, receipts).
    pub effects_applied: u64,
    /// Messages that must apply and have no effect (or did not settle as applied).
    pub lost: Vec<String>,
    /// Messages with more effects than allowed.
    pub doubled: Vec<String>,
    /// Every other broken invariant.
    pub violations: Vec<String>,
    /// Messages settled as applied.
    pub successes: u64,
    /// Rows of the dead-letter table.
    pub dead_letters: u64,
    /// Dead letters per reason.
    pub dead_letters_by_reason: BTreeMap<String, u64>,
    /// Keys whose status is `parked`.
    pub parked_keys: u64,
    /// Receipts applied again after their key was purged (allowed, documented).
    pub reruns_after_purge: u64,
    /// Calls the external service received more than once for a key (absorbed by it).
    pub external_repeats: u64,
}

/// The key a handler derives from `payment`.
pub fn key_of(payment: &Payment) -> Option<Uuid> {
    KeyBuilder::new()
        .part("payment_id", &payment.payment_id)
        .ok()
        .map(|builder| builder.finish().as_uuid())
}

fn scope_of(route: Route) -> &'static str {
    match route {
        Route::Ledger => LEDGER_SCOPE,
        Route::External => EXTERNAL_SCOPE,
        Route::Receipt => RECEIPT_SCOPE,
    }
}

fn describe(message: &Message) -> String {
    let id = message
        .payment
        .as_ref()
        .and_then(|p| p.payment_id.as_deref())
        .map(|id| id.chars().take(60).collect::<String>())
        .unwrap_or_default();
    format!(
        "message {} ({}, {:?}, {id:?})",
        message.id, message.kind, message.route
    )
}

/// Records the dead letters of the run (the workload's own table), then checks every
/// invariant.
pub async fn check(pool: &PgPool, plan: &Plan, settlement: &Settlement) -> Verdict {
    let mut verdict = Verdict::default();
    for conflict in settlement.conflicts() {
        verdict.violations.push(format!("two fates: {conflict}"));
    }
    for message in &plan.messages {
        if let Some(Fate::DeadLetter(reason)) = settlement.fate(message.id) {
            sqlx::query("INSERT INTO dead_letters (message, reason, payload) VALUES ($1, $2, $3)")
                .bind(i32::try_from(message.id).unwrap())
                .bind(reason.as_str())
                .bind(&message.payload)
                .execute(pool)
                .await
                .expect("record a dead letter");
        }
    }

    let keys: HashMap<(String, Uuid), String> = sqlx::query_as::<_, (String, Uuid, String)>(
        "SELECT scope, key, status FROM idem.idem_keys",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(scope, key, status)| ((scope, key), status))
    .collect();
    verdict.parked_keys = keys.values().filter(|status| *status == "parked").count() as u64;
    let mut ledger: HashMap<String, Vec<(String, i64)>> = HashMap::new();
    for (payment_id, account, amount) in sqlx::query_as::<_, (String, String, i64)>(
        "SELECT payment_id, account, amount_cents FROM ledger_entries",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    {
        ledger
            .entry(payment_id)
            .or_default()
            .push((account, amount));
    }
    let mut external: HashMap<String, Vec<(String, i64, i32)>> = HashMap::new();
    for (payment_id, account, amount, calls) in sqlx::query_as::<_, (String, String, i64, i32)>(
        "SELECT payment_id, account, amount_cents, calls FROM external_effects",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    {
        external
            .entry(payment_id)
            .or_default()
            .push((account, amount, calls));
    }
    let mut receipts: HashMap<String, Vec<(String, i64, i64)>> = HashMap::new();
    for (payment_id, account, amount, seq) in sqlx::query_as::<_, (String, String, i64, i64)>(
        "SELECT payment_id, account, amount_cents, seq FROM receipts ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    {
        receipts
            .entry(payment_id)
            .or_default()
            .push((account, amount, seq));
    }
    let mut purged: HashMap<Uuid, Vec<i64>> = HashMap::new();
    for (scope, key, seq) in sqlx::query_as::<_, (String, Uuid, i64)>(
        "SELECT scope, key, seq FROM purged_keys ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    {
        if scope == RECEIPT_SCOPE {
            purged.entry(key).or_default().push(seq);
        } else {
            verdict.violations.push(format!(
                "the cleanup deleted key {key} of scope {scope}, whose window is 7 days"
            ));
        }
    }
    verdict.effects_applied = (ledger.values().map(Vec::len).sum::<usize>()
        + external.values().map(Vec::len).sum::<usize>()
        + receipts.values().map(Vec::len).sum::<usize>()) as u64;

    let mut expected_balances: BTreeMap<String, (i64, i32)> = plan
        .accounts
        .iter()
        .map(|account| (account.clone(), (0, 0)))
        .collect();
    let mut known_ids: HashSet<&str> = HashSet::new();
    for message in &plan.messages {
        let fate = settlement.fate(message.id);
        let what = describe(message);
        match &fate {
            None => verdict.violations.push(format!("{what} never settled")),
            Some(fate) if *fate != message.expect => {
                if message.expect == Fate::Applied {
                    verdict
                        .lost
                        .push(format!("{what}: expected applied, ended {fate:?}"));
                } else {
                    verdict.violations.push(format!(
                        "{what}: expected {:?}, ended {fate:?}",
                        message.expect
                    ));
                }
            }
            Some(_) => {}
        }
        match &fate {
            Some(Fate::Applied) => verdict.successes += 1,
            Some(Fate::DeadLetter(reason)) => {
                *verdict
                    .dead_letters_by_reason
                    .entry(reason.as_str())
                    .or_default() += 1;
            }
            None => {}
        }
        // The effects of a payment whose key is its own (a variant shares its original's).
        let Some(payment) = &message.payment else {
            continue;
        };
        if message.variant_of.is_some() {
            continue;
        }
        let Some(payment_id) = payment.payment_id.as_deref() else {
            continue;
        };
        known_ids.insert(payment_id);
        let key = key_of(payment).expect("a payment with an id has a key");
        let status = keys
            .get(&(scope_of(message.route).to_owned(), key))
            .map(String::as_str);
        let payload = (payment.account.clone(), payment.amount_cents);
        let effects: Vec<(String, i64)> = match message.route {
            Route::Ledger => ledger.get(payment_id).cloned().unwrap_or_default(),
            Route::External => external
                .get(payment_id)
                .map(|rows| {
                    verdict.external_repeats +=
                        rows.iter().map(|r| (r.2 - 1).max(0) as u64).sum::<u64>();
                    rows.iter().map(|(a, m, _)| (a.clone(), *m)).collect()
                })
                .unwrap_or_default(),
            Route::Receipt => receipts
                .get(payment_id)
                .map(|rows| rows.iter().map(|(a, m, _)| (a.clone(), *m)).collect())
                .unwrap_or_default(),
        };
        if effects.iter().any(|effect| *effect != payload) {
            verdict.violations.push(format!(
                "{what}: an effect with another payload: {effects:?}"
            ));
        }
        if message.expect != Fate::Applied {
            if !effects.is_empty() {
                verdict.doubled.push(format!(
                    "{what}: dead-lettered, yet {} effect(s)",
                    effects.len()
                ));
            }
            if matches!(
                message.expect,
                Fate::DeadLetter(crate::deliveries::Reason::Parked)
            ) && status != Some("parked")
            {
                verdict
                    .violations
                    .push(format!("{what}: must be parked, key status {status:?}"));
            }
            continue;
        }
        if message.route == Route::Ledger {
            let balance = expected_balances
                .entry(payment.account.clone())
                .or_default();
            balance.0 += payment.amount_cents;
            balance.1 += 1;
        }
        if effects.is_empty() {
            verdict
                .lost
                .push(format!("{what}: no effect (key status {status:?})"));
            continue;
        }
        if message.route == Route::Receipt {
            // Each receipt after the first must follow a deletion of the key.
            let seqs: Vec<i64> = receipts[payment_id].iter().map(|r| r.2).collect();
            let deletions = purged.get(&key).cloned().unwrap_or_default();
            for pair in seqs.windows(2) {
                if deletions.iter().any(|d| pair[0] < *d && *d < pair[1]) {
                    verdict.reruns_after_purge += 1;
                } else {
                    verdict.doubled.push(format!(
                        "{what}: receipts at {} and {} without a deletion of its key between them",
                        pair[0], pair[1]
                    ));
                }
            }
            let last = *seqs.last().unwrap();
            let purged_after_last = deletions.iter().any(|d| *d > last);
            if status != Some("success") && !(status.is_none() && purged_after_last) {
                verdict.violations.push(format!(
                    "{what}: key status {status:?}, neither success nor purged after its receipt"
                ));
            }
        } else {
            if effects.len() > 1 {
                verdict
                    .doubled
                    .push(format!("{what}: {} effects", effects.len()));
            }
            if status != Some("success") {
                verdict
                    .violations
                    .push(format!("{what}: applied, but its key is {status:?}"));
            }
        }
    }
    for payment_id in ledger.keys().chain(external.keys()).chain(receipts.keys()) {
        if !known_ids.contains(payment_id.as_str()) {
            verdict
                .violations
                .push(format!("an effect of no message: {payment_id:?}"));
        }
    }

    // Balances: the sums of the distinct payments applied to each account.
    let balances: BTreeMap<String, (i64, i32)> =
        sqlx::query_as::<_, (String, i64, i32)>("SELECT account, balance, entries FROM accounts")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .map(|(account, balance, entries)| (account, (balance, entries)))
            .collect();
    if balances != expected_balances {
        let wrong: Vec<String> = expected_balances
            .iter()
            .filter(|(account, expected)| balances.get(*account) != Some(expected))
            .take(10)
            .map(|(account, expected)| {
                format!(
                    "{account:?}: expected {expected:?}, found {:?}",
                    balances.get(account)
                )
            })
            .collect();
        verdict.violations.push(format!(
            "balances differ from the applied payments: {wrong:?}"
        ));
    }

    // Input = successes + dead letters, and each dead letter with its reason.
    let dead: Vec<(i32, String)> = sqlx::query_as("SELECT message, reason FROM dead_letters")
        .fetch_all(pool)
        .await
        .unwrap();
    verdict.dead_letters = dead.len() as u64;
    if verdict.successes + verdict.dead_letters != plan.messages.len() as u64 {
        verdict.violations.push(format!(
            "{} messages, but {} successes + {} dead letters",
            plan.messages.len(),
            verdict.successes,
            verdict.dead_letters
        ));
    }

    // No lease left behind.
    let stale: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem.idem_keys
         WHERE status = 'processing' AND lease_expires_at < now() - $1 * interval '1 millisecond'",
    )
    .bind(i64::try_from(LEASE_GRACE.as_millis()).unwrap())
    .fetch_one(pool)
    .await
    .unwrap();
    if stale > 0 {
        verdict.violations.push(format!(
            "{stale} processing row(s) older than their lease plus {LEASE_GRACE:?}"
        ));
    }
    verdict
}
