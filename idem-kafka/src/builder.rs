//! The builder of a consumer: `Consumer::builder(...)`, the settings that differ from the
//! defaults, then `build`. Above the consumer: it creates one.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::Idem;

use crate::consumer::Consumer;
use crate::error::ConsumerError;
use crate::handler::Handler;
use crate::offset_store::OffsetStore;
use crate::schema::Schema;
use crate::settings::Settings;
use crate::stats::Stats;

/// Builds a [`Consumer`]: `Consumer::builder(brokers, group, topic)`, the settings that
/// differ from the defaults, then [`build`](Self::build).
///
/// ```no_run
/// # use std::time::Duration;
/// # fn f(idem: idem_runtime::Idem, handler: impl idem_kafka::Handler) -> Result<(), idem_kafka::ConsumerError> {
/// use idem_kafka::{Consumer, OffsetStore};
///
/// let consumer = Consumer::builder("127.0.0.1:9092", "order-appliers", "orders")
///     .offsets(OffsetStore::Postgres)
///     .batch_size(500)
///     .set("fetch.min.bytes", "1024")
///     .build(idem, handler)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct ConsumerBuilder {
    settings: Settings,
    stats: Option<Arc<Stats>>,
}

impl Consumer<()> {
    /// A builder for a member of `group` reading `topic` from `brokers`
    /// (`host:port[,host:port...]`).
    pub fn builder(
        brokers: impl Into<String>,
        group: impl Into<String>,
        topic: impl Into<String>,
    ) -> ConsumerBuilder {
        ConsumerBuilder {
            settings: Settings::new(brokers.into(), group.into(), topic.into()),
            stats: None,
        }
    }
}

impl ConsumerBuilder {
    /// Where processed offsets are kept (default [`OffsetStore::Kafka`]).
    pub fn offsets(mut self, offsets: OffsetStore) -> Self {
        self.settings.offsets = offsets;
        self
    }

    /// Messages handed to the handler together (default 1: one message, one
    /// transaction). Above 1, [`Handler::handle_batch`] gets up to this many.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.settings.batch_size = batch_size.max(1);
        self
    }

    /// How long a batch waits for more messages after its first one (default 20 ms).
    pub fn batch_linger(mut self, linger: Duration) -> Self {
        self.settings.batch_linger = linger;
        self
    }

    /// How many partitions the member works at once: at most `n` deliveries (a message, or
    /// a batch of one partition's messages) are handled at the same time, one per
    /// partition at most, each partition's in order.
    ///
    /// Each delivery in flight holds a connection of [`Idem`]'s pool while it runs (a
    /// delivery waiting to be retried holds none, and no other partition waits for it).
    /// The default is the pool's size less two, at least 1: the member's own flushes of
    /// positions, its stall watch and its dead letters take a connection now and then. `n`
    /// above the pool's size is lowered to it. Set it lower when the pool serves other
    /// work too (an outbox relay, several consumers on one pool); 1 works one delivery at
    /// a time across all the member's partitions.
    ///
    /// A member holds few partitions when its group has many members: it never works more
    /// deliveries at once than it holds partitions.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.settings.max_in_flight = Some(n.max(1));
        self
    }

    /// How often processed offsets are committed (default 1 s).
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.settings.commit_interval = interval;
        self
    }

    /// The first wait before retrying a message that failed in a way that can pass
    /// (default 50 ms), and the longest (default 5 s); it doubles in between.
    pub fn retry_backoff(mut self, first: Duration, longest: Duration) -> Self {
        self.settings.retry_backoff = first;
        self.settings.max_retry_backoff = longest.max(first);
        self
    }

    /// The group's session timeout: how long the broker waits for a silent member before
    /// it gives the member's partitions to the others (default 30 s; the heartbeat goes
    /// every quarter of it, at most every 3 s).
    ///
    /// The trade-off: a shorter session moves a dead member's partitions sooner (on a
    /// broker that does), and makes a shorter broker outage end every member's session,
    /// which then forces the whole group through a rebalance when the broker is back (on
    /// tansu 0.6 such a rebalance can fail to complete: see the README's "Broker
    /// outages"). 30 s rides out a broker restart of a few seconds with no rebalance at
    /// all, at the cost of a dead member's partitions waiting up to 30 s more.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.settings.session_timeout = timeout;
        self
    }

    /// How long a partition with records behind its position may stand still before it
    /// counts as stalled (default: twice the session timeout and at least 30 s, so 60 s
    /// with the default session; a broker expels a silent member only after its session,
    /// and a rejoin before then would hand its partitions back to it).
    ///
    /// Every member watches every partition of its topic (the broker's watermarks beside
    /// the group's stored or committed positions, every third of the bound, at most every
    /// 10 s): a stalled partition is logged at warn level, again every bound while it
    /// stays stalled, and shows in the gauges and in [`Stats::headway`], whoever holds it.
    /// While the database answers (an outage stops every partition, and is not the
    /// group's):
    /// - a member that is stuck (a partition it holds stands still while it waits for
    ///   messages and receives none, or it holds no partition while others stand still)
    ///   leaves the group and joins it again, at most once a bound; if that has not helped
    ///   two bounds after its first rejoin, [`Consumer::run`] returns
    ///   [`ConsumerError::Stalled`], for its supervisor to start it again;
    /// - a member that works its own partitions while others stand still (their member
    ///   died without leaving the group, and the broker does not hand them out again)
    ///   leaves and rejoins, at most once a bound, so that the group's next rebalance
    ///   gives them to the members alive; it goes on working whether that helps or not.
    pub fn stall_bound(mut self, bound: Duration) -> Self {
        self.settings.stall_bound = Some(bound.max(Duration::from_secs(1)));
        self
    }

    /// This member's client id (default `<group>-member`; shows in broker logs).
    pub fn client_id(mut self, client_id: impl Into<String>) -> Self {
        self.settings.client_id = client_id.into();
        self
    }

    /// The schema of the offset and dead-letter tables (default `<idem's schema>_kafka`).
    pub fn schema(mut self, schema: Schema) -> Self {
        self.settings.schema = Some(schema);
        self
    }

    /// A further librdkafka setting (e.g. `group.instance.id`, `security.protocol`),
    /// applied after the consumer's own.
    pub fn set(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.extra.push((name.into(), value.into()));
        self
    }

    /// Counts into `stats` (default: counters of its own), to share them between
    /// consumers.
    pub fn stats(mut self, stats: Arc<Stats>) -> Self {
        self.stats = Some(stats);
        self
    }

    /// Creates the consumer and subscribes it to the topic. Messages flow once
    /// [`Consumer::run`] polls it.
    ///
    /// idem's status table ([`Idem::migrate`]), idem-kafka's tables
    /// ([`Consumer::migrate`]) and what `handler` writes must exist before it runs.
    pub fn build<H: Handler>(self, idem: Idem, handler: H) -> Result<Consumer<H>, ConsumerError> {
        let mut settings = self.settings;
        let schema = settings
            .schema
            .take()
            .unwrap_or_else(|| Schema::for_idem(&idem))
            .behind(&idem)
            .checked()?;
        settings.schema = Some(schema.clone());
        Consumer::create(
            idem,
            settings,
            schema,
            self.stats.unwrap_or_default(),
            handler,
        )
    }
}
