//! The report: a table on stdout, `results.json` and a chart (`throughput.svg`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::Serialize;

use crate::scenarios::{BusyRound, Scenario};
use crate::{BoxError, Settings, SyncCommit};

/// The throughput of one scenario at one concurrency and `synchronous_commit` setting,
/// over all rounds.
#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    pub scenario: Scenario,
    pub sync: SyncCommit,
    pub concurrency: usize,
    pub messages: u64,
    pub seconds: f64,
    /// Messages over measured seconds, all rounds together.
    pub msgs_per_sec: f64,
    /// Each round's rate, in the order of the rounds.
    pub round_msgs_per_sec: Vec<f64>,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// `busy-key` cells: what the busy key's deliveries did, per round.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub busy: Vec<BusyRound>,
    #[serde(skip)]
    latencies_us: Vec<u32>,
}

impl CellResult {
    pub fn new(scenario: Scenario, sync: SyncCommit, concurrency: usize) -> Self {
        CellResult {
            scenario,
            sync,
            concurrency,
            messages: 0,
            seconds: 0.0,
            msgs_per_sec: 0.0,
            round_msgs_per_sec: Vec::new(),
            latency_p50_ms: 0.0,
            latency_p99_ms: 0.0,
            errors: 0,
            first_error: None,
            busy: Vec::new(),
            latencies_us: Vec::new(),
        }
    }

    pub fn add_round(
        &mut self,
        messages: u64,
        seconds: f64,
        errors: u64,
        first_error: Option<String>,
        latencies_us: Vec<u32>,
    ) {
        self.messages += messages;
        self.seconds += seconds;
        self.round_msgs_per_sec.push(messages as f64 / seconds);
        self.errors += errors;
        if self.first_error.is_none() {
            self.first_error = first_error;
        }
        self.latencies_us.extend(latencies_us);
    }

    pub fn finish(mut self) -> Self {
        self.msgs_per_sec = self.messages as f64 / self.seconds;
        self.latencies_us.sort_unstable();
        let at = |q: f64| -> f64 {
            if self.latencies_us.is_empty() {
                return 0.0;
            }
            let index = ((self.latencies_us.len() - 1) as f64 * q).round() as usize;
            f64::from(self.latencies_us[index]) / 1000.0
        };
        self.latency_p50_ms = at(0.50);
        self.latency_p99_ms = at(0.99);
        self.latencies_us = Vec::new();
        self
    }
}

/// Per message, on the wire between the client and PostgreSQL (counting proxy).
#[derive(Debug, Clone, Serialize)]
pub struct WirePerMessage {
    /// Times the client waited for the server (pipelined messages share one).
    pub round_trips: f64,
    /// `ReadyForQuery` messages: one per simple query or sync.
    pub ready_for_query: f64,
    /// Simple-protocol queries (`BEGIN`, `COMMIT`, ...); one may hold several statements.
    pub simple_queries: f64,
    /// Extended-protocol executions of prepared statements.
    pub extended_executes: f64,
    /// Statements prepared (0 once the connection's statement cache is warm).
    pub parses: f64,
    /// Syncs without a statement: the pool's liveness pings on acquire and release (an
    /// execution's sync and a parse's are not counted here).
    pub bare_syncs: f64,
}

