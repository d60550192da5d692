//! kplug's audit log: one JSON line per reconcile, whatever its outcome,
//! saying who made which plugin act on what, in the spirit of
//! kube-apiserver's audit events (which see only `create reconciles`, not
//! the object inside).
//!
//! A reconcile appends its line to a buffer in memory; a thread of its own
//! writes the buffer out every [`WRITE_INTERVAL`], and once more when the
//! log is dropped. Waking a writer for every line cost each reconcile a
//! futex wake and a write: 12-18 us of CPU under load (BENCHMARKS.md,
//! "Tenancy"). A sink slower than the reconciles never slows them: past
//! [`MAX_UNWRITTEN`] bytes waiting, lines are dropped and counted
//! (`kplug_audit_events_dropped_total`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde::Serialize;

/// How often the writer writes what has accumulated: a line reaches the
/// sink within this, and a kplug killed outright loses at most this much.
pub const WRITE_INTERVAL: Duration = Duration::from_millis(100);

/// Lines waiting for the writer, in bytes; beyond, new ones are dropped.
const MAX_UNWRITTEN: usize = 8 << 20;

/// Where the lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    Stdout,
    /// Appended to.
    File(PathBuf),
}

impl std::str::FromStr for Sink {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "" => Err("empty: give - for stdout or a file's path".to_owned()),
            "-" => Ok(Self::Stdout),
            path => Ok(Self::File(PathBuf::from(path))),
        }
    }
}

/// One reconcile, as the audit log records it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event<'a> {
    /// RFC 3339, when the answer was sent.
    pub timestamp: String,
    /// The call's id, as the plugin saw it; empty when no call was made.
    pub operation_id: &'a str,
    pub trace_id: String,
    pub user: UserRef<'a>,
    /// `Reconcile` or `Finalize`.
    pub operation: &'a str,
    pub dry_run: bool,
    pub object_ref: ObjectRef<'a>,
    /// The plugin and the instance that answered; empty when none did.
    pub plugin: &'a str,
    pub instance: &'a str,
    /// The HTTP code of kplug's answer: 201, or the error's.
    pub code: u16,
    /// `Success` or `Failure` (the plugin's own verdict) with a 201,
    /// otherwise the error's reason (`Forbidden`, `ServiceUnavailable`, ...).
    pub outcome: &'a str,
    /// The error's message, when there was one.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub message: &'a str,
    pub duration_seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct UserRef<'a> {
    pub username: &'a str,
    pub groups: &'a [String],
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub namespace: &'a str,
    pub name: &'a str,
}

/// The log: its lines not yet written, and the thread that writes them.
pub struct AuditLog {
    unwritten: Arc<Mutex<Vec<u8>>>,
    dropped: Counter,
    /// Dropped to tell the writer to write the rest and stop.
    stop: Option<Sender<()>>,
    writer: Option<JoinHandle<()>>,
}

impl AuditLog {
    /// Opens `sink` (a file is created or appended to) and starts the
    /// thread that writes to it.
    pub fn start(sink: &Sink) -> std::io::Result<Self> {
        let out: Box<dyn Write + Send> = match sink {
            Sink::Stdout => Box::new(std::io::stdout()),
            Sink::File(path) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        Self::writing_to(out)
    }

    /// The log with its writer writing to `out`.
    fn writing_to(out: Box<dyn Write + Send>) -> std::io::Result<Self> {
        let unwritten = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = std::sync::mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("audit-log".to_owned())
            .spawn({
                let unwritten = Arc::clone(&unwritten);
                move || write_lines(&unwritten, &stopped, out)
            })?;
        Ok(Self {
            unwritten,
            dropped: Counter::default(),
            stop: Some(stop),
            writer: Some(writer),
        })
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kplug_audit_events_dropped",
            "Audit events not written because too many were waiting (the audit log's sink is slower than the reconciles)",
            self.dropped.clone(),
        );
    }

    /// Appends `event` to the lines the writer writes next; never waits
    /// for the sink.
    pub fn record(&self, event: &Event<'_>) {
        let mut unwritten = self
            .unwritten
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if unwritten.len() >= MAX_UNWRITTEN {
            self.dropped.inc();
            return;
        }
        let before = unwritten.len();
        match serde_json::to_writer(&mut *unwritten, event) {
            Ok(()) => unwritten.push(b'\n'),
            Err(error) => {
                unwritten.truncate(before);
                tracing::error!(%error, "an audit event does not encode");
            }
        }
    }
}

