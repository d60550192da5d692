//! What a person reads after the common failures, pinned: for each, the
//! Widget's Ready condition and its Warning Event as `kubectl describe`
//! shows it, which must read as the book's troubleshooting page
//! (`docs/src/troubleshooting.md`) shows it (addresses and ages aside).
//! Real kplug over mutual TLS with identities it issues, real hello plugins
//! made to fail, the real `kplug-operator`.

mod support;

use std::path::Path;
use std::time::Duration;

use kplug_test_support::{PluginCerts, free_port, repo_root, wait_plugin_ready, wait_until};
use support::widgets::Widgets;

/// A Widget that fails one way: its name, the implementation it prefers,
/// and the Ready condition's reason it must end with.
struct Case {
    widget: &'static str,
    implementation: &'static str,
    reason: &'static str,
}

const FORBIDDEN: Case = Case {
    widget: "forbidden",
    implementation: "Victim",
    reason: "Forbidden",
};

const CASES: [Case; 5] = [
    Case {
        widget: "unserved",
        implementation: "Victim",
        reason: "PluginUnavailable",
    },
    Case {
        widget: "refused",
        implementation: "Refused",
        reason: "PluginUnavailable",
    },
    Case {
        widget: "slow",
        implementation: "Slow",
        reason: "PluginTimeout",
    },
    Case {
        widget: "impostor",
        implementation: "Impostor",
        reason: "PluginUnavailable",
    },
    Case {
        widget: "failing",
        implementation: "Failing",
        reason: "QuotaExceeded",
    },
];

/// What the operator needs to serve widgets, without `create reconciles`.
const WITHOUT_RECONCILES: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: widgets-operator, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: widgets-operator}
rules:
- apiGroups: [test.kplug.io]
  resources: [widgets]
  verbs: [get, list, watch, patch, update]
- apiGroups: [test.kplug.io]
  resources: [widgets/status]
  verbs: [get, patch, update]
- apiGroups: [plugins.kplug.io]
  resources: [plugins]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: widgets-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: widgets-operator}
subjects:
- {kind: ServiceAccount, name: widgets-operator, namespace: default}
"#;

