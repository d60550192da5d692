//! Load benchmark of the real `kplug-apiserver` binary, run as a separate
//! process on 127.0.0.1:
//!
//! 1. heartbeats per second over gRPC, for unchanged heartbeats (the steady
//!    state, read path) and for first registrations (write path);
//! 2. latency and size of `GET .../plugins` with 1,000 and 10,000 live
//!    plugins, as JSON and as a server-side Table, over one HTTP/2 TLS
//!    connection authenticated with the admin client certificate;
//! 3. the server's resident memory, idle, with 1,000 and 10,000 plugins,
//!    after the list runs (over 200 lists of 10,000 plugins), and with an
//!    open heartbeat stream for each of the 10,000;
//! 4. the same heartbeats written the way kplug replaces, as the status of a
//!    custom resource through a real kube-apiserver and etcd
//!    ([`crd_status`]), so that kplug's ratio to it comes from one run.
//!
//! With `KPLUG_BASELINE=REV` (a commit), kplug built at REV runs beside the
//! current build and gets the same load: lists alternate between the two in
//! rounds, heartbeat runs alternate which build goes first, and memory is
//! read from both at the same points. That is the before/after of a change,
//! measured in one run (hack/baseline.sh builds REV once into
//! ~/.cache/kplug/baseline).
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to stderr.
//! Run with `cargo build --release -p kplug-apiserver && cargo bench -p
//! kplug-apiserver --bench load`.

mod crd_status;
mod heartbeats;
mod lists;
mod report;
#[path = "../support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use kplug_test_support::bench_mode::BenchMode;
use kplug_test_support::measure::CpuSnapshot;
use kplug_test_support::plot::Plots;
use support::{BASELINE_VARIABLE, Server, baseline_from_env, print_machine};

/// The command that produces these numbers, as printed in the report.
const COMMAND: &str =
    "cargo build --release -p kplug-apiserver && cargo bench -p kplug-apiserver --bench load";

/// Flags of every server started here: plugins heartbeat every 300 s and
/// live 15 minutes, so none expires or turns late during a run; a 5 minute
/// status refresh keeps unchanged heartbeats on the read path throughout.
const SERVER_FLAGS: &[&str] = &[
    "--max-heartbeat-interval",
    "5m",
    "--ttl-intervals",
    "3",
    "--status-refresh-interval",
    "5m",
];

/// Upper bound of a phase, so that a wedged server fails the run instead of
/// hanging it (requests have `support::REQUEST_TIMEOUT`).
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);

/// One build of kplug under measurement.
pub struct Build {
    /// "current", or the baseline's commit.
    pub label: String,
    pub binary: PathBuf,
}

impl Build {
    fn start(&self) -> Server {
        Server::start_binary(&self.binary, SERVER_FLAGS)
    }
}

/// Which build goes first in round `round`: alternating, so that drift in
/// the machine's load hits every build alike.
fn round_order(round: usize, builds: usize) -> impl Iterator<Item = usize> {
    (0..builds).map(move |i| (i + round) % builds)
}

fn main() -> Result<()> {
    let binary = server_binary()?;
    let baseline = baseline_from_env()?;
    let mut builds = vec![Build {
        label: "current".to_owned(),
        binary: binary.clone(),
    }];
    if let Some((binary, rev)) = &baseline {
        builds.push(Build {
            label: rev.clone(),
            binary: binary.clone(),
        });
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let usage_before = CpuSnapshot::now(&[])?;

    let (lists, memory) = {
        let servers: Vec<Server> = builds.iter().map(Build::start).collect();
        runtime.block_on(lists::lists_and_memory(&servers))?
    };
    let heartbeats = heartbeats::run(&runtime, &builds)?;
    let work = tempfile::Builder::new()
        .prefix("kplug-load-")
        .tempdir_in("/tmp")
        .context("a work directory")?;
    let crd_status = crd_status::run(&runtime, work.path(), crd_status::WRITES)?;

    let others = usage_before.usage()?.other_load();
    let mut binaries = vec![("Server", binary.as_path())];
    if let Some((binary, _)) = &baseline {
        binaries.push(("Baseline server", binary));
    }
    let command = match &baseline {
        Some((_, rev)) => format!("{BASELINE_VARIABLE}={rev} {COMMAND}"),
        None => COMMAND.to_owned(),
    };
    print_machine(&binaries, &command, others)?;
    report::print_heartbeats(&builds, &heartbeats);
    report::print_against_crd_status(&heartbeats, &crd_status);
    report::plot_against_crd_status(
        &Plots::new(BenchMode::from_args())?,
        &heartbeats,
        &crd_status,
    )?;
    report::print_lists(&builds, &lists);
    report::print_memory(&builds, &memory);
    Ok(())
}

/// `target/<profile>/kplug-apiserver`, next to this bench's `deps/` directory.
fn server_binary() -> Result<PathBuf> {
    kplug_test_support::target_binary(
        "kplug-apiserver",
        "cargo build --release -p kplug-apiserver",
    )
}
