//! List bodies, a `PluginList` or a Table, assembled from the registry's
//! cached bytes of each object ([`crate::registry::Encoded`]) and streamed.

use std::vec;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;

use super::response::BodyWriter;
use super::table::TableWriter;
use crate::registry::Row;
use crate::v1alpha1::{API_VERSION, Plugin};

/// How each item is written.
enum Items {
    Json,
    Table(TableWriter),
}

/// The body of a list: the head (everything before the first item), the
/// items separated by commas, then the tail.
pub struct ListWriter {
    head: Option<Vec<u8>>,
    items: vec::IntoIter<Row>,
    first: bool,
    tail: &'static [u8],
    format: Items,
}

impl ListWriter {
    /// A `PluginList` of `items`: what serde writes for the list type.
    pub fn json(metadata: &ListMeta, items: Vec<Row>) -> Result<Self, serde_json::Error> {
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(br#"{"apiVersion":""#);
        head.extend_from_slice(API_VERSION.as_bytes());
        head.extend_from_slice(br#"","kind":""#);
        head.extend_from_slice(Plugin::LIST_KIND.as_bytes());
        head.extend_from_slice(br#"","metadata":"#);
        serde_json::to_writer(&mut head, metadata)?;
        head.extend_from_slice(br#","items":["#);
        Ok(Self::new(head, items, b"]}", Items::Json))
    }

    /// A Table of `items`, one row each.
    pub fn table(
        writer: TableWriter,
        metadata: &ListMeta,
        items: Vec<Row>,
    ) -> Result<Self, serde_json::Error> {
        let head = writer.head(metadata)?;
        Ok(Self::new(
            head,
            items,
            TableWriter::TAIL,
            Items::Table(writer),
        ))
    }

    fn new(head: Vec<u8>, items: Vec<Row>, tail: &'static [u8], format: Items) -> Self {
        Self {
            head: Some(head),
            items: items.into_iter(),
            first: true,
            tail,
            format,
        }
    }
}

impl BodyWriter for ListWriter {
    fn write_next(&mut self, out: &mut Vec<u8>) -> bool {
        if let Some(head) = self.head.take() {
            out.extend_from_slice(&head);
            return true;
        }
        let Some(item) = self.items.next() else {
            out.extend_from_slice(self.tail);
            return false;
        };
        if !std::mem::take(&mut self.first) {
            out.push(b',');
        }
        match &self.format {
            Items::Json => item.encoded.write_json(out),
            Items::Table(table) => table.row(out, &item.encoded, item.last_seen),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    //! The assembled bytes against what serde writes for the same list, as
    //! the server wrote it before lists were assembled from cached bytes.

    use std::time::Duration;

    use jiff::{SignedDuration, Timestamp};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
    use serde::Serialize;

    use super::*;
    use crate::api::negotiate::TableVersion;
    use crate::api::response::{CHUNK_BYTES, written_response};
    use crate::api::table::{COLUMNS, ColumnDefinition};
    use crate::api::table::{IncludeObject, human_duration};
    use crate::registry::{Declaration, Encoded, Registry, RegistryConfig};
    use crate::v1alpha1::{PluginApi, Protocol};

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct PluginList<'a> {
        api_version: &'static str,
        kind: &'static str,
        metadata: ListMeta,
        items: Vec<&'a Plugin>,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct PartialObjectMetadata<'a> {
        kind: &'static str,
        api_version: &'static str,
        metadata: &'a ObjectMeta,
    }

    #[derive(Serialize)]
    #[serde(untagged)]
    enum RowObject<'a> {
        Metadata(PartialObjectMetadata<'a>),
        Object(&'a Plugin),
    }

    #[derive(Serialize)]
    struct RefRow<'a> {
        cells: [String; 9],
        #[serde(skip_serializing_if = "Option::is_none")]
        object: Option<RowObject<'a>>,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Table<'a> {
        kind: &'static str,
        api_version: &'static str,
        metadata: ListMeta,
        column_definitions: &'static [ColumnDefinition],
        rows: Vec<RefRow<'a>>,
    }

    fn cells(plugin: &Plugin, last_seen: Timestamp, now: Timestamp) -> [String; 9] {
        let spec = &plugin.spec;
        let created = plugin
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0);
        let ready = plugin
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == crate::v1alpha1::CONDITION_READY)
            .map_or("Unknown", |c| c.status.as_str());
        [
            plugin.name().to_owned(),
            spec.api.qualified_resource(),
            spec.implementation.clone(),
            spec.version.clone(),
            ready.to_owned(),
            plugin.status.instances_summary(),
            human_duration(now.duration_since(last_seen).as_secs()),
            human_duration(now.duration_since(created).as_secs()),
            spec.address.clone(),
        ]
    }

    fn t0() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// A registry of `count` plugins with labels, extensions and text that
    /// JSON must escape, one of them late (not Ready).
    fn registry(count: usize) -> Registry {
        let registry = Registry::new(RegistryConfig::default());
        for i in 0..count {
            let declaration = Declaration {
                name: format!("plugin-{i:04}"),
                instance: String::new(),
                draining: false,
                version: format!("1.{i}.0"),
                api: PluginApi {
                    group: "databases.example.org".to_owned(),
                    resource: "databasetables".to_owned(),
                    version: "v1alpha1".to_owned(),
                },
                implementation: "Postgre\"SQL\" \u{e9}\n".to_owned(),
                address: format!("plugin-{i}.example:50051"),
                server_name: String::new(),
                canary_weight: 0,
                shadow_percent: 0,
                extensions: vec![crate::v1alpha1::ExtensionKind {
                    group: "backups.example.org".to_owned(),
                    version: String::new(),
                    kind: "Backup".to_owned(),
                }],
                labels: [("team".to_owned(), format!("team-{}", i % 3))]
                    .into_iter()
                    .collect(),
                interval: Duration::from_secs(10),
                protocol: Protocol {
                    version: "v1alpha1".to_owned(),
                    sdk: "test".to_owned(),
                    capabilities: vec!["Reconcile".to_owned()],
                },
                registered_by: (i % 2 == 0).then(|| "system:admin".to_owned()),
            };
            let at = t0() + SignedDuration::from_secs(i as i64);
            registry.heartbeat(declaration, at).expect("accepted");
        }
        // The sweep marks the earliest plugins late.
        registry.sweep(t0() + SignedDuration::from_secs(21));
        registry
    }

    fn metadata(paged: bool) -> ListMeta {
        ListMeta {
            resource_version: Some("42".to_owned()),
            continue_: paged.then(|| "eyJydiI6NDJ9".to_owned()),
            remaining_item_count: paged.then_some(7),
            ..ListMeta::default()
        }
    }

    /// Every plugin's row, and its typed object as the registry reads it back.
    fn rows(
        registry: &Registry,
        filter: impl Fn(&str, &Encoded) -> bool,
    ) -> (Vec<Row>, Vec<Plugin>) {
        let rows = registry.page(None, usize::MAX, filter).rows;
        let objects = rows
            .iter()
            .map(|row| row.encoded.object().expect("reads back"))
            .collect();
        (rows, objects)
    }

    fn drain(mut writer: ListWriter) -> Vec<u8> {
        let mut out = Vec::new();
        while writer.write_next(&mut out) {}
        out
    }

    #[test]
    fn json_lists_are_what_serde_writes() {
        for count in [0, 1, 5] {
            for paged in [false, true] {
                let registry = registry(count);
                let (rows, objects) = rows(&registry, |_, _| true);
                let expected = serde_json::to_vec(&PluginList {
                    api_version: API_VERSION,
                    kind: Plugin::LIST_KIND,
                    metadata: metadata(paged),
                    items: objects.iter().collect(),
                })
                .expect("json");
                let written = drain(ListWriter::json(&metadata(paged), rows).expect("head"));
                assert_eq!(
                    String::from_utf8_lossy(&written),
                    String::from_utf8_lossy(&expected),
                    "{count} plugins, paged: {paged}"
                );
            }
        }
    }

    #[test]
    fn tables_are_what_serde_writes() {
        let now = t0() + SignedDuration::from_secs(3 * 3600 + 61);
        let includes = [
            IncludeObject::None,
            IncludeObject::Metadata,
            IncludeObject::Object,
        ];
        for version in [TableVersion::V1, TableVersion::V1beta1] {
            for include in includes {
                for count in [0, 1, 5] {
                    let registry = registry(count);
                    let (rows, objects) = rows(&registry, |_, _| true);
                    let expected_rows = rows
                        .iter()
                        .zip(&objects)
                        .map(|(row, object)| RefRow {
                            cells: cells(object, row.last_seen, now),
                            object: match include {
                                IncludeObject::None => None,
                                IncludeObject::Metadata => {
                                    Some(RowObject::Metadata(PartialObjectMetadata {
                                        kind: "PartialObjectMetadata",
                                        api_version: version.api_version(),
                                        metadata: &object.metadata,
                                    }))
                                }
                                IncludeObject::Object => Some(RowObject::Object(object)),
                            },
                        })
                        .collect();
                    let expected = serde_json::to_vec(&Table {
                        kind: "Table",
                        api_version: version.api_version(),
                        metadata: metadata(count == 5),
                        column_definitions: &COLUMNS,
                        rows: expected_rows,
                    })
                    .expect("json");
                    let writer = TableWriter::new(version, include, now);
                    if let [row] = &rows[..] {
                        let mut single = Vec::new();
                        writer
                            .single(&mut single, &metadata(false), &row.encoded, row.last_seen)
                            .expect("single");
                        assert_eq!(single, expected, "{version:?} {include:?} single");
                    }
                    let written = drain(
                        ListWriter::table(writer, &metadata(count == 5), rows).expect("head"),
                    );
                    assert_eq!(
                        String::from_utf8_lossy(&written),
                        String::from_utf8_lossy(&expected),
                        "{version:?} {include:?} {count} plugins"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn large_lists_stream_in_pieces_that_add_up_to_the_whole() {
        use axum::body::HttpBody as _;
        use http_body_util::BodyExt as _;

        let registry = registry(400);
        let all = || registry.page(None, usize::MAX, |_, _| true).rows;
        let whole = drain(ListWriter::json(&metadata(false), all()).expect("head"));
        assert!(whole.len() > 3 * CHUNK_BYTES, "{} bytes", whole.len());
        let response = written_response(
            ListWriter::json(&metadata(false), all()).expect("head"),
            "application/json",
        );
        let mut body = response.into_body();
        assert_eq!(body.size_hint().exact(), None, "streamed");
        let mut pieces = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.expect("a frame").into_data().expect("data");
            pieces.push(data);
        }
        assert!(pieces.len() > 3, "{} pieces", pieces.len());
        assert!(
            pieces.iter().all(|p| p.len() < 2 * CHUNK_BYTES),
            "pieces are bounded"
        );
        assert_eq!(pieces.concat(), whole);

        let (small, _) = rows(&registry, |name, _| name == "plugin-0001");
        let response = written_response(
            ListWriter::json(&metadata(false), small).expect("head"),
            "application/json",
        );
        assert!(
            response.into_body().size_hint().exact().is_some(),
            "sent whole"
        );
    }
}
