//! The printout at the end of a run.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::invariants::Verdict;

/// What a run did and what the checks found.
pub struct Summary<'v> {
    /// The seed (`IDEM_FAULTS_SEED` repeats the run's choices).
    pub seed: u64,
    /// Distinct messages.
    pub messages: usize,
    /// Messages per kind of input.
    pub kinds: BTreeMap<&'static str, usize>,
    /// Deliveries made.
    pub deliveries: u64,
    /// Faults per kind.
    pub faults: Vec<(&'static str, u64)>,
    /// Cache writes that failed after their commit: Redis went down between the commit
    /// and the cache write (the success is then only in PostgreSQL, as it must be).
    pub cache_write_errors: u64,
    /// Duplicates answered by Redis.
    pub cache_hits: u64,
    /// The checks' findings.
    pub verdict: &'v Verdict,
    /// From the start of the cluster to the end of the checks.
    pub wall_time: Duration,
}

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.verdict;
        writeln!(f, "idem fault suite: ledger workload (seed {})", self.seed)?;
        writeln!(
            f,
            "  {:<46} {:>9}",
            "messages (distinct inputs)", self.messages
        )?;
        for (kind, count) in &self.kinds {
            writeln!(f, "    {kind:<44} {count:>9}")?;
        }
        writeln!(
            f,
            "  {:<46} {:>9}",
            "deliveries (duplicates, retries included)", self.deliveries
        )?;
        writeln!(f, "  faults injected:")?;
        for (kind, count) in &self.faults {
            writeln!(f, "    {kind:<44} {count:>9}")?;
        }
        writeln!(
            f,
            "    {:<44} {:>9}",
            "cache writes failed after a commit", self.cache_write_errors
        )?;
        writeln!(
            f,
            "  {:<46} {:>9}",
            "duplicates answered by Redis", self.cache_hits
        )?;
        writeln!(
            f,
            "  {:<46} {:>9}",
            "effects applied (rows)", v.effects_applied
        )?;
        writeln!(
            f,
            "    {:<44} {:>9}",
            "receipts run again after a purge", v.reruns_after_purge
        )?;
        writeln!(
            f,
            "    {:<44} {:>9}",
            "external calls repeated, absorbed", v.external_repeats
        )?;
        writeln!(f, "  {:<46} {:>9}", "successes", v.successes)?;
        writeln!(f, "  {:<46} {:>9}", "dead-lettered", v.dead_letters)?;
        for (reason, count) in &v.dead_letters_by_reason {
            writeln!(f, "    {reason:<44} {count:>9}")?;
        }
        writeln!(f, "  {:<46} {:>9}", "parked keys", v.parked_keys)?;
        writeln!(f, "  {:<46} {:>9}", "lost", v.lost.len())?;
        writeln!(f, "  {:<46} {:>9}", "doubled", v.doubled.len())?;
        writeln!(
            f,
            "  {:<46} {:>9}",
            "other invariants broken",
            v.violations.len()
        )?;
        write!(
            f,
            "  {:<46} {:>8.1}s",
            "wall time",
            self.wall_time.as_secs_f64()
        )
    }
}
