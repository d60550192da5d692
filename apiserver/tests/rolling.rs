//! Instances of a plugin stopping under load, with real processes: a loop
//! of reconciles runs on several threads while an instance gets SIGTERM,
//! as Kubernetes sends when it deletes a pod, and comes back, or while
//! every instance is replaced in turn as a rolling update does. No
//! reconcile may fail, none may run twice, and `kubectl get plugins -w`
//! must show the instance draining, leaving and returning.
//!
//! Each instance answers after a delay, and SIGTERM is sent when calls are
//! in flight on it (see [`wait_for_a_wave`]): the SDK must tell kplug it is
//! draining, finish those calls, and only then deregister. Each test checks
//! in the stopped instance's log that it did finish calls after SIGTERM.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use kplug_test_support::metrics::Samples;
use kplug_test_support::postgres::venv_python;
use kplug_test_support::{
    Lines, Process, StandaloneKplug, free_port, greeting_reconcile, plugin_instances, repo_root,
    wait_until, workspace_binary,
};
use serde_json::Value;

const PLUGINS: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
/// The plugin every instance serves.
const PLUGIN: &str = "hello";
/// Threads sending reconciles, each one call at a time.
const WORKERS: usize = 6;
/// How long an instance takes to answer: long next to a call's way through
/// curl and kplug, so that the instance about to be stopped can be caught
/// with calls in flight (see [`wait_for_a_wave`]).
const DELAY_MS: u64 = 400;
/// Long enough that no instance turns late on a busy machine, which would
/// show in the table as a change the tests do not expect. The draining
/// notice and the deregistration do not wait for a heartbeat.
const HEARTBEAT_INTERVAL: &str = "5s";
/// What an instance logs as a call starts its delay: the Rust hello
/// plugin's `--delay-ms`, the Python one's sleep.
const DELAYING: &str = "delaying the answer";
/// For whatever a test waits on: starting, draining, answering.
const PATIENCE: Duration = Duration::from_secs(30);

/// A process's output, every line kept as it is read, so that a test can
/// wait for a line during the scenario and still read all lines after it.
struct Log {
    lines: Lines,
    read: Mutex<Vec<String>>,
    /// Whose output, for messages.
    what: String,
}

impl Log {
    fn new(lines: Lines, what: &str) -> Self {
        Self {
            lines,
            read: Mutex::new(Vec::new()),
            what: what.to_owned(),
        }
    }

    fn read(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.read.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a line that satisfies `want`, keeping those before it.
    fn wait_for(&self, what: &str, want: impl Fn(&str) -> bool) -> String {
        self.lines
            .wait_for(PATIENCE, &format!("{what} in {}", self.what), |line| {
                self.read().push(line.to_owned());
                want(line)
            })
    }

    /// Every line, once the process has closed its output.
    fn all(&self) -> Vec<String> {
        let rest = self.lines.until_closed(PATIENCE, &self.what);
        let mut lines = self.read().clone();
        lines.extend(rest);
        lines
    }
}

/// One process serving [`PLUGIN`] as the instance `name`.
struct Instance {
    name: String,
    address: String,
    process: Process,
    /// Its stderr: the SDK's and the plugin's log.
    log: Log,
}

impl Instance {
    /// The Rust hello plugin (examples/hello-rust).
    fn rust(kplug: &StandaloneKplug, name: &str, address: &str) -> Self {
        let (process, lines) = Process::spawn_with_stderr(
            Command::new(workspace_binary("hello-plugin"))
                .args(["--registry", &kplug.grpc, "--name", PLUGIN])
                .args(["--instance", name, "--listen", address])
                .args(["--heartbeat-interval", HEARTBEAT_INTERVAL])
                .args(["--delay-ms", &DELAY_MS.to_string()])
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null()),
            name,
        );
        Self::new(name, address, process, lines, "hello-rust")
    }

