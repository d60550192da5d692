//! Events as kubectl shows them: the same Event again (object, type,
//! reason, action and note) continues one Event's series, and a changed
//! note is a new Event.
//!
//! kube-rs's `Recorder` does not fit: it keys its series without the note
//! (kube-runtime 5.0's `EventKey`), so a changed note would only bump the
//! count of an Event that still shows the first one; and it keeps every
//! Event it published whole for its six minutes. One `Recorder` per series,
//! the way round the first, kept a client, a map and a whole Event for
//! every object. Here a series keeps what its next repeat needs: its note,
//! its Event's name and its count.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use parking_lot::Mutex;
use serde_json::json;

/// A series ends after six minutes without a repeat, as kube-rs's and
/// client-go's do; its next Event is a new one.
const FORGET_AFTER: Duration = Duration::from_secs(6 * 60);
/// How often ended series are removed from memory.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The Events of one operator.
pub struct Events {
    client: Client,
    reporter: Reporter,
    series: Mutex<Series>,
}

impl Events {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            series: Mutex::default(),
        }
    }

    /// Publishes `event` about `regarding`: in the series of the last Event
    /// with the same note, else as a new Event.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = Key::new(event, regarding);
        let note = event.note.as_deref().unwrap_or_default();
        let now = Timestamp::now();
        // Cluster-scoped objects' Events go to `default`, as kube-rs's do.
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let next = {
            let object = regarding
                .name
                .as_deref()
                .unwrap_or(&self.reporter.controller);
            let fresh_name = || format!("{object}.{:x}", now.as_nanosecond());
            self.series
                .lock()
                .next(&key, note, Instant::now(), fresh_name)
        };
        let written = match &next {
            Next::New { name } => {
                let created = self.new_event(event, regarding, name, namespace, now);
                api.create(&PostParams::default(), &created).await.map(drop)
            }
            Next::Repeat { name, count } => {
                let series = EventSeries {
                    count: *count,
                    last_observed_time: MicroTime(now),
                };
                let patch = Patch::Merge(json!({ "series": series }));
                api.patch(name, &PatchParams::default(), &patch)
                    .await
                    .map(drop)
            }
        };
        if written.is_err() {
            // Not written, or its Event is gone: the next one starts anew.
            self.series.lock().forget(&key);
        }
        written
    }

    /// The first Event of a series, with the fields kube-rs's `Recorder`
    /// fills.
    fn new_event(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        name: &str,
        namespace: &str,
        now: Timestamp,
    ) -> K8sEvent {
        let controller = &self.reporter.controller;
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..K8sEvent::default()
        }
    }
}

/// What an Event's series is for, but its note.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Key {
    object: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    warning: bool,
    reason: String,
    action: String,
}

impl Key {
    fn new(event: &Event, regarding: &ObjectReference) -> Self {
        Self {
            object: (
                regarding.kind.clone(),
                regarding.namespace.clone(),
                regarding.name.clone(),
                regarding.uid.clone(),
            ),
            warning: event.type_ == EventType::Warning,
            reason: event.reason.clone(),
            action: event.action.clone(),
        }
    }
}

/// What to write for an Event.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// A new Event of this name.
    New { name: String },
    /// The `count`th of the series of Event `name`.
    Repeat { name: String, count: i32 },
}

/// The open series, by key: the last note, its Event and how many times it
/// was published.
#[derive(Default)]
struct Series {
    open: HashMap<Key, Last>,
    /// When ended series were last removed: once a minute at most, rather
    /// than a pass over every object's series on each Event.
    swept: Option<Instant>,
}

struct Last {
    note: String,
    name: String,
    count: i32,
    at: Instant,
}

