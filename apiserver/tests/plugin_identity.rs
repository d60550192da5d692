//! kplug as the plugin CA, with real processes: kplug in cluster mode
//! behind a real kube-apiserver signs the certificate requests that the
//! hello plugin (the Rust SDK's `--issued-identity`) sends on its
//! heartbeats, renews both sides' one-minute certificates while reconciles
//! flow, refuses requests it must not sign, and rotates its plugin CA by
//! the procedure of docs/src/guides/certificates.md without a failed reconcile.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_test_support::{
    AggregatedKplug, ControlPlane, PluginCerts, Process, call_plugin_directly, heartbeat_request,
    hello_plugin_command, kplug_with_plugin_tls, plugin_address, plugin_identity, reconcile,
    refused_in_tls_handshake, replace_file, tls_verdict, wait_plugin_ready, wait_until,
};
use rcgen::{CertificateParams, KeyPair};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

const PLUGIN: &str = "hello-id";
const IDENTITY: &str = "hello-id.plugins.kplug.io";
/// Renewed at two thirds: every 40 s.
const LIFETIME: &str = "1m";
/// How long reconciles flow across renewals (the acceptance).
const STEADY: Duration = Duration::from_secs(5 * 60);
/// Long enough for a reload (every second) and a renewal (every 40 s).
const STEP: Duration = Duration::from_secs(90);
/// One reconcile (a kubectl process) per pace at most: the flow crosses
/// every renewal many times over while leaving the machine's cores to the
/// tests that `hack/test.sh` runs beside this one.
const PACE: Duration = Duration::from_millis(200);

/// Sends one heartbeat of `PLUGIN` carrying `csr`, with the token in
/// `token_file`: kplug's answer, or the gRPC status as "Code: message".
fn heartbeat_with(kplug: &AggregatedKplug, token_file: &Path, csr: Vec<u8>) -> Result<(), String> {
    let ca = std::fs::read(kplug.certs.join("ca.crt")).expect("kplug's CA");
    let token = std::fs::read_to_string(token_file).expect("token");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let channel = Endpoint::from_shared(format!("https://localhost:{}", kplug.grpc))
            .map_err(|e| e.to_string())?
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let mut message =
            heartbeat_request(PLUGIN, "by-hand", "127.0.0.1:9", Duration::from_secs(1));
        message.certificate_request = csr;
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", token.trim()).parse().expect("header"),
        );
        match RegistryClient::new(channel).heartbeat(request).await {
            Ok(_) => Ok(()),
            Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
        }
    })
}

fn csr(key: &KeyPair, names: &[&str]) -> Vec<u8> {
    CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .and_then(|params| params.serialize_request(key))
        .expect("a certificate request")
        .der()
        .to_vec()
}

/// Reconciles through kube-apiserver, one per [`PACE`], until `stop`:
/// (answered, failures).
fn reconcile_until(
    cluster: &ControlPlane,
    request: &Path,
    stop: &AtomicBool,
) -> (u32, Vec<String>) {
    let (mut answered, mut failures) = (0, Vec::new());
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        match reconcile(cluster, PLUGIN, request) {
            Ok(_) => answered += 1,
            Err(error) => failures.push(error),
        }
        std::thread::sleep(PACE.saturating_sub(sent.elapsed()));
    }
    (answered, failures)
}

/// Sets its flag when dropped, as a panic unwinds too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// How many times the plugin logged taking a certificate or bundle so far.
fn taken(lines: &[String]) -> usize {
    lines
        .iter()
        .filter(|l| l.contains("certificate or trust bundle from kplug in use"))
        .count()
}

