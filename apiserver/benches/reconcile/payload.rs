//! The objects reconciled: realistic custom resources of exact sizes.

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use serde_json::{Value, json};

use crate::OBJECT_NAME;

/// The objects reconciled.
pub struct PayloadSpec {
    pub label: &'static str,
    /// Size of the object's JSON, exactly.
    bytes: usize,
    /// Timed reconciles per throughput run.
    throughput_reconciles: usize,
}

pub const PAYLOADS: [PayloadSpec; 2] = [
    PayloadSpec {
        label: "1 KiB",
        bytes: 1 << 10,
        throughput_reconciles: 40_000,
    },
    PayloadSpec {
        label: "64 KiB",
        bytes: 64 << 10,
        throughput_reconciles: 5_000,
    },
];

/// One object, ready to send both ways.
pub struct Payload {
    pub label: &'static str,
    pub throughput_reconciles: usize,
    /// The object's JSON: the plugin's `object` bytes.
    pub object: Vec<u8>,
    /// The Reconcile sent to kplug, with exactly those bytes as `spec.object`.
    pub body: Bytes,
}

impl Payload {
    pub fn new(spec: &PayloadSpec) -> Result<Self> {
        let object = object_of_size(spec.bytes)?;
        let mut body =
            br#"{"apiVersion":"plugins.kplug.io/v1alpha1","kind":"Reconcile","spec":{"object":"#
                .to_vec();
        body.extend_from_slice(&object);
        body.extend_from_slice(b"}}");
        Ok(Self {
            label: spec.label,
            throughput_reconciles: spec.throughput_reconciles,
            object,
            body: Bytes::from(body),
        })
    }
}

/// A custom resource whose compact JSON is exactly `bytes` long: realistic
/// metadata, and a `spec` of list entries padded to size. Compact, with
/// sorted keys, so the plugin gets these very bytes through kplug too,
/// whether kplug passes the object on as received or re-encodes it.
fn object_of_size(bytes: usize) -> Result<Vec<u8>> {
    let mut object = json!({
        "apiVersion": "example.com/v1",
        "kind": "Greeting",
        "metadata": {
            "name": OBJECT_NAME,
            "namespace": "default",
            "uid": "6f1c2a3e-8d4b-4f7a-9c1e-2b3d4e5f6a7b",
            "resourceVersion": "184467",
            "generation": 3,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "app.kubernetes.io/name": "greeter",
                "app.kubernetes.io/part-of": "kplug-bench",
            },
            "annotations": {"kplug.io/owner": "team-a"},
        },
        "spec": {"greeting": "hello", "replicas": 3, "entries": [], "padding": ""},
    });
    let length = |object: &Value| serde_json::to_vec(object).map_or(0, |json| json.len());
    ensure!(
        length(&object) <= bytes,
        "the bare object is over {bytes} bytes"
    );
    for index in 0.. {
        let entry = json!({
            "name": format!("entry-{index:05}"),
            "value": format!("{index:032x}"),
            "weight": index % 100,
        });
        let entries = object["spec"]["entries"]
            .as_array_mut()
            .context("spec.entries")?;
        entries.push(entry);
        if length(&object) > bytes {
            object["spec"]["entries"]
                .as_array_mut()
                .context("spec.entries")?
                .pop();
            break;
        }
    }
    let missing = bytes - length(&object);
    object["spec"]["padding"] = Value::String("p".repeat(missing));
    let json = serde_json::to_vec(&object)?;
    ensure!(json.len() == bytes, "the object is not {bytes} bytes");
    Ok(json)
}
