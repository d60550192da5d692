//! `kubectl kplug render` through the real kubectl, with no control plane
//! and no kplug: the Rust and Python hello plugins, the PostgreSQL plugin
//! against a real PostgreSQL, the website plugin's children fed with what
//! the operator observed, and what goes wrong said clearly.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

use kplug_test_support::postgres::{Postgres, venv_python};
use kplug_test_support::{output_text, repo_root, workspace_binary};
use serde_json::Value;
use support::Plugin;

/// No cluster is contacted: render never reads a kubeconfig.
const NOWHERE: &str = "/nonexistent/kubeconfig";
/// Bounds every run, so that a hang fails the test instead of stalling it.
const BOUND_SECONDS: u32 = 120;

const GREETING: &str = "\
apiVersion: greetings.example.com/v1
kind: Greeting
metadata:
  name: ada
spec: {}
";

struct Render {
    cli: Plugin,
    work: tempfile::TempDir,
}

impl Render {
    fn new() -> Self {
        let work = tempfile::tempdir().expect("temp dir");
        Self {
            cli: Plugin::install(work.path()),
            work,
        }
    }

    /// A file in the work directory holding `text`.
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.work.path().join(name);
        std::fs::write(&path, text).expect("write an input file");
        path
    }

    /// `kubectl kplug render ARGS...`, ended after [`BOUND_SECONDS`] if it
    /// hangs.
    fn run(&self, args: &[&str]) -> Output {
        let mut all = vec!["render", "--kubeconfig", NOWHERE];
        all.extend_from_slice(args);
        self.cli.bounded(BOUND_SECONDS, &all)
    }
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// The outcome printed on stdout, which must be YAML and nothing else.
fn outcome(output: &Output, code: i32) -> Value {
    assert_eq!(output.status.code(), Some(code), "{}", output_text(output));
    serde_saphyr::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not the YAML outcome ({e}): {}",
            output_text(output)
        )
    })
}

