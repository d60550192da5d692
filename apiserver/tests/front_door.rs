//! The front door against a hostile client, with real processes: stalled
//! connections are closed in time while the API keeps answering, the
//! connection cap holds, watches outlive the timeouts, secrets are
//! owner-only from their first byte, and in cluster mode a flood of bad
//! tokens leaves real users' cached answers alone and the verb is the one
//! the handler serves.

#[path = "front_door/client.rs"]
mod client;

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kplug_test_support::metrics::Samples;
use kplug_test_support::{Process, StandaloneKplug, output_text, wait_until};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";

fn scrape(kplug: &StandaloneKplug) -> Samples {
    let (code, body) = kplug.curl("GET", "/metrics", &[], None);
    assert_eq!(code, 200, "{body}");
    Samples::parse(&body)
}

fn api_metric(samples: &Samples, name: &str, extra: &[(&str, &str)]) -> f64 {
    let mut labels = vec![("listener", "api")];
    labels.extend_from_slice(extra);
    samples.expect(name, &labels)
}

/// Ways to stall a new connection, each a quarter of the flood.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// A TLS record header and the start of a ClientHello, no more.
    PartialClientHello,
    /// The TLS handshake, then silence.
    SilentAfterHandshake,
    /// HTTP/1.1 headers begun, never ended.
    PartialHeaders,
    /// The HTTP/2 preface and SETTINGS, never a request.
    PrefaceOnly,
}

/// Sends `bytes` on `stream` and nothing more.
async fn begin<S: tokio::io::AsyncWrite + Unpin>(mut stream: S, bytes: &[u8]) -> S {
    stream.write_all(bytes).await.expect("write");
    stream.flush().await.expect("flush");
    stream
}

/// Opens one stalled connection; returns it as something to read from.
async fn stall(
    how: Stall,
    address: std::net::SocketAddr,
    h1: &tokio_rustls::TlsConnector,
    h2: &tokio_rustls::TlsConnector,
) -> Box<dyn tokio::io::AsyncRead + Unpin + Send> {
    match how {
        Stall::PartialClientHello => {
            let mut tcp = TcpStream::connect(address).await.expect("connect");
            // A handshake record of 512 bytes, 6 of them sent.
            tcp.write_all(&[
                0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
            ])
            .await
            .expect("write");
            Box::new(tcp)
        }
        Stall::SilentAfterHandshake => Box::new(client::tls(address, h1).await),
        Stall::PartialHeaders => Box::new(
            begin(
                client::tls(address, h1).await,
                b"GET /livez HTTP/1.1\r\nHost: localhost\r\nX-Never-Ends: ",
            )
            .await,
        ),
        Stall::PrefaceOnly => Box::new(
            begin(
                client::tls(address, h2).await,
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
            )
            .await,
        ),
    }
}

