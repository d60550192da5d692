//! Events as kubectl shows them: the same Event again (object, type,
//! reason, action and note) continues one Event's series, and a changed
//! note is a new Event. kube-rs's `Recorder` keys its series without the
//! note (kube-runtime 5.0's `EventKey`), so a changed note would only bump
//! the count of an Event that still shows the first one. Here each object,
//! type, reason and action keeps the note it last published and a
//! `Recorder` of its own, replaced when the note changes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use parking_lot::Mutex;

/// kube-rs ends a series after six minutes without a repeat; a note older
/// than that is forgotten too.
const FORGET_AFTER: Duration = Duration::from_secs(6 * 60);

/// The Events of one operator.
pub struct Events {
    client: Client,
    reporter: Reporter,
    last: Mutex<Notes<Recorder>>,
}

impl Events {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            last: Mutex::new(Notes::default()),
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
        let note = event.note.clone().unwrap_or_default();
        let recorder = {
            let mut last = self.last.lock();
            last.recorder(key, note, Instant::now(), || {
                Recorder::new(self.client.clone(), self.reporter.clone())
            })
        };
        recorder.publish(event, regarding).await
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

/// The last note of each key, with what publishes its series (`R`: a
/// `Recorder`; anything in the tests).
struct Notes<R> {
    last: HashMap<Key, (String, R, Instant)>,
}

impl<R> Default for Notes<R> {
    fn default() -> Self {
        Self {
            last: HashMap::new(),
        }
    }
}

impl<R: Clone> Notes<R> {
    /// The publisher for `note` under `key`: the last one if its note is
    /// the same, else a new one from `fresh`. Forgets keys unused for
    /// [`FORGET_AFTER`].
    fn recorder(&mut self, key: Key, note: String, now: Instant, fresh: impl FnOnce() -> R) -> R {
        self.last
            .retain(|_, (_, _, at)| now.saturating_duration_since(*at) < FORGET_AFTER);
        match self.last.get_mut(&key) {
            Some((last_note, recorder, at)) if *last_note == note => {
                *at = now;
                recorder.clone()
            }
            _ => {
                let recorder = fresh();
                self.last.insert(key, (note, recorder.clone(), now));
                recorder
            }
        }
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

    #[test]
    fn the_same_note_continues_a_series_and_a_new_note_starts_one() {
        let mut notes = Notes::default();
        let mut made = 0;
        let start = Instant::now();
        let mut publisher = |note: &str, reason: &str, after: u64| {
            notes.recorder(
                key(reason),
                note.to_owned(),
                start + Duration::from_secs(after),
                || {
                    made += 1;
                    made
                },
            )
        };
        assert_eq!(publisher("3 files", "Provisioned", 0), 1);
        assert_eq!(
            publisher("3 files", "Provisioned", 1),
            1,
            "a repeat: its series"
        );
        assert_eq!(
            publisher("2 files", "Provisioned", 2),
            2,
            "a new note: a new Event"
        );
        assert_eq!(publisher("2 files", "Provisioned", 3), 2);
        assert_eq!(publisher("2 files", "Failed", 4), 3, "another reason");
        assert_eq!(
            publisher("3 files", "Provisioned", 5),
            4,
            "back to the first note: new"
        );
        // Unused for six minutes: forgotten, as kube-rs forgets the series.
        assert_eq!(publisher("3 files", "Provisioned", 5 + 6 * 60), 5);
    }
}
