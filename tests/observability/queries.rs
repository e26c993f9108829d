//! The queries to check: every expression of the Grafana dashboard (its template
//! variables' values replaced the way Grafana replaces them), every template variable's
//! `label_values`, and the underlying queries of each alerting rule (its threshold
//! comparisons removed).

use serde_json::Value;

/// What Grafana puts for `$__rate_interval` and the variables' "All" (`allValue`).
const RATE_INTERVAL: &str = "1m";
const ALL: &str = ".*";

/// One query of the dashboard: the panel's title, and the PromQL to send.
#[derive(Debug)]
pub struct PanelQuery {
    pub panel: String,
    pub expr: String,
}

/// Every `expr` of every panel's targets (rows' nested panels included), with the
/// dashboard's variables replaced.
pub fn dashboard_queries(dashboard: &Value) -> Vec<PanelQuery> {
    let variables: Vec<String> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|variable| {
            variable["name"]
                .as_str()
                .expect("a variable's name")
                .to_owned()
        })
        .collect();
    let mut queries = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a target's expr");
            let mut expr = expr.replace("$__rate_interval", RATE_INTERVAL);
            for name in &variables {
                expr = expr
                    .replace(&format!("${{{name}}}"), ALL)
                    .replace(&format!("${name}"), ALL);
            }
            assert!(!expr.contains('$'), "a variable left in {expr}");
            queries.push(PanelQuery {
                panel: panel["title"].as_str().unwrap_or("?").to_owned(),
                expr,
            });
        }
    }
    queries
}

/// The `(metric, label)` of each query variable's `label_values(metric, label)`.
pub fn variable_label_values(dashboard: &Value) -> Vec<(String, String, String)> {
    dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter(|variable| variable["type"] == "query")
        .map(|variable| {
            let name = variable["name"].as_str().unwrap_or("?").to_owned();
            let query = variable["query"]["query"]
                .as_str()
                .or(variable["query"].as_str())
                .expect("a query variable's query");
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|rest| rest.strip_suffix(')'))
                .unwrap_or_else(|| panic!("variable {name}: label_values(metric, label): {query}"));
            let (metric, label) = inner
                .split_once(',')
                .unwrap_or_else(|| panic!("variable {name}: label_values(metric, label)"));
            (name, metric.trim().to_owned(), label.trim().to_owned())
        })
        .collect()
}

/// The queries under an alert's expression: the operands of its top-level `unless`,
/// `and` and `or` (with their `on (...)` or `ignoring (...)`), each without its
/// threshold comparison (`> 300`, `>= bool 1`, ...) and outer parentheses.
pub fn underlying_queries(expr: &str) -> Vec<String> {
    split_set_operations(expr)
        .into_iter()
        .map(|operand| unwrap_parentheses(strip_comparison(unwrap_parentheses(operand))).to_owned())
        .collect()
}

/// The byte offsets of `text`'s characters at parenthesis depth 0 (and outside
/// strings and brackets).
fn top_level(text: &str) -> Vec<bool> {
    let mut depth = 0i32;
    let mut quote: Option<u8> = None;
    let bytes = text.as_bytes();
    let mut top = vec![false; bytes.len()];
    for (i, &byte) in bytes.iter().enumerate() {
        if let Some(q) = quote {
            if byte == q && bytes.get(i.wrapping_sub(1)) != Some(&b'\\') {
                quote = None;
            }
            continue;
        }
        match byte {
            b'"' | b'\'' | b'`' => quote = Some(byte),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => top[i] = depth == 0,
        }
    }
    top
}

fn split_set_operations(expr: &str) -> Vec<&str> {
    let top = top_level(expr);
    let bytes = expr.as_bytes();
    let word = |i: usize, w: &str| {
        expr[i..].starts_with(w)
            && top[i]
            && (i == 0 || bytes[i - 1].is_ascii_whitespace() || bytes[i - 1] == b')')
            && bytes
                .get(i + w.len())
                .is_none_or(|b| b.is_ascii_whitespace() || *b == b'(')
    };
    let mut operands = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(op) = ["unless", "and", "or"].into_iter().find(|op| word(i, op)) {
            operands.push(expr[start..i].trim());
            let mut rest = i + op.len();
            // A matching modifier: `on (labels)` or `ignoring (labels)`.
            let after = expr[rest..].trim_start();
            if let Some(modifier) = ["on", "ignoring"]
                .into_iter()
                .find(|m| after.starts_with(m) && after[m.len()..].trim_start().starts_with('('))
            {
                rest = expr.len() - after.len() + modifier.len();
                let close = expr[rest..].find(')').expect("a closing parenthesis");
                rest += close + 1;
            }
            start = rest;
            i = rest;
        } else {
            i += 1;
        }
    }
    operands.push(expr[start..].trim());
    operands
}

/// `expr` without a trailing top-level comparison with a number.
fn strip_comparison(expr: &str) -> &str {
    let top = top_level(expr);
    let bytes = expr.as_bytes();
    for i in (0..bytes.len()).rev() {
        if !top[i] || !matches!(bytes[i], b'>' | b'<' | b'=' | b'!') {
            continue;
        }
        let start = if i > 0 && matches!(bytes[i - 1], b'>' | b'<' | b'=' | b'!') {
            i - 1
        } else {
            i
        };
        let rest = expr[i + 1..].trim();
        let rest = rest.strip_prefix("bool").map_or(rest, str::trim);
        if rest.parse::<f64>().is_ok() {
            return expr[..start].trim();
        }
        break;
    }
    expr
}

/// `expr` without parentheses that enclose all of it.
fn unwrap_parentheses(mut expr: &str) -> &str {
    loop {
        expr = expr.trim();
        if !(expr.starts_with('(') && expr.ends_with(')')) {
            return expr;
        }
        // The first parenthesis must close at the very end.
        let mut depth = 0;
        for (i, byte) in expr.bytes().enumerate() {
            match byte {
                b'(' => depth += 1,
                b')' => depth -= 1,
                _ => {}
            }
            if depth == 0 && i < expr.len() - 1 {
                return expr;
            }
        }
        expr = &expr[1..expr.len() - 1];
    }
}

#[test]
fn an_alerts_underlying_queries_are_its_operands_without_their_thresholds() {
    assert_eq!(
        underlying_queries("max by (group) (idem_kafka_partition_still_seconds) > 300"),
        ["max by (group) (idem_kafka_partition_still_seconds)"]
    );
    assert_eq!(
        underlying_queries(
            "(sum by (scope) (increase(x_total[1d])) > 0) unless on (scope) (sum by (scope) (increase(x_total[6h])) >= bool 1)"
        ),
        [
            "sum by (scope) (increase(x_total[1d]))",
            "sum by (scope) (increase(x_total[6h]))"
        ]
    );
    assert_eq!(
        underlying_queries(
            r#"sum(rate(x_total{outcome=~"a|b", k!="v>1"}[5m])) / sum(rate(x_total[5m]))"#
        ),
        [r#"sum(rate(x_total{outcome=~"a|b", k!="v>1"}[5m])) / sum(rate(x_total[5m]))"#]
    );
    assert_eq!(
        underlying_queries("a > b and ignoring (x) c"),
        ["a > b", "c"]
    );
}
