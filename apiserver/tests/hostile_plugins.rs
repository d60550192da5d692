//! A hostile plugin is contained (issue 18, item 3): for each attack, the
//! caller's Status, kplug still up, a neighbour hello plugin answering all
//! through the attack, and a measured bound on kplug's cost. The figures
//! are printed (`--nocapture`), never asserted against a time: speed is the
//! benches' business.
//!
//! The hostile plugin is `kplug_test_support::hostile`, a fake gRPC server
//! registered with real heartbeats; kplug is a real standalone process.

use std::time::{Duration, Instant};

use kplug_api::children::MAX_CHILD_BYTES;
use kplug_apiserver::api::reconcile::{MAX_STATUS_BYTES, MAX_STATUS_DEPTH};
use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{
    DesiredChild, ExtensionKind, ExtensionStatus, ObjectReference, Readiness, ReconcileResponse,
};
use kplug_test_support::hostile::{Hostile, Mode, Registration, json_of, nested_json};
use kplug_test_support::measure::{Latencies, proc_status_kib, process_cpu_time};
use kplug_test_support::report::ms;
use kplug_test_support::{
    Process, StandaloneKplug, heartbeat_request, kube_client_without_retries, wait_until,
};
use serde_json::{Value, json};

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
/// kplug's default `--max-request-bytes`; its gRPC message limit to
/// plugins is this plus 1 MiB.
const MAX_REQUEST_BYTES: usize = 3 << 20;

/// kplug, the hostile plugin registered as `hostile`, and a well-behaved
/// neighbour (the hello plugin) registered as `neighbour`.
struct Scene {
    kplug: StandaloneKplug,
    hostile: Hostile,
    _neighbour: Process,
    client: kube::Client,
}

fn ready(object: &Value) -> bool {
    object["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// A caller's failure: the Status kplug answered with.
#[derive(Debug)]
struct Refused {
    code: u16,
    reason: String,
    message: String,
}

impl Scene {
    fn start(mode: Mode, flags: &[&str]) -> Self {
        let kplug = StandaloneKplug::start_with(flags);
        let hostile = Hostile::start(mode);
        hostile.heartbeat(&kplug.grpc, "hostile", &hostile.address);
        let neighbour = kplug.plugin("neighbour", &[]);
        kplug.wait_for_plugin("hostile", ready);
        kplug.wait_for_plugin("neighbour", ready);
        let client = hostile.block_on(kube_client_without_retries(&kplug.kubeconfig, None));
        Self {
            kplug,
            hostile,
            _neighbour: neighbour,
            client,
        }
    }

    /// Reconciles `spec` with `plugin`: the answer, or kplug's Status.
    fn reconcile(&self, plugin: &str, spec: Value) -> Result<Value, Refused> {
        let body =
            json!({"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": spec});
        let request = http::Request::post(format!("{PLUGINS}/{plugin}/reconcile"))
            .header("Content-Type", "application/json")
            .body(body.to_string().into_bytes())
            .expect("a request");
        let answer = self.hostile.block_on(self.client.request_text(request));
        match answer {
            Ok(text) => Ok(serde_json::from_str(&text).expect("the answer is JSON")),
            Err(kube::Error::Api(status)) => Err(Refused {
                code: status.code,
                reason: status.reason,
                message: status.message,
            }),
            Err(other) => panic!("no answer from kplug: {other}"),
        }
    }

    /// One neighbour call, which must succeed; its latency.
    fn neighbour_call(&self) -> Duration {
        let started = Instant::now();
        let answer = self
            .reconcile("neighbour", json!({"object": greeting("n")}))
            .unwrap_or_else(|refused| panic!("the neighbour was refused: {refused:?}"));
        assert_eq!(answer["status"]["success"], true, "{answer:#}");
        started.elapsed()
    }

    /// The neighbour's latencies while `attack` runs on another thread
    /// (at least `min_calls` calls), and what the attack returned.
    fn during<T: Send>(
        &self,
        min_calls: usize,
        attack: impl FnOnce() -> T + Send,
    ) -> (Latencies, T) {
        std::thread::scope(|scope| {
            let attack = scope.spawn(attack);
            let mut samples = Vec::new();
            while !attack.is_finished() || samples.len() < min_calls {
                samples.push(self.neighbour_call());
            }
            let result = attack.join().expect("the attack's thread");
            (Latencies::new(samples), result)
        })
    }

    /// The neighbour's latencies with no attack.
    fn baseline(&self, calls: usize) -> Latencies {
        Latencies::new((0..calls).map(|_| self.neighbour_call()).collect())
    }

    fn kib(&self, field: &str) -> u64 {
        proc_status_kib(self.kplug.pid(), field).expect("kplug's /proc status")
    }

    fn plugin(&self, name: &str) -> Value {
        serde_json::from_str(
            &self
                .kplug
                .kubectl_ok(&["get", "plugin", name, "-o", "json"]),
        )
        .expect("the plugin as JSON")
    }
}

fn greeting(name: &str) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Greeting", "metadata": {"name": name}})
}

fn widget(name: &str) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name, "namespace": "ns"}})
}