/// Per message, as the server's statistics count it for the bench database.
#[derive(Debug, Clone, Serialize)]
pub struct DbPerMessage {
    /// Messages the counts are divided by (warm-up included).
    pub messages: u64,
    pub commits: f64,
    pub rollbacks: f64,
    pub rows_inserted: f64,
    pub rows_updated: f64,
    pub rows_deleted: f64,
    /// WAL written by the whole server meanwhile, per message (other databases' activity
    /// included, so an upper bound).
    pub wal_bytes_cluster: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProbeResult {
    pub scenario: Scenario,
    pub messages: u64,
    pub wire: WirePerMessage,
    /// CPU time of the PostgreSQL backend per message, in microseconds (when the server
    /// runs on this machine).
    pub server_cpu_us: Option<f64>,
    pub db: DbPerMessage,
}

#[derive(Debug, Clone, Serialize)]
pub struct IndexSize {
    pub name: String,
    pub bytes: i64,
    pub mb_per_million_keys: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SizeResult {
    pub table: String,
    pub keys: u64,
    pub heap_bytes: i64,
    pub index_bytes: i64,
    pub total_bytes: i64,
    pub heap_mb_per_million_keys: f64,
    pub index_mb_per_million_keys: f64,
    pub total_mb_per_million_keys: f64,
    pub indexes: Vec<IndexSize>,
}

/// The process's resident set size after a number of messages of the memory run.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryMark {
    pub messages: u64,
    /// `VmHWM`: the peak so far.
    pub peak_rss_kib: u64,
    /// `VmRSS`: now.
    pub rss_kib: u64,
}

impl MemoryMark {
    pub fn new(messages: u64, (peak, now): (u64, u64)) -> Self {
        MemoryMark {
            messages,
            peak_rss_kib: peak,
            rss_kib: now,
        }
    }
}

/// The memory run: many messages through the batch path.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryResult {
    pub messages: u64,
    pub batch: u64,
    pub workers: usize,
    pub seconds: f64,
    pub msgs_per_sec: f64,
    pub marks: Vec<MemoryMark>,
    /// Rows of the status table afterwards, and its size.
    pub keys: u64,
    pub heap_bytes: i64,
    pub index_bytes: i64,
    pub heap_mb_per_million_keys: f64,
    pub index_mb_per_million_keys: f64,
}

impl MemoryResult {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        messages: u64,
        batch: u64,
        workers: usize,
        seconds: f64,
        marks: Vec<MemoryMark>,
        keys: u64,
        heap_bytes: i64,
        index_bytes: i64,
    ) -> Self {
        MemoryResult {
            messages,
            batch,
            workers,
            seconds,
            msgs_per_sec: messages as f64 / seconds,
            marks,
            keys,
            heap_bytes,
            index_bytes,
            heap_mb_per_million_keys: per_million(heap_bytes, keys.max(1)),
            index_mb_per_million_keys: per_million(index_bytes, keys.max(1)),
        }
    }
}

/// Duplicate latency answered from the Redis cache against from PostgreSQL.
#[derive(Debug, Clone, Serialize)]
pub struct DuplicateLatency {
    pub concurrency: usize,
    pub cache_p50_ms: f64,
    pub cache_p99_ms: f64,
    pub postgres_p50_ms: f64,
    pub postgres_p99_ms: f64,
    /// Cache p50 over PostgreSQL p50 (goal: <= 0.5).
    pub p50_ratio: f64,
    pub met: bool,
}

/// The first quartile, the median and the third quartile of `values` (linear
/// interpolation; zeros when there are none).
fn quartiles(values: &[f64]) -> [f64; 3] {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| -> f64 {
        if sorted.is_empty() {
            return 0.0;
        }
        let position = (sorted.len() - 1) as f64 * q;
        let (low, high) = (position.floor() as usize, position.ceil() as usize);
        sorted[low] + (sorted[high] - sorted[low]) * (position - low as f64)
    };
    [at(0.25), at(0.5), at(0.75)]
}

/// 1, 2 and 5 times the powers of ten between `low` and `high`: the labels of a log axis.
fn key_points(low: f64, high: f64) -> Vec<f64> {
    let mut points = Vec::new();
    let mut decade = 10f64.powf(low.max(1.0).log10().floor());
    while decade <= high {
        for factor in [1.0, 2.0, 5.0] {
            let point = decade * factor;
            if point >= low && point <= high {
                points.push(point);
            }
        }
        decade *= 10.0;
    }
    points
}

fn per_million(bytes: i64, keys: u64) -> f64 {
    bytes as f64 * 1e6 / keys as f64 / 1e6
}

impl SizeResult {
    pub fn new(
        table: &str,
        keys: u64,
        heap: i64,
        indexes_total: i64,
        total: i64,
        indexes: Vec<(String, i64)>,
    ) -> Self {
        SizeResult {
            table: table.into(),
            keys,
            heap_bytes: heap,
            index_bytes: indexes_total,
            total_bytes: total,
            heap_mb_per_million_keys: per_million(heap, keys),
            index_mb_per_million_keys: per_million(indexes_total, keys),
            total_mb_per_million_keys: per_million(total, keys),
            indexes: indexes
                .into_iter()
                .map(|(name, bytes)| IndexSize {
                    name,
                    bytes,
                    mb_per_million_keys: per_million(bytes, keys),
                })
                .collect(),
        }
    }
}