impl Drop for AuditLog {
    /// Writes what is left before the process goes.
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(writer) = self.writer.take()
            && writer.join().is_err()
        {
            tracing::error!("the audit log's writer panicked");
        }
    }
}

/// Every [`WRITE_INTERVAL`], writes the lines that have accumulated, and
/// once more when told to stop. The buffer is swapped out under the lock,
/// so reconciles never wait for the sink.
fn write_lines(unwritten: &Mutex<Vec<u8>>, stop: &Receiver<()>, mut out: Box<dyn Write + Send>) {
    let mut writing = Vec::new();
    loop {
        let stopping = match stop.recv_timeout(WRITE_INTERVAL) {
            Err(RecvTimeoutError::Timeout) => false,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
        };
        std::mem::swap(
            &mut writing,
            &mut *unwritten.lock().unwrap_or_else(PoisonError::into_inner),
        );
        if !writing.is_empty() {
            if let Err(error) = out.write_all(&writing).and_then(|()| out.flush()) {
                tracing::error!(%error, "writing the audit log");
            }
            writing.clear();
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_parse_as_kube_apiserver_audit_log_path() {
        assert_eq!("-".parse(), Ok(Sink::Stdout));
        assert_eq!(
            "/var/log/kplug/audit.log".parse(),
            Ok(Sink::File(PathBuf::from("/var/log/kplug/audit.log")))
        );
        assert!("".parse::<Sink>().is_err());
    }

    fn event(name: &str) -> Event<'_> {
        Event {
            timestamp: "2026-11-28T15:00:00Z".to_owned(),
            operation_id: "",
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
            user: UserRef {
                username: "op",
                groups: &[],
            },
            operation: "Reconcile",
            dry_run: false,
            object_ref: ObjectRef {
                name,
                ..ObjectRef::default()
            },
            plugin: "p",
            instance: "",
            code: 201,
            outcome: "Success",
            message: "",
            duration_seconds: 0.001,
        }
    }

    /// A sink that takes nothing until it is released.
    struct Stuck(Receiver<()>);

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_reach_the_sink_while_the_log_runs() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("audit.log");
        let log = AuditLog::start(&Sink::File(path.clone())).expect("the log opens");
        log.record(&event("a"));
        let deadline = std::time::Instant::now() + 50 * WRITE_INTERVAL;
        let text = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if !text.is_empty() || std::time::Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(WRITE_INTERVAL / 4);
        };
        assert_eq!(text.lines().count(), 1, "{text:?}");
        drop(log);
    }

    #[test]
    fn a_stuck_sink_drops_lines_past_the_bound_and_counts_them() {
        let (release, stuck) = std::sync::mpsc::channel();
        let log = AuditLog::writing_to(Box::new(Stuck(stuck))).expect("the log starts");
        let line = serde_json::to_vec(&event("x")).expect("encodes").len() + 1;
        // The writer takes the buffer at most once before it is stuck:
        // two full buffers hold fewer lines than this.
        let events = 3 * MAX_UNWRITTEN / line;
        for _ in 0..events {
            log.record(&event("x"));
        }
        let dropped = log.dropped.get();
        assert!(dropped > 0, "nothing dropped of {events}");
        assert!(
            usize::try_from(dropped).is_ok_and(|d| d < events),
            "all {events} dropped"
        );
        drop(release);
        drop(log);
    }

    #[test]
    fn events_are_one_json_line_each() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("audit.log");
        let log = AuditLog::start(&Sink::File(path.clone())).expect("the log opens");
        let groups = ["system:authenticated".to_owned()];
        for name in ["a", "b"] {
            log.record(&Event {
                timestamp: "2026-11-28T15:00:00Z".to_owned(),
                operation_id: "",
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
                user: UserRef {
                    username: "op",
                    groups: &groups,
                },
                operation: "Finalize",
                dry_run: false,
                object_ref: ObjectRef {
                    api_version: "example.com/v1",
                    kind: "Widget",
                    namespace: "team-b",
                    name,
                },
                plugin: "",
                instance: "",
                code: 403,
                outcome: "Forbidden",
                message: "widgets.example.com \"a\" is forbidden",
                duration_seconds: 0.001,
            });
        }
        // Dropping the log writes what is left, at once.
        drop(log);
        let lines = std::fs::read_to_string(&path).expect("the log was written");
        let events: Vec<serde_json::Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        assert_eq!(events.len(), 2, "{lines}");
        assert_eq!(events[1]["objectRef"]["name"], "b");
        assert_eq!(events[0]["user"]["username"], "op");
        assert_eq!(events[0]["code"], 403);
        assert!(events[0].get("instance").is_some());
    }
}
