//! The wire forms of one stored object version, made once when the registry
//! stores it: lists, tables and watches then copy these bytes (and
//! decompress its spec and status) instead of serializing every object for
//! every request.
//!
//! They are also the only form the registry keeps: the typed object is
//! parsed back from the JSON when a request needs it (a pinned selection,
//! a selector, a departed plugin's addresses). At 10,000 plugins the typed
//! objects and their strings were 2 KB a plugin beside 1.3 KB of JSON.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::LazyLock;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::Deserialize;

use crate::v1alpha1::{
    CONDITION_CANARY, CONDITION_READY, ExtensionKind, Plugin, PluginApi, PluginInstance,
    PluginSpec, PluginStatus, Protocol,
};

/// What precedes `metadata` in every stored object: the registry renders
/// each with this kplug's apiVersion and kind (the tests hold this to what
/// serde writes for them).
const OBJECT_HEAD: &[u8] =
    br#"{"apiVersion":"plugins.kplug.io/v1alpha1","kind":"Plugin","metadata":"#;

/// A plugin version as JSON, with the parts of it that responses reuse.
///
/// What follows `metadata` (`spec` and `status`, two thirds of the object)
/// is kept as an LZ4 block against a dictionary of a typical plugin's
/// `spec` and `status`: the keys and kplug's own words, which every object
/// repeats, take a few bytes each. The load bench's plugin's spec and status
/// take about a quarter of their JSON so, read back in a fraction of a
/// microsecond (BENCHMARKS.md, "kplug's memory at 10,000 plugins").
/// `metadata` and the Table cells, which selectors and `kubectl get` read
/// on every object of a list, stay as they are.
#[derive(Debug)]
pub struct Encoded {
    /// The registry's counter this version was stored at.
    resource_version: u64,
    /// `metadata` exactly as `serde_json::to_vec` writes it, then the Table
    /// cells that do not depend on the time of the request, as JSON array
    /// elements: `"Name","API","Implementation","Version","Ready",
    /// "Instances"`, then (from `split`) `"Address"`. The two ages go
    /// between them (see `api::table`, whose column definitions this order
    /// follows).
    plain: Box<[u8]>,
    /// Where `metadata` ends in `plain`, and the cells begin.
    metadata_end: usize,
    split: usize,
    /// The rest of the object.
    body: Body,
    /// `metadata.creationTimestamp`, for the Age cell.
    created: Timestamp,
    /// `status.lastHeartbeatTime`, for the Last Heartbeat cell of a plugin
    /// that is gone.
    last_heartbeat: Timestamp,
}

/// What follows `metadata` in a stored version, `,"spec":...,"status":...}`,
/// as an LZ4 block against [`DICTIONARY`]: most of the cost of storing a
/// version, and independent of its resourceVersion, so that a registration
/// makes it before it takes the registry's lock.
#[derive(Debug)]
pub struct Body {
    lz4: Box<[u8]>,
    /// Its length as JSON.
    len: usize,
}

impl Body {
    /// `plugin`'s `spec` and `status`.
    pub fn new(plugin: &Plugin) -> Self {
        let json = write_body(&plugin.spec, &plugin.status);
        Self {
            lz4: lz4_flex::block::compress_with_dict(&json, &DICTIONARY).into_boxed_slice(),
            len: json.len(),
        }
    }

    /// Appends the JSON to `out`; `false` if it did not read back (see
    /// [`Encoded::write_json`]).
    fn write(&self, out: &mut Vec<u8>) -> bool {
        let start = out.len();
        out.resize(start + self.len, 0);
        let read = out
            .get_mut(start..)
            .map(|json| lz4_flex::block::decompress_into_with_dict(&self.lz4, json, &DICTIONARY));
        if matches!(read, Some(Ok(n)) if n == self.len) {
            return true;
        }
        tracing::error!(?read, "reading back a stored plugin's spec and status");
        out.truncate(start);
        false
    }
}

impl Encoded {
    /// `plugin` as stored at `resource_version`. Its `apiVersion` and
    /// `kind` are taken to be the resource's, as the registry renders them.
    pub fn new(plugin: &Plugin, resource_version: u64) -> Self {
        Self::with_body(plugin, resource_version, Body::new(plugin))
    }

