//! What a benchmark found: every comparison with its medians, the proxy's
//! throughput, the reference tools on their own, and the errors; printed
//! as a table or as JSON.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::measure::Stats;

/// One hako figure against its reference, measured in the same loop.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The figure's plain name within its backend, e.g.
    /// `warm_exec.ratio_vs_fork_exec` (see [`Report::figures`]).
    pub figure: String,
    /// What was measured, in words.
    pub name: String,
    /// The backend measured (`docker+runsc` for docker on gVisor).
    pub backend: Option<&'static str>,
    /// hako's runs.
    pub hako: Stats,
    /// The reference, in words (its command line for a tool).
    pub reference: String,
    /// The reference's runs.
    pub reference_stats: Stats,
    /// hako median / reference median: lower is better, 1.0 is parity.
    pub ratio: f64,
}

/// A [`Comparison`], its ratio computed from the medians.
pub(crate) fn compare(
    figure: String,
    name: String,
    backend: Option<&'static str>,
    hako: Stats,
    reference: &str,
    reference_stats: Stats,
) -> Comparison {
    Comparison {
        figure,
        name,
        backend,
        hako,
        reference: reference.to_string(),
        ratio: hako.median_us / reference_stats.median_us.max(f64::MIN_POSITIVE),
        reference_stats,
    }
}

/// A reference tool measured on its own, or why it was not.
#[derive(Debug, Clone, Serialize)]
pub struct Reference {
    /// The tool's command line.
    pub tool: String,
    /// Its runs, when it ran.
    pub stats: Option<Stats>,
    /// Why it did not run, when it did not.
    pub skipped: Option<String>,
}

/// Bytes moved per second, hako's path against the direct one.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// Plain name, as in [`Comparison::figure`].
    pub figure: String,
    /// What was measured, in words.
    pub name: String,
    /// The backend measured.
    pub backend: &'static str,
    /// Bytes each transfer moved.
    pub bytes: u64,
    /// hako's median throughput, in MiB/s.
    pub hako_mib_s: f64,
    /// The direct path, in words.
    pub reference: String,
    /// The direct path's median throughput, in MiB/s.
    pub reference_mib_s: f64,
    /// hako's throughput / the reference's: higher is better, 1.0 is parity.
    pub ratio: f64,
}

/// Everything one benchmark measured; its JSON is what `hako bench --json`
/// prints.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Runs per measurement.
    pub iterations: usize,
    /// How the measured `hako` was linked: `static` (as `scripts/build`
    /// links it), `dynamic`, or `unknown`. A dynamic one starts slower.
    pub linked: &'static str,
    /// Every ratio by backend and plain name (`cold_run.ratio_vs_bwrap`,
    /// `warm_exec.ratio_vs_fork_exec`, ...), for scripts.
    pub figures: BTreeMap<String, BTreeMap<String, f64>>,
    /// Each hako figure against its reference.
    pub comparisons: Vec<Comparison>,
    /// Throughput through the egress proxy (the `linux` backend).
    pub throughput: Vec<Throughput>,
    /// The reference tools measured on their own.
    pub references: Vec<Reference>,
    /// What could not be measured, one line each (a backend that failed).
    pub errors: Vec<String>,
    /// The copy-on-write findings (`hako bench --cow`) beside their
    /// ratios; absent from other runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cow: Option<crate::cow::CowFindings>,
}

impl Report {
    /// An empty report of `iterations` runs each, of a `hako` linked as
    /// `linked` says.
    pub(crate) fn new(iterations: usize, linked: &'static str) -> Report {
        Report {
            iterations,
            linked,
            figures: BTreeMap::new(),
            comparisons: Vec::new(),
            throughput: Vec::new(),
            references: Vec::new(),
            errors: Vec::new(),
            cow: None,
        }
    }

    /// Fills [`Report::figures`] from the comparisons and the throughput.
    pub(crate) fn index_figures(&mut self) {
        for c in &self.comparisons {
            if let Some(backend) = c.backend {
                self.figures
                    .entry(backend.to_string())
                    .or_default()
                    .insert(c.figure.clone(), c.ratio);
            }
        }
        for t in &self.throughput {
            self.figures
                .entry(t.backend.to_string())
                .or_default()
                .insert(t.figure.clone(), t.ratio);
        }
    }

