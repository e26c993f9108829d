//! The watchdog of the Kafka tests (`support::watchdog`): a test that runs over its bound
//! ends the test binary with a failure that names it and shows every thread's state.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::watchdog::{self, BOUND_VARIABLE};

/// Set in the child process, whose test then hangs.
const HANG: &str = "IDEM_TEST_WATCHDOG_HANG";

#[test]
fn a_test_over_its_bound_ends_the_binary_and_says_where_it_hangs() {
    let started = Instant::now();
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "watchdog_ends_a_hung_test::hangs",
            "--include-ignored",
            "--nocapture",
        ])
        .env(HANG, "1")
        .env(BOUND_VARIABLE, "2")
        .output()
        .expect("the test binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(101),
        "the binary fails: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(150),
        "it ends soon after the bound, gdb's time included: {:?}",
        started.elapsed()
    );
    for expected in [
        "watchdog: the test `watchdog_ends_a_hung_test::hangs` has run for",
        "over its bound of 2 s",
        "test watchdog",
        "watchdog: ending the test binary: `watchdog_ends_a_hung_test::hangs` hangs",
    ] {
        assert!(stderr.contains(expected), "{expected:?} in:\n{stderr}");
    }
    // With gdb, the hung thread's stack shows where it waits.
    if stderr.contains("Thread ") {
        assert!(
            stderr.contains("kafka::watchdog_ends_a_hung_test::hangs"),
            "the hung test's frame:\n{stderr}"
        );
    }
}

/// Hangs, in the child process only.
#[test]
#[ignore = "run by a_test_over_its_bound_ends_the_binary_and_says_where_it_hangs"]
fn hangs() {
    if std::env::var_os(HANG).is_none() {
        return;
    }
    watchdog::watch_this_test();
    std::thread::sleep(Duration::from_secs(600));
    panic!("the watchdog did not end the binary");
}
