//! A hostile plugin in cluster mode (issue 18, item 3): with its own
//! ServiceAccount's token, allowed to heartbeat as itself only, it declares
//! plugin after plugin (each a new API). kplug refuses every one, registers
//! nothing but itself, and a neighbour stays Ready. What it costs
//! kube-apiserver is one SubjectAccessReview per new name until it has been
//! denied 20 times in 10 s; then kplug refuses its names without review,
//! while its own name, allowed and cached, is still accepted. The reviews
//! are counted from kplug's metrics, and the log lines of its refusals are
//! bounded too.

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
/// kplug's bound on an identity's denied heartbeats per 10 s window.
const DENIALS: usize = 20;
/// kplug's bound on the log lines of refused heartbeats per 10 s window.
const LOG_LINES: u64 = 20;

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
fn a_plugin_declaring_plugin_after_plugin_is_refused_at_a_bounded_number_of_reviews() {
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
    // Itself, which it may: accepted, and the decision cached.
    assert_eq!(hostile.heartbeat_once(&registration), Ok(true));
    let before = denials(&scrape(&cluster, &kplug));
    let flood = hostile.flood(
        &registration,
        NAMES,
        1_000,
        Duration::from_secs(3),
        CONCURRENCY,
    );
    let after = denials(&scrape(&cluster, &kplug));
    let logged = kplug
        .log
        .drain()
        .iter()
        .filter(|line| line.contains("heartbeat refused"))
        .count();
    assert_eq!(flood.accepted + flood.refused, 0, "{flood:?}");
    assert_eq!(
        flood.failed, flood.sent,
        "each was PermissionDenied: {flood:?}"
    );
    // Its own name, allowed, is still accepted in the window.
    assert_eq!(hostile.heartbeat_once(&registration), Ok(true));
    let listed = cluster.kubectl_ok(&["get", "plugins", "-o", "name"]);
    assert_eq!(
        listed.split_whitespace().collect::<Vec<_>>(),
        [
            "plugin.plugins.kplug.io/greedy",
            "plugin.plugins.kplug.io/neighbour"
        ],
        "nothing registered but the two plugins' own names"
    );
    wait_plugin_ready(&cluster, "neighbour");
    let distinct = flood.sent.min(NAMES);
    eprintln!(
        "hostile (cluster): {} heartbeats of {distinct} names in {} ms, all refused; kplug sent {} SubjectAccessReviews, all denied",
        flood.sent,
        flood.elapsed.as_millis(),
        after - before
    );
    // Its refusals' log lines: at most kplug's 20 per 10 s window, in each
    // window the flood touched.
    let windows = flood.elapsed.as_secs() / 10 + 2;
    eprintln!("hostile (cluster): {logged} 'heartbeat refused' lines in kplug's log");
    assert!(
        (1..=(LOG_LINES * windows) as usize).contains(&logged),
        "{logged} refusal lines for {} refused heartbeats in {:?}",
        flood.sent,
        flood.elapsed
    );
    // A review per name until the identity's 20th denial, and those in
    // flight then (at most one per caller); none after.
    let sent = after - before;
    assert!(
        (DENIALS as f64..=(DENIALS + CONCURRENCY) as f64).contains(&sent),
        "{sent} reviews for {} heartbeats of {distinct} names",
        flood.sent
    );
}