    /// The Python hello plugin (examples/hello-python/hello.py) run by the
    /// Python SDK's `kplug.run`, its `reconcile` made to take [`DELAY_MS`]
    /// first, which hello.py has no flag for.
    fn python(kplug: &StandaloneKplug, name: &str, address: &str) -> Self {
        const SLOW_HELLO: &str = "\
import importlib.util, logging, sys, time
import kplug
spec = importlib.util.spec_from_file_location('hello', sys.argv[1])
hello = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hello)
class SlowHello(hello.Hello):
    def reconcile(self, request):
        logging.getLogger('hello').info('delaying the answer by %s s', sys.argv[2])
        time.sleep(float(sys.argv[2]))
        return super().reconcile(request)
kplug.run(SlowHello(), sys.argv[3:])
";
        let python = venv_python();
        assert!(
            python.exists(),
            "{} is missing: run hack/python-env.sh",
            python.display()
        );
        let hello = repo_root().join("examples/hello-python/hello.py");
        let delay = Duration::from_millis(DELAY_MS).as_secs_f64().to_string();
        let (process, lines) = Process::spawn_with_stderr(
            Command::new(python)
                .args(["-c", SLOW_HELLO])
                .arg(hello)
                .arg(delay)
                .args(["--registry", &kplug.grpc, "--name", PLUGIN])
                .args(["--instance", name, "--listen", address])
                .args(["--heartbeat-interval", HEARTBEAT_INTERVAL])
                .stdin(Stdio::null())
                .stdout(Stdio::null()),
            name,
        );
        Self::new(name, address, process, lines, "hello-python")
    }

    fn new(name: &str, address: &str, process: Process, lines: Lines, kind: &str) -> Self {
        Self {
            name: name.to_owned(),
            address: address.to_owned(),
            process,
            log: Log::new(lines, &format!("the log of {name} ({kind} on {address})")),
        }
    }

    /// Waits until a call is in its handler: more calls have started their
    /// delay ([`DELAYING`]) than it has answered.
    fn wait_until_busy(&self) {
        let busy = || {
            let lines = self.log.read();
            let started = lines.iter().filter(|l| l.contains(DELAYING)).count();
            let answered = lines.iter().filter(|l| greeted(l).is_some()).count();
            started > answered
        };
        if !busy() {
            self.log.wait_for("a call in its handler", |_| busy());
        }
    }

    /// Waits until it has answered a call numbered `since` or later.
    fn wait_for_a_call(&self, since: usize) {
        self.log
            .wait_for(&format!("a greeting of call {since} or later"), |line| {
                greeted(line).is_some_and(|call| number(call) >= since)
            });
    }

    /// SIGTERM, as Kubernetes stops a pod; waits for a clean exit and
    /// returns the whole log.
    fn terminate(mut self) -> Vec<String> {
        assert!(
            self.process.terminate(PATIENCE),
            "{} did not exit cleanly within {PATIENCE:?} of SIGTERM; its log: {:#?}",
            self.name,
            self.log.read()
        );
        self.log.all()
    }
}

/// A loopback address nothing listens on, for a new instance.
fn loopback() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// The call a line of a hello plugin's log greets, e.g. `call-000042`:
/// `... hello_plugin: greeting greeting=hello, call-000042 dry_run=false`
/// (Rust) or `... hello ...: greeting call-000042` (Python).
fn greeted(line: &str) -> Option<&str> {
    let (_, greeting) = line.rsplit_once(": greeting ")?;
    let call = &greeting[greeting.find("call-")?..];
    let digits = call["call-".len()..]
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(call.len() - "call-".len());
    Some(&call[.."call-".len() + digits])
}

fn number(call: &str) -> usize {
    call.trim_start_matches("call-").parse().unwrap_or_default()
}

/// What the log of an instance stopped by SIGTERM shows: that it told
/// kplug it was draining, then deregistered, and served no call after;
/// returns the calls it finished between SIGTERM and its deregistration.
fn shutdown(instance: &str, log: &[String]) -> Vec<String> {
    let position = |what: &str, want: &dyn Fn(&str) -> bool| {
        log.iter()
            .position(|line| want(line))
            .unwrap_or_else(|| panic!("{instance} did not log {what}: {log:#?}"))
    };
    let signal = position("SIGTERM", &|l| {
        l.contains("SIGTERM") && l.contains("shutting down")
    });
    let draining = position("telling kplug it was draining", &|l| {
        l.contains("told kplug") && l.contains("draining")
    });
    let deregistered = position("its deregistration", &|l| {
        l.contains("deregistered") && l.contains("from kplug")
    });
    assert!(
        signal < draining && draining < deregistered,
        "{instance} did not drain then deregister after SIGTERM: {log:#?}"
    );
    let late: Vec<&str> = log[deregistered..]
        .iter()
        .filter_map(|l| greeted(l))
        .collect();
    assert!(
        late.is_empty(),
        "{instance} answered {late:?} after deregistering: {log:#?}"
    );
    log[signal..deregistered]
        .iter()
        .filter_map(|l| greeted(l).map(str::to_owned))
        .collect()
}