    /// As [`Encoded::new`], with `plugin`'s [`Body`] made beforehand.
    pub fn with_body(plugin: &Plugin, resource_version: u64, body: Body) -> Self {
        // The object is written part by part, as its derived `Serialize`
        // writes it (the tests compare the two), so that `metadata` and the
        // body can be kept apart without a second serialization.
        let mut plain = Vec::with_capacity(512);
        write_json(&mut plain, &plugin.metadata);
        let metadata_end = plain.len();
        let spec = &plugin.spec;
        let ready = plugin
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
            .map_or("Unknown", |c| c.status.as_str());
        write_json(&mut plain, plugin.name());
        plain.push(b',');
        write_json(
            &mut plain,
            &format_args!("{}.{}", spec.api.resource, spec.api.group),
        );
        let instances = plugin.status.instances_summary();
        for cell in [&spec.implementation, &spec.version, ready, &instances] {
            plain.push(b',');
            write_json(&mut plain, cell);
        }
        let split = plain.len();
        write_json(&mut plain, &spec.address);
        Self {
            resource_version,
            plain: plain.into_boxed_slice(),
            metadata_end,
            split,
            body,
            created: plugin
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
            last_heartbeat: plugin.status.last_heartbeat_time.0,
        }
    }

    /// The length of the whole object as JSON.
    pub fn json_len(&self) -> usize {
        OBJECT_HEAD.len() + self.metadata_end + self.body.len
    }