#[test]
fn common_failures_read_as_the_book_shows() {
    let ca_dir = tempfile::Builder::new()
        .prefix("kplug-messages-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let ca = PluginCerts::make(&ca_dir.path().join("ca"), &[]);
    let flag = |name: &str, path: &Path| format!("--{name}={}", path.display());
    let kplug_flags = [
        "--plugin-tls=required".to_owned(),
        flag("plugin-signing-cert-file", &ca.ca()),
        flag("plugin-signing-key-file", &ca.dir.join("ca.key")),
        flag("plugin-ca-file", &ca.ca()),
    ];
    let world = Widgets::start_with(&kplug_flags.each_ref().map(String::as_str));
    let described = |case: &Case| {
        wait_for_reason(&world, case);
        world
            .cluster
            .kubectl_ok(&["describe", "widget", case.widget, "-n", "default"])
    };
    let mut descriptions = Vec::new();
    let mut logged = Vec::new();

    // Forbidden: an operator whose identity may not create reconciles.
    world.cluster.apply(WITHOUT_RECONCILES);
    let kubeconfig = world.work.path().join("widgets-operator.kubeconfig");
    let token = world.cluster.token("default", "widgets-operator");
    world.cluster.kubeconfig_for_token(&kubeconfig, &token);
    {
        let (mut operator, log) = world.run_operator_as(&kubeconfig, &[]);
        world.apply(FORBIDDEN.widget, &spec(&FORBIDDEN));
        descriptions.push((&FORBIDDEN, described(&FORBIDDEN)));
        assert!(operator.terminate(Duration::from_secs(30)), "stopped");
        logged.extend(log.drain());
    }

    // The rest with an operator that may, and a 1 s deadline.
    let (_operator, log) = world.run_operator(&["--reconcile-timeout=1s"]);
    let [unserved, refused, slow, impostor, failing] = &CASES;
    world.apply(unserved.widget, &spec(unserved));
    descriptions.push((unserved, described(unserved)));

    let plugin = |name: &str, implementation: &str, extra: &[&str]| {
        let instance = format!("--instance={name}-7d4b9-x2p4q");
        let flags = [&["--issued-identity", instance.as_str()], extra].concat();
        let (process, _log) = world.plugin_logged(name, implementation, &flags);
        wait_plugin_ready(&world.cluster, name);
        process
    };
    let _victim = plugin("widgets", "Victim", &[]);
    let closed = format!("--advertise=127.0.0.1:{}", free_port());
    let _refused = plugin("widgets-refused", "Refused", &[&closed]);
    let _slow = plugin("widgets-slow", "Slow", &["--delay-ms=5000"]);
    // Another plugin's address: kplug finds the identity of `widgets` there.
    let victim = world.cluster.kubectl_ok(&[
        "get",
        "plugin",
        "widgets",
        "-o",
        "jsonpath={.status.instances[0].address}",
    ]);
    let stolen = format!("--advertise={}", victim.trim());
    let _impostor = plugin("widgets-impostor", "Impostor", &[&stolen]);
    let _failing = plugin("widgets-failing", "Failing", &["--fail-with=QuotaExceeded"]);
    for case in [refused, slow, impostor, failing] {
        world.apply(case.widget, &spec(case));
    }
    for case in [refused, slow, impostor, failing] {
        descriptions.push((case, described(case)));
    }

    // The log says the same in the same words: no library's Debug dump, and
    // no ERROR for answers that only mean "not yet".
    logged.extend(log.drain());
    let dumps = ["Status {", "Os {", "Error(", "Some("];
    let bad: Vec<&String> = logged
        .iter()
        .filter(|l| l.contains("ERROR") || dumps.iter().any(|d| l.contains(d)))
        .collect();
    assert!(bad.is_empty(), "the operator's log: {bad:#?}");
    for case in std::iter::once(&FORBIDDEN).chain(&CASES) {
        let object = format!("/{}.default", case.widget);
        assert!(
            logged.iter().any(|l| l.contains(" WARN ")
                && l.contains(&object)
                && l.contains(&format!("reason=\"{}\"", case.reason))),
            "no log line for {object}: {logged:#?}"
        );
    }

    let page = repo_root().join("docs/src/troubleshooting.md");
    let page = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let shown: Vec<Event> = page.lines().filter_map(Event::parse).collect();
    let mut unshown = Vec::new();
    for (case, description) in &descriptions {
        let line = description
            .lines()
            .find(|l| {
                Event::parse(l).is_some_and(|e| e.kind == "Warning" && e.reason == case.reason)
            })
            .unwrap_or_else(|| {
                panic!(
                    "{}: no Warning {}:\n{description}",
                    case.widget, case.reason
                )
            });
        if !Event::parse(line).is_some_and(|e| shown.contains(&e)) {
            unshown.push(format!("{}:\n{line}", case.widget));
        }
    }
    assert!(
        unshown.is_empty(),
        "docs/src/troubleshooting.md does not show these Events as kubectl describe does:\n{}",
        unshown.join("\n")
    );
}

fn spec(case: &Case) -> String {
    format!("size: 1, preferredImplementation: {}", case.implementation)
}

fn wait_for_reason(world: &Widgets, case: &Case) {
    wait_until(
        &format!("{}: Ready=False {}", case.widget, case.reason),
        Duration::from_secs(60),
        || {
            let ready = world.ready(case.widget)?;
            (ready["status"] == "False" && ready["reason"] == case.reason)
                .then_some(())
                .ok_or_else(|| ready.to_string())
        },
    );
}

/// One line of `kubectl describe`'s Events table, without its age, with
/// addresses and the hello plugin's version written as placeholders.
#[derive(Debug, PartialEq, Eq)]
struct Event {
    kind: String,
    reason: String,
    from: String,
    message: String,
}

impl Event {
    /// `Type  Reason  Age  From  Message`, columns two or more spaces apart.
    fn parse(line: &str) -> Option<Self> {
        let columns: Vec<&str> = line
            .trim()
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        let [kind, reason, _age, from, message @ ..] = columns.as_slice() else {
            return None;
        };
        if !["Normal", "Warning"].contains(kind) || message.is_empty() {
            return None;
        }
        Some(Self {
            kind: (*kind).to_owned(),
            reason: (*reason).to_owned(),
            from: (*from).to_owned(),
            message: placeholders(&message.join("  ")),
        })
    }
}

/// `message` with each IPv4 `address:port` as `ADDRESS`.
fn placeholders(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some((start, end)) = find_address(rest) {
        out.push_str(&rest[..start]);
        out.push_str("ADDRESS");
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The byte range of the first `a.b.c.d:port` in `text`.
fn find_address(text: &str) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let is_part = |b: u8| b.is_ascii_digit() || b == b'.' || b == b':';
    let mut start = 0;
    while start < bytes.len() {
        if !bytes[start].is_ascii_digit() || (start > 0 && is_part(bytes[start - 1])) {
            start += 1;
            continue;
        }
        let end = start + bytes[start..].iter().take_while(|b| is_part(**b)).count();
        let candidate = &text[start..end];
        if let Some((host, port)) = candidate.split_once(':')
            && host.parse::<std::net::Ipv4Addr>().is_ok()
            && port.parse::<u16>().is_ok()
        {
            return Some((start, end));
        }
        start = end;
    }
    None
}
