//! kplug's audit log: one JSON line per reconcile, whatever its outcome,
//! saying who made which plugin act on what, in the spirit of
//! kube-apiserver's audit events (which see only `create reconciles`, not
//! the object inside). Written by a thread of its own from a bounded queue,
//! so that a slow sink never slows a reconcile: when the queue is full the
//! event is dropped and counted (`kplug_audit_events_dropped_total`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde::Serialize;

/// Events waiting for the writer; beyond, new ones are dropped.
const QUEUE: usize = 10_000;

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

/// The writer's end of the log.
pub struct AuditLog {
    queue: SyncSender<Vec<u8>>,
    dropped: Counter,
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
        let (queue, lines) = std::sync::mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("audit-log".to_owned())
            .spawn(move || write_lines(lines, out))?;
        Ok(Self {
            queue,
            dropped: Counter::default(),
        })
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kplug_audit_events_dropped",
            "Audit events not written because the audit log's queue was full (its sink is slower than the reconciles)",
            self.dropped.clone(),
        );
    }

    /// Queues `event` for the writer; never waits.
    pub fn record(&self, event: &Event<'_>) {
        let mut line = match serde_json::to_vec(event) {
            Ok(line) => line,
            Err(error) => {
                tracing::error!(%error, "an audit event does not encode");
                return;
            }
        };
        line.push(b'\n');
        match self.queue.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.inc();
            }
            Err(TrySendError::Disconnected(_)) => {
                self.dropped.inc();
                tracing::error!("the audit log's writer has stopped");
            }
        }
    }
}

/// Writes each line as it comes, flushing whenever the queue is empty.
fn write_lines(lines: Receiver<Vec<u8>>, mut out: Box<dyn Write + Send>) {
    let mut buffered = std::io::BufWriter::new(&mut out);
    while let Ok(line) = lines.recv() {
        let mut result = buffered.write_all(&line);
        while let Ok(more) = lines.try_recv() {
            result = result.and_then(|()| buffered.write_all(&more));
        }
        if let Err(error) = result.and_then(|()| buffered.flush()) {
            tracing::error!(%error, "writing the audit log");
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
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let lines = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() == 2 || std::time::Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
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
