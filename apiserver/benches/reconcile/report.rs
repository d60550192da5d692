//! The Markdown report for BENCHMARKS.md.

use std::time::Duration;

use anyhow::Result;
use kplug_test_support::measure::Latencies;
use kplug_test_support::plot::{Corner, Line, Lines, Plots, distribution};
use kplug_test_support::report::{micros, thousands, verdict};

use crate::payload::PAYLOADS;
use crate::route::Route;
use crate::{
    IN_FLIGHT, PER_ROUND, PLUGIN_NAME, PLUGIN_PATH, RECONCILE_PATH, RECONCILE_TIMEOUT, ROUNDS,
    Sequential, TARGET_ADDED_P50, TARGET_SMALL_PER_SECOND, THROUGHPUT_ROUNDS, WARMUP,
};

/// The most the current build may cost over the baseline: 5 %.
const TARGET_BASELINE_RATIO: f64 = 1.05;

/// Sequential latencies of one payload, every route.
pub struct LatencyRun {
    pub payload: &'static str,
    pub object_bytes: usize,
    pub request_bytes: usize,
    pub answer_bytes: usize,
    pub latencies: Sequential,
}

impl LatencyRun {
    fn added(&self, p: f64) -> f64 {
        self.latencies.kplug.percentile(p).as_secs_f64()
            - self.latencies.direct.percentile(p).as_secs_f64()
    }
}

/// One throughput run.
pub struct ThroughputRun {
    pub payload: &'static str,
    pub connections: usize,
    pub route: Route,
    pub reconciles: usize,
    pub elapsed: Duration,
    pub latencies: Latencies,
    pub client_cpu: Duration,
    /// kplug's, or on the relay's route the relay's.
    pub proxy_cpu: Duration,
    pub plugin_cpu: Duration,
}

impl ThroughputRun {
    /// Two runs of the same route as one: their calls, time and CPU added.
    pub fn merge(self, other: Self) -> Self {
        Self {
            reconciles: self.reconciles + other.reconciles,
            elapsed: self.elapsed + other.elapsed,
            latencies: self.latencies.merge(other.latencies),
            client_cpu: self.client_cpu + other.client_cpu,
            proxy_cpu: self.proxy_cpu + other.proxy_cpu,
            plugin_cpu: self.plugin_cpu + other.plugin_cpu,
            ..self
        }
    }

    fn per_second(&self) -> f64 {
        self.reconciles as f64 / self.elapsed.as_secs_f64()
    }

    fn cpu_per_reconcile(&self, cpu: Duration) -> String {
        micros(cpu / u32::try_from(self.reconciles.max(1)).unwrap_or(u32::MAX))
    }
}

pub struct Report {
    /// The commit of the baseline build, when one ran.
    pub baseline: Option<String>,
    pub latency: Vec<LatencyRun>,
    /// GETs of the plugin's own object, for scale.
    pub floor: Latencies,
    pub floor_bytes: usize,
    pub throughput: Vec<ThroughputRun>,
}

/// `+123 µs`, or `−5 µs`.
fn signed_micros(seconds: f64) -> String {
    let sign = if seconds < 0.0 { "−" } else { "+" };
    format!("{sign}{:.0} µs", seconds.abs() * 1e6)
}

impl Report {
    /// The relay's latency, in the same rounds: the floor of a proxy that
    /// only terminates TLS and HTTP/2 and makes the gRPC call.
    fn print_relay(&self) {
        println!(
            "The floor of any proxy here: in the same rounds, a relay (a process of its own, a \
                 Tokio runtime of two workers) that terminates TLS and HTTP/2 as kplug does, with \
                 kplug's certificate and the admin's verified, passes the body to the plugin as \
                 `object` in one gRPC call and answers with the plugin's `objectStatus`: two hops \
                 and nothing between them. It is in the throughput runs below too.\n"
        );
        println!(
            "| Object | relay p50 | relay p99 | relay p50 ÷ direct p50 | kplug p50 ÷ relay p50 |"
        );
        println!("|---|---:|---:|---:|---:|");
        for run in &self.latency {
            let latencies = &run.latencies;
            let relay = latencies
                .relay
                .percentile(50.0)
                .as_secs_f64()
                .max(f64::EPSILON);
            println!(
                "| {} | {} | {} | {:.2} | {:.2} |",
                run.payload,
                micros(latencies.relay.percentile(50.0)),
                micros(latencies.relay.percentile(99.0)),
                relay
                    / latencies
                        .direct
                        .percentile(50.0)
                        .as_secs_f64()
                        .max(f64::EPSILON),
                latencies.kplug.percentile(50.0).as_secs_f64() / relay,
            );
        }
        println!();
    }

