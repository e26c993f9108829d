//! What the commands print: aligned tables for people, one JSON document with `--json`.

use idem_runtime::admin::{
    Change, Cursor, KeyRow, MigrationState, PurgePlan, ScopeInfo, Stats, TimeBuckets,
};
use idem_runtime::retention::PurgeReport;
use serde::Serialize;

/// Writes to stdout; a closed pipe (`idem keys list | head`) ends the output quietly.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// [`out!`] with a newline.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Where and how results are printed.
pub struct Output {
    /// One JSON document instead of tables.
    pub json: bool,
}

/// Columns padded to their widest cell.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut text = line(header.to_vec());
    text.push('\n');
    for row in rows {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
        text.push('\n');
    }
    text
}

fn time(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// A positive span to the minute: `2h05m`, `45m`, `0m`.
fn rough(span: chrono::TimeDelta) -> String {
    let minutes = span.num_minutes();
    if minutes >= 60 {
        format!("{}h{:02}m", minutes / 60, minutes % 60)
    } else {
        format!("{minutes}m")
    }
}

/// An instant to the microsecond (a fact's time, as the time buckets keep it).
fn precise_time(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// The catalog's estimate of a bucket's rows: `?` before its first `VACUUM` or `ANALYZE`.
fn estimated_rows(rows: Option<i64>) -> String {
    rows.map_or_else(|| "?".to_owned(), |rows| format!("~{rows}"))
}

/// A size in bytes, in the largest unit that keeps it above 1.
fn size(bytes: i64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// Milliseconds in the largest unit that divides them: `30d`, `36h`, `90s`, `1500ms`.
pub(crate) fn duration(millis: i64) -> String {
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if millis % size == 0 {
            return format!("{}{unit}", millis / size);
        }
    }
    format!("{millis}ms")
}

/// An error text on one line, at most `max` characters.
fn short(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    } else {
        line
    }
}

impl Output {
    /// Text as it is, on stdout.
    pub(crate) fn text(&self, text: &str) {
        out!("{text}");
    }

    pub(crate) fn json(&self, value: &impl Serialize) {
        outln!(
            "{}",
            serde_json::to_string_pretty(value)
                .unwrap_or_else(|error| format!("{{\"error\": \"cannot write JSON: {error}\"}}"))
        );
    }

    pub fn migrated(&self, schema: &str, applied: &[MigrationState]) {
        if self.json {
            self.json(&serde_json::json!({ "schema": schema, "applied": applied }));
        } else if applied.is_empty() {
            outln!("schema {schema}: up to date");
        } else {
            for migration in applied {
                outln!("applied {:04} {}", migration.version, migration.description);
            }
            outln!("schema {schema}: up to date");
        }
    }

    pub fn migrations(&self, migrations: &[MigrationState]) {
        if self.json {
            let pending = migrations.iter().filter(|m| !m.applied).count();
            let unknown = migrations.iter().filter(|m| !m.known).count();
            self.json(&serde_json::json!({
                "migrations": migrations,
                "pending": pending,
                "unknown": unknown,
            }));
            return;
        }
        let rows: Vec<Vec<String>> = migrations
            .iter()
            .map(|m| {
                let state = match (m.applied, m.known) {
                    (true, true) => "applied",
                    (false, _) => "pending",
                    (true, false) => "applied, unknown",
                };
                vec![
                    format!("{:04}", m.version),
                    state.to_owned(),
                    m.description.clone(),
                ]
            })
            .collect();
        out!("{}", table(&["VERSION", "STATE", "DESCRIPTION"], &rows));
        if migrations.iter().any(|m| !m.known) {
            outln!(
                "applied, unknown: applied by a later release of idem; this one keeps working on them"
            );
        }
    }

    pub fn key(&self, row: &KeyRow) {
        if self.json {
            self.json(row);
            return;
        }
        let optional = |value: Option<String>| value.unwrap_or_else(|| "-".to_owned());
        let fields = [
            ("scope", row.scope.clone()),
            ("key", row.key.to_string()),
            ("status", row.status.clone()),
            ("attempts", row.attempts.to_string()),
            ("created_at", time(&row.created_at)),
            ("updated_at", time(&row.updated_at)),
            ("fingerprint", optional(row.fingerprint.clone())),
            (
                "lease_owner",
                optional(row.lease_owner.map(|o| o.to_string())),
            ),
            (
                "lease_expires_at",
                optional(row.lease_expires_at.as_ref().map(time)),
            ),
            (
                "result",
                optional(row.result.as_ref().map(|r| r.to_string())),
            ),
            ("last_error", optional(row.last_error.clone())),
        ];
        for (name, value) in fields {
            outln!("{name:<17}{value}");
        }
        // A key kept by its fact's time, in the bucket of that time.
        if let Some(fact_time) = &row.fact_time {
            outln!("{:<17}{}", "fact_time", precise_time(fact_time));
        }
    }

    /// The keys' table; with a `FACT TIME` column before `LAST ERROR` when a key of
    /// the page is kept by its fact's time.
    fn key_rows(rows: &[KeyRow]) -> String {
        let timed = rows.iter().any(|row| row.fact_time.is_some());
        let rows: Vec<Vec<String>> = rows
            .iter()
            .map(|row| {
                let mut cells = vec![
                    row.scope.clone(),
                    row.key.to_string(),
                    row.status.clone(),
                    row.attempts.to_string(),
                    time(&row.updated_at),
                ];
                if timed {
                    cells.push(
                        row.fact_time
                            .as_ref()
                            .map_or_else(|| "-".to_owned(), precise_time),
                    );
                }
                cells.push(short(row.last_error.as_deref().unwrap_or(""), 60));
                cells
            })
            .collect();
        let mut header = vec!["SCOPE", "KEY", "STATUS", "ATTEMPTS", "UPDATED"];
        if timed {
            header.push("FACT TIME");
        }
        header.push("LAST ERROR");
        table(&header, &rows)
    }

    pub fn list(&self, rows: &[KeyRow], next: Option<&Cursor>) {
        if self.json {
            self.json(&serde_json::json!({
                "keys": rows,
                "next": next.map(ToString::to_string),
            }));
            return;
        }
        out!("{}", Self::key_rows(rows));
        match next {
            Some(cursor) => outln!("more: --after '{cursor}'"),
            None => outln!("{} key(s)", rows.len()),
        }
    }

    pub fn change(&self, verb: &str, change: &Change) {
        if self.json {
            self.json(&serde_json::json!({
                "dry_run": change.dry_run,
                "count": change.keys.len(),
                "keys": change.keys,
            }));
            return;
        }
        if !change.keys.is_empty() {
            out!("{}", Self::key_rows(&change.keys));
        }
        if change.dry_run {
            outln!("dry run: {} key(s) would be {verb}", change.keys.len());
        } else {
            outln!("{} key(s) {verb}", change.keys.len());
        }
    }

    pub fn purge(&self, report: &PurgeReport) {
        if self.json {
            self.json(report);
            return;
        }
        if report.locked_out {
            outln!("another cleaner of this status table is running: nothing deleted");
            return;
        }
        let rows: Vec<Vec<String>> = report
            .by_scope
            .iter()
            .map(|(scope, count)| vec![scope.clone(), count.to_string()])
            .collect();
        if !rows.is_empty() {
            out!("{}", table(&["SCOPE", "KEYS"], &rows));
        }
        if report.dry_run {
            outln!("dry run: {} key(s) would be deleted", report.deleted);
        } else {
            outln!(
                "deleted {} key(s) in {} batch(es), {} timeout(s), {} ms{}",
                report.deleted,
                report.batches,
                report.timeouts,
                report.elapsed_ms,
                if report.finished {
                    ""
                } else {
                    " (stopped early: run again)"
                }
            );
            if report.buckets_made > 0 || report.buckets_dropped > 0 {
                outln!(
                    "time buckets: {} made ahead, {} expired dropped with their keys",
                    report.buckets_made,
                    report.buckets_dropped
                );
            }
        }
    }

    /// What `purge --dry-run` found: the keys and the time buckets.
    pub fn purge_plan(&self, plan: &PurgePlan) {
        if self.json {
            self.json(plan);
            return;
        }
        self.purge(&plan.report);
        for bucket in &plan.buckets_to_make {
            outln!(
                "dry run: time bucket {} to {} would be made",
                time(&bucket.starts_at),
                time(&bucket.ends_at)
            );
        }
        for bucket in &plan.buckets_to_drop {
            outln!(
                "dry run: time bucket {} ({} to {}, {}) would be dropped with its keys",
                bucket.name,
                time(&bucket.starts_at),
                time(&bucket.ends_at),
                estimated_rows(bucket.estimated_rows)
            );
        }
        if !plan.buckets_to_make.is_empty() || !plan.buckets_to_drop.is_empty() {
            outln!(
                "dry run: {} time bucket(s) would be made, {} dropped",
                plan.buckets_to_make.len(),
                plan.buckets_to_drop.len()
            );
        }
    }

    /// The overview; with `every_bucket`, the time buckets' lines and every bucket after it.
    pub fn stats(&self, stats: &Stats, every_bucket: bool) {
        if self.json {
            self.json(stats);
            return;
        }
        // The fact times of the scopes kept by them, after the status table's columns.
        let timed = stats.counts.iter().any(|count| count.timed);
        let rows: Vec<Vec<String>> = stats
            .counts
            .iter()
            .map(|count| {
                let mut cells = vec![
                    count.scope.clone(),
                    count.status.clone(),
                    count.count.to_string(),
                    time(&count.oldest),
                ];
                if timed {
                    cells.push(match (&count.oldest_fact, &count.newest_fact) {
                        (Some(oldest), Some(newest)) => {
                            format!("{} to {}", time(oldest), time(newest))
                        }
                        _ => "-".to_owned(),
                    });
                }
                cells
            })
            .collect();
        let mut header = vec!["SCOPE", "STATUS", "KEYS", "OLDEST"];
        if timed {
            header.push("FACTS");
        }
        out!("{}", table(&header, &rows));
        outln!("total keys: {}", stats.total);
        if stats.timed_total > 0 {
            outln!("keys kept by their fact's time: {}", stats.timed_total);
        }
        match &stats.oldest_lease {
            Some(lease) => outln!(
                "oldest lease in progress: {} {} since {}{}",
                lease.scope,
                lease.key,
                time(&lease.since),
                if lease.expired { " (expired)" } else { "" }
            ),
            None => outln!("oldest lease in progress: none"),
        }
        outln!("table size: {}", size(stats.table_bytes));
        for window in &stats.windows {
            outln!(
                "retention of {}: {} (declared by its handler)",
                window.scope,
                duration(window.retention_ms)
            );
        }
        // The time buckets, once keys are kept by their fact's time (or were: a horizon).
        if every_bucket || stats.timed_total > 0 || stats.buckets.horizon.is_some() {
            Self::bucket_summary(&stats.buckets);
        }
        if every_bucket {
            Self::bucket_table(&stats.buckets);
        }
    }

    /// The lines of `stats` on the time buckets.
    fn bucket_summary(buckets: &TimeBuckets) {
        match (&buckets.oldest, &buckets.newest_end) {
            (Some(oldest), Some(newest_end)) => outln!(
                "time buckets: {} for facts from {} to {}, about {} key(s) (estimated), {}",
                buckets.count,
                time(oldest),
                time(newest_end),
                buckets.estimated_rows,
                size(buckets.bytes)
            ),
            _ => outln!("time buckets: none"),
        }
        if let Some(newest_end) = &buckets.newest_end {
            let ahead = *newest_end - chrono::Utc::now();
            if ahead > chrono::TimeDelta::zero() {
                outln!(
                    "time buckets made ahead: {} (until {})",
                    rough(ahead),
                    time(newest_end)
                );
            } else {
                outln!(
                    "time buckets made ahead: none (the newest ended {}): is the retention cleanup running?",
                    time(newest_end)
                );
            }
        }
        match &buckets.horizon {
            Some(horizon) => outln!(
                "time bucket horizon: {}: facts before it are refused as outside the window",
                time(horizon)
            ),
            None => outln!("time bucket horizon: none (no bucket has expired)"),
        }
    }

    /// The time buckets alone, as JSON (`stats --buckets --json`).
    pub fn buckets(&self, buckets: &TimeBuckets) {
        self.json(buckets);
    }

    /// Every time bucket, a line each.
    fn bucket_table(buckets: &TimeBuckets) {
        let rows: Vec<Vec<String>> = buckets
            .buckets
            .iter()
            .map(|bucket| {
                vec![
                    bucket.name.clone(),
                    time(&bucket.starts_at),
                    time(&bucket.ends_at),
                    estimated_rows(bucket.estimated_rows),
                    size(bucket.bytes),
                ]
            })
            .collect();
        out!(
            "{}",
            table(&["BUCKET", "FROM", "TO", "KEYS (ESTIMATED)", "SIZE"], &rows)
        );
    }

    /// The scopes the status table records, with what their keys are made of.
    pub fn scopes(&self, scopes: &[ScopeInfo]) {
        if self.json {
            self.json(&serde_json::json!({ "scopes": scopes }));
            return;
        }
        let rows: Vec<Vec<String>> = scopes
            .iter()
            .map(|scope| {
                let (owner, handler) = if scope.shared {
                    ("(shared)".to_owned(), String::new())
                } else {
                    (
                        scope.owner.clone().unwrap_or_default(),
                        scope.handler.clone().unwrap_or_default(),
                    )
                };
                vec![
                    scope.scope.clone(),
                    owner,
                    handler,
                    scope
                        .key_definition
                        .clone()
                        .unwrap_or_else(|| "(not recorded)".to_owned()),
                ]
            })
            .collect();
        out!(
            "{}",
            table(&["SCOPE", "OWNER", "HANDLER", "KEY DEFINITION"], &rows)
        );
        for scope in scopes {
            if let Some(previous) = &scope.previous_key_definition {
                let seen = scope
                    .previous_key_seen_at
                    .as_ref()
                    .map_or("never".to_owned(), time);
                outln!(
                    "{}: key changed from `{previous}` (previous_key) since {}; last delivery answered by the previous key alone: {seen}",
                    scope.scope,
                    scope.key_defined_at.as_ref().map_or("-".to_owned(), time),
                );
            }
        }
    }

    /// The result of `scopes release`.
    pub fn released_scope(&self, scope: &str) {
        if self.json {
            self.json(&serde_json::json!({ "scope": scope, "released": true }));
        } else {
            outln!("scope {scope}: released; the next handler that runs with it records itself");
        }
    }
}