/// The PgBouncer of the `pgbouncer-*` scenarios, as its admin console shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PgBouncerInfo {
    /// `host:port`.
    pub address: String,
    /// `SHOW VERSION` (none when the admin console did not answer).
    pub version: Option<String>,
    /// The settings of `SHOW CONFIG` that matter here.
    pub settings: BTreeMap<String, String>,
}

/// A throughput ratio between two cells, with the goal of the issue where there is one.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub name: String,
    pub sync: SyncCommit,
    pub concurrency: usize,
    pub value: f64,
    /// The ratio within each round (cells of one round ran seconds apart).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub met: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub server_version: String,
    /// The PgBouncer of the `pgbouncer-*` scenarios.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pgbouncer: Option<PgBouncerInfo>,
    pub cores: usize,
    pub wall_seconds: f64,
    /// The 1-minute load average before and after the run (other processes on the
    /// machine compete with PostgreSQL and the bench for the cores).
    pub load_average: [f64; 2],
    pub settings: Settings,
    pub cells: Vec<CellResult>,
    pub ratios: Vec<Ratio>,
    pub round_trips: Vec<ProbeResult>,
    pub sizes: Vec<SizeResult>,
    pub duplicate_latency: Vec<DuplicateLatency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryResult>,
}

/// The ratios that the report prints: (numerator, denominator, goal for a sync setting
/// and concurrency).
type Goal = fn(SyncCommit, usize) -> Option<f64>;
const RATIOS: [(Scenario, Scenario, Goal); 34] = [
    // A new message: >= 0.75x the bare business transaction at c=4 and c=16.
    (Scenario::Idem, Scenario::Bare, |sync, c| {
        (sync == SyncCommit::On && (c == 4 || c == 16)).then_some(0.75)
    }),
    (Scenario::Idem, Scenario::Article, |sync, _| match sync {
        SyncCommit::On => Some(1.0),
        SyncCommit::Off => Some(1.3),
    }),
    (Scenario::Article, Scenario::Bare, |_, _| None),
    // The distance to the cheapest SQL with the same guarantees, through the same client:
    // within 5 % at c=4 and c=16.
    (Scenario::Idem, Scenario::Lean, |sync, c| {
        (sync == SyncCommit::On && (c == 4 || c == 16)).then_some(0.95)
    }),
    (Scenario::Lean, Scenario::Bare, |_, _| None),
    (Scenario::IdemResult, Scenario::Bare, |_, _| None),
    // A duplicate answered by PostgreSQL: >= 3x a new message at c=16.
    (Scenario::IdemDup, Scenario::Idem, |sync, c| {
        (sync == SyncCommit::On && c == 16).then_some(3.0)
    }),
    // The cheapest correct duplicate through the same client: within 10 %.
    (Scenario::IdemDup, Scenario::LeanDup, |_, _| Some(0.9)),
    (Scenario::ArticleDup, Scenario::Article, |_, _| None),
    // Batches of 500 against the same messages one by one, and against the bare batch.
    (Scenario::Batch500, Scenario::Idem, |sync, c| {
        (sync == SyncCommit::On && c == 4).then_some(10.0)
    }),
    (Scenario::Batch100, Scenario::Idem, |_, _| None),
    (Scenario::Batch10, Scenario::Idem, |_, _| None),
    (Scenario::Batch500, Scenario::BareBatch500, |sync, c| {
        (sync == SyncCommit::On && c == 4).then_some(0.6)
    }),
    // The batch handler (one body run, one multi-row insert per batch) against the bare
    // batch, and against the same messages one by one.
    (Scenario::BatchBulk500, Scenario::BareBatch500, |sync, c| {
        (sync == SyncCommit::On && c == 4).then_some(0.6)
    }),
    (Scenario::BatchBulk500, Scenario::Idem, |sync, c| {
        (sync == SyncCommit::On && c == 4).then_some(10.0)
    }),
    (Scenario::BareBatch500, Scenario::Bare, |_, _| None),
    (Scenario::Lease, Scenario::Bare, |_, _| None),
    (Scenario::Lease, Scenario::Idem, |_, _| None),
    // Redis stopped: PostgreSQL carries on, at >= 0.9x the PostgreSQL-only throughput.
    (Scenario::StormRedisDown, Scenario::Storm, |_, _| Some(0.9)),
    (Scenario::StormRedis, Scenario::Storm, |_, _| None),
    // The cache's cost on new messages: <= 5%.
    (Scenario::IdemRedis, Scenario::Idem, |_, _| Some(0.95)),
    // New keys while one key is held by a slow body and its duplicates wait: >= 0.8x the
    // same workload without the busy key.
    (Scenario::BusyKey, Scenario::Idem, |_, _| Some(0.8)),
    // Through PgBouncer in transaction pooling: idem against the bare transaction through
    // the same pooler (and `idem/bare` above on a direct connection) ...
    (Scenario::PgbouncerIdem, Scenario::PgbouncerBare, |_, _| {
        None
    }),
    // ... each through the pooler against the same on a direct connection ...
    (Scenario::PgbouncerBare, Scenario::Bare, |_, _| None),
    (Scenario::PgbouncerIdem, Scenario::Idem, |_, _| None),
    (Scenario::PgbouncerIdemDup, Scenario::IdemDup, |_, _| None),
    (
        Scenario::PgbouncerIdemDup,
        Scenario::PgbouncerIdem,
        |_, _| None,
    ),
    // ... and that split in two: the pooler's SQL (simple queries, unnamed statements) on a
    // direct connection, and the hop through the pooler with the same SQL.
    (
        Scenario::IdemUnprepared,
        Scenario::BareUnprepared,
        |_, _| None,
    ),
    (Scenario::BareUnprepared, Scenario::Bare, |_, _| None),
    (Scenario::IdemUnprepared, Scenario::Idem, |_, _| None),
    (Scenario::PgbouncerBare, Scenario::BareUnprepared, |_, _| {
        None
    }),
    (Scenario::PgbouncerIdem, Scenario::IdemUnprepared, |_, _| {
        None
    }),
    (Scenario::IdemDupUnprepared, Scenario::IdemDup, |_, _| None),
    (
        Scenario::PgbouncerIdemDup,
        Scenario::IdemDupUnprepared,
        |_, _| None,
    ),
];

