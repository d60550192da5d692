//! Mutual TLS from kplug to plugins, with real processes: kplug in cluster
//! mode behind a real kube-apiserver, the hello plugin serving TLS that
//! requires kplug's client certificate, certificates from
//! `kplug-apiserver plugin-certs`, and rotations of both sides' files
//! while both keep running.

use std::path::Path;
use std::time::Duration;

use kplug_test_support::{
    ControlPlane, PluginCerts, PluginTlsFlags, Process, call_plugin_directly, hello_plugin_command,
    hello_plugin_tls, kplug_with_plugin_tls, plugin_address, plugin_identity, reconcile,
    replace_file, wait_plugin_ready, wait_until,
};

/// The name the plugin's serving certificates are for, and that it declares.
const SERVER_NAME: &str = "hello-mtls.plugins.svc";
/// Long enough for a reload on either side (kplug checks every second).
const ROTATION: Duration = Duration::from_secs(60);

/// Waits until a reconcile through kplug fails with an error containing
/// `want`, e.g. after one side rotated to certificates the other does not
/// accept yet.
fn wait_refused(cluster: &ControlPlane, plugin: &str, request: &Path, want: &str) {
    wait_until(
        &format!("a reconcile of {plugin} refused with {want:?}"),
        ROTATION,
        || match reconcile(cluster, plugin, request) {
            Err(error) if error.contains(want) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
}

fn wait_answered(cluster: &ControlPlane, plugin: &str, request: &Path) {
    wait_until(
        &format!("a reconcile of {plugin} answered"),
        ROTATION,
        || reconcile(cluster, plugin, request).map(drop),
    );
}

/// [`call_plugin_directly`] for [`SERVER_NAME`].
fn call_directly(address: &str, ca: &Path, identity: Option<(&Path, &Path)>) -> Result<(), String> {
    call_plugin_directly(address, SERVER_NAME, ca, identity)
}

#[test]
fn kplug_calls_plugins_over_mutual_tls_and_follows_rotations() {
    let work = tempfile::Builder::new()
        .prefix("kplug-mtls-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let dir = work.path();
    // Two generations of everything, each from its own plugin CA.
    let one = PluginCerts::make(&dir.join("one"), &[SERVER_NAME]);
    let two = PluginCerts::make(&dir.join("two"), &[SERVER_NAME]);

    // The files each side reads, replaced in place to rotate.
    let live = dir.join("live");
    std::fs::create_dir(&live).expect("mkdir");
    let kplug_cert = live.join("kplug-client.crt");
    let kplug_key = live.join("kplug-client.key");
    let kplug_ca = live.join("plugin-ca.crt");
    let plugin_cert = live.join("serving.crt");
    let plugin_key = live.join("serving.key");
    let plugin_client_ca = live.join("client-ca.crt");
    let (client_one, client_one_key) = one.client();
    let (serving_one, serving_one_key) = one.serving(SERVER_NAME);
    for (from, to) in [
        (&client_one, &kplug_cert),
        (&client_one_key, &kplug_key),
        (&one.ca(), &kplug_ca),
        (&serving_one, &plugin_cert),
        (&serving_one_key, &plugin_key),
        (&one.ca(), &plugin_client_ca),
    ] {
        replace_file(from, to);
    }

    let cluster = ControlPlane::start(dir.join("cp"));
    let (kplug, request) = kplug_with_plugin_tls(
        &cluster,
        dir,
        &[
            format!("--plugin-client-cert-file={}", kplug_cert.display()),
            format!("--plugin-client-key-file={}", kplug_key.display()),
            format!("--plugin-ca-file={}", kplug_ca.display()),
        ],
    );

    // A plugin serving TLS for SERVER_NAME and requiring kplug's CA.
    let token = plugin_identity(&cluster, "hello-mtls", Some("hello-mtls"), dir);
    let _plugin = hello_plugin_tls(
        &kplug,
        "hello-mtls",
        &token,
        &PluginTlsFlags {
            cert: &plugin_cert,
            key: &plugin_key,
            client_ca: &plugin_client_ca,
            server_name: Some(SERVER_NAME),
        },
    );
    wait_plugin_ready(&cluster, "hello-mtls");
    let answer = reconcile(&cluster, "hello-mtls", &request).expect("a reconcile over mTLS");
    assert!(answer.contains("ada"), "{answer}");

    // Straight to the plugin: only kplug's client certificate gets in.
    let address = plugin_address(&cluster, "hello-mtls");
    let (client_two, client_two_key) = two.client();
    call_directly(&address, &one.ca(), Some((&client_one, &client_one_key)))
        .expect("kplug's certificate is accepted");
    let refused = |identity: Option<(&Path, &Path)>, what: &str| {
        let result = call_directly(&address, &one.ca(), identity);
        assert!(result.is_err(), "the plugin answered a caller with {what}");
    };
    refused(None, "no client certificate");
    refused(
        Some((&client_two, &client_two_key)),
        "a certificate of another CA",
    );
    refused(
        Some((&serving_one, &serving_one_key)),
        "the plugin's own serving certificate (serverAuth only)",
    );

    // A plugin whose certificate is not for the name kplug checks: none
    // declared, so the host of its address, 127.0.0.1.
    let token = plugin_identity(&cluster, "hello-misnamed", Some("hello-misnamed"), dir);
    let _misnamed = hello_plugin_tls(
        &kplug,
        "hello-misnamed",
        &token,
        &PluginTlsFlags {
            cert: &plugin_cert,
            key: &plugin_key,
            client_ca: &plugin_client_ca,
            server_name: None,
        },
    );
    wait_plugin_ready(&cluster, "hello-misnamed");
    let error = reconcile(&cluster, "hello-misnamed", &request).expect_err("wrong name");
    assert!(
        error.contains("ServiceUnavailable")
            && error.contains("TLS with plugin hello-misnamed")
            && error.contains("not \"127.0.0.1\""),
        "{error}"
    );

    // A plugin that asks for kplug's identity from a kplug without a plugin
    // CA cannot serve: it stops at once and says why.
    let token = plugin_identity(&cluster, "hello-unsigned", Some("hello-unsigned"), dir);
    let (mut unsigned, stderr) = Process::spawn_with_stderr(
        hello_plugin_command(&kplug, "hello-unsigned", &token)
            .args(["--heartbeat-interval", "1", "--issued-identity"])
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null()),
        "hello-unsigned",
    );
    let said = stderr.until_closed(Duration::from_secs(30), "the unsigned plugin's stderr");
    let exit = unsigned.child.wait().expect("the plugin's exit status");
    assert!(!exit.success(), "{said:#?}");
    assert!(
        said.iter().any(
            |l| l.contains("kplug refused the plugin's certificate request")
                && l.contains("this kplug does not sign plugin certificates")
        ),
        "{said:#?}"
    );

    // kplug's client certificate rotates to the second CA, which the plugin
    // does not trust yet: the refusal proves kplug dropped its established
    // connection and dialed again with the new files.
    replace_file(&client_two_key, &kplug_key);
    replace_file(&client_two, &kplug_cert);
    wait_refused(
        &cluster,
        "hello-mtls",
        &request,
        "refused kplug's client certificate",
    );
    // The plugin's client CA follows: the new certificate gets in, the old
    // one no longer does.
    replace_file(&two.ca(), &plugin_client_ca);
    wait_answered(&cluster, "hello-mtls", &request);
    call_directly(&address, &one.ca(), Some((&client_two, &client_two_key)))
        .expect("the new client certificate is accepted");
    refused(
        Some((&client_one, &client_one_key)),
        "the client certificate rotated out",
    );

    // The plugin CA rotates: kplug trusts only the second CA before the
    // plugin serves a certificate of it, and refuses the plugin; then the
    // plugin's serving certificate follows, without a restart.
    replace_file(&two.ca(), &kplug_ca);
    wait_refused(
        &cluster,
        "hello-mtls",
        &request,
        "kplug does not accept the plugin's serving certificate",
    );
    let (serving_two, serving_two_key) = two.serving(SERVER_NAME);
    replace_file(&serving_two_key, &plugin_key);
    replace_file(&serving_two, &plugin_cert);
    wait_answered(&cluster, "hello-mtls", &request);
    call_directly(&address, &two.ca(), Some((&client_two, &client_two_key)))
        .expect("the plugin serves the certificate of the second CA");
}
