//! The OpenAPI documents a running kplug serves are the ones it has always
//! served: byte for byte the golden files in `tests/golden/openapi/`
//! (captured from kplug before the OpenAPI code was split and its protobuf
//! encoder replaced; see the README there), with the headers clients rely
//! on, and kubectl 1.27, which reads the protobuf v2 document, still
//! explains from them.

use std::path::{Path, PathBuf};
use std::process::Command;

use kplug_apiserver::api::openapi::gnostic::openapi_v2::Document;
use kplug_test_support::{StandaloneKplug, kubectl_of, output_text};
use prost::Message as _;

const KUBECTL_V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const GROUP_VERSION: &str = "/openapi/v3/apis/plugins.kplug.io/v1alpha1";

fn golden(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/openapi");
    std::fs::read(path.join(name))
        .unwrap_or_else(|e| panic!("cannot read the golden file {name}: {e}"))
}

fn golden_text(name: &str) -> String {
    String::from_utf8(golden(name)).unwrap_or_else(|e| panic!("{name} is not UTF-8: {e}"))
}

/// The status and [`stable`] headers captured with a golden document
/// (`headers.txt`), by request name.
fn golden_headers(request: &str) -> (u16, Vec<(String, String)>) {
    let text = golden_text("headers.txt");
    let section = text
        .split("== ")
        .find_map(|section| section.strip_prefix(&format!("{request}\n")))
        .unwrap_or_else(|| panic!("no {request} in headers.txt"));
    let (status, headers) = parse_headers(section);
    (status, stable(&headers))
}

/// `HTTP/<version> <status>` then `name: value` lines, names lowercased.
fn parse_headers(text: &str) -> (u16, Vec<(String, String)>) {
    let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    (status, headers)
}

/// One response, with its body as bytes (the protobuf document is binary).
struct Fetched {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Fetched {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_str())
    }

    fn stable_headers(&self) -> Vec<(String, String)> {
        stable(&self.headers)
    }
}

/// The headers that must not change, ETag aside (checked on its own: the
/// content hash changed from FNV-1a to SHA-256) and those that differ from
/// one response to the next (Date, Content-Length, Expires).
fn stable(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| !["etag", "date", "content-length", "expires"].contains(&name.as_str()))
        .cloned()
        .collect()
}

/// GET `path` with curl as the admin, keeping the body's bytes.
fn fetch(kplug: &StandaloneKplug, path: &str, accept: Option<&str>) -> Fetched {
    let (cert, key) = kplug.admin_credentials();
    let out = tempfile::tempdir().expect("a temporary directory");
    let (headers, body) = (out.path().join("headers"), out.path().join("body"));
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--max-time", "10", "--cacert"])
        .arg(kplug.state.path().join("ca.crt"))
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .arg("-D")
        .arg(&headers)
        .arg("-o")
        .arg(&body);
    if let Some(accept) = accept {
        curl.args(["-H", &format!("Accept: {accept}")]);
    }
    let output = curl
        .arg(format!("{}{path}", kplug.api))
        .output()
        .expect("run curl");
    assert!(
        output.status.success(),
        "curl {path}: {}",
        output_text(&output)
    );
    let headers = std::fs::read_to_string(&headers).expect("curl's headers");
    let (status, headers) = parse_headers(&headers);
    let body = std::fs::read(&body).unwrap_or_default();
    Fetched {
        status,
        headers,
        body,
    }
}

/// The content hash kplug names documents by: the first 128 bits of their
/// SHA-256, as 32 uppercase hex digits.
fn content_hash(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let hash: String = digest
        .as_ref()
        .iter()
        .take(16)
        .map(|byte| format!("{byte:02X}"))
        .collect();
    hash
}

fn etag(data: &[u8]) -> String {
    format!("\"{}\"", content_hash(data))
}

