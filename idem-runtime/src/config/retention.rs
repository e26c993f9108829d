//! The retention settings of a handle: how long `success` keys are kept and how the
//! cleanup deletes them. Documented, with the cleanup, in [`retention`](crate::retention).

use std::collections::BTreeMap;
use std::time::Duration;

/// The default window: 7 days.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// The default width of a time bucket: an hour.
pub const DEFAULT_BUCKET_WIDTH: Duration = Duration::from_secs(3600);

/// The default bound on a fact's time ahead of the database clock: an hour.
pub const DEFAULT_FUTURE_BOUND: Duration = Duration::from_secs(3600);

/// The longest window and future bound a handle uses: 1,000 years. A longer one (up to
/// `Duration::MAX`, "for ever") is taken as this, which keeps every key of any fact a
/// database holds and stays inside what PostgreSQL's intervals can express.
pub const LONGEST: Duration = Duration::from_secs(1_000 * 366 * 24 * 3600);

/// How long `success` keys are kept, and how the cleanup deletes them.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::retention::Retention;
///
/// let retention = Retention::new(Duration::from_secs(3 * 24 * 3600))
///     .scope_window("audit::record", Duration::from_secs(30 * 24 * 3600))
///     .batch_size(2_000)
///     .statement_timeout(Duration::from_secs(1));
/// assert_eq!(retention.window_of("audit::record"), Duration::from_secs(30 * 24 * 3600));
/// assert_eq!(retention.window_of("billing::pay"), Duration::from_secs(3 * 24 * 3600));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    pub(crate) window: Duration,
    pub(crate) scopes: BTreeMap<String, Duration>,
    pub(crate) batch_size: u32,
    pub(crate) statement_timeout: Duration,
    pub(crate) pause: Duration,
    pub(crate) max_batches: Option<u32>,
    pub(crate) interval: Duration,
    pub(crate) bucket_width: Duration,
    pub(crate) future_bound: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention::new(DEFAULT_WINDOW)
    }
}

impl Retention {
    /// Keeps `success` keys for `window` after their last change (at most [`LONGEST`]);
    /// batches of 5,000 rows, each with a statement timeout of 2 s; a background cleanup
    /// every minute.
    pub fn new(window: Duration) -> Self {
        Retention {
            window: window.min(LONGEST),
            scopes: BTreeMap::new(),
            batch_size: 5_000,
            statement_timeout: Duration::from_secs(2),
            pause: Duration::ZERO,
            max_batches: None,
            interval: Duration::from_secs(60),
            bucket_width: DEFAULT_BUCKET_WIDTH,
            future_bound: DEFAULT_FUTURE_BOUND,
        }
    }

    /// The window of `scope`'s keys instead of the default one (and instead of the one its
    /// handler declares): longer for a scope whose messages can be replayed for longer,
    /// shorter for a busy scope (at most [`LONGEST`]).
    pub fn scope_window(mut self, scope: impl Into<String>, window: Duration) -> Self {
        self.scopes.insert(scope.into(), window.min(LONGEST));
        self
    }

    /// The most rows one batch deletes (default 5,000; at least 1).
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// The statement timeout of each batch (default 2 s). A batch that hits it rolls back
    /// and the next batch is half as large.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// A pause between two batches, to leave the database to the consumers (default none).
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// The most batches one cleanup runs (default: until nothing is left to delete).
    pub fn max_batches(mut self, batches: u32) -> Self {
        self.max_batches = Some(batches.max(1));
        self
    }

    /// How often the background task of [`Idem::spawn_retention`](crate::Idem::spawn_retention) runs the cleanup
    /// (default every minute).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The width of the time buckets this handle creates for the keys of handlers with
    /// `event_time` (default an hour; from a minute to a day: a width outside is taken as
    /// the nearer of the two): see
    /// [`time_buckets`](crate::time_buckets). A bucket expires whole once its newest fact
    /// is older than the longest window, so a narrower bucket frees space sooner, and a
    /// wider one makes fewer tables. Changing it is safe at any time: buckets that exist
    /// keep their range, new ones fill the gaps.
    pub fn bucket_width(mut self, width: Duration) -> Self {
        self.bucket_width = width.clamp(Duration::from_secs(60), Duration::from_secs(86_400));
        self
    }

    /// How far ahead of the database clock a fact's time may be (default an hour): a
    /// fact stamped later is refused (`Error::OutsideWindow`) rather than given a bucket
    /// that far ahead. Clock skew between producers and the database is what it allows
    /// for; a producer that stamps events in the future by more is a bug to see (at most
    /// [`LONGEST`]).
    pub fn future_bound(mut self, bound: Duration) -> Self {
        self.future_bound = bound.min(LONGEST);
        self
    }

    /// The width of new time buckets.
    pub fn bucket_width_duration(&self) -> Duration {
        self.bucket_width
    }

    /// The bound on a fact's time ahead of the database clock.
    pub fn future_bound_duration(&self) -> Duration {
        self.future_bound
    }

    /// The default window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The window of `scope` in these settings: its own, or the default. (A window that
    /// the scope's handler declares is read from the database by the cleanup, after these.)
    pub fn window_of(&self, scope: &str) -> Duration {
        self.scopes.get(scope).copied().unwrap_or(self.window)
    }

    /// The scopes with a window of their own.
    pub fn scope_windows(&self) -> impl Iterator<Item = (&str, Duration)> {
        self.scopes
            .iter()
            .map(|(scope, window)| (scope.as_str(), *window))
    }

    /// The longest of the default window and the scopes' own: how old a time bucket's
    /// facts must all be before it expires (the scopes' windows declared by their handlers
    /// are the database's to add).
    pub(crate) fn longest_window(&self) -> Duration {
        self.scopes
            .values()
            .copied()
            .fold(self.window, Duration::max)
    }

    /// The interval of the background task.
    pub fn interval_duration(&self) -> Duration {
        self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_for_ever_are_the_longest_that_postgresql_expresses() {
        let retention = Retention::new(Duration::MAX)
            .scope_window("audit", Duration::MAX)
            .future_bound(Duration::MAX);
        assert_eq!(retention.window(), LONGEST);
        assert_eq!(retention.window_of("audit"), LONGEST);
        assert_eq!(retention.future_bound_duration(), LONGEST);
        // Sent as milliseconds multiplied by `interval '1 millisecond'`.
        assert!(i64::try_from(LONGEST.as_millis()).is_ok());
    }
}