/// `kubectl get plugins -w`, held open for a whole scenario.
struct Watch {
    _kubectl: Process,
    log: Log,
}

impl Watch {
    /// Starts the watch and waits for its first row of [`PLUGIN`], which
    /// must show `instances`.
    fn start(kplug: &StandaloneKplug, instances: &str) -> Self {
        let (kubectl, lines) = kplug.kubectl_spawn(&["get", "plugins", "-w"]);
        let watch = Self {
            _kubectl: kubectl,
            log: Log::new(lines, "the output of kubectl get plugins -w"),
        };
        let first = watch.log.wait_for(&format!("a row of {PLUGIN}"), |line| {
            watch.cell(line).is_some()
        });
        assert_eq!(
            watch.cell(&first).as_deref(),
            Some(instances),
            "{:#?}",
            watch.log.read()
        );
        watch
    }

    /// The INSTANCES cell of `row` when it is [`PLUGIN`]'s, as placed by
    /// the header (the first line kubectl printed).
    fn cell(&self, row: &str) -> Option<String> {
        let position = self
            .log
            .read()
            .first()?
            .split_whitespace()
            .position(|h| h == "INSTANCES")?;
        let cells: Vec<&str> = row.split_whitespace().collect();
        (cells.first() == Some(&PLUGIN))
            .then(|| cells.get(position).map(|c| (*c).to_owned()))
            .flatten()
    }

    /// Waits until kubectl prints a row with `instances`.
    fn wait_for(&self, instances: &str) {
        self.log
            .wait_for(&format!("INSTANCES {instances}"), |line| {
                self.cell(line).as_deref() == Some(instances)
            });
    }

    /// The INSTANCES cells printed so far, each repetition once (a row
    /// printed again for another change shows the same count).
    fn seen(&self) -> Vec<String> {
        let rows: Vec<String> = self.log.read().clone();
        let mut cells: Vec<String> = rows.iter().filter_map(|row| self.cell(row)).collect();
        cells.dedup();
        cells
    }
}

/// Waits until [`PLUGIN`] has exactly these instances (name, address),
/// all Ready.
fn wait_for_instances(kplug: &StandaloneKplug, want: &[(&str, &str)]) {
    let mut want: Vec<(String, String, bool)> = want
        .iter()
        .map(|(n, a)| ((*n).to_owned(), (*a).to_owned(), true))
        .collect();
    want.sort();
    wait_until(
        &format!("{PLUGIN} with the Ready instances {want:?}"),
        PATIENCE,
        || {
            let output = kplug.kubectl(&["get", "plugin", PLUGIN, "-o", "json"]);
            let plugin: Value = serde_json::from_slice(&output.stdout)
                .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&output.stderr)))?;
            let mut got = plugin_instances(&plugin);
            got.sort();
            (got == want)
                .then_some(())
                .ok_or_else(|| format!("instances {got:?}"))
        },
    );
}

/// One reconcile the load sent, and kplug's answer.
#[derive(Debug)]
struct Call {
    name: String,
    code: u16,
    answer: String,
}

impl Call {
    fn succeeded(&self) -> bool {
        self.code == 201
            && serde_json::from_str::<Value>(&self.answer)
                .is_ok_and(|answer| answer["status"]["success"] == true)
    }
}

/// Reconciles of objects `call-NNNNNN`, numbered in the order sent, by
/// [`WORKERS`] threads in a loop.
struct Load<'k> {
    kplug: &'k StandaloneKplug,
    issued: AtomicUsize,
    stop: AtomicBool,
    calls: Mutex<Vec<Call>>,
}

impl Load<'_> {
    /// How many calls were sent so far: the number of the next.
    fn issued(&self) -> usize {
        self.issued.load(Ordering::SeqCst)
    }

    fn work(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let name = format!("call-{:06}", self.issued.fetch_add(1, Ordering::SeqCst));
            let body = greeting_reconcile(&name);
            let (code, answer) = self.kplug.curl(
                "POST",
                &format!("{PLUGINS}/{PLUGIN}/reconcile"),
                &["Content-Type: application/json"],
                Some(&body.to_string()),
            );
            self.calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Call { name, code, answer });
        }
    }
}

