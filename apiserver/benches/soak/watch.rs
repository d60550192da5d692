//! A watch on the plugins held open for the whole run, as a controller
//! would hold it: it counts the events by type (a DELETED is a plugin that
//! left the registry) and, when kplug closes it (a watch that fell behind
//! is cut off), resumes from the last resourceVersion it saw.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::task::JoinHandle;

use crate::PLUGINS_PATH;
use crate::support::ApiClient;

/// DELETED plugin names kept for the report.
const KEPT_DELETIONS: usize = 10;

/// Events seen so far, by type.
#[derive(Default)]
pub struct WatchCounts {
    pub added: AtomicU64,
    pub modified: AtomicU64,
    pub deleted: AtomicU64,
    pub bookmarks: AtomicU64,
    /// Times the watch ended before the run did and was resumed.
    pub resumed: AtomicU64,
    /// The first plugins deleted.
    pub deletions: Mutex<Vec<String>>,
}

impl WatchCounts {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The running watch, until [`Watch::stop`] or the end of the runtime.
pub struct Watch {
    pub counts: Arc<WatchCounts>,
    task: JoinHandle<Result<()>>,
}

impl Watch {
    /// Starts watching every plugin, from an empty registry on, with
    /// bookmarks, for up to `seconds` per request; `prefix` starts its
    /// progress lines.
    pub fn start(api: ApiClient, seconds: u64, prefix: &'static str) -> Self {
        let counts = Arc::new(WatchCounts::default());
        let task = tokio::spawn(watch(api, seconds, counts.clone(), prefix));
        Self { counts, task }
    }

    /// Ends the watch; fails if it had failed (it could not resume).
    pub async fn stop(self) -> Result<()> {
        if self.task.is_finished() {
            return self.task.await.context("the watch task panicked")?;
        }
        self.task.abort();
        Ok(())
    }
}

#[derive(Deserialize)]
struct Line {
    #[serde(rename = "type")]
    kind: String,
    object: Object,
}

#[derive(Deserialize)]
struct Object {
    #[serde(default)]
    metadata: Metadata,
    /// An ERROR event's Status message.
    #[serde(default)]
    message: String,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    #[serde(default)]
    name: String,
    #[serde(default)]
    resource_version: String,
}

async fn watch(
    mut api: ApiClient,
    seconds: u64,
    counts: Arc<WatchCounts>,
    prefix: &str,
) -> Result<()> {
    let mut resource_version: Option<String> = None;
    loop {
        let mut path =
            format!("{PLUGINS_PATH}?watch=true&allowWatchBookmarks=true&timeoutSeconds={seconds}");
        if let Some(rv) = &resource_version {
            path.push_str(&format!("&resourceVersion={rv}"));
        }
        let mut body = api.get_streaming(&path, "application/json").await?;
        let mut pending: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.context("reading the watch")?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            pending.extend_from_slice(data);
            let mut start = 0;
            while let Some(end) = pending[start..].iter().position(|b| *b == b'\n') {
                let line: Line = serde_json::from_slice(&pending[start..start + end])
                    .context("a watch event is not JSON")?;
                start += end + 1;
                count(&counts, &line)?;
                if !line.object.metadata.resource_version.is_empty() {
                    resource_version = Some(line.object.metadata.resource_version);
                }
            }
            pending.drain(..start);
        }
        counts.resumed.fetch_add(1, Ordering::Relaxed);
        eprintln!("{prefix}the watch ended; resuming from resourceVersion {resource_version:?}");
    }
}

fn count(counts: &WatchCounts, line: &Line) -> Result<()> {
    let counter = match line.kind.as_str() {
        "ADDED" => &counts.added,
        "MODIFIED" => &counts.modified,
        "BOOKMARK" => &counts.bookmarks,
        "DELETED" => {
            let mut deletions = counts.deletions.lock();
            if deletions.len() < KEPT_DELETIONS {
                deletions.push(line.object.metadata.name.clone());
            }
            &counts.deleted
        }
        // 410 Gone: the history no longer reaches back to where the watch
        // was; a relist would lose the DELETED events in between.
        "ERROR" => bail!("the watch could not go on: {}", line.object.message),
        other => bail!("unknown watch event type {other:?}"),
    };
    counter.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
