//! What the bench reads from `/proc`: the CPU time of a process's threads and of one
//! database's PostgreSQL backends (`schedstat`, in nanoseconds), the load average.

use std::collections::HashMap;
use std::time::Instant;

/// The clocks at one moment of a run.
pub struct Sample {
    pub at: Instant,
    /// The consumer's threads' CPU, in nanoseconds, by thread.
    pub consumer: Threads,
    /// The bench database's backends' CPU, in nanoseconds, by process.
    pub postgres: Threads,
    /// Round trips through the proxy so far.
    pub round_trips: u64,
}

/// CPU time in nanoseconds by thread (or process) id.
#[derive(Debug, Clone, Default)]
pub struct Threads(HashMap<u32, u64>);

impl Threads {
    /// The CPU spent since `earlier`, in seconds, by the threads alive now: a thread that
    /// ended meanwhile is not counted (the bench samples while the consumer and its
    /// connections run), one that started counts from zero.
    pub fn since(&self, earlier: &Threads) -> f64 {
        let nanos: u64 = self
            .0
            .iter()
            .map(|(id, &now)| now.saturating_sub(earlier.0.get(id).copied().unwrap_or(0)))
            .sum();
        nanos as f64 / 1e9
    }
}

/// The CPU time of every thread of `pid` (`/proc/<pid>/task/<tid>/schedstat`).
pub fn process_threads(pid: u32) -> Threads {
    let mut threads = HashMap::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Some(nanos) = schedstat(&format!("/proc/{pid}/task/{tid}/schedstat")) {
                threads.insert(tid, nanos);
            }
        }
    }
    Threads(threads)
}

/// The first field of a `schedstat` file: time spent on a CPU, in nanoseconds.
fn schedstat(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The CPU of the backends connected to `database` now, by process: the processes
/// whose title is `postgres: ... <user> <database> <client> ...`. Backends that have
/// ended are not counted, so the bench reads this while the consumer's connections are
/// open.
pub fn backends(database: &str) -> Threads {
    let mut backends = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Threads(backends);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(title) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let title = String::from_utf8_lossy(&title);
        if !title.starts_with("postgres: ") {
            continue;
        }
        if title.split([' ', '\0']).any(|word| word == database)
            && let Some(nanos) = schedstat(&format!("/proc/{pid}/schedstat"))
        {
            backends.insert(pid, nanos);
        }
    }
    Threads(backends)
}

/// The 1-minute load average.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}