    /// Appends the whole object, as JSON, to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.reserve(self.json_len());
        out.extend_from_slice(OBJECT_HEAD);
        out.extend_from_slice(self.metadata());
        if !self.body.write(out) {
            // A block this process compressed, read into a buffer of its
            // exact length, always reads back (the tests check); should it
            // not, a bug, that is logged, and the object ends after its
            // metadata so that the response stays JSON.
            out.push(b'}');
        }
    }

    /// The whole object, as JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let mut json = Vec::new();
        self.write_json(&mut json);
        json
    }

    /// The typed object, parsed from the JSON.
    pub fn object(&self) -> Option<Plugin> {
        read_back(&self.to_json(), "object")
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

    /// Its `metadata` value.
    pub fn metadata(&self) -> &[u8] {
        &self.plain[..self.metadata_end]
    }

    /// The Table cells before the ages ("Name" to "Instances").
    pub fn cells_before_ages(&self) -> &[u8] {
        &self.plain[self.metadata_end..self.split]
    }

    /// The Table cells after the ages ("Address").
    pub fn cells_after_ages(&self) -> &[u8] {
        &self.plain[self.split..]
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

/// What follows `metadata` in the object: `,"spec":...,"status":...}`.
fn write_body(spec: &PluginSpec, status: &PluginStatus) -> Vec<u8> {
    let mut body = Vec::with_capacity(1024);
    body.extend_from_slice(br#","spec":"#);
    write_json(&mut body, spec);
    body.extend_from_slice(br#","status":"#);
    write_json(&mut body, status);
    body.push(b'}');
    body
}

/// The body of a typical plugin, with every field kplug writes: the
/// dictionary that stored bodies are compressed against. Any body reads
/// back whatever it holds; the closer a plugin's to it, the fewer bytes it
/// takes. The dictionary lives as long as the process, which is as long as
/// the stored bodies do, so a later kplug may change it freely.
static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let at = Time(Timestamp::constant(1_798_761_600, 0)); // 2027-01-01
    let condition = |type_: &str, reason: &str, message: &str| Condition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: at.clone(),
        observed_generation: None,
    };
    let instance = |name: &str, canary_weight, shadow_percent| PluginInstance {
        name: name.to_owned(),
        address: "10.244.0.10:50051".to_owned(),
        server_name: "widgets.plugins.svc".to_owned(),
        version: "1.0.0".to_owned(),
        ready: true,
        draining: false,
        last_heartbeat_time: at.clone(),
        canary_weight,
        shadow_percent,
    };
    let spec = PluginSpec {
        api: PluginApi {
            group: "example.com".to_owned(),
            resource: "widgets".to_owned(),
            version: "v1alpha1".to_owned(),
        },
        implementation: "default".to_owned(),
        version: "1.0.0".to_owned(),
        address: "widgets.plugins.svc.cluster.local:50051".to_owned(),
        extensions: vec![ExtensionKind {
            group: "example.com".to_owned(),
            version: "v1alpha1".to_owned(),
            kind: "WidgetExtension".to_owned(),
        }],
        heartbeat_interval_seconds: 10,
        protocol: Protocol {
            version: "v1alpha1".to_owned(),
            sdk: "kplug-sdk-rust/0.1.0 kplug-sdk-python/0.1.0".to_owned(),
            capabilities: vec!["Reconcile".to_owned(), "Finalize".to_owned()],
        },
    };
    let status = PluginStatus {
        conditions: vec![
            condition(
                CONDITION_READY,
                "HeartbeatReceived",
                "the plugin is heartbeating",
            ),
            condition(
                CONDITION_CANARY,
                "Serving",
                "canary 1.1.0 takes 10% of the objects",
            ),
        ],
        last_heartbeat_time: at.clone(),
        expires_at: at.clone(),
        registered_by: Some("system:serviceaccount:plugins:widgets".to_owned()),
        instances: vec![
            instance("widgets-5d8f7c9b6d-x2x9k", 0, 0),
            instance("widgets-canary-7c9b6d5d8f-k9x2x", 10, 100),
        ],
    };
    write_body(&spec, &status)
});

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
        assert_eq!(
            encoded.to_json(),
            serde_json::to_vec(&plugin).expect("json")
        );
        assert_eq!(encoded.json_len(), encoded.to_json().len());
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

    /// The load bench's plugin as kplug served it (`GET`): unlike the
    /// dictionary's in every value.
    const SERVED: &str = r#"{"apiVersion":"plugins.kplug.io/v1alpha1","kind":"Plugin","metadata":{"creationTimestamp":"2026-11-30T03:40:21Z","labels":{"kplug.io/api":"databasetables.databases.bench.kplug.io","kplug.io/implementation":"postgresql","team":"team-1","tier":"gold"},"name":"bench-plugin-00001","resourceVersion":"5ce3a9fc.1","uid":"599b0f1c-58c9-4c93-b949-f385d8ae9526"},"spec":{"api":{"group":"databases.bench.kplug.io","resource":"databasetables","version":"v1alpha1"},"implementation":"PostgreSQL","version":"1.4.2","address":"plugin-00001.bench.invalid:50051","extensions":[{"group":"backups.bench.kplug.io","kind":"Backup"}],"heartbeatIntervalSeconds":300,"protocol":{"version":"v1alpha1","sdk":"kplug-bench/0.1.0","capabilities":["Reconcile","Finalize"]}},"status":{"conditions":[{"lastTransitionTime":"2026-11-30T03:40:21Z","message":"the plugin is heartbeating","reason":"HeartbeatReceived","status":"True","type":"Ready"}],"lastHeartbeatTime":"2026-11-30T03:40:21Z","expiresAt":"2026-11-30T03:55:21Z","instances":[{"name":"plugin-00001.bench.invalid:50051","address":"plugin-00001.bench.invalid:50051","version":"1.4.2","ready":true,"draining":false,"lastHeartbeatTime":"2026-11-30T03:40:21Z"}]}}"#;

    #[test]
    fn a_typical_body_is_kept_in_a_fraction_of_its_json() {
        let plugin: Plugin = serde_json::from_str(SERVED).expect("a Plugin");
        let encoded = Encoded::new(&plugin, 2);
        assert_eq!(encoded.to_json(), SERVED.as_bytes());
        assert!(
            encoded.body.lz4.len() * 3 < encoded.body.len,
            "{} bytes kept for a body of {}",
            encoded.body.lz4.len(),
            encoded.body.len
        );
    }

    #[test]
    fn any_body_reads_back() {
        let mut plugin: Plugin = serde_json::from_str(SERVED).expect("a Plugin");
        // Nothing like the dictionary, and beyond LZ4's 64 KiB window.
        plugin.status.conditions[0].message = "é\"\\\n\u{1F600}".repeat(10_000);
        let template = plugin.status.instances[0].clone();
        plugin.status.instances = (0..64)
            .map(|i| PluginInstance {
                name: format!("instance-{i}"),
                canary_weight: i,
                ..template.clone()
            })
            .collect();
        let encoded = Encoded::new(&plugin, 3);
        let json = encoded.to_json();
        assert_eq!(json, serde_json::to_vec(&plugin).expect("json"));
        assert_eq!(encoded.json_len(), json.len());
        assert_eq!(encoded.object(), Some(plugin));
        let mut after = b"[1,".to_vec();
        encoded.write_json(&mut after);
        assert_eq!(after[..3], *b"[1,", "appends to what is there");
        assert_eq!(after[3..], json);
    }
}
