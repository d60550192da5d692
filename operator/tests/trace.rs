//! One trace across the three hops: the operator continues an object's
//! `kplug.io/traceparent`, kplug passes it on, and a plugin of each SDK
//! sees it in its request (and reports it in the object status) while
//! every hop logs the same trace id and operation id.

mod support;

use std::time::Duration;

use kplug_proto::trace::TraceParent;
use kplug_test_support::{Lines, wait_plugin_ready, wait_until};
use support::widgets::{Widgets, widget};

/// The value of `key=` in a log line (span fields print as `key=value`).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    line[start..]
        .split(|c: char| c.is_whitespace() || matches!(c, '}' | ':' | ','))
        .next()
}

/// Waits for `log`'s line with `trace_id` that also has `needle`; returns
/// the operation id that line carries.
fn operation_logged(log: &Lines, hop: &str, trace_id: &str, needle: &str) -> String {
    let line = log.wait_for(
        Duration::from_secs(30),
        &format!("{hop} logs trace {trace_id}"),
        |line| field(line, "trace_id") == Some(trace_id) && line.contains(needle),
    );
    field(&line, "operation_id")
        .unwrap_or_else(|| panic!("{hop}: no operation_id in {line:?}"))
        .to_owned()
}

#[test]
fn one_trace_id_goes_from_the_operator_through_kplug_to_plugins_of_both_sdks() {
    let world = Widgets::start_with(&["--log", "info,kplug_apiserver::api::reconcile=debug"]);
    let (_rust, rust_log) = world.plugin_logged("hello-rust", "Rust", &["--report-trace-id"]);
    let (_python, python_log) =
        world.python_plugin("hello-python", "Python", &["--report-trace-id"]);
    for plugin in ["hello-rust", "hello-python"] {
        wait_plugin_ready(&world.cluster, plugin);
    }
    let (_operator, operator_log) = world.run_operator(&[]);

    for (name, implementation, plugin_log, plugin_needle) in [
        ("traced-rust", "Rust", &rust_log, "greeting"),
        ("traced-python", "Python", &python_log, "greeting"),
    ] {
        let trace = TraceParent::new_root();
        let trace_id = trace.trace_id();
        world
            .cluster
            .apply(&widget(name, implementation, Some(&trace.to_string())));

        // The plugin saw the trace in its request: it reports it.
        wait_until(
            &format!("{name} reconciled by {implementation} with its trace"),
            Duration::from_secs(60),
            || {
                let object = world.get(name)?;
                let status = &object["status"];
                (status["implementation"] == implementation
                    && status["traceID"] == trace_id.as_str())
                .then_some(())
                .ok_or_else(|| status.to_string())
            },
        );

        // Each hop logged the call with the trace id and one operation id
        // (the operator's reconcile also logs its finalizer, before the call).
        let by_operator =
            operation_logged(&operator_log, "the operator", &trace_id, ": reconciled ");
        let by_kplug = operation_logged(&world.kplug.log, "kplug", &trace_id, "reconciled");
        let by_plugin = operation_logged(plugin_log, implementation, &trace_id, plugin_needle);
        assert_eq!(by_kplug, by_operator, "{name}: kplug and the operator");
        assert_eq!(
            by_plugin, by_operator,
            "{name}: the plugin and the operator"
        );
    }
}

#[test]
fn log_fields_are_read_from_span_and_event_fields() {
    let line = "2026 INFO reconcile{object=default/a trace_id=4bf9 operation_id=e1}: reconciled";
    assert_eq!(field(line, "trace_id"), Some("4bf9"));
    assert_eq!(field(line, "operation_id"), Some("e1"));
    assert_eq!(
        field(
            "x operation_id=op-1 trace_id=ab: greeting world",
            "trace_id"
        ),
        Some("ab")
    );
    assert_eq!(field(line, "missing"), None);
}
