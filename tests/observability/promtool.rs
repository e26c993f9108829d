//! `promtool check rules` and `promtool test rules` on ops/prometheus: no error, no
//! warning, every unit test passing.

use std::process::Command;

use crate::prometheus::{Prometheus, repository};

fn promtool(prometheus: &Prometheus, args: &[&str]) -> String {
    let output = Command::new(&prometheus.promtool)
        .args(args)
        .current_dir(repository().join("ops/prometheus"))
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("$ promtool {}\n{text}", args.join(" "));
    assert!(
        output.status.success(),
        "promtool {} failed ({}):\n{text}",
        args.join(" "),
        output.status
    );
    text
}

#[test]
fn the_alerting_rules_pass_promtool_check_and_their_unit_tests() {
    // The server itself is not needed here: services.sh brings promtool with it.
    let prometheus = Prometheus::start("promtool", 19190, &[], &[]);
    let checked = promtool(&prometheus, &["check", "rules", "idem-alerts.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    assert!(!checked.contains("WARNING"), "{checked}");
    let tested = promtool(&prometheus, &["test", "rules", "idem-alerts.test.yml"]);
    assert!(
        tested.contains("SUCCESS") && !tested.contains("FAILED"),
        "{tested}"
    );
}
