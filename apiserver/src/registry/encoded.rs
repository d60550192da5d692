//! The wire forms of one stored object version, made once when the registry
//! stores it: lists, tables and watches then copy these bytes instead of
//! serializing every object for every request.
//!
//! They are also the only form the registry keeps: the typed object is
//! parsed back from the JSON when a request needs it (a pinned selection,
//! a selector, a departed plugin's addresses). At 10,000 plugins the typed
//! objects and their strings were 2 KB a plugin beside 1.3 KB of JSON.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use jiff::Timestamp;
use serde::Deserialize;

use crate::v1alpha1::{CONDITION_READY, Plugin};

/// A plugin version as JSON, with the parts of it that responses reuse.
#[derive(Debug)]
pub struct Encoded {
    /// The registry's counter this version was stored at.
    resource_version: u64,
    /// The object exactly as `serde_json::to_vec` writes it.
    json: Box<[u8]>,
    /// Where the object's `metadata` value is in `json`.
    metadata: Range<usize>,
    /// The Table cells that do not depend on the time of the request, as JSON
    /// array elements: `"Name","API","Implementation","Version","Ready",
    /// "Instances"`, then
    /// (from `split`) `"Address"`. The two ages go between them (see
    /// `api::table`, whose column definitions this order follows).
    cells: Box<[u8]>,
    split: usize,
    /// `metadata.creationTimestamp`, for the Age cell.
    created: Timestamp,
    /// `status.lastHeartbeatTime`, for the Last Heartbeat cell of a plugin
    /// that is gone.
    last_heartbeat: Timestamp,
}

impl Encoded {
    /// `plugin` as stored at `resource_version`.
    pub fn new(plugin: &Plugin, resource_version: u64) -> Self {
        // The object is written field by field, as its derived `Serialize`
        // writes it (the tests compare the two), so that the range of
        // `metadata` is known without a second serialization.
        let mut json = Vec::with_capacity(1024);
        json.extend_from_slice(br#"{"apiVersion":"#);
        write_json(&mut json, &plugin.api_version);
        json.extend_from_slice(br#","kind":"#);
        write_json(&mut json, &plugin.kind);
        json.extend_from_slice(br#","metadata":"#);
        let start = json.len();
        write_json(&mut json, &plugin.metadata);
        let metadata = start..json.len();
        json.extend_from_slice(br#","spec":"#);
        write_json(&mut json, &plugin.spec);
        json.extend_from_slice(br#","status":"#);
        write_json(&mut json, &plugin.status);
        json.push(b'}');

        let spec = &plugin.spec;
        let ready = plugin
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
            .map_or("Unknown", |c| c.status.as_str());
        let mut cells = Vec::with_capacity(128);
        write_json(&mut cells, plugin.name());
        cells.push(b',');
        write_json(
            &mut cells,
            &format_args!("{}.{}", spec.api.resource, spec.api.group),
        );
        let instances = plugin.status.instances_summary();
        for cell in [&spec.implementation, &spec.version, ready, &instances] {
            cells.push(b',');
            write_json(&mut cells, cell);
        }
        let split = cells.len();
        write_json(&mut cells, &spec.address);
        Self {
            resource_version,
            json: json.into_boxed_slice(),
            metadata,
            cells: cells.into_boxed_slice(),
            split,
            created: plugin
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
            last_heartbeat: plugin.status.last_heartbeat_time.0,
        }
    }

    /// The typed object, parsed from the JSON.
    pub fn object(&self) -> Option<Plugin> {
        read_back(&self.json, "object")
    }

    /// The name and labels, for selectors, read from the JSON's `metadata`
    /// and borrowed from it: no more than a map node is allocated.
    pub fn head(&self) -> Option<Head<'_>> {
        serde_json::from_slice(self.metadata())
            .inspect_err(|error| tracing::error!(%error, "reading back a stored plugin's metadata"))
            .ok()
    }

    /// The registry's counter this version was stored at.
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// The whole object.
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// Its `metadata` value.
    pub fn metadata(&self) -> &[u8] {
        self.json.get(self.metadata.clone()).unwrap_or(b"{}")
    }

    /// The Table cells before the ages ("Name" to "Instances").
    pub fn cells_before_ages(&self) -> &[u8] {
        &self.cells[..self.split]
    }

    /// The Table cells after the ages ("Address").
    pub fn cells_after_ages(&self) -> &[u8] {
        &self.cells[self.split..]
    }

    /// When the object was created.
    pub fn created(&self) -> Timestamp {
        self.created
    }

    /// The version's `status.lastHeartbeatTime`.
    pub fn last_heartbeat(&self) -> Timestamp {
        self.last_heartbeat
    }
}

/// A stored version's name and labels (see [`Encoded::head`]).
#[derive(Debug, Deserialize)]
pub struct Head<'a> {
    #[serde(borrow, default)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default)]
    labels: BTreeMap<Cow<'a, str>, Cow<'a, str>>,
}

impl Head<'_> {
    /// The value of the label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(AsRef::as_ref)
    }
}

/// `json`, written by [`Encoded::new`], as a `T`. It always reads back (the
/// tests check); should it not, a bug, that is logged and the part counts
/// as absent.
fn read_back<T: serde::de::DeserializeOwned>(json: &[u8], part: &'static str) -> Option<T> {
    serde_json::from_slice(json)
        .inspect_err(|error| tracing::error!(%error, part, "reading back a stored plugin"))
        .ok()
}

/// serde_json only fails on maps with non-string keys and on types whose
/// `Serialize` reports errors; a Plugin has neither, so this never logs.
fn write_json(out: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    if let Err(error) = serde_json::to_writer(&mut *out, value) {
        tracing::error!(%error, "encoding a registry object");
        out.extend_from_slice(b"null");
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;
    use crate::v1alpha1::PluginStatus;

    #[test]
    fn the_parts_are_what_serde_writes() {
        let mut plugin = Plugin {
            api_version: crate::v1alpha1::API_VERSION.to_owned(),
            kind: Plugin::KIND.to_owned(),
            metadata: ObjectMeta {
                name: Some("pg \"quoted\"".to_owned()),
                resource_version: Some("7".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Default::default(),
            status: PluginStatus {
                conditions: Vec::new(),
                last_heartbeat_time: Time(Timestamp::UNIX_EPOCH),
                expires_at: Time(Timestamp::UNIX_EPOCH),
                registered_by: None,
                instances: Vec::new(),
            },
        };
        plugin.spec.address = "db:5432".to_owned();
        plugin.metadata.labels = Some([("tier".to_owned(), "\"gold\"".to_owned())].into());
        let encoded = Encoded::new(&plugin, 7);
        assert_eq!(encoded.json(), serde_json::to_vec(&plugin).expect("json"));
        assert_eq!(encoded.object(), Some(plugin.clone()));
        let head = encoded.head().expect("reads back");
        assert_eq!(head.name, "pg \"quoted\"");
        assert_eq!(head.label("tier"), Some("\"gold\""));
        assert_eq!(head.label("team"), None);
        assert_eq!(encoded.resource_version(), 7);
        assert_eq!(
            encoded.metadata(),
            serde_json::to_vec(&plugin.metadata).expect("json")
        );
        assert_eq!(
            encoded.cells_before_ages(),
            br#""pg \"quoted\"",".","","","Unknown","0/0""#
        );
        assert_eq!(encoded.cells_after_ages(), br#""db:5432""#);
    }
}