/// The ratios of the PgBouncer section of the report: (numerator, denominator, label).
const POOLER_RATIOS: [(Scenario, Scenario, &str); 11] = [
    (
        Scenario::PgbouncerIdem,
        Scenario::PgbouncerBare,
        "idem/bare through PgBouncer",
    ),
    (Scenario::Idem, Scenario::Bare, "idem/bare direct"),
    (
        Scenario::PgbouncerBare,
        Scenario::Bare,
        "bare: PgBouncer/direct",
    ),
    (
        Scenario::PgbouncerIdem,
        Scenario::Idem,
        "idem: PgBouncer/direct",
    ),
    (
        Scenario::PgbouncerIdemDup,
        Scenario::IdemDup,
        "idem-dup: PgBouncer/direct",
    ),
    (
        Scenario::BareUnprepared,
        Scenario::Bare,
        "bare: unprepared/prepared, direct",
    ),
    (
        Scenario::IdemUnprepared,
        Scenario::Idem,
        "idem: Pooler::Transaction/default, direct",
    ),
    (
        Scenario::IdemDupUnprepared,
        Scenario::IdemDup,
        "idem-dup: Pooler::Transaction/default, direct",
    ),
    (
        Scenario::PgbouncerBare,
        Scenario::BareUnprepared,
        "bare: the hop alone",
    ),
    (
        Scenario::PgbouncerIdem,
        Scenario::IdemUnprepared,
        "idem: the hop alone",
    ),
    (
        Scenario::PgbouncerIdemDup,
        Scenario::IdemDupUnprepared,
        "idem-dup: the hop alone",
    ),
];