#[test]
fn documents_are_byte_for_byte_the_golden_ones() {
    let kplug = StandaloneKplug::start();
    let v2_json = golden("v2.json");
    let v3 = golden("v3-apis-plugins.kplug.io-v1alpha1.json");

    // The v2 document as JSON, as kube-apiserver's aggregator asks for it.
    let served = fetch(&kplug, "/openapi/v2", Some("application/json"));
    assert_eq!(served.body, v2_json, "/openapi/v2 as JSON");
    assert_eq!(
        (served.status, served.stable_headers()),
        golden_headers("v2-json")
    );
    assert_eq!(served.header("etag"), Some(etag(&v2_json).as_str()));

    // The v2 document in protobuf, as kubectl asks for it: the same
    // message as the golden one, in prost's canonical field order (see
    // the gnostic module: the old encoder wrote fields in JSON key order).
    let served = fetch(&kplug, "/openapi/v2", Some(KUBECTL_V2_PROTOBUF));
    let golden_message = Document::decode(&golden("v2.pb")[..]).expect("golden v2.pb decodes");
    let served_message = Document::decode(&served.body[..]).expect("served v2 protobuf decodes");
    assert!(
        served_message == golden_message,
        "the protobuf v2 document changed"
    );
    assert_eq!(served.body, golden_message.encode_to_vec());
    assert_eq!(
        (served.status, served.stable_headers()),
        golden_headers("v2-pb")
    );
    // Every representation carries the JSON form's ETag.
    assert_eq!(served.header("etag"), Some(etag(&v2_json).as_str()));

    // The group-version document, without and with its hash.
    let served = fetch(&kplug, GROUP_VERSION, None);
    assert_eq!(served.body, v3, "{GROUP_VERSION}");
    assert_eq!(
        (served.status, served.stable_headers()),
        golden_headers("v3-gv")
    );
    assert_eq!(served.header("etag"), Some(etag(&v3).as_str()));

    // The index names it by its hash: the golden index, with the hash the
    // document has now.
    let golden_index = golden_text("v3.json");
    let old_url: serde_json::Value = serde_json::from_str(&golden_index).expect("golden index");
    let old_hash = old_url["paths"]["apis/plugins.kplug.io/v1alpha1"]["serverRelativeURL"]
        .as_str()
        .and_then(|url| url.split_once("?hash="))
        .map(|(_, hash)| hash.to_owned())
        .expect("the golden index names a hash");
    let hash = content_hash(&v3);
    let index = golden_index.replace(&old_hash, &hash);
    let served = fetch(&kplug, "/openapi/v3", None);
    assert_eq!(String::from_utf8_lossy(&served.body), index, "/openapi/v3");
    assert_eq!(
        (served.status, served.stable_headers()),
        golden_headers("v3-index")
    );
    assert_eq!(served.header("etag"), Some(etag(index.as_bytes()).as_str()));

    let served = fetch(&kplug, &format!("{GROUP_VERSION}?hash={hash}"), None);
    assert_eq!(served.body, v3, "{GROUP_VERSION}?hash={hash}");
    assert_eq!(
        (served.status, served.stable_headers()),
        golden_headers("v3-gv-hashed")
    );
    assert_eq!(served.header("etag"), Some(etag(&v3).as_str()));
    // Cached for a year from now.
    let expires = served.header("expires").expect("an Expires header");
    let expires = jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(expires)
        .unwrap_or_else(|e| panic!("Expires {expires:?} is not an HTTP date: {e}"));
    let ahead = expires.duration_since(jiff::Timestamp::now());
    let year = jiff::SignedDuration::from_secs(365 * 24 * 60 * 60);
    assert!(
        (ahead - year).abs() < jiff::SignedDuration::from_secs(60),
        "Expires is {ahead:?} ahead"
    );
}

/// kubectl 1.27 fetches the protobuf v2 document for every `explain`, and
/// renders from it with `--output=plaintext-openapiv2`: what it prints is
/// what it printed from the hand-encoded document.
#[test]
fn kubectl_1_27_explains_from_the_protobuf_document() {
    let Some(kubectl) = kubectl_of("1.27") else {
        return;
    };
    let kplug = StandaloneKplug::start();
    // A cache of its own, so that kubectl fetches what this kplug serves.
    let cache = tempfile::tempdir().expect("a temporary directory");
    let explain = |args: &[&str]| {
        let cache_dir: PathBuf = cache.path().into();
        let mut all = vec!["--cache-dir", cache_dir.to_str().expect("a UTF-8 path")];
        all.extend(args);
        let output = kplug.kubectl_with(&kubectl, &all);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            output_text(&output)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };

    let explained = explain(&["explain", "plugins.spec"]);
    assert!(
        explained.contains("implementation") && explained.contains("address"),
        "{explained}"
    );
    for (args, golden) in [
        (
            &["explain", "plugins.spec"][..],
            "explain-1.27-openapiv2-plugins.spec.txt",
        ),
        (
            &["explain", "plugins", "--recursive"][..],
            "explain-1.27-openapiv2-plugins.txt",
        ),
        (
            &["explain", "reconciles", "--recursive"][..],
            "explain-1.27-openapiv2-reconciles.txt",
        ),
    ] {
        let mut args = args.to_vec();
        args.push("--output=plaintext-openapiv2");
        assert_eq!(explain(&args), golden_text(golden), "{args:?}");
    }
}