/// The error line of a run that could not ask the plugin: exit 1, nothing
/// on stdout, no panic, and `error: ...` after whatever the plugin logged.
fn error(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "{}", output_text(output));
    assert!(output.stdout.is_empty(), "{}", output_text(output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let at = stderr
        .find("error: ")
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    stderr[at..].to_owned()
}

#[test]
fn the_rust_and_python_hello_plugins_answer_without_a_cluster() {
    let render = Render::new();
    let greeting = render.file("greeting.yaml", GREETING);
    let rust = workspace_binary("hello-plugin");
    let python = venv_python();
    let hello_py = repo_root().join("examples/hello-python/hello.py");
    let commands: [&[&str]; 2] = [&[path(&rust)], &[path(&python), path(&hello_py)]];
    for command in commands {
        let mut args = vec!["-f", path(&greeting), "--"];
        args.extend_from_slice(command);
        let answer = outcome(&render.run(&args), 0);
        assert_eq!(answer["success"], true, "{command:?}: {answer}");
        assert_eq!(
            answer["results"][0]["reason"], "Greeted",
            "{command:?}: {answer}"
        );
        assert_eq!(
            answer["objectStatus"]["greeting"], "hello, ada",
            "{command:?}: {answer}"
        );

        let mut args = vec!["-f", path(&greeting), "--finalize", "-o", "json", "--"];
        args.extend_from_slice(command);
        let output = render.run(&args);
        assert_eq!(output.status.code(), Some(0), "{}", output_text(&output));
        let answer: Value = serde_json::from_slice(&output.stdout).expect("-o json");
        assert_eq!(
            answer["results"][0]["reason"], "Goodbye",
            "{command:?}: {answer}"
        );
    }

    // A failure the plugin reports: printed, and exit 1.
    let output = render.run(&[
        "-f",
        path(&greeting),
        "--",
        path(&rust),
        "--fail-with",
        "Unwell",
    ]);
    let answer = outcome(&output, 1);
    assert_eq!(answer["success"], false, "{answer}");
    assert_eq!(answer["results"][0]["reason"], "Unwell", "{answer}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("error: the plugin reported a failure: Unwell: "),
        "{stderr}"
    );
}

#[test]
fn the_website_plugin_s_children_render_with_the_observed_ones() {
    let render = Render::new();
    let site = render.file(
        "site.yaml",
        &std::fs::read_to_string(repo_root().join("examples/website/site.yaml"))
            .expect("the example site"),
    );
    let plugin = workspace_binary("website-plugin");
    let answer = outcome(&render.run(&["-f", path(&site), "--", path(&plugin)]), 0);
    let children: Vec<(&str, &str, i64)> = answer["desiredChildren"]
        .as_array()
        .unwrap_or_else(|| panic!("no children: {answer}"))
        .iter()
        .map(|c| {
            let kind = c["object"]["kind"].as_str().unwrap_or_default();
            (
                c["key"].as_str().unwrap_or_default(),
                kind,
                c["wave"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        children,
        [
            ("pages", "ConfigMap", 0),
            ("web", "Deployment", 1),
            ("service", "Service", 1)
        ]
    );
    assert_eq!(answer["objectStatus"]["availableReplicas"], 0, "{answer}");

    // The Deployment as `kubectl get -o yaml` would print it, in a List,
    // with the key the operator annotates its children with.
    let observed = render.file(
        "observed.yaml",
        "apiVersion: v1\nkind: List\nmetadata: {resourceVersion: \"\"}\nitems:\n\
         - apiVersion: apps/v1\n  kind: Deployment\n  metadata:\n    name: hello\n    \
         namespace: default\n    annotations: {plugins.kplug.io/child-key: web}\n  \
         status: {availableReplicas: 1}\n",
    );
    let args = [
        "-f",
        path(&site),
        "--observed",
        path(&observed),
        "--",
        path(&plugin),
    ];
    let answer = outcome(&render.run(&args), 0);
    assert_eq!(answer["objectStatus"]["availableReplicas"], 1, "{answer}");

    // An observed object the operator did not annotate names no child.
    let unkeyed = render.file("unkeyed.yaml", GREETING);
    let args = [
        "-f",
        path(&site),
        "--observed",
        path(&unkeyed),
        "--",
        path(&plugin),
    ];
    assert!(
        error(&render.run(&args))
            .contains("unkeyed.yaml, document 1: no plugins.kplug.io/child-key annotation"),
    );
}

#[test]
fn the_postgresql_plugin_plans_in_a_dry_run_and_creates_the_table_for_real() {
    let postgres = Postgres::start();
    let render = Render::new();
    let users = repo_root().join("examples/database-table/users.yaml");
    let python = venv_python();
    let plugin = [
        path(&python),
        "-m",
        "postgresql_plugin",
        "--dsn",
        &postgres.dsn,
    ];
    let run = |extra: &[&str]| {
        let mut args = vec!["-f", path(&users)];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(&plugin);
        render.run(&args)
    };

    let planned = outcome(&run(&["--dry-run"]), 0);
    let reasons = |answer: &Value| -> Vec<String> {
        answer["results"]
            .as_array()
            .map(|results| {
                results
                    .iter()
                    .map(|r| format!("{}: {}", r["reason"], r["message"]))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(
        reasons(&planned).iter().any(|r| r.contains("would")),
        "a dry run says what it would do: {planned}"
    );
    assert_eq!(
        postgres.columns("users"),
        "NULL",
        "the dry run created the table"
    );

    let applied = outcome(&run(&[]), 0);
    assert_eq!(applied["success"], true, "{applied}");
    assert_eq!(
        postgres.columns("users"),
        "id numeric, name character varying",
        "{applied}"
    );
    // The extension the plugin serves gets its status, as kplug reports it.
    let extension = &applied["extensionStatuses"][0];
    assert_eq!(
        extension["ref"]["kind"], "DatabaseTablePostgreSqlExtension",
        "{applied}"
    );
}

/// A fault no SDK plugin produces on demand: it says where it listens, as
/// the SDKs do, then accepts connections and never reads from them.
const SILENT_PLUGIN: &str = "\
import os, signal, socket, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
listener = socket.socket()
listener.bind(('127.0.0.1', 0))
listener.listen()
path = os.environ['KPLUG_LOCAL_ADDRESS_FILE']
with open(path + '.partial', 'w') as file:
    file.write('127.0.0.1:%d' % listener.getsockname()[1])
os.replace(path + '.partial', path)
time.sleep(600)
";

#[test]
fn bad_input_and_broken_plugins_end_with_a_clear_error_and_exit_1() {
    let render = Render::new();
    let greeting = render.file("greeting.yaml", GREETING);
    let list = render.file("list.yaml", "- apiVersion: v1\n");
    let nameless = render.file("nameless.yaml", "apiVersion: v1\nkind: X\nmetadata: {}\n");
    let hello = workspace_binary("hello-plugin");

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["-f", path(&list), "--", path(&hello)],
            "list.yaml, document 1: not a Kubernetes object: it is a list",
        ),
        (
            vec![
                "-f",
                path(&greeting),
                "-f",
                path(&nameless),
                "--",
                path(&hello),
            ],
            "nameless.yaml, document 1: not a Kubernetes object: metadata.name: Required value",
        ),
        (
            vec!["-f", "/nonexistent/object.yaml", "--", path(&hello)],
            "cannot read /nonexistent/object.yaml: No such file or directory",
        ),
        (
            vec!["-f", path(&greeting), "--", "/nonexistent/plugin"],
            "the plugin did not start: cannot run \"/nonexistent/plugin\": No such file or directory",
        ),
        (
            vec!["-f", path(&greeting), "--", "false"],
            "the plugin did not start: \"false\" exited (exit status: 1) before it listened",
        ),
        (
            vec![
                "-f",
                path(&greeting),
                "--start-timeout",
                "1s",
                "--",
                "sleep",
                "600",
            ],
            "the plugin did not start: \"sleep 600\" did not start listening within 1s",
        ),
        (
            vec![
                "-f",
                path(&greeting),
                "--timeout",
                "1s",
                "--",
                path(&hello),
                "--delay-ms",
                "600000",
            ],
            "the plugin answered Reconcile with gRPC DeadlineExceeded",
        ),
        (
            // Listens and never answers, not even to its deadline, and
            // ignores SIGTERM: render gives up at --timeout and kills it.
            vec![
                "-f",
                path(&greeting),
                "--timeout",
                "1s",
                "--",
                "python3",
                "-c",
                SILENT_PLUGIN,
            ],
            "the plugin did not answer Reconcile within 1s (--timeout)",
        ),
        (
            vec!["-f", path(&greeting), "--plugin-address", "127.0.0.1:1"],
            "cannot call the plugin at 127.0.0.1:1: transport error: tcp connect error: Connection refused",
        ),
    ];
    for (args, expected) in cases {
        let message = error(&render.run(&args));
        assert!(
            message.starts_with("error: ") && message.contains(expected),
            "{args:?}: expected {expected:?}, got {message:?}"
        );
    }
}