impl Report {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: &Settings,
        server_version: String,
        pgbouncer: Option<PgBouncerInfo>,
        cells: Vec<CellResult>,
        round_trips: Vec<ProbeResult>,
        sizes: Vec<SizeResult>,
        memory: Option<MemoryResult>,
        wall_seconds: f64,
        load_average: [f64; 2],
    ) -> Self {
        let find = |scenario, sync, concurrency| {
            cells
                .iter()
                .find(|c| c.scenario == scenario && c.sync == sync && c.concurrency == concurrency)
        };
        let rate =
            |scenario, sync, concurrency| find(scenario, sync, concurrency).map(|c| c.msgs_per_sec);
        let mut ratios = Vec::new();
        for (top, bottom, goal) in RATIOS {
            for &sync in &settings.sync {
                for &concurrency in &settings.concurrency {
                    // Duplicates run with the default setting; compare them with new
                    // messages under the same setting.
                    if let (Some(a), Some(b)) = (
                        rate(top, sync, concurrency),
                        rate(bottom, sync, concurrency),
                    ) {
                        let goal = goal(sync, concurrency);
                        let value = a / b;
                        let rounds = match (
                            find(top, sync, concurrency),
                            find(bottom, sync, concurrency),
                        ) {
                            (Some(a), Some(b)) => a
                                .round_msgs_per_sec
                                .iter()
                                .zip(&b.round_msgs_per_sec)
                                .map(|(a, b)| a / b)
                                .collect(),
                            _ => Vec::new(),
                        };
                        ratios.push(Ratio {
                            name: format!("{}/{}", top.name(), bottom.name()),
                            sync,
                            concurrency,
                            value,
                            rounds,
                            goal,
                            met: goal.map(|g| value >= g),
                        });
                    }
                }
            }
        }
        let cell = |scenario, concurrency| {
            cells.iter().find(|c| {
                c.scenario == scenario && c.sync == SyncCommit::On && c.concurrency == concurrency
            })
        };
        let duplicate_latency = settings
            .concurrency
            .iter()
            .filter_map(|&c| {
                let (cache, postgres) = (
                    cell(Scenario::IdemDupRedis, c)?,
                    cell(Scenario::IdemDup, c)?,
                );
                let p50_ratio = cache.latency_p50_ms / postgres.latency_p50_ms;
                Some(DuplicateLatency {
                    concurrency: c,
                    cache_p50_ms: cache.latency_p50_ms,
                    cache_p99_ms: cache.latency_p99_ms,
                    postgres_p50_ms: postgres.latency_p50_ms,
                    postgres_p99_ms: postgres.latency_p99_ms,
                    p50_ratio,
                    met: p50_ratio <= 0.5,
                })
            })
            .collect();
        Report {
            duplicate_latency,
            memory,
            server_version,
            pgbouncer,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            wall_seconds,
            load_average,
            settings: settings.clone(),
            cells,
            ratios,
            round_trips,
            sizes,
        }
    }

    pub fn print(&self) {
        let concurrency = &self.settings.concurrency;
        println!();
        println!(
            "Throughput (msg/s; {} round(s) x {} s per cell; p50/p99 latency in ms at the highest concurrency)",
            self.settings.rounds, self.settings.secs
        );
        let mut header = format!("{:<19} {:<5}", "scenario", "sync");
        for c in concurrency {
            header += &format!(" {:>9}", format!("c={c}"));
        }
        header += "   p50/p99 ms";
        println!("{header}");
        let rows: BTreeSet<(SyncCommit, Scenario)> =
            self.cells.iter().map(|c| (c.sync, c.scenario)).collect();
        for (sync, scenario) in rows {
            let mut line = format!("{:<19} {:<5}", scenario.name(), sync.name());
            let mut last = None;
            for &c in concurrency {
                match self
                    .cells
                    .iter()
                    .find(|x| x.scenario == scenario && x.sync == sync && x.concurrency == c)
                {
                    Some(cell) => {
                        line += &format!(" {:>9.0}", cell.msgs_per_sec);
                        last = Some(cell);
                    }
                    None => line += &format!(" {:>9}", "-"),
                }
            }
            if let Some(cell) = last {
                line += &format!("   {:.2}/{:.2}", cell.latency_p50_ms, cell.latency_p99_ms);
                if cell.errors > 0 {
                    line += &format!("  ({} errors)", cell.errors);
                }
            }
            println!("{line}");
        }

        if !self.ratios.is_empty() {
            println!();
            println!("Ratios (throughput of the first over the second)");
            let mut header = format!("{:<38} {:<5}", "ratio", "sync");
            for c in concurrency {
                header += &format!(" {:>9}", format!("c={c}"));
            }
            header += "   goal";
            println!("{header}");
            let mut seen = Vec::new();
            for ratio in &self.ratios {
                let key = (ratio.name.clone(), ratio.sync);
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                let mut line = format!("{:<38} {:<5}", ratio.name, ratio.sync.name());
                let mut goals = Vec::new();
                for &c in concurrency {
                    match self.ratios.iter().find(|r| {
                        r.name == ratio.name && r.sync == ratio.sync && r.concurrency == c
                    }) {
                        Some(r) => {
                            let mark = match r.met {
                                Some(true) => " ",
                                Some(false) => "!",
                                None => " ",
                            };
                            line += &format!(" {:>8.2}{mark}", r.value);
                            if let Some(goal) = r.goal {
                                goals.push((c, goal));
                            }
                        }
                        None => line += &format!(" {:>9}", "-"),
                    }
                }
                if let Some((_, goal)) = goals.first() {
                    let all = goals.len() == concurrency.len();
                    let at: Vec<String> = goals.iter().map(|(c, _)| format!("c={c}")).collect();
                    line += &format!(
                        "   >= {goal}{}",
                        if all {
                            String::new()
                        } else {
                            format!(" at {}", at.join(","))
                        }
                    );
                }
                println!("{line}");
            }
            println!("('!' marks a ratio below its goal)");
        }

        self.print_pooler();

        let busy: Vec<&CellResult> = self.cells.iter().filter(|c| !c.busy.is_empty()).collect();
        if !busy.is_empty() {
            println!();
            println!(
                "Busy key (busy-key): new keys measured while one other key is held by its body and duplicates of it arrive"
            );
            println!(
                "{:>5} {:>5} {:>9} {:>7} {:>10} {:>10} {:>9} {:>12} {:>9}",
                "c",
                "round",
                "msg/s",
                "held s",
                "measured s",
                "duplicates",
                "answered",
                "in progress",
                "settled s"
            );
            for cell in busy {
                for (round, b) in cell.busy.iter().enumerate() {
                    println!(
                        "{:>5} {:>5} {:>9.0} {:>7.1} {:>10.1} {:>10} {:>9} {:>12} {:>9.1}{}",
                        cell.concurrency,
                        round + 1,
                        cell.round_msgs_per_sec.get(round).copied().unwrap_or(0.0),
                        b.held_secs,
                        b.measured_secs,
                        b.duplicates,
                        b.duplicate_answers,
                        b.in_progress_answers,
                        b.settled_secs,
                        b.first_error
                            .as_ref()
                            .map_or_else(String::new, |error| format!("  ERROR: {error}"))
                    );
                }
            }
            println!(
                "(the pool has one connection more than the workers, the busy body's; answered: duplicates \
                 answered `Duplicate` after the body committed; in progress: `InProgress` answers, each \
                 delivered again; settled: seconds from the body's start to the last answer)"
            );
        }

        if !self.duplicate_latency.is_empty() {
            println!();
            println!(
                "Duplicate latency (ms per message): answered from Redis (idem-dup-redis) vs from PostgreSQL (idem-dup)"
            );
            println!(
                "{:>5} {:>10} {:>10} {:>10} {:>10} {:>10}",
                "c", "redis p50", "redis p99", "pg p50", "pg p99", "p50 ratio"
            );
            for d in &self.duplicate_latency {
                println!(
                    "{:>5} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>9.2}{}",
                    d.concurrency,
                    d.cache_p50_ms,
                    d.cache_p99_ms,
                    d.postgres_p50_ms,
                    d.postgres_p99_ms,
                    d.p50_ratio,
                    if d.met { " " } else { "!" }
                );
            }
            println!("(goal: redis p50 <= 0.5x pg p50; '!' marks a miss)");
        }

        if !self.round_trips.is_empty() {
            println!();
            println!(
                "Per message at concurrency 1 (wire: counting proxy, after warm-up; db: pg_stat_database of the bench database)"
            );
            println!(
                "{:<19} {:>6} {:>6} {:>7} {:>6} {:>6} {:>7} {:>6} | {:>7} {:>9} {:>6} {:>6} {:>9}",
                "scenario",
                "rtrips",
                "simple",
                "prepared",
                "pings",
                "parses",
                "srv cpu",
                "/bare",
                "commits",
                "rollbacks",
                "ins",
                "upd",
                "WAL B*"
            );
            // The server's CPU per message against the bare business transaction's.
            let bare_cpu = self
                .round_trips
                .iter()
                .find(|probe| probe.scenario == Scenario::Bare)
                .and_then(|probe| probe.server_cpu_us);
            for probe in &self.round_trips {
                let w = &probe.wire;
                let d = &probe.db;
                let cpu_ratio = probe
                    .server_cpu_us
                    .zip(bare_cpu)
                    .filter(|&(_, bare)| bare > 0.0)
                    .map_or_else(|| "-".to_string(), |(us, bare)| format!("{:.2}", us / bare));
                println!(
                    "{:<19} {:>6.2} {:>6.2} {:>8.2} {:>6.2} {:>6.2} {:>7} {:>6} | {:>7.2} {:>9.2} {:>6.2} {:>6.2} {:>9.0}",
                    probe.scenario.name(),
                    w.round_trips,
                    w.simple_queries,
                    w.extended_executes,
                    w.bare_syncs,
                    w.parses,
                    probe
                        .server_cpu_us
                        .map_or_else(|| "-".to_string(), |us| format!("{us:.0}us")),
                    cpu_ratio,
                    d.commits,
                    d.rollbacks,
                    d.rows_inserted,
                    d.rows_updated,
                    d.wal_bytes_cluster
                );
            }
            println!(
                "(rtrips: times the client waited for the server, pool pings included; simple: BEGIN/COMMIT-style queries; \
                 prepared: statement executions; pings: sqlx pool liveness checks on acquire and release; \
                 srv cpu: the PostgreSQL backend's CPU time; /bare: srv cpu over the bare transaction's \
                 (goals: idem <= 1.6, idem-dup <= 0.5); commits..upd: per message, warm-up included, plus ~3 \
                 set-up transactions of the probe spread over them; *WAL: whole server, an upper bound)"
            );
        }

        if !self.sizes.is_empty() {
            println!();
            println!("Size per million keys (MB, extrapolated from the keys inserted)");
            for size in &self.sizes {
                let indexes: Vec<String> = size
                    .indexes
                    .iter()
                    .map(|i| format!("{} {:.1}", i.name, i.mb_per_million_keys))
                    .collect();
                println!(
                    "{:<24} keys {:>8}: heap {:>6.1}  indexes {:>6.1} ({})  total {:>6.1}",
                    size.table,
                    size.keys,
                    size.heap_mb_per_million_keys,
                    size.index_mb_per_million_keys,
                    indexes.join(", "),
                    size.total_mb_per_million_keys
                );
            }
        }
        if let Some(memory) = &self.memory {
            println!();
            println!(
                "Memory: {} messages through batches of {} ({} workers), {:.0} s, {:.0} msg/s",
                memory.messages, memory.batch, memory.workers, memory.seconds, memory.msgs_per_sec
            );
            for mark in &memory.marks {
                println!(
                    "  after {:>8} messages: peak RSS {:>7.1} MiB, RSS {:>7.1} MiB",
                    mark.messages,
                    mark.peak_rss_kib as f64 / 1024.0,
                    mark.rss_kib as f64 / 1024.0
                );
            }
            println!(
                "  idem.idem_keys with {} keys: heap {:.1} MB, indexes {:.1} MB per million keys",
                memory.keys, memory.heap_mb_per_million_keys, memory.index_mb_per_million_keys
            );
        }
        println!();
        println!(
            "PostgreSQL {}, {} cores, {:.0} s, load average {:.1} before, {:.1} after",
            self.server_version,
            self.cores,
            self.wall_seconds,
            self.load_average[0],
            self.load_average[1]
        );
        // The load after the run is mostly the bench's own (64 workers and their backends);
        // the load before it is what other processes (or a previous run) left.
        if self.load_average[0] > self.cores as f64 {
            println!(
                "warning: the machine was loaded beyond its cores before the run; the figures are noisy"
            );
        }
    }

    /// The PgBouncer section: the pooler run's ratios at each concurrency, with their
    /// range over the rounds.
    fn print_pooler(&self) {
        if !self.cells.iter().any(|c| c.scenario.through_pgbouncer()) {
            return;
        }
        println!();
        println!("Through PgBouncer (transaction pooling), synchronous_commit=on");
        if let Some(pgbouncer) = &self.pgbouncer {
            let settings: Vec<String> = pgbouncer
                .settings
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            println!(
                "{} at {}: {}",
                pgbouncer.version.as_deref().unwrap_or("PgBouncer"),
                pgbouncer.address,
                settings.join(", ")
            );
        }
        let concurrency = &self.settings.concurrency;
        let mut header = format!("{:<45}", "ratio");
        for c in concurrency {
            header += &format!(" {:>23}", format!("c={c}"));
        }
        println!("{header}");
        for (top, bottom, label) in POOLER_RATIOS {
            let name = format!("{}/{}", top.name(), bottom.name());
            let mut line = format!("{label:<45}");
            let mut any = false;
            for &c in concurrency {
                match self
                    .ratios
                    .iter()
                    .find(|r| r.name == name && r.sync == SyncCommit::On && r.concurrency == c)
                {
                    Some(r) => {
                        any = true;
                        let [q1, median, q3] = quartiles(&r.rounds);
                        line += &format!(
                            " {:>23}",
                            format!("{:.2} m{median:.2} {q1:.2}-{q3:.2}", r.value)
                        );
                    }
                    None => line += &format!(" {:>23}", "-"),
                }
            }
            if any {
                println!("{line}");
            }
        }
        println!(
            "(each cell: the ratio over all rounds, m: the median of the rounds' ratios, then their \
             quartiles; pgbouncer-*: the bench database through PgBouncer; bare and the idem \
             handler's insert .persistent(false), the handle built with Pooler::Transaction; \
             unprepared: the same SQL on a direct connection; the hop alone: PgBouncer against that)"
        );
    }

    /// Writes `results.json` and `throughput.svg` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, BoxError> {
        std::fs::create_dir_all(dir)?;
        let json = dir.join("results.json");
        std::fs::write(&json, serde_json::to_vec_pretty(self)?)?;
        let mut written = vec![json];
        if !self.cells.is_empty() {
            let svg = dir.join("throughput.svg");
            self.chart(&svg)?;
            written.push(svg);
        }
        Ok(written)
    }

    /// Throughput per scenario over concurrency, log scale.
    fn chart(&self, path: &Path) -> Result<(), BoxError> {
        let concurrency = &self.settings.concurrency;
        let n = concurrency.len() as i32;
        let max = self
            .cells
            .iter()
            .map(|c| c.msgs_per_sec)
            .fold(1.0, f64::max);
        let min = self
            .cells
            .iter()
            .map(|c| c.msgs_per_sec)
            .filter(|&r| r > 0.0)
            .fold(max, f64::min);
        let root = SVGBackend::new(path, (1000, 640)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "idem: messages per second by scenario and concurrency (PostgreSQL {}, {} cores)",
                    self.server_version, self.cores
                ),
                ("sans-serif", 20),
            )
            .margin(20)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (0..n - 1).into_segmented(),
                (min * 0.7..max * 1.5)
                    .log_scale()
                    .with_key_points(key_points(min * 0.7, max * 1.5)),
            )?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("concurrent workers")
            .y_desc("messages per second (log scale)")
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => concurrency
                    .get(*i as usize)
                    .map_or_else(String::new, |c| c.to_string()),
                _ => String::new(),
            })
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        let series: BTreeSet<(SyncCommit, Scenario)> =
            self.cells.iter().map(|c| (c.sync, c.scenario)).collect();
        for (index, (sync, scenario)) in series.into_iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            let points: Vec<(SegmentValue<i32>, f64)> = concurrency
                .iter()
                .enumerate()
                .filter_map(|(i, &c)| {
                    self.cells
                        .iter()
                        .find(|x| x.scenario == scenario && x.sync == sync && x.concurrency == c)
                        .map(|cell| (SegmentValue::CenterOf(i as i32), cell.msgs_per_sec))
                })
                .collect();
            let width = if sync == SyncCommit::On { 3 } else { 1 };
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(width)))?
                .label(format!(
                    "{} (synchronous_commit={})",
                    scenario.name(),
                    sync.name()
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|point| Circle::new(point, 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}
