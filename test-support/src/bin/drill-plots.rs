//! Draws the failure drills' request timelines from their report
//! (`hack/tests/test_drills.py` writes it, to `target/drills/report.json`
//! unless told otherwise): one SVG per phase, `drill-PHASE.svg` in
//! `OUT_DIR`, each titled with the commit and the day the drills ran at.
//!
//! ```sh
//! cargo run -p kplug-test-support --bin drill-plots -- target/drills/report.json docs/src/plots
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kplug_test_support::plot::{Plots, Request, Requests, Timeline};
use serde::Deserialize;

const USAGE: &str = "usage: drill-plots REPORT.json OUT_DIR";

/// What the pictures need of the report; the figures its tables show are
/// left alone.
#[derive(Deserialize)]
struct Report {
    /// The commit the drills ran at.
    commit: String,
    /// When they started, as `%Y-%m-%dT%H:%M:%S%z`.
    started: String,
    /// Each read on its own, so that an error names its phase.
    phases: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct Phase {
    /// What the drill marked, at s into the phase.
    marks_s: BTreeMap<String, f64>,
    /// By kind, every request as `[s into the phase, latency in ms, ok]`,
    /// ok 1 if it did what it should, else 0.
    timeline: BTreeMap<String, Vec<(f64, f64, u8)>>,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [report, out_dir] = args.as_slice() else {
        bail!(USAGE);
    };
    for picture in draw(Path::new(report), PathBuf::from(out_dir))? {
        println!("{picture}");
    }
    Ok(())
}

/// Draws every phase of the report at `path` into `out_dir`; returns the
/// pictures' paths.
fn draw(path: &Path, out_dir: PathBuf) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let report: Report =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let day = jiff::fmt::strtime::parse("%Y-%m-%dT%H:%M:%S%z", &report.started)
        .and_then(|started| started.to_date())
        .with_context(|| format!("{}: its start, {:?}", path.display(), report.started))?;
    let plots = Plots::of_run(out_dir, format!("kplug at {}, {day}", report.commit))?;
    report
        .phases
        .into_iter()
        .map(|(name, phase)| {
            let timeline = timeline(&name, phase)
                .with_context(|| format!("{}: phase {name:?}", path.display()))?;
            plots.timeline(&file_name(&name), &timeline)
        })
        .collect()
}

fn timeline(name: &str, phase: serde_json::Value) -> Result<Timeline> {
    let phase: Phase = serde_json::from_value(phase)?;
    let kinds = phase
        .timeline
        .into_iter()
        .map(|(label, samples)| {
            let requests = samples
                .into_iter()
                .map(|(at_s, latency_ms, ok)| {
                    let ok = match ok {
                        0 => false,
                        1 => true,
                        other => bail!("{label}: ok is {other}, not 0 or 1"),
                    };
                    Ok(Request {
                        at_s,
                        latency_ms,
                        ok,
                    })
                })
                .collect::<Result<_>>()?;
            Ok(Requests { label, requests })
        })
        .collect::<Result<_>>()?;
    Ok(Timeline {
        title: format!("Failure drills, {name}"),
        x: "s into the phase".to_owned(),
        kinds,
        marks: phase.marks_s.into_iter().collect(),
    })
}

/// `drill-` and the phase's name in lower case, each run of other
/// characters than letters and digits as one `-`.
fn file_name(phase: &str) -> String {
    let words: Vec<String> = phase
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    format!("drill-{}", words.join("-"))
}