    /// Each payload's calls through kplug by the stages of their
    /// `Server-Timing`, beside the direct call.
    fn print_stages(&self) {
        println!(
            "Through kplug, by stage, as kplug measured each (its `Server-Timing` header: \
             `auth` authentication, `read` reading the body and routing, `decode`, `select` \
             validation and selection, `checks` the object checks and the capability, `plugin` \
             kplug's gRPC call from sending to decoding the answer, `answer` rendering it); the \
             connection's part is the answer's latency less all stages, measured per call. p50 of \
             each stage per call: they do not add up to the p50 of the whole.\n"
        );
        println!("| Object | Stage | p50 | p99 | p50 ÷ direct p50 |");
        println!("|---|---|---:|---:|---:|");
        for run in &self.latency {
            let direct = run.latencies.direct.percentile(50.0).as_secs_f64();
            for (stage, latencies) in &run.latencies.stages {
                let p50 = latencies.percentile(50.0);
                println!(
                    "| {} | {stage} | {} | {} | {:.2} |",
                    run.payload,
                    micros(p50),
                    micros(latencies.percentile(99.0)),
                    p50.as_secs_f64() / direct.max(f64::EPSILON),
                );
            }
            println!(
                "| {} | *the direct call* | {} | {} | 1.00 |",
                run.payload,
                micros(run.latencies.direct.percentile(50.0)),
                micros(run.latencies.direct.percentile(99.0)),
            );
        }
        println!();
    }

    pub fn print(&self) {
        println!("## Reconcile: through kplug vs direct\n");
        println!(
            "The `hello-plugin` example, registered as `{PLUGIN_NAME}`, reconciles the same \
             object two ways: **through kplug**, `POST {RECONCILE_PATH}` with a Reconcile over \
             HTTP/2 and TLS with the admin client certificate; **direct**, \
             `kplug.v1alpha1.Plugin/Reconcile` over a tonic channel with `object` = the same \
             JSON bytes and the same {} s deadline. Each call is timed until the whole answer is \
             read.\n",
            RECONCILE_TIMEOUT.as_secs()
        );
        println!("| Object | Object JSON | Reconcile request body | kplug's answer |");
        println!("|---|---:|---:|---:|");
        for run in &self.latency {
            println!(
                "| {} | {} B | {} B | {} B |",
                run.payload,
                thousands(run.object_bytes),
                thousands(run.request_bytes),
                thousands(run.answer_bytes)
            );
        }
        println!();

        println!(
            "### Latency, 1 in flight\n\nOne reused connection per route; {WARMUP} warm-up calls \
             per route, then {ROUNDS} rounds of {} calls per route, alternating which route goes \
             first. Target: kplug adds < {} at p50.\n",
            thousands(PER_ROUND),
            micros(TARGET_ADDED_P50)
        );
        println!(
            "| Object | Calls per route | kplug p50 | direct p50 | Added p50 | kplug p99 | direct p99 | Added p99 | Target |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for run in &self.latency {
            let latencies = &run.latencies;
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                run.payload,
                thousands(latencies.kplug.len()),
                micros(latencies.kplug.percentile(50.0)),
                micros(latencies.direct.percentile(50.0)),
                signed_micros(run.added(50.0)),
                micros(latencies.kplug.percentile(99.0)),
                micros(latencies.direct.percentile(99.0)),
                signed_micros(run.added(99.0)),
                verdict(run.added(50.0) < TARGET_ADDED_P50.as_secs_f64()),
            );
        }
        println!();
        println!(
            "Through kplug, split by the answer's `status.durationMilliseconds` (how long kplug's \
             own gRPC call to the plugin took) into that call and the rest (TLS and HTTP/2 on \
             both ends, decoding, selection, encoding the answer):\n"
        );
        println!("| Object | kplug's gRPC call p50 | direct call p50 | Rest p50 | Rest p99 |");
        println!("|---|---:|---:|---:|---:|");
        for run in &self.latency {
            let latencies = &run.latencies;
            println!(
                "| {} | {} | {} | {} | {} |",
                run.payload,
                micros(latencies.plugin_call.percentile(50.0)),
                micros(latencies.direct.percentile(50.0)),
                micros(latencies.outside_plugin_call.percentile(50.0)),
                micros(latencies.outside_plugin_call.percentile(99.0)),
            );
        }
        println!();
        self.print_stages();
        println!(
            "For scale, `GET {PLUGIN_PATH}` ({} B of JSON; TLS, HTTP/2 and authentication, no \
             plugin call) on the same connection: p50 {}, p99 {} over {} requests.\n",
            thousands(self.floor_bytes),
            micros(self.floor.percentile(50.0)),
            micros(self.floor.percentile(99.0)),
            thousands(self.floor.len()),
        );
        self.print_relay();

