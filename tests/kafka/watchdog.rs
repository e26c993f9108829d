//! A test that hangs fails, and says where: a test that runs consumers is watched from the
//! moment it takes its turn until its thread ends (its members' drops included). One that
//! takes longer than the bound ([`BOUND_VARIABLE`], 15 minutes by default) stops the test
//! binary with a failure, after printing its name and every thread's state: where each
//! thread waits in the kernel and, when `gdb` is installed, each thread's stack.
//!
//! Without it, a consumer whose drop never returns holds the suite until CI's own limit,
//! which says nothing of the cause.

use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

/// The bound of one test, in seconds (unset: 900).
pub const BOUND_VARIABLE: &str = "IDEM_TEST_KAFKA_BOUND_SECS";

const DEFAULT_BOUND: Duration = Duration::from_secs(15 * 60);

/// How long `gdb` may take to print the stacks.
const GDB_BOUND: Duration = Duration::from_secs(90);

/// The watched tests: their thread, name and start.
static WATCHED: Mutex<Option<HashMap<ThreadId, (String, Instant)>>> = Mutex::new(None);

thread_local! {
    /// Ends the watch of this thread's test when the thread ends.
    static UNWATCH: Unwatch = const { Unwatch };
}

struct Unwatch;

impl Drop for Unwatch {
    fn drop(&mut self) {
        let id = thread::current().id();
        if let Some(watched) = lock().as_mut() {
            watched.remove(&id);
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<HashMap<ThreadId, (String, Instant)>>> {
    WATCHED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Watches the test of this thread from now until the thread ends (a test run on the main
/// thread, with `--test-threads=1`, is watched from its start until the next one starts).
pub fn watch_this_test() {
    let bound = bound();
    static WATCHER: OnceLock<()> = OnceLock::new();
    WATCHER.get_or_init(|| {
        thread::Builder::new()
            .name("test watchdog".into())
            .spawn(move || watch(bound))
            .expect("the watchdog's thread");
    });
    let current = thread::current();
    let name = current.name().unwrap_or("an unnamed test").to_owned();
    lock()
        .get_or_insert_with(HashMap::new)
        .insert(current.id(), (name, Instant::now()));
    UNWATCH.with(|_| {});
}

fn bound() -> Duration {
    match std::env::var(BOUND_VARIABLE) {
        Ok(seconds) => Duration::from_secs(
            seconds
                .parse()
                .unwrap_or_else(|_| panic!("{BOUND_VARIABLE}: a number of seconds")),
        ),
        Err(_) => DEFAULT_BOUND,
    }
}

fn watch(bound: Duration) {
    loop {
        thread::sleep(Duration::from_secs(1));
        let overdue = lock().as_ref().and_then(|watched| {
            watched
                .values()
                .find(|(_, since)| since.elapsed() > bound)
                .map(|(name, since)| (name.clone(), since.elapsed()))
        });
        if let Some((name, elapsed)) = overdue {
            fail(&name, elapsed, bound);
        }
    }
}

/// Prints what the process is doing and ends it with a failure.
fn fail(name: &str, elapsed: Duration, bound: Duration) -> ! {
    let mut out = std::io::stderr().lock();
    let _ = writeln!(
        out,
        "\n\nwatchdog: the test `{name}` has run for {:.0} s, over its bound of {} s ({BOUND_VARIABLE}); the threads of the test binary:",
        elapsed.as_secs_f64(),
        bound.as_secs()
    );
    let _ = writeln!(out, "{}", threads());
    let _ = writeln!(out, "{}", stacks());
    let _ = writeln!(out, "watchdog: ending the test binary: `{name}` hangs");
    drop(out);
    std::process::exit(101);
}

/// Every thread's name, state and kernel wait channel, from `/proc`.
fn threads() -> String {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return "  (no /proc/self/task)".into();
    };
    let mut lines = Vec::new();
    for task in tasks.flatten() {
        let path = task.path();
        let read = |file: &str| {
            std::fs::read_to_string(path.join(file))
                .map(|text| text.trim().to_owned())
                .unwrap_or_default()
        };
        let stat = read("stat");
        // The state follows the name, which is in parentheses and may hold spaces.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_owned();
        lines.push(format!(
            "  {:>8} {:<28} state {state} wchan {}",
            task.file_name().to_string_lossy(),
            read("comm"),
            read("wchan")
        ));
    }
    lines.sort();
    lines.join("\n")
}

/// Every thread's stack, by `gdb` attached to this process (when it is installed).
fn stacks() -> String {
    let child = Command::new("gdb")
        .args(["-p", &std::process::id().to_string(), "-batch", "-nx"])
        .args([
            "-ex",
            "set pagination off",
            "-ex",
            "set print frame-arguments none",
        ])
        .args(["-ex", "thread apply all bt 30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return "watchdog: no stacks (gdb is not installed)".into();
    };
    let stdout = child.stdout.take().expect("piped");
    let reader = thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let started = Instant::now();
    while started.elapsed() < GDB_BOUND {
        if let Ok(Some(_)) = child.try_wait() {
            return reader.join().unwrap_or_default();
        }
        thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    format!(
        "watchdog: gdb did not finish within {} s; what it printed:\n{}",
        GDB_BOUND.as_secs(),
        reader.join().unwrap_or_default()
    )
}