impl Series {
    /// What publishing `note` under `key` at `now` writes, recorded as
    /// written (see [`Series::forget`]). Series unused for
    /// [`FORGET_AFTER`] end.
    fn next(
        &mut self,
        key: &Key,
        note: &str,
        now: Instant,
        fresh_name: impl FnOnce() -> String,
    ) -> Next {
        if self
            .swept
            .is_none_or(|swept| now.saturating_duration_since(swept) >= SWEEP_EVERY)
        {
            self.open
                .retain(|_, last| now.saturating_duration_since(last.at) < FORGET_AFTER);
            self.swept = Some(now);
        }
        if let Some(last) = self.open.get_mut(key)
            && last.note == note
            && now.saturating_duration_since(last.at) < FORGET_AFTER
        {
            last.count = last.count.saturating_add(1);
            last.at = now;
            return Next::Repeat {
                name: last.name.clone(),
                count: last.count,
            };
        }
        let name = fresh_name();
        let last = Last {
            note: note.to_owned(),
            name: name.clone(),
            count: 1,
            at: now,
        };
        self.open.insert(key.clone(), last);
        Next::New { name }
    }

    /// Ends `key`'s series: what [`Series::next`] planned was not written.
    fn forget(&mut self, key: &Key) {
        self.open.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(reason: &str) -> Key {
        Key {
            object: (
                Some("Widget".into()),
                Some("default".into()),
                Some("a".into()),
                None,
            ),
            warning: true,
            reason: reason.into(),
            action: "Reconcile".into(),
        }
    }

    fn new(name: &str) -> Next {
        Next::New { name: name.into() }
    }

    fn repeat(name: &str, count: i32) -> Next {
        Next::Repeat {
            name: name.into(),
            count,
        }
    }

    #[test]
    fn the_same_note_continues_a_series_and_a_new_note_starts_one() {
        let mut series = Series::default();
        let mut made = 0;
        let start = Instant::now();
        let mut publish = |note: &str, reason: &str, after: u64| {
            series.next(
                &key(reason),
                note,
                start + Duration::from_secs(after),
                || {
                    made += 1;
                    format!("a.{made}")
                },
            )
        };
        assert_eq!(publish("3 files", "Provisioned", 0), new("a.1"));
        assert_eq!(
            publish("3 files", "Provisioned", 1),
            repeat("a.1", 2),
            "a repeat: its series"
        );
        assert_eq!(publish("3 files", "Provisioned", 2), repeat("a.1", 3));
        assert_eq!(
            publish("2 files", "Provisioned", 3),
            new("a.2"),
            "a new note: a new Event"
        );
        assert_eq!(publish("2 files", "Provisioned", 4), repeat("a.2", 2));
        assert_eq!(
            publish("2 files", "Failed", 5),
            new("a.3"),
            "another reason"
        );
        assert_eq!(
            publish("3 files", "Provisioned", 6),
            new("a.4"),
            "back to the first note: new"
        );
        // Unused for six minutes: a new Event, as kube-rs ends the series.
        assert_eq!(publish("3 files", "Provisioned", 6 + 6 * 60), new("a.5"));
    }

    #[test]
    fn a_series_ends_after_six_minutes_between_sweeps() {
        let mut series = Series::default();
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        assert_eq!(
            series.next(&key("Provisioned"), "done", at(0), || "a.1".into()),
            new("a.1")
        );
        assert_eq!(
            series.next(&key("Provisioned"), "done", at(35), || "a.x".into()),
            repeat("a.1", 2)
        );
        // A sweep at 390 s keeps the series, used 355 s before.
        assert_eq!(
            series.next(&key("Failed"), "no", at(390), || "b.1".into()),
            new("b.1")
        );
        assert_eq!(series.open.len(), 2, "swept, and the first series kept");
        // 361 s after its last use, 6 s after the sweep: ended all the same.
        assert_eq!(
            series.next(&key("Provisioned"), "done", at(361 + 35), || "a.2".into()),
            new("a.2")
        );
    }

    #[test]
    fn what_was_not_written_starts_anew() {
        let mut series = Series::default();
        let now = Instant::now();
        let planned = series.next(&key("Provisioned"), "done", now, || "a.1".into());
        assert_eq!(planned, new("a.1"));
        series.forget(&key("Provisioned"));
        assert_eq!(
            series.next(&key("Provisioned"), "done", now, || "a.2".into()),
            new("a.2")
        );
        assert_eq!(
            series.next(&key("Provisioned"), "done", now, || "a.3".into()),
            repeat("a.2", 2)
        );
        series.forget(&key("Provisioned"));
        assert_eq!(
            series.next(&key("Provisioned"), "done", now, || "a.4".into()),
            new("a.4")
        );
    }
}
