//! A hostile plugin in cluster mode (issue 18, item 3): with its own
//! ServiceAccount's token, allowed to heartbeat as itself only, it declares
//! plugin after plugin (each a new API). kplug refuses every one, registers
//! nothing, and a neighbour stays Ready; what it costs is one
//! SubjectAccessReview per new name, counted here from kplug's metrics.

use std::time::Duration;

use kplug_proto::v1alpha1::PluginApi;
use kplug_test_support::hostile::{Hostile, Mode, Registration};
use kplug_test_support::metrics::Samples;
use kplug_test_support::{
    AggregatedKplug, ControlPlane, heartbeat_request, hello_plugin, plugin_identity,
    wait_plugin_ready,
};

const NAMES: usize = 1_000;
const CONCURRENCY: usize = 16;

/// kplug's metrics, read as kube-apiserver's front proxy would.
fn scrape(cluster: &ControlPlane, kplug: &AggregatedKplug) -> Samples {
    let cert = cluster.var("KPLUG_FRONT_PROXY_CLIENT_CERT");
    let key = cluster.var("KPLUG_FRONT_PROXY_CLIENT_KEY");
    let (_, code, body) = kplug.curl(
        Some((&cert, &key)),
        &["X-Remote-User: admin", "X-Remote-Group: system:masters"],
        "/metrics",
    );
    assert_eq!(code, 200, "{body}");
    Samples::parse(&body)
}

/// SubjectAccessReviews that denied (the neighbour's are allowed).
fn denials(samples: &Samples) -> f64 {
    samples.sum(
        "kplug_auth_reviews_total",
        &[("review", "SubjectAccessReview"), ("result", "denied")],
    )
}

#[test]
fn a_plugin_declaring_plugin_after_plugin_is_refused_each_at_one_review_per_name() {
    let work = tempfile::Builder::new()
        .prefix("kplug-hostile-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let cluster = ControlPlane::start(work.path().join("cp"));
    let kplug = AggregatedKplug::start(&cluster, work.path(), &[]);
    cluster.kubectl_ok(&["create", "namespace", "plugins"]);
    let neighbour_token = plugin_identity(&cluster, "neighbour", Some("neighbour"), work.path());
    let _neighbour = hello_plugin(&kplug, "neighbour", &neighbour_token);
    wait_plugin_ready(&cluster, "neighbour");

    let hostile = Hostile::start(Mode::Silent);
    let token = plugin_identity(&cluster, "greedy", Some("greedy"), work.path());
    let mut request = heartbeat_request("greedy", "", &hostile.address, Duration::from_secs(1));
    request.api = Some(PluginApi {
        group: "greedy.example.com".to_owned(),
        resource: "r".to_owned(),
        version: "v1".to_owned(),
    });
    let registration = Registration::cluster(&kplug, &token, request);
    let before = denials(&scrape(&cluster, &kplug));
    // Names in turn, each again once all were sent: then kplug's cache of
    // denials answers.
    let flood = hostile.flood(
        &registration,
        NAMES,
        1_000,
        Duration::from_secs(3),
        CONCURRENCY,
    );
    let after = denials(&scrape(&cluster, &kplug));
    assert_eq!(flood.accepted + flood.refused, 0, "{flood:?}");
    assert_eq!(
        flood.failed, flood.sent,
        "each was PermissionDenied: {flood:?}"
    );
    let listed = cluster.kubectl_ok(&["get", "plugins", "-o", "name"]);
    assert_eq!(
        listed.trim(),
        "plugin.plugins.kplug.io/neighbour",
        "nothing registered but the neighbour"
    );
    wait_plugin_ready(&cluster, "neighbour");
    let distinct = flood.sent.min(NAMES);
    eprintln!(
        "hostile (cluster): {} heartbeats of {distinct} names in {} ms, all refused; kplug sent {} SubjectAccessReviews, all denied",
        flood.sent,
        flood.elapsed.as_millis(),
        after - before
    );
    // One review per name; a repeat only while its name's first review is
    // in flight (at most one per caller), never once the denial is cached.
    let sent = after - before;
    assert!(
        sent >= distinct as f64 && sent <= (distinct + CONCURRENCY) as f64,
        "{sent} reviews for {} heartbeats of {distinct} names",
        flood.sent
    );
}