/// Reconciles kplug is serving now.
fn reconciles_in_flight(kplug: &StandaloneKplug) -> f64 {
    let (code, body) = kplug.curl("GET", "/metrics", &[], None);
    assert_eq!(code, 200, "scraping kplug's metrics: {body}");
    Samples::parse(&body).sum(
        "apiserver_current_inflight_requests",
        &[("request_kind", "mutating")],
    )
}

/// Waits until `instance` has calls in flight with most of [`DELAY_MS`] to
/// go, the moment to stop it.
///
/// The workers' calls all take [`DELAY_MS`], so they tend to travel in
/// waves. Waits for `instance` to answer a call sent from now on: it has
/// just become the least busy, so kplug gives it the next calls. Then
/// scrapes kplug, one scrape after the other, until nearly every worker
/// has sent a call since and nearly that many are in flight: a worker
/// sends its next call only once its last was answered, so most of the
/// calls in flight are new, and usually some of them on `instance`. As
/// kplug's count does not say where they are, it then waits, if need be,
/// until `instance`'s log shows a call in its handler (one in ten CI runs
/// had stopped a Python instance with none).
fn wait_for_a_wave(kplug: &StandaloneKplug, load: &Load, instance: &Instance) {
    instance.wait_for_a_call(load.issued());
    let wave = load.issued();
    let enough = WORKERS - 1;
    let deadline = Instant::now() + PATIENCE;
    loop {
        // Read before the scrape: these were sent when it counted.
        let sent = load.issued() - wave;
        let in_flight = reconciles_in_flight(kplug);
        if sent >= enough && in_flight >= enough as f64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no wave of {enough} reconciles in flight: {sent} sent, {in_flight} in flight"
        );
    }
    instance.wait_until_busy();
}

/// Sets the flag when dropped, also when the scenario panics, so that the
/// workers stop and the scope can join them.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Runs `scenario` while the load runs; returns its result and every call,
/// once all have been answered.
fn under_load<R>(kplug: &StandaloneKplug, scenario: impl FnOnce(&Load) -> R) -> (R, Vec<Call>) {
    let load = Load {
        kplug,
        issued: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        calls: Mutex::new(Vec::new()),
    };
    let result = std::thread::scope(|scope| {
        let _stop = StopOnDrop(&load.stop);
        for _ in 0..WORKERS {
            scope.spawn(|| load.work());
        }
        scenario(&load)
    });
    let calls = load
        .calls
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    (result, calls)
}

/// No reconcile failed.
fn assert_none_failed(calls: &[Call]) {
    let failed: Vec<&Call> = calls.iter().filter(|c| !c.succeeded()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} reconciles failed: {failed:#?}",
        failed.len(),
        calls.len()
    );
}

/// Each call ran exactly once, on one of the instances whose whole logs
/// are given, and each instance answered some; prints who answered how
/// many.
fn assert_all_answered_once(calls: &[Call], logs: &[(&str, &[String])]) {
    let mut served_by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (instance, log) in logs {
        let served: Vec<&str> = log.iter().filter_map(|l| greeted(l)).collect();
        eprintln!("{instance} answered {} calls", served.len());
        assert!(!served.is_empty(), "{instance} answered no call: {log:#?}");
        for call in served {
            served_by.entry(call).or_default().push(instance);
        }
    }
    for call in calls {
        match served_by.get(call.name.as_str()).map(Vec::as_slice) {
            Some([_]) => {}
            other => panic!(
                "{} succeeded but was answered by {other:?}, not by exactly one instance",
                call.name
            ),
        }
    }
    assert_eq!(
        served_by.len(),
        calls.len(),
        "the instances answered calls the test did not send"
    );
    eprintln!("{} reconciles, all answered once", calls.len());
}