/// The neighbour's p50 before and during an attack, for the record.
fn report(attack: &str, before: &Latencies, during: &Latencies, extra: &str) {
    eprintln!(
        "hostile: {attack}: neighbour p50 {} before ({} calls), {} during ({} calls, max {}){extra}",
        ms(before.percentile(50.0), 2),
        before.len(),
        ms(during.percentile(50.0), 2),
        during.len(),
        ms(during.max(), 2),
    );
}

fn assert_refused(refused: &Refused, code: u16, reason: &str, contains: &[&str]) {
    assert_eq!(
        (refused.code, refused.reason.as_str()),
        (code, reason),
        "{refused:?}"
    );
    for part in contains {
        assert!(
            refused.message.contains(part),
            "{part:?} not in {refused:?}"
        );
    }
}

#[test]
fn a_100_mb_answer_is_refused_at_the_message_limit_without_being_read() {
    const HUNDRED_MB: usize = 100 << 20;
    let scene = Scene::start(Mode::Huge(HUNDRED_MB), &[]);
    let before = scene.baseline(20);
    let (rss, peak) = (scene.kib("VmRSS"), scene.kib("VmHWM"));
    let limit = (MAX_REQUEST_BYTES + (1 << 20)).to_string();
    let (during, ()) = scene.during(20, || {
        for _ in 0..3 {
            let refused = scene
                .reconcile("hostile", json!({"object": greeting("a")}))
                .expect_err("a 100 MB answer");
            assert_refused(
                &refused,
                500,
                "InternalError",
                &["hostile", "answered more than kplug accepts", &limit],
            );
        }
    });
    assert_eq!(scene.hostile.calls(), 3, "each call reached the plugin");
    let (rss_after, peak_after) = (scene.kib("VmRSS"), scene.kib("VmHWM"));
    report(
        "3 answers of 100 MiB",
        &before,
        &during,
        &format!("; kplug RSS {rss} KiB -> {rss_after} KiB, peak {peak} KiB -> {peak_after} KiB"),
    );
    // kplug reads the message's length and stops: its peak memory grew by
    // far less than one answer.
    let grown = peak_after.saturating_sub(peak) << 10;
    assert!(
        grown < (HUNDRED_MB as u64) / 4,
        "kplug's peak RSS grew by {grown} bytes"
    );
}

/// An answer with only `object_status` set.
fn with_object_status(status: Vec<u8>) -> ReconcileResponse {
    ReconcileResponse {
        success: true,
        object_status: status,
        ..ReconcileResponse::default()
    }
}

/// An answer with one extension status for `reference`.
fn with_extension_status(reference: Value, status: &[u8]) -> ReconcileResponse {
    let text = |field: &str| reference[field].as_str().unwrap_or_default().to_owned();
    ReconcileResponse {
        success: true,
        extension_statuses: vec![ExtensionStatus {
            r#ref: Some(ObjectReference {
                api_version: text("apiVersion"),
                kind: text("kind"),
                namespace: reference["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                name: reference["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            }),
            status: status.to_vec(),
        }],
        ..ReconcileResponse::default()
    }
}