    /// The report as pretty-printed JSON (empty if it cannot be written).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The report as a table for people, one line each, every line ended.
    pub fn table(&self) -> Table<'_> {
        Table(self)
    }
}

/// [`Report::table`]: the plain output of `hako bench`.
pub struct Table<'a>(&'a Report);

impl fmt::Display for Table<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self.0;
        writeln!(
            f,
            "{} runs each; median (p90); ratio = hako / reference, lower is better",
            report.iterations
        )?;
        if report.linked == "dynamic" {
            writeln!(f, "note: this hako is dynamically linked, and its cold starts pay for the dynamic loader; ./scripts/build links it static-pie")?;
        }
        for c in &report.comparisons {
            writeln!(
                f,
                "{:<62} {:>9.1} us ({:>9.1})  vs {:<16} {:>9.1} us  ratio {:>6.2}",
                c.name,
                c.hako.median_us,
                c.hako.p90_us,
                c.reference,
                c.reference_stats.median_us,
                c.ratio
            )?;
        }
        for t in &report.throughput {
            writeln!(
                f,
                "{:<62} {:>9.0} MiB/s  vs {:<16} {:>9.0} MiB/s  ratio {:>6.2} (higher is better)",
                t.name, t.hako_mib_s, t.reference, t.reference_mib_s, t.ratio
            )?;
        }
        for r in &report.references {
            match (&r.stats, &r.skipped) {
                (Some(s), _) => writeln!(f, "reference {:<52} {:>9.1} us", r.tool, s.median_us)?,
                (None, Some(why)) => writeln!(f, "reference {:<52} skipped: {why}", r.tool)?,
                _ => {}
            }
        }
        if let Some(cow) = &report.cow {
            if let (Some(ratio), Some(met)) = (cow.write_ratio, cow.write_meets_goal) {
                writeln!(
                    f,
                    "copy-on-write write job: ratio {ratio:.2}, goal at most {:.2}: {}",
                    cow.write_goal,
                    if met { "met" } else { "NOT met" }
                )?;
            }
            writeln!(
                f,
                "hako diff walked {} upper-layer entries and {} workspace entries, listed {} workspace directories, found {} of {} changes (git status listed {}) in {} files",
                cow.visited.upper_entries,
                cow.visited.lower_entries,
                cow.visited.lower_dirs_listed,
                cow.changes_found,
                cow.diff_changes,
                cow.git_status_lines,
                cow.diff_files
            )?;
            writeln!(
                f,
                "setup (trees, tar, git repository): {:.1} s",
                cow.setup_s
            )?;
        }
        for e in &report.errors {
            writeln!(f, "error: {e}")?;
        }
        Ok(())
    }
}