#[test]
fn stalled_connections_are_closed_in_time_while_the_api_answers() {
    const WANTED: usize = 3_000;
    const TIMEOUT: Duration = Duration::from_secs(15);
    // Both ends of every connection live on this machine: the test's and kplug's.
    let limit = client::raise_open_files_limit(2 * WANTED as u64 + 1_024);
    let count = WANTED.min(
        usize::try_from(limit / 2)
            .unwrap_or(WANTED)
            .saturating_sub(512),
    );
    eprintln!("open files limit {limit}: {count} stalled connections");
    assert!(
        count >= 1_000,
        "the open files limit ({limit}) is too low for this test"
    );
    let kplug = StandaloneKplug::start_with(&[
        "--request-header-timeout",
        "15s",
        "--max-connections",
        &(2 * WANTED).to_string(),
    ]);
    let address = kplug.api_address();
    let ca = kplug.state.path().join("ca.crt");
    let runtime = client::runtime();
    let kinds = [
        Stall::PartialClientHello,
        Stall::SilentAfterHandshake,
        Stall::PartialHeaders,
        Stall::PrefaceOnly,
    ];
    let started = Instant::now();
    let closes = runtime.block_on(async {
        let h1 = client::connector(&ca, &[b"http/1.1"]);
        let h2 = client::connector(&ca, &[b"h2"]);
        futures::stream::iter(0..count)
            .map(|i| {
                let (h1, h2) = (h1.clone(), h2.clone());
                async move {
                    let how = kinds[i % kinds.len()];
                    let opened = Instant::now();
                    let stream = stall(how, address, &h1, &h2).await;
                    (how, opened, tokio::spawn(client::closed(stream)))
                }
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await
    });
    let opening = started.elapsed();
    eprintln!("{count} connections stalled in {opening:?}");

    // While they are held, a real client is served.
    let held = api_metric(&scrape(&kplug), "kplug_connections_open", &[]);
    let out = kplug.kubectl(&["get", "plugins"]);
    assert!(out.status.success(), "{}", output_text(&out));
    if opening < TIMEOUT / 2 {
        assert!(
            held >= count as f64 / 2.0,
            "only {held} of {count} open at once"
        );
    }

    // Each is closed by the server, not before its deadline, and not long after.
    let mut late = Vec::new();
    runtime.block_on(async {
        for (how, opened, closed) in closes {
            let closed = tokio::time::timeout(TIMEOUT * 3, closed)
                .await
                .unwrap_or_else(|_| {
                    panic!("a {how:?} connection still open after {:?}", TIMEOUT * 3)
                })
                .expect("the reader");
            let held = closed - opened;
            if !client::within(held, TIMEOUT, Duration::from_secs(10)) {
                late.push((how, held));
            }
        }
    });
    assert!(late.is_empty(), "closed too early or too late: {late:?}");

    let out = kplug.kubectl(&["get", "plugins"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let samples = scrape(&kplug);
    let quarter = (count / kinds.len()) as f64;
    let timed_out = |phase| {
        api_metric(
            &samples,
            "kplug_connections_timed_out_total",
            &[("phase", phase)],
        )
    };
    assert!(timed_out("handshake") >= quarter, "{}", samples.text);
    assert!(timed_out("request") >= 3.0 * quarter, "{}", samples.text);
    assert_eq!(
        api_metric(&samples, "kplug_connections_refused_total", &[]),
        0.0
    );
}

#[test]
fn connections_past_the_cap_are_refused_until_others_close() {
    const CAP: usize = 8;
    let kplug = StandaloneKplug::start_with(&[
        "--max-connections",
        &CAP.to_string(),
        "--request-header-timeout",
        "60s",
    ]);
    let address = kplug.api_address();
    let held: Vec<_> = (0..CAP)
        .map(|_| std::net::TcpStream::connect(address).expect("connect"))
        .collect();
    // The backlog is first in, first out: this one comes after the held ones.
    let mut extra = std::net::TcpStream::connect(address).expect("connect");
    extra
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    let asked = std::time::Instant::now();
    let answer = extra.read(&mut [0; 64]);
    assert!(
        matches!(answer, Ok(0))
            || matches!(&answer, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "refused at once, not left waiting: {answer:?} after {:?}",
        asked.elapsed()
    );
    // curl, which does not retry as kubectl does, gets no answer either.
    let (code, body) = kplug.curl("GET", "/livez", &[], None);
    assert_eq!(code, 0, "no HTTP answer past the cap: {body}");

    drop(held);
    wait_until("kubectl served again", Duration::from_secs(30), || {
        let out = kplug.kubectl(&["get", "plugins"]);
        out.status
            .success()
            .then_some(())
            .ok_or_else(|| output_text(&out))
    });
    let samples = scrape(&kplug);
    assert!(
        api_metric(&samples, "kplug_connections_refused_total", &[]) >= 2.0,
        "{}",
        samples.text
    );
}

#[test]
fn watches_outlive_the_timeouts_and_idle_connections_do_not() {
    const HEADERS: Duration = Duration::from_secs(1);
    const IDLE: Duration = Duration::from_secs(2);
    let kplug = StandaloneKplug::start_with(&[
        "--request-header-timeout",
        "1s",
        "--idle-connection-timeout",
        "2s",
    ]);
    // A watch over HTTP/2 (kubectl) and one over HTTP/1.1 (curl).
    let (_kubectl, kubectl_lines) =
        kplug.kubectl_spawn(&["get", "plugins", "-w", "--output-watch-events"]);
    let (_curl, curl_lines) = Process::spawn_with_stdout(
        admin_curl(&kplug)
            .args(["-N", "--http1.1"])
            .arg(format!("{}{PLUGINS}?watch=true", kplug.api))
            .stdin(Stdio::null())
            .stderr(Stdio::inherit()),
        "curl watch",
    );
    wait_until("both watches open", Duration::from_secs(30), || {
        let open = scrape(&kplug).sum("apiserver_longrunning_requests", &[("verb", "WATCH")]);
        (open >= 2.0).then_some(()).ok_or(open)
    });

    // Idle connections are closed: HTTP/2 after the idle timeout, HTTP/1.1
    // keep-alive after the header timeout (hyper's, for the next request).
    let ca = kplug.state.path().join("ca.crt");
    let runtime = client::runtime();
    runtime.block_on(async {
        for (h2, after) in [(true, IDLE), (false, HEADERS)] {
            let idle = client::one_request_then_idle(kplug.api_address(), &ca, h2, "/livez").await;
            let ended = tokio::time::timeout(Duration::from_secs(30), idle.ended)
                .await
                .expect("the idle connection closed")
                .expect("the connection task");
            // The server's timer started between the request's sending and
            // this client's reading the answer (later on a loaded machine).
            let (at_most, at_least) = (ended - idle.sent, ended - idle.answered);
            assert!(
                at_most >= after && at_least <= after + Duration::from_secs(5),
                "h2 {h2}: idle between {at_least:?} and {at_most:?}, expected {after:?}"
            );
        }
    });
    let samples = scrape(&kplug);
    assert!(
        api_metric(
            &samples,
            "kplug_connections_timed_out_total",
            &[("phase", "idle")]
        ) >= 1.0
    );

    // The watches, older than every timeout, still deliver.
    let _plugin = kplug.plugin("late", &[]);
    kubectl_lines.wait_for(Duration::from_secs(30), "ADDED late (HTTP/2)", |l| {
        l.starts_with("ADDED") && l.contains("late")
    });
    curl_lines.wait_for(Duration::from_secs(30), "ADDED late (HTTP/1.1)", |l| {
        l.contains(r#""type":"ADDED""#) && l.contains(r#""name":"late""#)
    });
}

/// curl, silent but for errors, with kplug's CA and admin client certificate.
fn admin_curl(kplug: &StandaloneKplug) -> Command {
    let (cert, key) = kplug.admin_credentials();
    let mut curl = Command::new("curl");
    curl.arg("-sS")
        .arg("--cacert")
        .arg(kplug.state.path().join("ca.crt"))
        .arg("--cert")
        .arg(cert)
        .arg("--key")
        .arg(key);
    curl
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn is_secret(name: &str) -> bool {
    name.contains(".key") || name.contains("kubeconfig")
}

#[test]
fn secrets_are_owner_only_from_the_first_byte() {
    let root = tempfile::tempdir().expect("temp dir");
    let state = root.path().join("new/state");
    // Every file seen in the state directory while kplug makes it, with its mode.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (state, stop) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen: Vec<(String, u32)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for entry in std::fs::read_dir(&state).into_iter().flatten().flatten() {
                    if let Ok(metadata) = entry.metadata() {
                        let name = entry.file_name().to_string_lossy().into_owned();
                        seen.push((name, metadata.permissions().mode() & 0o777));
                    }
                }
            }
            seen
        })
    };
    let (mut kplug, stdout) = Process::spawn_with_stdout(
        Command::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
            .arg("standalone")
            .arg("--state-dir")
            .arg(&state)
            .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
            .stdin(Stdio::null()),
        "kplug-apiserver standalone",
    );
    stdout.wait_for(Duration::from_secs(30), "the serving banner", |l| {
        l.starts_with("kplug is serving")
    });
    stop.store(true, Ordering::Relaxed);
    let seen = watcher.join().expect("the watcher");
    kplug.kill();

    let loose: BTreeSet<_> = seen
        .iter()
        .filter(|(name, mode)| is_secret(name) && *mode != 0o600)
        .collect();
    assert!(
        loose.is_empty(),
        "secrets seen readable by others: {loose:?}"
    );
    let names: BTreeSet<_> = seen.iter().map(|(name, _)| name.as_str()).collect();
    for name in ["ca.key", "kubeconfig"] {
        assert!(names.contains(name), "{name} never seen: {names:?}");
        assert_eq!(mode(&state.join(name)), 0o600, "{name}");
    }
    assert_eq!(mode(&state), 0o700, "the state directory");
    assert_eq!(mode(&state.join("ca.crt")) & 0o022, 0, "ca.crt");

    // `certs`, fresh and rotating over a key someone made world-readable.
    let out: PathBuf = root.path().join("certs");
    let certs = |extra: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
            .args(["certs", "--out-dir"])
            .arg(&out)
            .args(extra)
            .output()
            .expect("kplug-apiserver certs");
        assert!(output.status.success(), "{}", output_text(&output));
    };
    certs(&[]);
    assert_eq!(mode(&out.join("ca.key")), 0o600);
    assert_eq!(mode(&out.join("tls.key")), 0o600);
    std::fs::set_permissions(out.join("tls.key"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let (ca_cert, ca_key) = (out.join("ca.crt"), out.join("ca.key"));
    certs(&[
        "--ca-cert",
        &ca_cert.to_string_lossy(),
        "--ca-key",
        &ca_key.to_string_lossy(),
    ]);
    assert_eq!(mode(&out.join("tls.key")), 0o600);
}

#[path = "front_door/cluster.rs"]
mod cluster;

#[test]
fn heartbeat_answers_carry_no_date_and_api_answers_do() {
    use kplug_proto::v1alpha1::registry_client::RegistryClient;
    use kplug_test_support::heartbeat_request;

    let kplug = StandaloneKplug::start();
    // Every plugin instance holds a connection to the heartbeat listener: a
    // new `date` in every answer would grow each connection's HPACK table.
    let reply = client::runtime().block_on(async {
        let mut registry = RegistryClient::connect(kplug.grpc.clone())
            .await
            .expect("connect to the registry");
        let request = heartbeat_request("dated", "dated-0", "127.0.0.1:9", Duration::from_secs(10));
        registry.heartbeat(request).await.expect("a heartbeat")
    });
    assert!(reply.get_ref().accepted, "{:?}", reply.get_ref());
    assert!(
        reply.metadata().get("date").is_none(),
        "{:?}",
        reply.metadata()
    );

    // The API's answers keep theirs, as HTTP asks of an origin server.
    let headers = output_text(
        &admin_curl(&kplug)
            .args(["--http2", "-o", "/dev/null", "-D", "-"])
            .arg(format!("{}/livez", kplug.api))
            .output()
            .expect("curl runs"),
    );
    assert!(
        headers
            .lines()
            .any(|l| l.to_ascii_lowercase().starts_with("date:")),
        "{headers}"
    );
}
