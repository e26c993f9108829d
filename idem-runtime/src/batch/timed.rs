//! A batch whose keys are kept by their facts' times (`event_time`): the scope's window
//! its claim inserts in, the buckets of its facts made where missing, and the facts
//! refused as outside their window, each alone.

use std::collections::{BTreeSet, HashSet};

use chrono::{DateTime, Datelike, Utc};

use super::plan::Indexed;
use crate::Idem;
use crate::handler::HandlerSpec;
use crate::key::IdempotencyKey;
use crate::outcome::{Error, WindowEdge};
use crate::store::Bucket;

/// The window a batch's claim inserts in, in milliseconds: back from the database clock
/// (the scope's retention window) and ahead of it (the future bound).
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    pub(super) window_ms: i64,
    pub(super) ahead_ms: i64,
}

impl Window {
    /// The window of the handler's scope, as a delivery of one message takes it: the
    /// scope's own on this handle, then the one the handler declares, then the default.
    pub(super) fn of(idem: &Idem, spec: &HandlerSpec) -> Self {
        let window = crate::transactional::fact_window(idem, spec, Utc::now());
        Window {
            window_ms: window.window_ms,
            ahead_ms: window.ahead_ms,
        }
    }
}

/// The refusal of a fact outside its window: which side, by this process's clock.
pub(super) fn outside<T, E>(
    index: usize,
    key: IdempotencyKey,
    fact_time: DateTime<Utc>,
) -> Indexed<T, E> {
    let edge = if fact_time > Utc::now() {
        WindowEdge::Future
    } else {
        WindowEdge::Past
    };
    (
        index,
        Err(Error::OutsideWindow {
            key,
            fact_time,
            edge,
        }),
    )
}

/// Whether PostgreSQL's `timestamptz` holds `at` (4713 BC to 294276 AD): a time beyond is
/// outside every window, and is never sent.
pub(super) fn representable(at: DateTime<Utc>) -> bool {
    (-4712..=294_275).contains(&at.year())
}

/// Makes the buckets of the facts `times` where they are missing (on the pool, a few
/// buckets a transaction): the facts the database refuses, older than their
/// window or than the buckets that expired, or too far ahead.
pub(super) async fn make_buckets(
    idem: &Idem,
    window: Window,
    times: impl IntoIterator<Item = DateTime<Utc>>,
) -> Result<HashSet<DateTime<Utc>>, sqlx::Error> {
    // Each time once, in order: facts of one bucket make it once.
    let times: Vec<DateTime<Utc>> = times
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let width = idem.config().retention().bucket_width_duration();
    let made = idem
        .statements()
        .make_batch_buckets(
            idem.pool(),
            &times,
            width,
            window.window_ms,
            window.ahead_ms,
        )
        .await?;
    Ok(made
        .into_iter()
        .filter(|(_, bucket)| *bucket != Bucket::Ready)
        .map(|(at, _)| at)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_postgresql_cannot_hold_are_not_representable() {
        assert!(representable(Utc::now()));
        // chrono's earliest instant is some 262,000 years BC; PostgreSQL's 4713 BC.
        assert!(!representable(DateTime::<Utc>::MIN_UTC));
        let before_postgresql = chrono::NaiveDate::from_ymd_opt(-4713, 12, 31)
            .and_then(|day| day.and_hms_opt(0, 0, 0))
            .unwrap()
            .and_utc();
        assert!(!representable(before_postgresql));
    }
}
