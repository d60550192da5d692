//! Watches: a newline-delimited stream of `{"type": ..., "object": ...}` events.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::AppState;
use super::negotiate::Representation;
use super::options::{ListOptions, place};
use super::status::ApiError;
use super::table::TableWriter;
use crate::registry::{Encoded, Event, EventType, RequestedVersion, WatchError};
use crate::v1alpha1::{API_VERSION, Plugin};

/// Events buffered per watch before the writer waits for the client.
const WATCH_BUFFER: usize = 64;
/// Marks the bookmark that ends the initial events of a `sendInitialEvents` watch.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

#[derive(Serialize)]
struct WatchEvent<T: Serialize> {
    #[serde(rename = "type")]
    type_: &'static str,
    object: T,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Bookmark {
    kind: &'static str,
    api_version: &'static str,
    metadata: ObjectMeta,
}

/// Renders events for one watch.
struct Encoder {
    state: Arc<AppState>,
    options: ListOptions,
    repr: Representation,
}

impl Encoder {
    fn line<T: Serialize>(type_: &'static str, object: T) -> Bytes {
        let mut bytes = serde_json::to_vec(&WatchEvent { type_, object }).unwrap_or_default();
        bytes.push(b'\n');
        Bytes::from(bytes)
    }

    /// `{"type":...,"object":...}` around the cached bytes of the version
    /// stored at `resource_version`, as a Table of one row when the watch
    /// asked for tables.
    fn object(&self, type_: &'static str, resource_version: u64, encoded: &Encoded) -> Bytes {
        let mut out = Vec::with_capacity(encoded.json_len() + 64);
        out.extend_from_slice(br#"{"type":""#);
        out.extend_from_slice(type_.as_bytes());
        out.extend_from_slice(br#"","object":"#);
        match self.repr {
            Representation::Json => encoded.write_json(&mut out),
            Representation::Table(version) => {
                let registry = &self.state.registry;
                // The instances' latest heartbeat while the plugin lives,
                // the version's own once it is gone.
                let last_seen = encoded
                    .head()
                    .and_then(|head| registry.last_seen(&head.name))
                    .unwrap_or(encoded.last_heartbeat());
                let metadata = ListMeta {
                    resource_version: Some(registry.version(resource_version)),
                    ..ListMeta::default()
                };
                let table =
                    TableWriter::new(version, self.options.include_object, Timestamp::now());
                if let Err(error) = table.single(&mut out, &metadata, encoded, last_seen) {
                    // A ListMeta of one string always serializes.
                    tracing::error!(%error, "encoding a watch event");
                }
            }
        }
        out.extend_from_slice(b"}\n");
        Bytes::from(out)
    }

    fn bookmark(&self, resource_version: u64, initial_events_end: bool) -> Bytes {
        let annotations =
            initial_events_end.then(|| [(INITIAL_EVENTS_END.to_owned(), "true".to_owned())].into());
        Self::line(
            "BOOKMARK",
            Bookmark {
                kind: Plugin::KIND,
                api_version: API_VERSION,
                metadata: ObjectMeta {
                    resource_version: Some(self.state.registry.version(resource_version)),
                    annotations,
                    ..ObjectMeta::default()
                },
            },
        )
    }

    /// The event as this watch's selectors see it: a change that moves an
    /// object into or out of the selection is an ADDED or DELETED.
    fn event(&self, event: &Event) -> Option<Bytes> {
        let now = self.options.selects(&event.encoded);
        // A MODIFIED event without the previous object changed only the
        // status, which no selector looks at.
        let before = event
            .previous
            .as_ref()
            .map_or(now, |p| self.options.selects(p));
        let type_ = match (event.event_type, before, now) {
            (EventType::Modified, true, true) => EventType::Modified,
            (EventType::Modified, false, true) => EventType::Added,
            (EventType::Modified, true, false) => EventType::Deleted,
            (EventType::Modified, false, false) => return None,
            (other, _, true) => other,
            (_, _, false) => return None,
        };
        Some(self.object(type_.as_str(), event.resource_version, &event.encoded))
    }
}

fn error_line(error: &ApiError) -> Bytes {
    Encoder::line("ERROR", error.to_status())
}

/// Starts a watch and returns the streaming response.
pub fn watch(
    state: Arc<AppState>,
    options: ListOptions,
    repr: Representation,
) -> Result<Response, ApiError> {
    let initial_events = match options.send_initial_events {
        Some(true) if !options.allow_bookmarks => {
            return Err(ApiError::Invalid {
                name: String::new(),
                message: "sendInitialEvents requires allowWatchBookmarks=true".to_owned(),
                causes: vec![(
                    "allowWatchBookmarks".to_owned(),
                    "must be true when sendInitialEvents is true".to_owned(),
                )],
            });
        }
        Some(send) => send,
        None => options.resource_version.is_none(),
    };
    let since = match place(&state.registry, options.resource_version.as_deref())? {
        Some(RequestedVersion::Foreign(foreign)) => return Ok(expired(foreign.to_string())),
        _ if initial_events => None,
        Some(RequestedVersion::Local(rv)) => Some(rv),
        None => Some(state.registry.resource_version()),
    };
    let timeout = options
        .timeout
        .unwrap_or(state.watch.default_timeout)
        .min(state.watch.max_timeout);
    let bookmark_interval = state.watch.bookmark_interval;
    let (tx, rx) = mpsc::channel::<Bytes>(WATCH_BUFFER);

    match state.registry.watch(since) {
        Err(WatchError::TooLarge { requested, current }) => {
            return Err(ApiError::Timeout(format!(
                "Too large resource version: {}, current: {}",
                state.registry.version(requested),
                state.registry.version(current)
            )));
        }
        Err(WatchError::Expired { requested, oldest }) => {
            return Ok(expired(format!(
                "too old resource version: {} ({})",
                state.registry.version(requested),
                state.registry.version(oldest)
            )));
        }
        Ok(start) => {
            let encoder = Encoder {
                state,
                options,
                repr,
            };
            let send_initial_end = encoder.options.send_initial_events == Some(true);
            tokio::spawn(async move {
                let mut last_rv = start.resource_version;
                for event in &start.initial {
                    last_rv = last_rv.max(event.resource_version);
                    if let Some(line) = encoder.event(event)
                        && tx.send(line).await.is_err()
                    {
                        return;
                    }
                }
                if send_initial_end && tx.send(encoder.bookmark(last_rv, true)).await.is_err() {
                    return;
                }
                stream_feed(encoder, start.feed, tx, last_rv, timeout, bookmark_interval).await;
            });
        }
    }

    Ok(stream_response(Body::from_stream(
        ReceiverStream::new(rx).map(Ok::<_, Infallible>),
    )))
}

/// A watch from a version this process cannot resume from (compacted, or
/// another process's): like kube-apiserver, a 200 whose only event is the
/// 410, so clients relist.
fn expired(message: String) -> Response {
    stream_response(Body::from(error_line(&ApiError::Expired(message))))
}

fn stream_response(body: Body) -> Response {
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

async fn stream_feed(
    encoder: Encoder,
    mut feed: broadcast::Receiver<Arc<Event>>,
    tx: mpsc::Sender<Bytes>,
    mut last_rv: u64,
    timeout: std::time::Duration,
    bookmark_interval: std::time::Duration,
) {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut bookmarks = tokio::time::interval(bookmark_interval);
    bookmarks.tick().await;
    // At shutdown the watch ends, as at its timeout: the client watches again.
    let mut closing = encoder.state.closing.clone();
    loop {
        let line = tokio::select! {
            () = &mut deadline => return,
            () = tx.closed() => return,
            () = async { drop(closing.wait_for(|closing| *closing).await) } => return,
            _ = bookmarks.tick(), if encoder.options.allow_bookmarks => {
                Some(encoder.bookmark(last_rv, false))
            }
            received = feed.recv() => match received {
                Ok(event) if event.resource_version > last_rv => {
                    last_rv = event.resource_version;
                    encoder.event(&event)
                }
                // Already sent as part of the initial events.
                Ok(_) => None,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    // The client resumes from its last resourceVersion.
                    tracing::warn!(missed, "watcher fell behind; closing its watch");
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        if let Some(line) = line
            && tx.send(line).await.is_err()
        {
            return;
        }
    }
}