/// How the executable at `exe` (none: unknown) was linked: `dynamic` when
/// it names a program interpreter (the dynamic loader), `static` when it
/// does not.
pub(crate) fn linkage(exe: Option<&Path>) -> &'static str {
    match exe.and_then(hako_container::is_static_elf) {
        Some(true) => "static",
        Some(false) => "dynamic",
        None => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(median_us: f64) -> Stats {
        Stats {
            median_us,
            p90_us: median_us * 2.0,
        }
    }

    fn sample() -> Report {
        let mut report = Report::new(3, "dynamic");
        report.comparisons.push(compare(
            "warm_exec.ratio_vs_fork_exec".into(),
            "exec true in an open host sandbox (library)".into(),
            Some("host"),
            stats(300.0),
            "fork/exec true",
            stats(200.0),
        ));
        report.throughput.push(Throughput {
            figure: "proxy_throughput.ratio_vs_loopback".into(),
            name: "linux 100 MiB".into(),
            backend: "linux",
            bytes: 100 << 20,
            hako_mib_s: 900.0,
            reference: "direct loopback".into(),
            reference_mib_s: 1000.0,
            ratio: 0.9,
        });
        report.references.push(Reference {
            tool: "bwrap".into(),
            stats: None,
            skipped: Some("bwrap is not installed".into()),
        });
        report.errors.push("Docker: no daemon".into());
        report.index_figures();
        report
    }

    #[test]
    fn ratios_are_hako_over_the_reference_and_indexed_by_backend() {
        let report = sample();
        assert_eq!(report.comparisons[0].ratio, 1.5);
        assert_eq!(report.figures["host"]["warm_exec.ratio_vs_fork_exec"], 1.5);
        assert_eq!(
            report.figures["linux"]["proxy_throughput.ratio_vs_loopback"],
            0.9
        );
        // A reference measured at zero does not divide by it.
        let c = compare(
            String::new(),
            String::new(),
            None,
            stats(1.0),
            "",
            stats(0.0),
        );
        assert!(c.ratio.is_finite());
    }

    #[test]
    fn json_keeps_its_shape() {
        let json = sample().to_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        // The top-level keys, in the order they are printed.
        let at = |key: &str| json.find(&format!("\n  \"{key}\": "));
        let order: Vec<Option<usize>> = [
            "iterations",
            "linked",
            "figures",
            "comparisons",
            "throughput",
            "references",
            "errors",
        ]
        .into_iter()
        .map(at)
        .collect();
        assert!(order.iter().all(Option::is_some), "{json}");
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{json}");
        assert_eq!(v.as_object().map(|o| o.len()), Some(7));
        let c = &v["comparisons"][0];
        assert_eq!(c["backend"], "host");
        assert_eq!(c["hako"]["median_us"], 300.0);
        assert_eq!(c["reference_stats"]["p90_us"], 400.0);
        assert_eq!(v["references"][0]["stats"], serde_json::Value::Null);
        assert_eq!(v["throughput"][0]["bytes"], 100 << 20);
    }

    #[test]
    fn the_table_has_a_line_for_each_finding() {
        let table = sample().table().to_string();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 6, "{table}");
        assert!(lines[0].starts_with("3 runs each"));
        assert!(lines[1].starts_with("note: this hako is dynamically linked"));
        assert!(lines[2].ends_with("ratio   1.50"), "{}", lines[2]);
        assert!(lines[3].ends_with("(higher is better)"));
        assert!(lines[4].ends_with("skipped: bwrap is not installed"));
        assert_eq!(lines[5], "error: Docker: no daemon");
        assert!(table.ends_with('\n'));
    }

    #[test]
    fn a_cow_report_carries_its_findings_and_says_whether_the_goal_is_met() {
        let mut report = Report::new(2, "static");
        report.comparisons.push(compare(
            crate::cow::figure::WRITE.into(),
            "linux --cow: untar".into(),
            Some("linux"),
            stats(120.0),
            "plain",
            stats(100.0),
        ));
        report.cow = Some(crate::cow::CowFindings {
            files: 20_000,
            rewritten: 2_000,
            write_goal: crate::cow::WRITE_GOAL,
            write_ratio: Some(1.2),
            write_meets_goal: Some(false),
            diff_files: 100_000,
            diff_changes: 100,
            changes_found: 100,
            git_status_lines: 100,
            visited: crate::cow::Walked {
                upper_entries: 250,
                lower_entries: 250,
                lower_dirs_listed: 0,
            },
            setup_s: 1.5,
        });
        report.index_figures();
        assert_eq!(report.figures["linux"]["cow_write.ratio_vs_plain"], 1.2);
        let v: serde_json::Value =
            serde_json::from_str(&report.to_json()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["cow"]["visited"]["upper_entries"], 250);
        assert_eq!(v["cow"]["write_meets_goal"], false);
        let table = report.table().to_string();
        assert!(
            table.contains("copy-on-write write job: ratio 1.20, goal at most 1.15: NOT met"),
            "{table}"
        );
        assert!(table.contains("walked 250 upper-layer entries"), "{table}");
        // Without it, the JSON has no `cow` key (its shape is unchanged).
        assert!(sample().to_json().find("\"cow\"").is_none());
    }
}
