//! Answers kplug gives before reading a request's body reach the client
//! (`server/early_answer.rs`): real curl over HTTP/2 and HTTP/1.1, and
//! nghttp (HTTP/2), send each early-refused request [`TRIES`] times to
//! kplug's API listener, standalone and `serve` (authentication and
//! authorization by a real kube-apiserver), and every try gets its whole
//! Status. Before kplug read the rest of refused bodies, curl 7.88 lost
//! 25-100 % of them.
//!
//! The connection stays usable where the protocol allows: every HTTP/2 run
//! is one connection, and so is every HTTP/1.1 run with a small body. With
//! a large one curl sends `Expect: 100-continue`; a client answered
//! instead may still send its body, so that connection closes.

use std::path::{Path, PathBuf};
use std::process::Command;

use kplug_test_support::{AggregatedKplug, ControlPlane, StandaloneKplug, client_cert};
use serde_json::Value;

const TRIES: usize = 100;
/// Many times `--max-request-bytes` (3 MiB): 413.
const OVERSIZED_BODY_BYTES: usize = 20 << 20;
/// Large enough that the client is still sending when it is answered (it
/// is over h2's 1 MiB window and curl's 1 MiB `Expect: 100-continue`).
const LARGE_BODY_BYTES: usize = 4 << 20;
const RECONCILES: &str = "/apis/plugins.kplug.io/v1alpha1/reconciles";
const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
/// Open to everyone on both modes: what the reused connection is checked with.
const LIVEZ: &str = "/livez";

/// How a client proves who it is.
#[derive(Clone, Debug)]
enum Credential {
    None,
    Certificate(PathBuf, PathBuf),
    Bearer(&'static str),
}

impl Credential {
    fn curl_args(&self) -> Vec<String> {
        match self {
            Credential::None => vec![],
            Credential::Certificate(cert, key) => vec![
                "--cert".into(),
                cert.display().to_string(),
                "--key".into(),
                key.display().to_string(),
            ],
            Credential::Bearer(token) => {
                vec!["-H".into(), format!("Authorization: Bearer {token}")]
            }
        }
    }

