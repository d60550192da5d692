//! The fuzz targets' seeds (`fuzz/seeds/TARGET`) and every input a target
//! once failed on (`fuzz/regressions/TARGET`), replayed through the same
//! entry points (`kplug_apiserver::fuzzing`) on every test run: the targets
//! keep compiling and what they found stays fixed. The fuzzing itself is
//! `hack/fuzz.sh`.

use std::path::Path;

use kplug_apiserver::fuzzing;
use kplug_test_support::repo_root;

fn entry_point(target: &str) -> fn(&[u8]) {
    match target {
        "accept" => fuzzing::accept,
        "duration" => fuzzing::duration,
        "heartbeat" => fuzzing::heartbeat,
        "list_query" => fuzzing::list_query,
        "reconcile_body" => fuzzing::reconcile_body,
        "selectors" => fuzzing::selectors,
        "traceparent" => fuzzing::traceparent,
        other => panic!("fuzz/{other}: no such target in kplug_apiserver::fuzzing"),
    }
}

/// Runs every file under `dir/TARGET/`; returns how many.
fn replay(dir: &Path) -> usize {
    let mut inputs = 0;
    let Ok(targets) = std::fs::read_dir(dir) else {
        return 0;
    };
    for target in targets {
        let target = target.expect("a fuzz target's directory").path();
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let run = entry_point(&name);
        for input in std::fs::read_dir(&target).expect("read the inputs") {
            let input = input.expect("an input").path();
            let bytes = std::fs::read(&input).expect("read an input");
            let outcome = std::panic::catch_unwind(|| run(&bytes));
            assert!(outcome.is_ok(), "{} fails again", input.display());
            inputs += 1;
        }
    }
    inputs
}

#[test]
fn the_fuzz_targets_pass_their_seeds_and_past_failures() {
    let fuzz = repo_root().join("fuzz");
    let seeds = replay(&fuzz.join("seeds"));
    assert!(seeds >= 7, "the seeds of every target: {seeds}");
    replay(&fuzz.join("regressions"));
    // The targets in fuzz/Cargo.toml are the entry points replayed here.
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for line in manifest.lines() {
        if let Some(name) = line
            .strip_prefix("name = \"")
            .and_then(|l| l.strip_suffix('"'))
            && name != "kplug-fuzz"
        {
            entry_point(name);
        }
    }
}
