//! The in-cluster report, as Markdown on stdout.

use std::time::Duration;

use anyhow::Result;
use kplug_test_support::bench_mode::BenchMode;
use kplug_test_support::in_cluster::{CLIENT_NAMESPACE, IMAGES, Pod};
use kplug_test_support::measure::OtherLoad;
use kplug_test_support::report::{Machine, micros, seconds, size, thousands};

use super::routes::{RECONCILE_PATH, Route};
use super::{IN_FLIGHT, Results};
use crate::OBJECT_BYTES;

pub(super) struct Report<'a> {
    pub(super) mode: BenchMode,
    pub(super) results: &'a Results,
    /// The pod the calls came from.
    pub(super) client: &'a Pod,
    /// What the images were built from.
    pub(super) tree: &'a str,
    pub(super) load_at_start: &'a str,
    pub(super) command: &'a str,
}

pub(super) fn print(report: &Report<'_>) -> Result<()> {
    let r = report.results;
    println!("## In the cluster: reconcile through kube-apiserver, a kplug pod and a plugin pod\n");
    if let Some(warning) = report.mode.warning() {
        println!("{warning}");
    }
    let pods: Vec<String> = r
        .memory
        .pods
        .iter()
        .map(|(role, pod)| format!("{role} `{}` ({})", pod.name, pod.ip))
        .collect();
    let others: OtherLoad = r.throughput.iter().map(|run| run.others).sum();
    Machine {
        heading: "### Machine",
        shared_by: "the cluster (kube-apiserver, etcd, kubelet, containerd, the pods) and the bench",
        memory: true,
        notes: &[
            format!("Load average before the run: {}", report.load_at_start),
            format!("Pods: {}", pods.join(", ")),
            format!(
                "Calls from pod `{CLIENT_NAMESPACE}/{}` ({}): the bench's measuring threads in \
                 its network namespace",
                report.client.name, report.client.ip
            ),
            format!(
                "Images built from the tree at {} by `hack/images.sh build {}`",
                report.tree,
                IMAGES.join(" ")
            ),
        ],
        others: (others, "the throughput runs"),
        details: &[
            "Kubernetes v1.20.2 of `hack/cluster.sh` (one node, this machine); kplug and the \
             plugin as README.md and examples/hello-rust/deploy/README.md install them"
                .to_owned(),
        ],
        binaries: &[],
        binary_note: "",
        command: report.command,
    }
    .print()?;
    print_latency(r, report.client);
    print_throughput(r);
    print_memory(r);
    Ok(())
}

