//! What needs no cluster, through the real kubectl: the plugin is found
//! on the PATH, and help, version and completion answer.

mod support;

use std::path::Path;

use kplug_test_support::repo_root;
use support::{Plugin, ok};

#[test]
fn kubectl_finds_the_plugin_and_it_explains_itself() {
    let work = tempfile::tempdir().expect("temp dir");
    let cli = Plugin::install(work.path());
    // No cluster is contacted: any kubeconfig path will do.
    let nowhere = Path::new("/nonexistent/kubeconfig");

    let version = ok(&cli.run(nowhere, &["version"]));
    assert_eq!(
        version,
        format!("kubectl-kplug version {}\n", env!("CARGO_PKG_VERSION"))
    );

    let help = ok(&cli.run(nowhere, &["reconcile", "--help"]));
    for part in [
        "Examples:",
        "kubectl kplug reconcile databasetable/users",
        "Usage:",
        "NEVER writes status",
    ] {
        assert!(help.contains(part), "{part}: {help}");
    }
    let root = ok(&cli.run(nowhere, &["--help"]));
    assert!(
        root.contains("Available Commands:") && root.contains("plugins"),
        "{root}"
    );

    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef kubectl-kplug"),
        ("fish", "complete -c kubectl-kplug"),
    ] {
        let script = ok(&cli.run(nowhere, &["completion", shell]));
        assert!(script.contains(marker), "{shell}: {script}");
    }

    // A malformed TYPE/NAME is a usage error before any connection.
    let output = cli.run(nowhere, &["reconcile", "databasetable"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: \"databasetable\" names no object")
            && stderr.contains("TYPE/NAME"),
        "{stderr}"
    );
}

/// The DatabaseTable example ships `create plugin`'s output: it must be what
/// the command prints now, as the file's first line says (regenerate with
/// that command when this fails).
#[test]
fn the_examples_plugin_manifests_are_create_plugins_output() {
    let work = tempfile::tempdir().expect("temp dir");
    let cli = Plugin::install(work.path());
    let nowhere = Path::new("/nonexistent/kubeconfig");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/database-table/deploy");
    // kplug reads every extension a DatabaseTable lists, whichever plugin
    // serves it (users.yaml lists both kinds), so both plugins' read roles
    // name both: each plugin's manifests then suffice on their own.
    let extensions = [
        "--extension-resource",
        "databasetablemariadbextensions.myorg.org",
        "--extension-resource",
        "databasetablepostgresqlextensions.myorg.org",
    ];
    for (file, plugin) in [
        ("postgresql-plugin.yaml", "database-table-postgresql-plugin"),
        ("mariadb-plugin.yaml", "database-table-mariadb-plugin"),
    ] {
        let image = format!("ghcr.io/kplug/{plugin}:0.1.0");
        let mut command = vec![
            "create",
            "plugin",
            plugin,
            "--image",
            &image,
            "--api",
            "databasetables.myorg.org/v1alpha1",
        ];
        command.extend(extensions);
        command.extend(["-n", "plugins"]);
        let printed = ok(&cli.run(nowhere, &command));
        let shipped = std::fs::read_to_string(deploy.join(file)).expect("the example's file");
        assert_eq!(
            shipped, printed,
            "{file} is not `kubectl kplug create plugin {plugin}`'s output"
        );
        // The first line is the command that regenerates the file.
        let first = shipped.lines().next().unwrap_or_default();
        assert!(
            first.ends_with(&format!("kubectl kplug {}", command.join(" "))),
            "{file}: {first}"
        );
    }
    // A name Kubernetes would refuse is refused before anything is printed.
    let output = cli.run(nowhere, &["create", "plugin", "Bad_Name", "--image", "x"]);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    assert!(String::from_utf8_lossy(&output.stderr).contains("RFC 1123 label"));
    // So is an extension without the API whose objects reference it.
    let output = cli.run(
        nowhere,
        &[
            "create",
            "plugin",
            "tables",
            "--image",
            "x",
            "--extension-resource",
            "configmaps",
        ],
    );
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("needs --api"), "{stderr}");
}

/// The manifests the examples ship from `kubectl kplug create` (their first
/// line is the command that printed them) are what it prints today.
#[test]
fn the_examples_create_manifests_are_what_create_prints_today() {
    let work = tempfile::tempdir().expect("temp dir");
    let cli = Plugin::install(work.path());
    let nowhere = Path::new("/nonexistent/kubeconfig");
    let mut checked = Vec::new();
    for example in std::fs::read_dir(repo_root().join("examples")).expect("examples") {
        let deploy = example.expect("an example").path().join("deploy");
        let Ok(files) = std::fs::read_dir(&deploy) else {
            continue;
        };
        for file in files {
            let path = file.expect("a manifest").path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let first = text.lines().next().unwrap_or_default();
            let Some((_, command)) = first.split_once(": kubectl kplug create ") else {
                continue;
            };
            let mut args = vec!["create"];
            args.extend(command.split_whitespace());
            let printed = ok(&cli.run(nowhere, &args));
            assert!(
                printed == text,
                "{} is not what `kubectl kplug create {command}` prints now: write it again with that command",
                path.display()
            );
            checked.push(path);
        }
    }
    let names: Vec<_> = checked.iter().filter_map(|p| p.file_name()).collect();
    assert!(
        names.contains(&"plugin.yaml".as_ref()) && names.contains(&"operator.yaml".as_ref()),
        "{checked:?}"
    );
}
