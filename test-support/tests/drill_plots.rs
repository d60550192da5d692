//! `drill-plots` on a report of two phases, as `hack/tests/test_drills.py`
//! writes one: a picture per phase, titled with the run, with every mark's
//! label; and a report without timelines refused, naming the phase.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

fn drill_plots(report: &Value, dir: &Path) -> Output {
    let path = dir.join("report.json");
    std::fs::write(&path, report.to_string()).expect("writing the report");
    Command::new(env!("CARGO_BIN_EXE_drill-plots"))
        .arg(&path)
        .arg(dir.join("plots"))
        .output()
        .expect("running drill-plots")
}

fn report(phases: Value) -> Value {
    json!({
        "commit": "abc1234",
        "started": "2026-11-29T01:02:03+0000",
        "images": {},
        "phases": phases,
    })
}

#[test]
fn draws_each_phase_with_its_marks() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let timeline = json!({
        "discovery": [[0.1, 2.3, 1], [0.2, 2.1, 1], [3.0, 4.0, 0], [5.0, 2.2, 1]],
        "direct reconciles": [[0.3, 20.5, 1], [2.9, 10000.0, 0], [5.1, 3142.4, 1]],
    });
    let phases = json!({
        "baseline": {"duration_s": 5.2, "marks_s": {"load on": 0.2}, "timeline": timeline},
        "6 kubelet stopped 60 s": {
            "duration_s": 5.2,
            "marks_s": {"kubelet stopped": 1.0, "node NotReady": 2.5, "kubelet started": 4.0},
            "timeline": timeline,
        },
    });
    let output = drill_plots(&report(phases), dir.path());
    assert!(
        output.status.success(),
        "drill-plots failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let plots = dir.path().join("plots");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).lines().count(),
        2,
        "one picture per phase"
    );
    let svg = std::fs::read_to_string(plots.join("drill-6-kubelet-stopped-60-s.svg"))
        .expect("the kubelet phase's picture");
    assert!(
        svg.contains("Failure drills, 6 kubelet stopped 60 s (kplug at abc1234, 2026-11-29)"),
        "the picture lacks its title"
    );
    // Each the whole of a text (plotters writes a text's content on a line
    // of its own): the marks' labels and the legend's entries.
    for text in [
        "kubelet stopped",
        "node NotReady",
        "kubelet started",
        "direct reconciles",
        "discovery",
        "failed",
    ] {
        assert!(
            svg.lines().any(|line| line == text),
            "the picture lacks {text:?}"
        );
    }
    assert!(plots.join("drill-baseline.svg").is_file());
}

#[test]
fn refuses_a_phase_without_a_timeline() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let phases = json!({"baseline": {"duration_s": 5.2, "marks_s": {}}});
    let output = drill_plots(&report(phases), dir.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("phase \"baseline\"") && stderr.contains("timeline"),
        "{stderr}"
    );
}
