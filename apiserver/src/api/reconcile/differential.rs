//! The one-pass decoder ([`super::decode`]) against what kplug did before
//! it: serde_json decoding into `Reconcile`, a second pass for unknown
//! field names and a third for each object's head. The decoder's tests and
//! the `reconcile_body` fuzz target both judge it with [`check`].

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::decode::{Request, request};
use super::scan::{Reason, SyntaxError};
use crate::v1alpha1::{Reconcile, ReconcileSpec};

/// Where the decoder and serde_json part ways, in words.
pub type Disagreement = String;

/// Decodes `body` both ways. Both accept: the same fields, unknown names,
/// object heads and object bytes. Both reject: the same message, position
/// included (invalid UTF-8 aside, which each reports where it looked).
/// Only the decoder rejects: one of the documented corners (a struct
/// written as an array; invalid UTF-8 in a value kplug ignores).
pub fn check(body: &[u8]) -> Result<(), Disagreement> {
    let text = String::from_utf8_lossy(body);
    let utf8 = std::str::from_utf8(body).is_ok();
    // Where the decoder is documented stricter, serde_json's verdict and
    // message (if any) do not bind it.
    let stricter = |ours: &SyntaxError| {
        ours.to_string()
            .starts_with("invalid type: sequence, expected struct")
            || (ours.reason == Reason::InvalidUnicode && !utf8)
    };
    match (request(body), serde_json::from_slice::<Reconcile>(body)) {
        (Ok(ours), Ok(theirs)) => same_as_serde(body, &ours, &theirs),
        (Err(ours), Err(theirs)) => {
            if utf8 && !stricter(&ours) && ours.to_string() != theirs.to_string() {
                return Err(format!("{text}: rejected as {ours:?}, serde: {theirs}"));
            }
            Ok(())
        }
        (Err(ours), Ok(_)) if stricter(&ours) => Ok(()),
        (Err(ours), Ok(_)) => Err(format!("{text}: rejected as {ours}, serde accepts it")),
        (Ok(_), Err(theirs)) => Err(format!("{text}: accepted, serde rejects it: {theirs}")),
    }
}

/// A body both accepted: the same fields, unknown names, object heads, and
/// each object's exact bytes.
pub(crate) fn same_as_serde(
    body: &[u8],
    ours: &Request<'_>,
    theirs: &Reconcile,
) -> Result<(), Disagreement> {
    let text = String::from_utf8_lossy(body);
    let differ = |what: &str| Err(format!("{text}: {what} differs from serde's"));
    let (spec, their_spec) = (&ours.spec, &theirs.spec);
    if ours.api_version != theirs.api_version
        || ours.kind != theirs.kind
        || ours.metadata != theirs.metadata
    {
        return differ("apiVersion, kind or metadata");
    }
    if spec.operation != their_spec.operation_name
        || spec.dry_run != their_spec.dry_run
        || spec.timeout_seconds != their_spec.timeout_seconds
        || spec.api != their_spec.api
        || spec.object_ref != their_spec.object_ref
        || spec.plugin != their_spec.plugin
        || spec.preferred_implementation != their_spec.preferred_implementation
        || spec.required_implementation != their_spec.required_implementation
        || spec.version_constraint != their_spec.version_constraint
    {
        return differ("a spec field");
    }
    let objects: Vec<_> = spec.object.iter().chain(&spec.extensions).collect();
    let their_objects: Vec<_> = their_spec
        .object
        .iter()
        .chain(&their_spec.extensions)
        .collect();
    if objects.len() != their_objects.len() {
        return differ("the number of objects");
    }
    for (object, theirs) in objects.into_iter().zip(their_objects) {
        if object.raw != theirs.get().as_bytes() {
            return differ("an object's bytes");
        }
        let head = object.head;
        if head.readable.then(|| {
            (
                head.api_version.map(|t| t.value().into_owned()),
                head.kind.map(|t| t.value().into_owned()),
                head.name.map(|t| t.value().into_owned()),
                head.namespace.map(|t| t.value().into_owned()),
            )
        }) != serde_head(object.raw)
        {
            return differ("an object's head");
        }
    }
    // The earlier pass buffered every field (serde's flatten), which meets
    // serde_json's depth limit where decoding did not: no verdict then.
    if let Some(theirs) = serde_unknown(body)
        && ours.unknown != theirs
    {
        return Err(format!(
            "{text}: unknown fields {:?}, serde's {theirs:?}",
            ours.unknown
        ));
    }
    Ok(())
}

/// The unknown field names the earlier second pass found, `None` where it
/// failed.
pub(crate) fn serde_unknown(body: &[u8]) -> Option<Vec<String>> {
    #[derive(Deserialize)]
    struct FieldNames {
        #[serde(default)]
        spec: BTreeMap<String, IgnoredAny>,
        #[serde(flatten)]
        top: BTreeMap<String, IgnoredAny>,
    }
    let names = serde_json::from_slice::<FieldNames>(body).ok()?;
    let top = names
        .top
        .into_keys()
        .filter(|k| !Reconcile::FIELDS.contains(&k.as_str()));
    let spec = names
        .spec
        .into_keys()
        .filter(|k| !ReconcileSpec::FIELDS.contains(&k.as_str()))
        .map(|k| format!("spec.{k}"));
    Some(top.chain(spec).collect())
}

/// The earlier third pass: an object's head (apiVersion, kind, name and
/// namespace, each when a non-empty string), or `None` when unreadable.
pub(crate) fn serde_head(raw: &[u8]) -> Option<SerdeHead> {
    #[derive(Deserialize)]
    struct ObjectHead {
        #[serde(rename = "apiVersion")]
        api_version: Option<String>,
        kind: Option<String>,
        #[serde(default)]
        metadata: HeadMetadata,
    }
    #[derive(Default, Deserialize)]
    struct HeadMetadata {
        name: Option<String>,
        namespace: Option<String>,
    }
    let head = serde_json::from_slice::<ObjectHead>(raw).ok()?;
    let present = |v: Option<String>| v.filter(|s| !s.is_empty());
    Some((
        present(head.api_version),
        present(head.kind),
        present(head.metadata.name),
        present(head.metadata.namespace),
    ))
}

/// apiVersion, kind, name and namespace.
pub(crate) type SerdeHead = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);