#[test]
fn kplug_signs_renews_refuses_and_rotates_plugin_identities() {
    let work = tempfile::Builder::new()
        .prefix("kplug-identity-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let dir = work.path();
    // Two plugin CAs; each also holds a client certificate (clientAuth) and
    // a serving certificate (serverAuth) made by `plugin-certs`.
    let one = PluginCerts::make(&dir.join("one"), &["other.plugins.svc"]);
    let two = PluginCerts::make(&dir.join("two"), &[]);
    // What kplug reads, as the kplug-plugin-ca Secret's files would be.
    let live = dir.join("live");
    std::fs::create_dir(&live).expect("mkdir");
    let (signing_cert, signing_key, bundle) = (
        live.join("tls.crt"),
        live.join("tls.key"),
        live.join("ca.crt"),
    );
    replace_file(&one.ca(), &signing_cert);
    replace_file(&one.dir.join("ca.key"), &signing_key);
    replace_file(&one.ca(), &bundle);

    let cluster = ControlPlane::start(dir.join("cp"));
    let (kplug, request) = kplug_with_plugin_tls(
        &cluster,
        dir,
        &[
            format!("--plugin-signing-cert-file={}", signing_cert.display()),
            format!("--plugin-signing-key-file={}", signing_key.display()),
            format!("--plugin-ca-file={}", bundle.display()),
            format!("--plugin-cert-lifetime={LIFETIME}"),
        ],
    );

    // The plugin: a token, a name, the registry and its CA; no certificate.
    let token = plugin_identity(&cluster, PLUGIN, Some(PLUGIN), dir);
    let (_plugin, plugin_log) = Process::spawn_with_stderr(
        hello_plugin_command(&kplug, PLUGIN, &token)
            .args(["--heartbeat-interval", "1", "--issued-identity"])
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null()),
        PLUGIN,
    );
    wait_plugin_ready(&cluster, PLUGIN);
    let answer = reconcile(&cluster, PLUGIN, &request).expect("a reconcile over mutual TLS");
    assert!(answer.contains("ada"), "{answer}");
    let mut plugin_lines = plugin_log.drain();

    // Reconciles flow from here to the end; none may fail.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let flow = std::thread::scope(|scope| {
        let flow = scope.spawn(|| reconcile_until(&cluster, &request, &stop));
        // A failing step stops the flow as it unwinds: the scope joins the
        // flow's thread before the failure propagates, and would wait forever.
        let _stop_on_failure = StopOnDrop(&stop);

        // Straight to the plugin: its certificate is of CA one for its
        // identity; only a client certificate (clientAuth) of a trusted CA
        // gets in.
        let address = plugin_address(&cluster, PLUGIN);
        let (client_one, client_one_key) = one.client();
        let (client_two, client_two_key) = two.client();
        let (serving, serving_key) = one.serving("other.plugins.svc");
        call_plugin_directly(
            &address,
            IDENTITY,
            &one.ca(),
            Some((&client_one, &client_one_key)),
        )
        .expect("a client certificate of the plugin CA is accepted");
        for (identity, what) in [
            (None, "no client certificate"),
            (
                Some((client_two.as_path(), client_two_key.as_path())),
                "a certificate of another CA",
            ),
            (
                Some((serving.as_path(), serving_key.as_path())),
                "a serving certificate (serverAuth only)",
            ),
        ] {
            let verdict = tls_verdict(&address, IDENTITY, &one.ca(), identity);
            assert!(
                refused_in_tls_handshake(&verdict),
                "a caller with {what}: not refused in the handshake: {verdict:?}"
            );
        }

        // Requests kplug must not sign, each refused with its reason, and
        // nothing registered for them.
        let key = KeyPair::generate().expect("key");
        let rsa = KeyPair::from_pem(include_str!("../src/identity/testdata/rsa-2048.key"))
            .expect("RSA key");
        for (csr, want) in [
            (
                csr(&key, &["other.plugins.kplug.io"]),
                "may ask only for the DNS name \"hello-id.plugins.kplug.io\"",
            ),
            (b"not a request".to_vec(), "not a DER PKCS#10 request"),
            (vec![0x30; 5000], "kplug reads at most 4096"),
            (
                csr(&rsa, &[IDENTITY]),
                "the certificate request's key is RSA 2048",
            ),
        ] {
            let error = heartbeat_with(&kplug, &token, csr).expect_err(want);
            assert!(
                error.starts_with("InvalidArgument: certificate request refused"),
                "{error}"
            );
            assert!(error.contains(want), "{error}");
        }
        kplug.wait_for_log(Duration::from_secs(10), "a refusal logged", |l| {
            l.contains("certificate request refused") && l.contains("RSA 2048")
        });
        // A ServiceAccount that may not heartbeat as the plugin gets nothing.
        let stranger = plugin_identity(&cluster, "stranger", None, dir);
        let error =
            heartbeat_with(&kplug, &stranger, csr(&key, &[IDENTITY])).expect_err("forbidden");
        assert!(error.starts_with("PermissionDenied"), "{error}");
        let instances = cluster.kubectl_ok(&[
            "get",
            "plugin",
            PLUGIN,
            "-o",
            "jsonpath={.status.instances[*].name}",
        ]);
        assert!(
            !instances.contains("by-hand"),
            "a refused request registered: {instances}"
        );

        // The plugin CA rotates (docs/src/guides/certificates.md). 1: both CAs trusted.
        std::fs::write(
            &bundle,
            [std::fs::read(one.ca()), std::fs::read(two.ca())]
                .map(|r| r.expect("CA"))
                .concat(),
        )
        .expect("bundle");
        let before = taken(&plugin_lines);
        wait_until("the plugin holds the new bundle", STEP, || {
            plugin_lines.extend(plugin_log.drain());
            (taken(&plugin_lines) > before)
                .then_some(())
                .ok_or("not yet")
        });
        call_plugin_directly(
            &address,
            IDENTITY,
            &one.ca(),
            Some((&client_two, &client_two_key)),
        )
        .expect("the plugin accepts CA two's client certificates");
        // 2: CA two signs (key first, as a Secret update swaps both at once).
        replace_file(&two.dir.join("ca.key"), &signing_key);
        replace_file(&two.ca(), &signing_cert);
        wait_until("the plugin serves a certificate of CA two", STEP, || {
            call_plugin_directly(
                &address,
                IDENTITY,
                &two.ca(),
                Some((&client_two, &client_two_key)),
            )
        });
        // 3: CA one leaves the bundle; its certificates are no longer
        // accepted. Refused in the handshake, while CA two's are accepted
        // at the same moment: the plugin is up, and it is the bundle.
        replace_file(&two.ca(), &bundle);
        wait_until(
            "the plugin refuses CA one's client certificates and accepts CA two's",
            STEP,
            || {
                let verdict = |(cert, key): (&Path, &Path)| {
                    tls_verdict(&address, IDENTITY, &two.ca(), Some((cert, key)))
                };
                let one = verdict((&client_one, &client_one_key));
                let two = verdict((&client_two, &client_two_key));
                (refused_in_tls_handshake(&one) && two.is_ok())
                    .then_some(())
                    .ok_or_else(|| format!("CA one's client: {one:?}, CA two's client: {two:?}"))
            },
        );

        // Steady reconciles for the rest of the window, across renewals.
        if let Some(rest) = STEADY.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
        stop.store(true, Ordering::Relaxed);
        flow.join().expect("the reconciles' thread")
    });
    let (answered, failures) = flow;
    assert!(
        failures.is_empty(),
        "{} of {} reconciles failed: {failures:?}",
        failures.len(),
        answered as usize + failures.len()
    );
    assert!(answered > 100, "only {answered} reconciles in {STEADY:?}");
    // Renewed at 40 s over five minutes: at least 6 certificates, plus the
    // two bundle changes of the rotation.
    plugin_lines.extend(plugin_log.drain());
    assert!(
        taken(&plugin_lines) >= 8,
        "{} certificates or bundles taken",
        taken(&plugin_lines)
    );
    let renewed = kplug
        .log
        .drain()
        .iter()
        .filter(|l| l.contains("plugin TLS material renewed"))
        .count();
    assert!(
        renewed >= 6,
        "kplug renewed its client certificate {renewed} times"
    );
}