/// Instance `b` of two gets SIGTERM while reconciles run, and returns at
/// its address, as a restarted container of the same pod.
fn sigterm_and_return(start_b: fn(&StandaloneKplug, &str, &str) -> Instance) {
    let kplug = StandaloneKplug::start();
    let (address_a, address_b) = (loopback(), loopback());
    let a = Instance::rust(&kplug, "hello-a", &address_a);
    let b = start_b(&kplug, "hello-b", &address_b);
    wait_for_instances(&kplug, &[("hello-a", &address_a), ("hello-b", &address_b)]);
    let watch = Watch::start(&kplug, "2/2");

    let ((stopped, returned), calls) = under_load(&kplug, |load| {
        a.wait_for_a_call(0);
        wait_for_a_wave(&kplug, load, &b);
        let stopped = b.terminate();
        watch.wait_for("1/1");
        let returned = start_b(&kplug, "hello-b", &address_b);
        watch.wait_for("2/2");
        wait_for_instances(&kplug, &[("hello-a", &address_a), ("hello-b", &address_b)]);
        // Calls sent from now on reach both.
        let since = load.issued();
        returned.wait_for_a_call(since);
        a.wait_for_a_call(since);
        (stopped, returned)
    });

    assert_none_failed(&calls);
    assert_eq!(
        watch.seen(),
        ["2/2", "1/2", "1/1", "2/2"],
        "draining, deregistered, returned: {:#?}",
        watch.log.read()
    );
    let drained = shutdown("hello-b", &stopped);
    eprintln!("hello-b finished {drained:?} after SIGTERM");
    assert!(
        !drained.is_empty(),
        "no call was in flight on hello-b when it got SIGTERM: {stopped:#?}"
    );
    let (a, returned) = (a.terminate(), returned.terminate());
    assert_all_answered_once(
        &calls,
        &[
            ("hello-a", &a),
            ("hello-b", &stopped),
            ("hello-b (returned)", &returned),
        ],
    );
}

#[test]
fn an_instance_stopped_by_sigterm_loses_no_reconcile_and_returns() {
    sigterm_and_return(Instance::rust);
}

#[test]
fn a_python_instance_stopped_by_sigterm_loses_no_reconcile_and_returns() {
    sigterm_and_return(Instance::python);
}

/// Replaces `old` by a new process of the same instance on a new port, as
/// a rolling update replaces a pod, once kplug shows it gone; returns the
/// old one's log and the new one, once Ready beside `other`.
fn roll(
    kplug: &StandaloneKplug,
    load: &Load,
    watch: &Watch,
    old: Instance,
    other: &Instance,
) -> (Vec<String>, Instance) {
    let name = old.name.clone();
    wait_for_a_wave(kplug, load, &old);
    let log = old.terminate();
    watch.wait_for("1/1");
    let new = Instance::rust(kplug, &name, &loopback());
    watch.wait_for("2/2");
    wait_for_instances(
        kplug,
        &[(&name, &new.address), (&other.name, &other.address)],
    );
    (log, new)
}

#[test]
fn rolling_the_instances_one_by_one_loses_no_reconcile() {
    let kplug = StandaloneKplug::start();
    let (address_a, address_b) = (loopback(), loopback());
    let a = Instance::rust(&kplug, "hello-a", &address_a);
    let b = Instance::rust(&kplug, "hello-b", &address_b);
    wait_for_instances(&kplug, &[("hello-a", &address_a), ("hello-b", &address_b)]);
    let watch = Watch::start(&kplug, "2/2");

    let ((old_a, old_b, new_a, new_b), calls) = under_load(&kplug, |load| {
        b.wait_for_a_call(0);
        let (old_a, new_a) = roll(&kplug, load, &watch, a, &b);
        let (old_b, new_b) = roll(&kplug, load, &watch, b, &new_a);
        // Calls sent once the update is done reach both new pods.
        let since = load.issued();
        new_a.wait_for_a_call(since);
        new_b.wait_for_a_call(since);
        (old_a, old_b, new_a, new_b)
    });

    assert_none_failed(&calls);
    assert_eq!(
        watch.seen(),
        ["2/2", "1/2", "1/1", "2/2", "1/2", "1/1", "2/2"],
        "each old pod draining, deregistered, replaced: {:#?}",
        watch.log.read()
    );
    for (instance, log) in [("hello-a", &old_a), ("hello-b", &old_b)] {
        let drained = shutdown(instance, log);
        eprintln!("{instance} finished {drained:?} after SIGTERM");
        assert!(
            !drained.is_empty(),
            "no call was in flight on {instance} when it got SIGTERM: {log:#?}"
        );
    }
    let (new_a, new_b) = (new_a.terminate(), new_b.terminate());
    assert_all_answered_once(
        &calls,
        &[
            ("hello-a", &old_a),
            ("hello-b", &old_b),
            ("hello-a (new pod)", &new_a),
            ("hello-b (new pod)", &new_b),
        ],
    );
}
