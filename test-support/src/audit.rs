//! kube-apiserver's audit log of the writes in one namespace: what a
//! bench's phase cost, counted by what kube-apiserver itself recorded, not
//! by what the writers say they did.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

/// The audit policy: every write in the namespace `NAMESPACE`, at the
/// `Metadata` level (who, what, no bodies), once answered; nothing else.
const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  namespaces: [NAMESPACE]
  verbs: [create, update, patch, delete]
- level: None
"#;

/// The log kube-apiserver writes with [`AuditLog::apiserver_args`].
pub struct AuditLog {
    path: PathBuf,
}

/// Writes counted in a stretch of the log, by request (`verb resource`,
/// with the group and subresource).
pub type Writes = BTreeMap<String, usize>;

impl AuditLog {
    /// Writes the policy for the writes in `namespace` into `dir`; the log
    /// goes there too.
    pub fn new(dir: &Path, namespace: &str) -> Result<Self> {
        let policy = dir.join("audit-policy.yaml");
        std::fs::write(&policy, POLICY.replace("NAMESPACE", namespace))
            .with_context(|| format!("writing {}", policy.display()))?;
        Ok(Self {
            path: dir.join("audit.log"),
        })
    }

    /// kube-apiserver's flags for this log (written as each request is
    /// answered: the default blocking mode).
    pub fn apiserver_args(&self) -> Vec<String> {
        let policy = self.path.with_file_name("audit-policy.yaml");
        vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", self.path.display()),
            "--audit-log-format=json".to_owned(),
        ]
    }

    /// Where the log ends now: what [`AuditLog::writes_since`] counts from.
    pub fn mark(&self) -> Result<u64> {
        match std::fs::metadata(&self.path) {
            Ok(metadata) => Ok(metadata.len()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(error) => Err(error).with_context(|| format!("reading {}", self.path.display())),
        }
    }

    /// The writes logged since `mark`, by request.
    pub fn writes_since(&self, mark: u64) -> Result<Writes> {
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.seek(SeekFrom::Start(mark))?;
        let mut text = String::new();
        file.read_to_string(&mut text)
            .with_context(|| format!("reading {}", self.path.display()))?;
        Ok(count(&text))
    }
}

/// Counts the `ResponseComplete` events of `log` (JSON lines) by request.
fn count(log: &str) -> Writes {
    let mut writes = Writes::new();
    for event in log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if event["stage"] != "ResponseComplete" {
            continue;
        }
        let reference = &event["objectRef"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let mut request = format!("{} {}", text(&event["verb"]), text(&reference["resource"]));
        let group = text(&reference["apiGroup"]);
        if !group.is_empty() {
            request = format!("{request}.{group}");
        }
        let subresource = text(&reference["subresource"]);
        if !subresource.is_empty() {
            request = format!("{request}/{subresource}");
        }
        *writes.entry(request).or_default() += 1;
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answered_writes_count_by_verb_resource_group_and_subresource() {
        let log = r#"{"stage":"ResponseComplete","verb":"patch","objectRef":{"resource":"widgets","namespace":"bench","apiGroup":"bench.kplug.io","subresource":"status"}}
{"stage":"ResponseComplete","verb":"patch","objectRef":{"resource":"widgets","namespace":"bench","apiGroup":"bench.kplug.io","subresource":"status"}}
{"stage":"Panic","verb":"patch","objectRef":{"resource":"widgets"}}
{"stage":"ResponseComplete","verb":"create","objectRef":{"resource":"events","namespace":"bench","apiGroup":"events.k8s.io"}}
{"stage":"ResponseComplete","verb":"patch","objectRef":{"resource":"configmaps","namespace":"bench"}}
half a line"#;
        let writes = count(log);
        assert_eq!(writes["patch widgets.bench.kplug.io/status"], 2);
        assert_eq!(writes["create events.events.k8s.io"], 1);
        assert_eq!(writes["patch configmaps"], 1);
        assert_eq!(writes.len(), 3);
    }
}