#[test]
fn statuses_that_cannot_be_written_are_refused_and_nothing_of_them_is_answered() {
    let scene = Scene::start(Mode::Silent, &[]);
    let spec = json!({"object": greeting("a"), "extensions": [widget("sent")]});

    // What a plugin may answer: a status for the extension it was sent.
    scene.hostile.set(Mode::Answer(with_extension_status(
        widget("sent"),
        br#"{"ok":true}"#,
    )));
    let answer = scene
        .reconcile("hostile", spec.clone())
        .expect("a valid answer");
    assert_eq!(
        answer["status"]["extensionStatuses"][0]["status"]["ok"], true,
        "{answer:#}"
    );

    let too_long = json_of(MAX_STATUS_BYTES + 1);
    let too_deep = nested_json(MAX_STATUS_DEPTH + 1);
    let cases: Vec<(&str, ReconcileResponse, String)> = vec![
        (
            "a status for an extension it was not sent",
            with_extension_status(widget("other"), br#"{"ok":true}"#),
            "status.extensionStatuses[0].ref: Invalid value: \"example.com/v1 Widget ns/other\": names no extension the plugin was sent".to_owned(),
        ),
        (
            "an object status that is not an object",
            with_object_status(br#""done""#.to_vec()),
            "status.objectStatus: Invalid value: \"string\": must be of type object".to_owned(),
        ),
        (
            "an extension status that is not an object",
            with_extension_status(widget("sent"), b"[1]"),
            "status.extensionStatuses[0].status: Invalid value: \"array\": must be of type object".to_owned(),
        ),
        (
            "a status deeper than kube-apiserver's clients read",
            with_object_status(too_deep),
            format!(
                "status.objectStatus: Invalid value: \"object\": must be nested at most {MAX_STATUS_DEPTH} levels deep, found {}",
                MAX_STATUS_DEPTH + 1
            ),
        ),
        (
            "a status larger than etcd stores",
            with_object_status(too_long.clone()),
            format!(
                "status.objectStatus: Too long: must have at most {MAX_STATUS_BYTES} bytes, found {}",
                too_long.len()
            ),
        ),
    ];
    for (attack, answer, message) in cases {
        scene.hostile.set(Mode::Answer(answer));
        let refused = scene.reconcile("hostile", spec.clone()).expect_err(attack);
        assert_refused(
            &refused,
            500,
            "InternalError",
            &["plugin hostile returned an invalid answer: ", &message],
        );
        // The neighbour answers in between.
        let latency = scene.neighbour_call();
        eprintln!(
            "hostile: {attack}: refused; the neighbour's next call took {}",
            ms(latency, 2)
        );
    }
}

/// An answer with these desired children, each a key and its JSON.
fn with_children(children: &[(&str, Vec<u8>)]) -> ReconcileResponse {
    ReconcileResponse {
        success: true,
        desired_children: children
            .iter()
            .map(|(key, object)| DesiredChild {
                key: (*key).to_owned(),
                object: object.clone(),
                ..DesiredChild::default()
            })
            .collect(),
        ..ReconcileResponse::default()
    }
}

#[test]
fn children_no_operator_should_apply_are_refused_naming_the_child() {
    let scene = Scene::start(Mode::Silent, &[]);
    let mut parent = greeting("site");
    parent["metadata"]["namespace"] = json!("shop");
    let spec = json!({"object": parent});
    let config_map = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"site"}}"#;
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "web", "namespace": "shop"}});

    // What a plugin may answer: children of its object's namespace, each
    // with its verdict and wave, returned as they were sent.
    let mut answer = with_children(&[
        ("site", config_map.to_vec()),
        ("web", deployment.to_string().into_bytes()),
    ]);
    answer.desired_children[1].ready = Readiness::NotReady.into();
    answer.desired_children[1].wave = 1;
    scene.hostile.set(Mode::Answer(answer));
    let answered = scene
        .reconcile("hostile", spec.clone())
        .expect("valid children");
    assert_eq!(
        answered["status"]["desiredChildren"],
        json!([
            {"key": "site", "object": serde_json::from_slice::<Value>(config_map).expect("JSON")},
            {"key": "web", "object": deployment, "ready": false, "wave": 1},
        ]),
        "{answered:#}"
    );

    let huge = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"big"}},"data":{{"a":"{}"}}}}"#,
        "x".repeat(2 << 20)
    );
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (
            "no kind",
            br#"{"apiVersion":"v1","metadata":{"name":"a"}}"#.to_vec(),
            "child \"bad\": status.desiredChildren[1].object.kind: Required value".to_owned(),
        ),
        (
            "a 2 MiB object",
            huge.clone().into_bytes(),
            format!(
                "child \"bad\": status.desiredChildren[1].object: Too long: must have at most \
                 {MAX_CHILD_BYTES} bytes, found {}",
                huge.len()
            ),
        ),
        (
            "owner references set by the plugin",
            br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","ownerReferences":[{"apiVersion":"v1","kind":"Namespace","name":"kube-system","uid":"x"}]}}"#.to_vec(),
            "child \"bad\": status.desiredChildren[1].object.metadata.ownerReferences: \
             Forbidden: a plugin may not set it: the operator ties the child to its object"
                .to_owned(),
        ),
        (
            "another namespace, which the caller does not allow",
            br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"kube-system"}}"#.to_vec(),
            "child \"bad\": status.desiredChildren[1].object.metadata.namespace: Forbidden: \
             must be the object's namespace \"shop\" (or unset)"
                .to_owned(),
        ),
    ];
    for (attack, child, message) in cases {
        let answer = with_children(&[("site", config_map.to_vec()), ("bad", child.clone())]);
        scene.hostile.set(Mode::Answer(answer));
        let refused = scene.reconcile("hostile", spec.clone()).expect_err(attack);
        assert_refused(
            &refused,
            500,
            "InternalError",
            &["plugin hostile returned an invalid answer: ", &message],
        );
        assert!(
            !refused.message.contains("site"),
            "the good child is not answered: {refused:?}"
        );
        eprintln!("hostile: a child with {attack}: refused");
    }

    // An operator started to allow children elsewhere says so.
    let elsewhere =
        br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"kube-system"}}"#;
    scene
        .hostile
        .set(Mode::Answer(with_children(&[("away", elsewhere.to_vec())])));
    let mut cluster = spec.clone();
    cluster["childScope"] = json!("Cluster");
    let answered = scene
        .reconcile("hostile", cluster)
        .expect("allowed with childScope Cluster");
    assert_eq!(
        answered["status"]["desiredChildren"][0]["object"]["metadata"]["namespace"],
        "kube-system"
    );
}