/// `a` − `b` as "+12 µs" or "−12 µs".
fn difference(a: Duration, b: Duration) -> String {
    if a >= b {
        format!("+{}", micros(a - b))
    } else {
        format!("−{}", micros(b - a))
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(f64::EPSILON)
}

fn print_latency(r: &Results, client: &Pod) {
    println!("### Latency, one call at a time\n");
    println!(
        "A {OBJECT_BYTES}-byte object (a {} Reconcile to kplug), {} calls per route after {} \
         untimed, the routes taking turns: `POST {RECONCILE_PATH}` to kube-apiserver as the \
         admin; the same straight to a kplug pod with the front proxy's certificate as the admin \
         in `system:masters` (what the aggregator sends); the same to kplug's Service with the \
         bearer token of a ServiceAccount with an operator's rights, `kplug:operator` and \
         `update greetings/status` (an operator's `--kplug-url`: kplug reviews the token and \
         checks the right on the object, both cached, where the admin is not checked; \
         kube-proxy picks the pod); \
         `Plugin/Reconcile` direct to a plugin pod over mutual TLS with kplug's client \
         certificate. Each from the pod `{}`, to both pods of each kind in turn.\n",
        size(r.request_bytes),
        thousands(r.counts.latency_calls),
        thousands(r.counts.latency_warmup),
        client.name,
    );
    let Some(direct) = r.latency.iter().find(|run| run.route == Route::Direct) else {
        return;
    };
    println!("| Route | Calls | p50 | p90 | p99 | p50 ÷ direct p50 |");
    println!("|---|---:|---:|---:|---:|---:|");
    for run in &r.latency {
        let l = &run.latencies;
        println!(
            "| {} | {} | {} | {} | {} | {:.2} |",
            run.route.label(),
            thousands(l.len()),
            micros(l.percentile(50.0)),
            micros(l.percentile(90.0)),
            micros(l.percentile(99.0)),
            ratio(l.percentile(50.0), direct.latencies.percentile(50.0)),
        );
    }
    let at = |route: Route, p: f64| {
        r.latency
            .iter()
            .find(|run| run.route == route)
            .map_or(Duration::ZERO, |run| run.latencies.percentile(p))
    };
    println!(
        "| *added by kube-apiserver (through it − straight to kplug)* | | {} | {} | {} | |",
        difference(at(Route::Apiserver, 50.0), at(Route::Kplug, 50.0)),
        difference(at(Route::Apiserver, 90.0), at(Route::Kplug, 90.0)),
        difference(at(Route::Apiserver, 99.0), at(Route::Kplug, 99.0)),
    );
    println!(
        "| *added by kplug (straight to kplug − direct)* | | {} | {} | {} | |\n",
        difference(at(Route::Kplug, 50.0), at(Route::Direct, 50.0)),
        difference(at(Route::Kplug, 90.0), at(Route::Direct, 90.0)),
        difference(at(Route::Kplug, 99.0), at(Route::Direct, 99.0)),
    );
    println!(
        "kplug's own gRPC call to the plugin pod (the answer's `status.durationMilliseconds`), \
         beside the bench's direct call from its pod:\n"
    );
    println!("| Route | kplug's call p50 | kplug's call p99 | direct p50 | direct p99 |");
    println!("|---|---:|---:|---:|---:|");
    for run in r.latency.iter().filter(|run| !run.kplug_calls.is_empty()) {
        println!(
            "| {} | {} | {} | {} | {} |",
            run.route.label(),
            micros(run.kplug_calls.percentile(50.0)),
            micros(run.kplug_calls.percentile(99.0)),
            micros(direct.latencies.percentile(50.0)),
            micros(direct.latencies.percentile(99.0)),
        );
    }
    println!();
}

fn print_throughput(r: &Results) {
    println!("### Throughput, {IN_FLIGHT} in flight\n");
    println!(
        "{} rounds of {} calls per route, the routes taking turns; the calls in \
         flight spread over two connections per route (two to kube-apiserver, one to each kplug \
         pod, two to kplug's Service, one to each plugin pod). CPU per reconcile is the processes' user + system time from \
         `/proc` (kplug and the plugin: both pods together). Throttled is the time the pods' CPU \
         limits (500m each, as shipped) held them back (`throttled_time` in their `cpu.stat`).\n",
        r.counts.throughput_rounds,
        thousands(r.counts.throughput_calls),
    );
    let per_second =
        |calls: usize, elapsed: Duration| calls as f64 / elapsed.as_secs_f64().max(f64::EPSILON);
    let Some(direct) = r.throughput.iter().find(|run| run.route == Route::Direct) else {
        return;
    };
    let direct_rate = per_second(direct.calls, direct.elapsed);
    println!(
        "| Route | Calls | Elapsed | Reconciles/s | ÷ direct | p50 | p99 | CPU per reconcile: kube-apiserver / kplug / plugin / bench | kplug pods' shares of kplug's CPU | Throttled: kplug / plugin | Other load |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for run in &r.throughput {
        let rate = per_second(run.calls, run.elapsed);
        let per = |cpu: Duration| micros(cpu / u32::try_from(run.calls.max(1)).unwrap_or(1));
        let shares: Vec<String> = run
            .kplug_pods
            .iter()
            .map(|cpu| format!("{:.0} %", 100.0 * ratio(*cpu, run.cpu[1])))
            .collect();
        println!(
            "| {} | {} | {} | {} | {:.2} | {} | {} | {} / {} / {} / {} | {} | {} / {} | {:.0} % |",
            run.route.label(),
            thousands(run.calls),
            seconds(run.elapsed),
            thousands(rate.round() as usize),
            rate / direct_rate.max(f64::EPSILON),
            micros(run.latencies.percentile(50.0)),
            micros(run.latencies.percentile(99.0)),
            per(run.cpu[0]),
            per(run.cpu[1]),
            per(run.cpu[2]),
            per(run.cpu[3]),
            shares.join(" / "),
            seconds(run.throttled[0]),
            seconds(run.throttled[1]),
            run.others.percent(),
        );
    }
    println!();
}

fn print_memory(r: &Results) {
    println!("### Memory of the pods\n");
    r.memory.print("the latency and throughput runs above");
}
