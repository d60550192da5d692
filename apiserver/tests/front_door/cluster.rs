//! Cluster mode behind a real kube-apiserver: a flood of random bearer
//! tokens does not push a real user's answers out of kplug's caches, and a
//! percent-encoded `watch` is authorized as the watch it is served as.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::Empty;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kplug_test_support::metrics::Samples;
use kplug_test_support::{AggregatedKplug, ControlPlane, repo_root, wait_until};
use serde_json::Value;

use super::{PLUGINS, client};

/// Random tokens sent; the caches hold far fewer (see the flags). Each is
/// new, so each costs a real TokenReview:
/// 10,000 took 14-19 s here, 32 in flight on one HTTP/2 connection.
const FLOOD: usize = 10_000;
const CACHE_SIZE: &str = "100";

/// Every role that `deploy/` and the example's `deploy/` ship, rendered by
/// kustomize and read by kubectl, the way `kubectl apply -k` would send
/// them. Only the roles go to kubectl: this kube-apiserver (1.20) serves
/// neither `policy/v1` PodDisruptionBudgets nor the example's gRPC probes.
fn shipped_roles(cluster: &ControlPlane) -> Vec<Value> {
    let mut roles = Vec::new();
    for dir in ["deploy", "examples/database-table/deploy"] {
        let rendered = cluster.kubectl_ok(&["kustomize", &repo_root().join(dir).to_string_lossy()]);
        let yaml = rendered
            .split("\n---\n")
            .filter(|document| {
                document
                    .lines()
                    .any(|line| matches!(line, "kind: ClusterRole" | "kind: Role"))
            })
            .collect::<Vec<_>>()
            .join("\n---\n");
        let file = cluster.dir().join("rendered.yaml");
        std::fs::write(&file, yaml).expect("write the rendered manifests");
        // One JSON object after another.
        let printed = cluster.kubectl_ok(&[
            "create",
            "--dry-run=client",
            "--validate=false",
            "-o",
            "json",
            "-f",
            &file.to_string_lossy(),
        ]);
        let items = serde_json::Deserializer::from_str(&printed)
            .into_iter::<Value>()
            .map(|object| object.expect("the manifests as JSON"));
        roles.extend(
            items
                .into_iter()
                .filter(|o| matches!(o["kind"].as_str(), Some("ClusterRole" | "Role"))),
        );
    }
    roles
}