        println!(
            "### Throughput, {IN_FLIGHT} in flight\n\n{IN_FLIGHT} concurrent callers spread over \
             1 or 4 fresh connections per run (kplug itself always uses one HTTP/2 connection to \
             the plugin); an untimed warm-up of a tenth of the calls first. Each route runs in \
             {THROUGHPUT_ROUNDS} rounds of a third of the calls, alternating which route goes \
             first; a row adds them up. CPU is user + system \
             time from `/proc/PID/stat` over the timed part, divided by the reconciles; the \
             client is this bench, the proxy kplug or on its route the relay (on the direct \
             route, kplug idle). Target: ≥ {} reconciles/s of the 1 KiB object through \
             kplug.\n",
            thousands(TARGET_SMALL_PER_SECOND as usize)
        );
        println!(
            "| Object | Connections | Route | Reconciles | Elapsed | Reconciles/s | p50 | p99 | CPU per reconcile: client / proxy / plugin | Target |"
        );
        println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---|");
        for run in &self.throughput {
            let target = if run.route == Route::Kplug && run.payload == PAYLOADS[0].label {
                verdict(run.per_second() >= TARGET_SMALL_PER_SECOND)
            } else {
                "–"
            };
            println!(
                "| {} | {} | {} | {} | {:.2} s | {} | {} | {} | {} / {} / {} | {target} |",
                run.payload,
                run.connections,
                run.route.label(),
                thousands(run.reconciles),
                run.elapsed.as_secs_f64(),
                thousands(run.per_second() as usize),
                micros(run.latencies.percentile(50.0)),
                micros(run.latencies.percentile(99.0)),
                run.cpu_per_reconcile(run.client_cpu),
                run.cpu_per_reconcile(run.proxy_cpu),
                run.cpu_per_reconcile(run.plugin_cpu),
            );
        }
        println!();
        self.print_before_after();
    }

    /// Current build against the baseline build, when one ran.
    fn print_before_after(&self) {
        let Some(rev) = &self.baseline else {
            return;
        };
        println!(
            "### Before and after: this build against {rev}\n\nThe same calls through kplug \
             built at {rev} (its own process and plugin process, alternating with the other \
             routes in every round). Ratio = this build / {rev}; target: latency ratio ≤ \
             {TARGET_BASELINE_RATIO:.2} and throughput ratio ≥ {:.2}.\n",
            1.0 / TARGET_BASELINE_RATIO
        );
        println!(
            "| Object | This build p50 | {rev} p50 | Ratio | This build p99 | {rev} p99 | Ratio | Target |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---|");
        for run in &self.latency {
            let Some(baseline) = &run.latencies.baseline else {
                continue;
            };
            let ratio = |p: f64| {
                run.latencies.kplug.percentile(p).as_secs_f64()
                    / baseline.percentile(p).as_secs_f64()
            };
            println!(
                "| {} | {} | {} | {:.3} | {} | {} | {:.3} | {} |",
                run.payload,
                micros(run.latencies.kplug.percentile(50.0)),
                micros(baseline.percentile(50.0)),
                ratio(50.0),
                micros(run.latencies.kplug.percentile(99.0)),
                micros(baseline.percentile(99.0)),
                ratio(99.0),
                verdict(ratio(50.0) <= TARGET_BASELINE_RATIO),
            );
        }
        println!();
        println!(
            "| Object | Connections | This build reconciles/s | {rev} reconciles/s | Ratio | Target |"
        );
        println!("|---|---:|---:|---:|---:|---|");
        for run in self.throughput.iter().filter(|r| r.route == Route::Kplug) {
            let Some(baseline) = self.throughput.iter().find(|b| {
                b.route == Route::Baseline
                    && b.payload == run.payload
                    && b.connections == run.connections
            }) else {
                continue;
            };
            let ratio = run.per_second() / baseline.per_second();
            println!(
                "| {} | {} | {} | {} | {ratio:.3} | {} |",
                run.payload,
                run.connections,
                thousands(run.per_second() as usize),
                thousands(baseline.per_second() as usize),
                verdict(ratio >= 1.0 / TARGET_BASELINE_RATIO),
            );
        }
        println!();
    }
}

impl Report {
    /// Each payload's one-at-a-time latencies as distributions: through
    /// kplug, straight to the plugin, and a GET of one plugin (the floor an
    /// HTTPS request to kplug costs), from the same rounds.
    pub fn plot(&self, plots: &Plots) -> Result<()> {
        for run in &self.latency {
            let mut lines = vec![
                Line {
                    label: "through kplug".to_owned(),
                    points: distribution(&run.latencies.kplug),
                },
                Line {
                    label: "direct gRPC to the plugin".to_owned(),
                    points: distribution(&run.latencies.direct),
                },
            ];
            if !self.floor.is_empty() {
                lines.push(Line {
                    label: "GET of one plugin (the floor)".to_owned(),
                    points: distribution(&self.floor),
                });
            }
            let name = format!(
                "reconcile-latency-{}",
                run.payload.replace(' ', "").to_lowercase()
            );
            let path = plots.lines(
                &name,
                &Lines {
                    title: format!("Reconcile latency, {}, one at a time (to p99)", run.payload),
                    x: "µs".to_owned(),
                    y: "share of calls at most this long".to_owned(),
                    lines,
                    legend: Corner::LowerRight,
                },
            )?;
            println!("Plot ({}): `{path}`\n", run.payload);
        }
        Ok(())
    }
}
