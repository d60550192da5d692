//! The wire forms of one stored object version, made once when the registry
//! stores it: lists, tables and watches then copy these bytes instead of
//! serializing every object for every request.

use std::ops::Range;

use jiff::Timestamp;

use crate::v1alpha1::{CONDITION_READY, Plugin};

/// A plugin version as JSON, with the parts of it that responses reuse.
#[derive(Debug)]
pub struct Encoded {
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
}

impl Encoded {
    pub fn new(plugin: &Plugin) -> Self {
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
            json: json.into_boxed_slice(),
            metadata,
            cells: cells.into_boxed_slice(),
            split,
            created: plugin
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        }
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
        let encoded = Encoded::new(&plugin);
        assert_eq!(encoded.json(), serde_json::to_vec(&plugin).expect("json"));
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