/// Every shipped rule that grants `plugins/heartbeat` names the plugins it
/// is for: one without `resourceNames` lets one ServiceAccount register,
/// and take over, any plugin name.
fn shipped_heartbeat_roles_name_their_plugins(cluster: &ControlPlane) {
    let mut pinned = 0;
    for role in shipped_roles(cluster) {
        for rule in role["rules"].as_array().into_iter().flatten() {
            let heartbeat = rule["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r == "plugins/heartbeat");
            if !heartbeat {
                continue;
            }
            let names = rule["resourceNames"].as_array().map_or(0, Vec::len);
            assert!(
                names > 0,
                "{} grants plugins/heartbeat for any plugin name: {rule}",
                role["metadata"]["name"]
            );
            pinned += 1;
        }
    }
    assert!(pinned >= 2, "the example's plugin roles were not found");
}

/// Sends `FLOOD` requests with random bearer tokens straight to kplug over
/// one HTTP/2 connection; each must be refused with 401.
fn flood(kplug: &AggregatedKplug) -> Duration {
    let runtime = client::runtime();
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], kplug.https));
    let ca = kplug.certs.join("ca.crt");
    runtime.block_on(async {
        let io = TokioIo::new(client::tls(address, &client::connector(&ca, &[b"h2"])).await);
        let (send, connection) = http2::handshake(TokioExecutor::new(), io)
            .await
            .expect("the HTTP/2 handshake");
        tokio::spawn(connection);
        let started = std::time::Instant::now();
        let statuses: Vec<u16> = futures::stream::iter(0..FLOOD)
            .map(|_| {
                let mut send = send.clone();
                async move {
                    let request = hyper::Request::get(PLUGINS)
                        .header("host", "localhost")
                        .header("authorization", format!("Bearer {}", uuid::Uuid::new_v4()))
                        .body(Empty::<Bytes>::new())
                        .expect("a request");
                    match send.send_request(request).await {
                        Ok(response) => response.status().as_u16(),
                        Err(e) => panic!("no answer: {e}"),
                    }
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        let unauthorized = statuses.iter().filter(|s| **s == 401).count();
        assert_eq!(unauthorized, FLOOD, "every random token is refused");
        started.elapsed()
    })
}

#[test]
fn bad_tokens_and_encoded_verbs_behind_a_real_kube_apiserver() {
    let work = tempfile::Builder::new()
        .prefix("kplug-front-door-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let cluster = ControlPlane::start(work.path().join("cp"));
    let kplug = AggregatedKplug::start(
        &cluster,
        work.path(),
        &[
            // Long enough to outlast the flood.
            "--authentication-cache-ttl",
            "10m",
            "--authorization-allowed-cache-ttl",
            "10m",
            "--authorization-denied-cache-ttl",
            "1s",
            "--authentication-cache-size",
            CACHE_SIZE,
            "--authorization-cache-size",
            CACHE_SIZE,
        ],
    );
    shipped_heartbeat_roles_name_their_plugins(&cluster);
    kplug.wait_for_log(Duration::from_secs(10), "the auth ConfigMap loaded", |l| {
        l.contains("loaded kube-system/extension-apiserver-authentication")
            && l.contains("front_proxy=true")
    });
    let front_proxy = (
        cluster.var("KPLUG_FRONT_PROXY_CLIENT_CERT"),
        cluster.var("KPLUG_FRONT_PROXY_CLIENT_KEY"),
    );
    let as_user = |user: &str, path: &str| {
        let (_, code, body) = kplug.curl(
            Some((&front_proxy.0, &front_proxy.1)),
            &[
                &format!("X-Remote-User: {user}"),
                "X-Remote-Group: system:authenticated",
            ],
            path,
        );
        (code, body)
    };
    // Scraped as system:masters through the front proxy: neither cache is used.
    let scrape = || {
        let (_, code, body) = kplug.curl(
            Some((&front_proxy.0, &front_proxy.1)),
            &["X-Remote-User: admin", "X-Remote-Group: system:masters"],
            "/metrics",
        );
        assert_eq!(code, 200, "{body}");
        Samples::parse(&body)
    };
    let lookups = |samples: &Samples, cache: &str, result: &str| {
        samples.sum(
            "kplug_auth_cache_lookups_total",
            &[("cache", cache), ("result", result)],
        )
    };

    // A user who may list plugins, and not watch them.
    cluster.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: plugin-lister}\nrules:\n- {apiGroups: [plugins.kplug.io], resources: [plugins], verbs: [list]}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: plugin-lister}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: plugin-lister}\nsubjects:\n- {kind: User, name: lister, apiGroup: rbac.authorization.k8s.io}\n",
    );
    wait_until("lister may list", Duration::from_secs(20), || {
        let (code, body) = as_user("lister", PLUGINS);
        (code == 200).then_some(()).ok_or(format!("{code}: {body}"))
    });
    for query in ["watch=true", "watch=%74rue", "w%61tch=1"] {
        let (code, body) = as_user("lister", &format!("{PLUGINS}?{query}"));
        assert_eq!(code, 403, "?{query} must be authorized as a watch: {body}");
        assert!(body.contains("cannot watch resource"), "{body}");
    }

    // A real user with a ServiceAccount token and the shipped reader role.
    cluster.kubectl_ok(&["create", "serviceaccount", "legit", "-n", "default"]);
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "legit-reads",
        "--clusterrole=kplug:reader",
        "--serviceaccount=default:legit",
    ]);
    let token = cluster.token("default", "legit");
    let bearer = format!("Authorization: Bearer {token}");
    let as_legit = || kplug.curl(None, &[&bearer], PLUGINS);
    wait_until("the legit user may list", Duration::from_secs(20), || {
        let (_, code, body) = as_legit();
        (code == 200).then_some(()).ok_or(format!("{code}: {body}"))
    });

    let elapsed = flood(&kplug);
    eprintln!("{FLOOD} random tokens refused in {elapsed:?}");

    let before = scrape();
    let (_, code, body) = as_legit();
    assert_eq!(code, 200, "{body}");
    let after = scrape();
    let delta = |cache, result| lookups(&after, cache, result) - lookups(&before, cache, result);
    assert_eq!(
        (delta("token", "hit"), delta("token", "miss")),
        (1.0, 0.0),
        "the legit token is still cached after {FLOOD} random ones"
    );
    assert!(
        delta("decision", "hit") >= 1.0,
        "the legit user's decision is still cached"
    );
    let reviews =
        |samples: &Samples| samples.sum("kplug_auth_reviews_total", &[("review", "TokenReview")]);
    assert_eq!(
        reviews(&after),
        reviews(&before),
        "no TokenReview for a cached token"
    );
    assert!(
        reviews(&after) >= FLOOD as f64,
        "every random token was reviewed: {}",
        after.text
    );
}
