//! Lists of 1,000 and 10,000 plugins, as JSON and as Tables, and the
//! server's memory before and after them.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use kplug_test_support::measure::Latencies;
use kplug_test_support::report::thousands;

use crate::heartbeats::{Way, heartbeat_requests, open_streams, send_heartbeats, ways_taken};
use crate::support::{ApiClient, Server};

/// Registry sizes at which lists and memory are measured.
pub const LIST_SIZES: [usize; 2] = [1_000, 10_000];
/// Untimed lists per build before the timed ones.
pub const LIST_WARMUP: usize = 5;
/// Timed lists per size, representation and build...
pub const LIST_REQUESTS: usize = 100;
/// ...in this many rounds, alternating which build goes first.
pub const LIST_ROUNDS: usize = 10;
/// kubectl get asks for pages of this many (its --chunk-size default).
const KUBECTL_CHUNK: usize = 500;
/// Pause before reading memory, so the numbers are not mid-burst.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
pub const PLUGINS_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";

/// One way of listing plugins.
pub struct ListVariant {
    label: &'static str,
    accept: &'static str,
    query: &'static str,
    /// Where the list's entries are in the response.
    items_field: &'static str,
    limit: Option<usize>,
}

static LIST_VARIANTS: [ListVariant; 3] = [
    ListVariant {
        label: "JSON",
        accept: "application/json",
        query: "",
        items_field: "items",
        limit: None,
    },
    ListVariant {
        label: "Table",
        accept: TABLE_ACCEPT,
        query: "",
        items_field: "rows",
        limit: None,
    },
    ListVariant {
        label: "Table, limit=500 (kubectl get's first page)",
        accept: TABLE_ACCEPT,
        query: "?limit=500",
        items_field: "rows",
        limit: Some(KUBECTL_CHUNK),
    },
];

/// The connections that carry the plugins' open heartbeat streams, at most
/// 100 streams each (kplug takes 250 by default).
const STREAM_CONNECTIONS: usize = 100;

/// What one list variant measured on one build.
pub struct ListRun {
    pub plugins: usize,
    pub variant: &'static str,
    /// Index of the build in `main`'s list.
    pub build: usize,
    pub latencies: Latencies,
    pub bytes: usize,
}

/// The servers' resident memory at one point of the run, in build order.
pub struct MemoryPoint {
    pub state: String,
    pub rss_kib: Vec<u64>,
}

fn rss(servers: &[Server], peak: bool) -> Result<Vec<u64>> {
    servers
        .iter()
        .map(|s| if peak { s.peak_rss_kib() } else { s.rss_kib() })
        .collect()
}

/// Registers plugins up to each of `LIST_SIZES` on every server, reading
/// memory and timing lists at each size.
pub async fn lists_and_memory(servers: &[Server]) -> Result<(Vec<ListRun>, Vec<MemoryPoint>)> {
    tokio::time::sleep(SETTLE).await;
    let mut memory = vec![MemoryPoint {
        state: "idle (no plugins, no connections)".to_owned(),
        rss_kib: rss(servers, false)?,
    }];
    let mut clients = Vec::with_capacity(servers.len());
    for server in servers {
        clients.push(ApiClient::connect(server).await?);
    }
    let mut lists = Vec::new();
    let mut registered = 0;
    for size in LIST_SIZES {
        eprintln!("registering plugins {registered}..{size}");
        let requests = heartbeat_requests(registered..size);
        let total = requests.len();
        for server in servers {
            send_heartbeats(server, Way::Calls, requests.clone(), total).await?;
        }
        registered = size;
        tokio::time::sleep(SETTLE).await;
        memory.push(MemoryPoint {
            state: format!("{} plugins, before listing", thousands(size)),
            rss_kib: rss(servers, false)?,
        });
        for variant in &LIST_VARIANTS {
            eprintln!(
                "timing {LIST_REQUESTS} lists of {size} plugins as {} per build",
                variant.label
            );
            lists.extend(measure_list(&mut clients, size, variant).await?);
        }
    }
    tokio::time::sleep(SETTLE).await;
    let last = thousands(registered);
    memory.push(MemoryPoint {
        state: format!("{last} plugins, after the list runs"),
        rss_kib: rss(servers, false)?,
    });
    let mut streaming = true;
    for server in servers {
        streaming &= ways_taken(server).await?.contains(&Way::Streams);
    }
    if streaming {
        eprintln!("opening a heartbeat stream for each of the {registered} plugins");
        let requests = heartbeat_requests(0..registered);
        let mut held = Vec::with_capacity(servers.len());
        for server in servers {
            held.push(open_streams(server, &requests, STREAM_CONNECTIONS).await?);
        }
        tokio::time::sleep(SETTLE).await;
        memory.push(MemoryPoint {
            state: format!(
                "{last} plugins with an open heartbeat stream each ({STREAM_CONNECTIONS} connections)"
            ),
            rss_kib: rss(servers, false)?,
        });
    }
    memory.push(MemoryPoint {
        state: "peak during the run (VmHWM)".to_owned(),
        rss_kib: rss(servers, true)?,
    });
    Ok((lists, memory))
}

/// One variant on every build: checked, warmed up, then timed in rounds.
async fn measure_list(
    clients: &mut [ApiClient],
    plugins: usize,
    variant: &'static ListVariant,
) -> Result<Vec<ListRun>> {
    let path = format!("{PLUGINS_PATH}{}", variant.query);
    let expected = variant.limit.map_or(plugins, |limit| limit.min(plugins));
    let mut bytes = Vec::with_capacity(clients.len());
    for api in clients.iter_mut() {
        let body = api.get(&path, variant.accept).await?;
        let listed = count_entries(&body, variant.items_field)?;
        ensure!(
            listed == expected,
            "{} list returned {listed} entries, expected {expected}",
            variant.label
        );
        bytes.push(body.len());
        for _ in 0..LIST_WARMUP {
            api.get(&path, variant.accept).await?;
        }
    }
    let mut samples = vec![Vec::with_capacity(LIST_REQUESTS); clients.len()];
    for round in 0..LIST_ROUNDS {
        for build in crate::round_order(round, clients.len()) {
            for _ in 0..LIST_REQUESTS / LIST_ROUNDS {
                let started = Instant::now();
                let body = clients[build].get(&path, variant.accept).await?;
                samples[build].push(started.elapsed());
                bytes[build] = body.len();
            }
        }
    }
    Ok(samples
        .into_iter()
        .zip(bytes)
        .enumerate()
        .map(|(build, (samples, bytes))| ListRun {
            plugins,
            variant: variant.label,
            build,
            latencies: Latencies::new(samples),
            bytes,
        })
        .collect())
}

fn count_entries(body: &[u8], field: &str) -> Result<usize> {
    let value: serde_json::Value =
        serde_json::from_slice(body).context("the list response is not JSON")?;
    value
        .get(field)
        .and_then(serde_json::Value::as_array)
        .map(Vec::len)
        .with_context(|| format!("the list response has no {field:?} array"))
}