#[test]
fn a_plugin_that_never_answers_holds_at_most_its_in_flight_bound_until_the_deadline() {
    let scene = Scene::start(Mode::Silent, &["--max-inflight-per-plugin", "2"]);
    let before = scene.baseline(20);
    let spec = json!({"object": greeting("a"), "timeoutSeconds": 3});
    let (during, held) = scene.during(20, || {
        std::thread::scope(|scope| {
            let held: Vec<_> = (0..2)
                .map(|_| scope.spawn(|| scene.reconcile("hostile", spec.clone())))
                .collect();
            wait_until(
                "two calls held by the plugin",
                Duration::from_secs(20),
                || {
                    let calls = scene.hostile.calls();
                    (calls == 2).then_some(()).ok_or(calls)
                },
            );
            // Its bound is full: a third call is refused at once, unsent.
            let refused = scene
                .reconcile("hostile", spec.clone())
                .expect_err("a third call");
            assert_refused(&refused, 429, "TooManyRequests", &["hostile"]);
            held.into_iter()
                .map(|call| call.join().expect("a held call"))
                .collect::<Vec<_>>()
        })
    });
    assert_eq!(
        scene.hostile.calls(),
        2,
        "the third call never reached the plugin"
    );
    // A deadline passed is 504 Timeout. (tonic's channel times the call by
    // the grpc-timeout kplug sends, beside kplug's own timer; when tonic's
    // fires first its CANCELLED must still read as the deadline.)
    for answer in held {
        let refused = answer.expect_err("a call the plugin never answered");
        assert_refused(&refused, 504, "Timeout", &["hostile", "3s"]);
    }
    // The deadline gave the calls' places back.
    scene
        .hostile
        .set(Mode::Answer(with_object_status(br#"{"ok":true}"#.to_vec())));
    let answer = scene
        .reconcile("hostile", spec)
        .expect("an answer after the deadlines");
    assert_eq!(answer["status"]["objectStatus"]["ok"], true, "{answer:#}");
    report(
        "2 calls never answered, a 3rd refused",
        &before,
        &during,
        "",
    );
}

#[test]
fn an_answer_after_the_deadline_is_dropped() {
    let scene = Scene::start(Mode::Late(Duration::from_secs(3)), &[]);
    let before = scene.baseline(20);
    let (during, (refused, elapsed)) = scene.during(20, || {
        let started = Instant::now();
        let refused = scene
            .reconcile(
                "hostile",
                json!({"object": greeting("a"), "timeoutSeconds": 1}),
            )
            .expect_err("an answer after the deadline");
        (refused, started.elapsed())
    });
    assert_refused(&refused, 504, "Timeout", &["hostile", "1s"]);
    // The late answer's success went nowhere: the next call is answered
    // with what the plugin says now.
    scene
        .hostile
        .set(Mode::Answer(ReconcileResponse::default()));
    let answer = scene
        .reconcile("hostile", json!({"object": greeting("b")}))
        .expect("an answer");
    assert_eq!(answer["status"]["success"], false, "{answer:#}");
    report(
        "an answer 3 s late for a 1 s deadline",
        &before,
        &during,
        &format!("; the caller had its 504 after {}", ms(elapsed, 0)),
    );
}

#[test]
fn garbage_at_the_grpc_layer_is_unavailable_naming_the_plugin() {
    let scene = Scene::start(Mode::Silent, &[]);
    let garbage = scene.hostile.garbage(1 << 20);
    scene
        .hostile
        .heartbeat(&scene.kplug.grpc, "garbage", &garbage);
    scene.kplug.wait_for_plugin("garbage", ready);
    let before = scene.baseline(20);
    let rss = scene.kib("VmRSS");
    let (during, codes) = scene.during(20, || {
        (0..20)
            .map(|_| {
                let refused = scene
                    .reconcile("garbage", json!({"object": greeting("a")}))
                    .expect_err("garbage for an answer");
                // Where the garbage surfaces decides the words: read as
                // HTTP/2 it is not gRPC; a connection kplug already dropped
                // over it is one the plugin closed.
                assert_refused(
                    &refused,
                    503,
                    "ServiceUnavailable",
                    &["plugin garbage", &garbage],
                );
                let not_grpc = refused.message.contains("does not speak gRPC over HTTP/2");
                let closed = refused.message.contains("closed the connection");
                assert!(not_grpc || closed, "{refused:?}");
                not_grpc
            })
            .collect::<Vec<_>>()
    });
    let not_grpc = codes.iter().filter(|c| **c).count();
    report(
        "20 calls answered with garbage",
        &before,
        &during,
        &format!(
            "; {not_grpc} read as not gRPC, {} as a closed connection; kplug RSS {rss} KiB -> {} KiB",
            codes.len() - not_grpc,
            scene.kib("VmRSS")
        ),
    );
}

#[test]
fn a_heartbeat_flood_is_absorbed_and_writes_nothing() {
    // No periodic status refresh during the test: any change is the flood's.
    let scene = Scene::start(Mode::Silent, &["--status-refresh-interval", "10m"]);
    let version = |plugin: &Value| plugin["metadata"]["resourceVersion"].clone();
    let written = version(&scene.plugin("hostile"));
    let before = scene.baseline(20);
    let cpu = process_cpu_time(scene.kplug.pid()).expect("kplug's CPU time");
    let registration = Registration::plain(&scene.kplug.grpc, "hostile", &scene.hostile.address);
    let (during, flood) = scene.during(20, || {
        scene
            .hostile
            .flood(&registration, 1, 10_000, Duration::from_secs(3), 64)
    });
    let used = process_cpu_time(scene.kplug.pid()).expect("kplug's CPU time") - cpu;
    assert_eq!(flood.failed, 0, "every heartbeat was answered: {flood:?}");
    assert_eq!(flood.accepted, flood.sent, "{flood:?}");
    assert_eq!(
        version(&scene.plugin("hostile")),
        written,
        "the flood changed the plugin"
    );
    assert!(
        ready(&scene.plugin("neighbour")),
        "the neighbour stayed Ready"
    );
    let per_heartbeat = used / u32::try_from(flood.sent.max(1)).unwrap_or(u32::MAX);
    report(
        "heartbeats aimed at 10,000/s for 3 s",
        &before,
        &during,
        &format!(
            "; {} heartbeats in {} ms ({:.0}/s), kplug CPU {} ms, {} µs a heartbeat (debug build)",
            flood.sent,
            flood.elapsed.as_millis(),
            flood.sent as f64 / flood.elapsed.as_secs_f64(),
            used.as_millis(),
            per_heartbeat.as_micros()
        ),
    );
}

#[test]
fn a_declaration_of_10000_apis_is_refused_with_a_field_error() {
    let scene = Scene::start(Mode::Silent, &[]);
    let mut request =
        heartbeat_request("greedy", "", &scene.hostile.address, Duration::from_secs(1));
    request.extensions = (0..10_000)
        .map(|i| ExtensionKind {
            group: format!("g{i}.example.com"),
            version: "v1".to_owned(),
            kind: format!("Kind{i}"),
        })
        .collect();
    let refused = scene.hostile.block_on(async {
        let mut client = RegistryClient::connect(scene.kplug.grpc.clone())
            .await
            .expect("connect to kplug's registry");
        client.heartbeat(request).await.expect_err("10,000 APIs")
    });
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused
            .message()
            .starts_with("invalid heartbeat: extensions: Too many: 10000: must have at most "),
        "{refused:?}"
    );
    let absent = scene.kplug.kubectl_err(&["get", "plugin", "greedy"]);
    assert!(absent.contains("NotFound"), "{absent}");
    scene.neighbour_call();
}