    fn nghttp_args(&self) -> Vec<String> {
        match self {
            Credential::Bearer(token) => {
                vec!["-H".into(), format!("authorization: Bearer {token}")]
            }
            // nghttp takes the same two options.
            _ => self.curl_args(),
        }
    }
}

/// A request kplug answers before reading its body.
struct Refusal {
    what: &'static str,
    path: &'static str,
    body: PathBuf,
    credential: Credential,
    code: u16,
    reason: &'static str,
}

/// kplug's API listener: its address and the CA of its serving certificate.
struct Listener {
    base: String,
    ca: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Http {
    Two,
    OnePointOne,
}

/// One transfer as curl's `-w` reports it.
struct Transfer {
    exit: i32,
    code: u16,
    connects: u32,
    body: String,
}

const MARK: &str = "\n@@kplug-early-answers@@ ";

/// [`TRIES`] times: the refused request, then `GET /livez`, all in one curl.
fn curl(listener: &Listener, refusal: &Refusal, http: Http) -> Vec<Transfer> {
    let common = |command: &mut Command| {
        command
            .args(["-sS", "--max-time", "30", "-w"])
            .arg(format!(
                "{MARK}%{{http_code}} %{{num_connects}} %{{exitcode}}\n"
            ))
            .arg(match http {
                Http::Two => "--http2",
                Http::OnePointOne => "--http1.1",
            })
            .arg("--cacert")
            .arg(&listener.ca)
            .args(refusal.credential.curl_args());
    };
    let mut command = Command::new("curl");
    for _ in 0..TRIES {
        common(&mut command);
        command
            .args(["-X", "POST", "-H", "Content-Type: application/json"])
            .arg("--data-binary")
            .arg(format!("@{}", refusal.body.display()))
            .arg(format!("{}{}", listener.base, refusal.path))
            .arg("--next");
        common(&mut command);
        command
            .arg(format!("{}{LIVEZ}", listener.base))
            .arg("--next");
    }
    // A last `--next` starts an empty transfer: end with a real one.
    common(&mut command);
    command.arg(format!("{}{LIVEZ}", listener.base));
    let output = command.output().expect("run curl");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut pieces = stdout.split(MARK);
    let mut body = pieces.next().unwrap_or_default().to_owned();
    let mut transfers = Vec::new();
    for piece in pieces {
        let (report, next_body) = piece.split_once('\n').unwrap_or((piece, ""));
        let mut fields = report.split(' ');
        let (code, connects, exit) = (fields.next(), fields.next(), fields.next());
        transfers.push(Transfer {
            code: code.and_then(|f| f.parse().ok()).unwrap_or(0),
            connects: connects.and_then(|f| f.parse().ok()).unwrap_or(u32::MAX),
            exit: exit.and_then(|f| f.parse().ok()).unwrap_or(-1),
            body: std::mem::take(&mut body),
        });
        body = next_body.to_owned();
    }
    assert_eq!(
        transfers.len(),
        2 * TRIES + 1,
        "curl reported every transfer; stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    transfers
}

/// The refused request's answer is the Status it should be.
fn status_problem(refusal: &Refusal, code: u16, body: &str) -> Option<String> {
    if code != refusal.code {
        return Some(format!("HTTP {code}, body {body:?}"));
    }
    let status: Value = match serde_json::from_str(body) {
        Ok(status) => status,
        Err(e) => return Some(format!("not JSON ({e}): {body:?}")),
    };
    let complete = status["kind"] == "Status"
        && status["code"] == refusal.code
        && status["reason"] == refusal.reason
        && status["message"].as_str().is_some_and(|m| !m.is_empty());
    (!complete).then(|| format!("not the whole Status: {body}"))
}

fn check_curl(listener: &Listener, refusal: &Refusal, http: Http) {
    let transfers = curl(listener, refusal, http);
    let mut failures = Vec::new();
    for (i, pair) in transfers.chunks(2).take(TRIES).enumerate() {
        let (refused, livez) = (&pair[0], &pair[1]);
        if refused.exit != 0 {
            failures.push(format!("try {i}: curl exit {}", refused.exit));
        } else if let Some(problem) = status_problem(refusal, refused.code, &refused.body) {
            failures.push(format!("try {i}: {problem}"));
        }
        if livez.exit != 0 || livez.code != 200 {
            failures.push(format!(
                "try {i}: /livez after it: exit {}, HTTP {}",
                livez.exit, livez.code
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} over {http:?}: {} of {TRIES} tries lost their answer:\n{}",
        refusal.what,
        failures.len(),
        failures.join("\n")
    );
    let connections: u32 = transfers.iter().map(|t| t.connects).sum();
    // curl 7.88 expects `100 Continue` above 1 MiB.
    let small = std::fs::metadata(&refusal.body).map_or(0, |m| m.len()) < 1 << 20;
    if http == Http::Two || small {
        assert_eq!(
            connections, 1,
            "{} over {http:?}: every try on the first connection",
            refusal.what
        );
    }
}

/// [`TRIES`] streams of the refused request on one nghttp connection.
fn check_nghttp(listener: &Listener, refusal: &Refusal) {
    let output = Command::new("nghttp")
        .args(["--stat", "--multiply", &TRIES.to_string(), "--data"])
        .arg(&refusal.body)
        .args(["-H", "content-type: application/json"])
        .args(refusal.credential.nghttp_args())
        .arg(format!("{}{}", listener.base, refusal.path))
        .output()
        .expect("run nghttp (Debian's nghttp2-client)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} with nghttp: exit {:?}\n{stderr}",
        refusal.what,
        output.status
    );
    // The bodies, one after another, then the statistics: one line per
    // stream with its status code in the fifth column.
    let (bodies, statistics) = stdout
        .split_once("***** Statistics *****")
        .unwrap_or((&stdout, ""));
    let answered = statistics
        .lines()
        .filter(|line| {
            line.split_whitespace().nth(4) == Some(&refusal.code.to_string())
                && line.ends_with(refusal.path)
        })
        .count();
    let statuses = serde_json::Deserializer::from_str(bodies)
        .into_iter::<Value>()
        .filter_map(Result::ok)
        .filter(|s| {
            s["kind"] == "Status" && s["code"] == refusal.code && s["reason"] == refusal.reason
        })
        .count();
    assert_eq!(
        (answered, statuses),
        (TRIES, TRIES),
        "{} with nghttp: streams answered {}, whole Statuses; stdout:\n{stdout}\n{stderr}",
        refusal.what,
        refusal.code
    );
}

fn check_all(listener: &Listener, refusals: &[Refusal]) {
    for refusal in refusals {
        check_curl(listener, refusal, Http::Two);
        check_curl(listener, refusal, Http::OnePointOne);
        check_nghttp(listener, refusal);
    }
}

/// A body of `size` bytes, written under `dir` as `NAME.json`.
fn body(dir: &Path, name: &str, size: usize) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    let mut bytes = vec![b' '; size.max(2)];
    bytes[0] = b'{';
    bytes[size.max(2) - 1] = b'}';
    std::fs::write(&path, bytes).expect("write a request body");
    path
}

/// A few bytes (sent right after the headers), [`LARGE_BODY_BYTES`] and
/// [`OVERSIZED_BODY_BYTES`].
fn bodies(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        body(dir, "small", 16),
        body(dir, "large", LARGE_BODY_BYTES),
        body(dir, "oversized", OVERSIZED_BODY_BYTES),
    )
}

/// What kplug refuses whoever asks: a POST on the collection (405) and a
/// reconcile over `--max-request-bytes` (413).
fn refused_to_anyone(small: &Path, oversized: &Path, admin: &Credential) -> [Refusal; 2] {
    [
        Refusal {
            what: "POST on the plugins collection",
            path: PLUGINS,
            body: small.to_owned(),
            credential: admin.clone(),
            code: 405,
            reason: "MethodNotAllowed",
        },
        Refusal {
            what: "a 20 MiB reconcile",
            path: RECONCILES,
            body: oversized.to_owned(),
            credential: admin.clone(),
            code: 413,
            reason: "RequestEntityTooLarge",
        },
    ]
}

#[test]
fn standalone_early_answers_reach_curl_and_nghttp() {
    let kplug = StandaloneKplug::start();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (small, large, oversized) = bodies(dir.path());
    let (cert, key) = kplug.admin_credentials();
    let admin = Credential::Certificate(cert, key);
    let listener = Listener {
        base: kplug.api.clone(),
        ca: kplug.state.path().join("ca.crt"),
    };
    let [not_allowed, too_large] = refused_to_anyone(&small, &oversized, &admin);
    check_all(
        &listener,
        &[
            not_allowed,
            too_large,
            Refusal {
                what: "a reconcile without a client certificate",
                path: RECONCILES,
                body: large,
                credential: Credential::None,
                code: 401,
                reason: "Unauthorized",
            },
        ],
    );
}

#[test]
fn serve_early_answers_reach_curl_and_nghttp() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cluster = ControlPlane::start(dir.path().join("cp"));
    let kplug = AggregatedKplug::start(&cluster, dir.path(), &[]);
    let (small, large, oversized) = bodies(dir.path());
    let admin = Credential::Certificate(
        cluster.var("KPLUG_ADMIN_CERT").into(),
        cluster.var("KPLUG_ADMIN_KEY").into(),
    );
    // A user the cluster's CA vouches for, whom no role grants anything.
    let (cert, key) = client_cert(
        dir.path(),
        "nobody",
        &cluster.var("KPLUG_CA_CERT"),
        &cluster.var("KPLUG_CA_KEY"),
    );
    let nobody = Credential::Certificate(cert.into(), key.into());
    let listener = Listener {
        base: format!("https://localhost:{}", kplug.https),
        ca: kplug.certs.join("ca.crt"),
    };
    let [not_allowed, too_large] = refused_to_anyone(&small, &oversized, &admin);
    check_all(
        &listener,
        &[
            not_allowed,
            too_large,
            Refusal {
                what: "a reconcile with a token kube-apiserver does not know",
                path: RECONCILES,
                body: large.clone(),
                credential: Credential::Bearer("not-a-token"),
                code: 401,
                reason: "Unauthorized",
            },
            Refusal {
                what: "a reconcile by a user no role allows",
                path: RECONCILES,
                body: large,
                credential: nobody,
                code: 403,
                reason: "Forbidden",
            },
        ],
    );
}
