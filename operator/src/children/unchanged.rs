//! Whether a child already is what applying it would make it, so that the
//! operator leaves it alone: a parent's reconciles (its children's own
//! watch events wake it once each) then cost one apply per child, not one
//! per child per reconcile.
//!
//! Two checks, both needed. The [`APPLIED_ANNOTATION`] on the child is the
//! digest of the body last applied: a body that changed, a field the plugin
//! dropped included (which only an apply removes), has another digest.
//! And every field of the body still has its value on the live object: a
//! field someone else changed or removed since is applied again (and, when
//! another manager owns it, reported as drift).

use ring::digest::{SHA256, digest};
use serde_json::Value;

/// The child's annotation holding the digest of the body last applied.
pub const APPLIED_ANNOTATION: &str = "plugins.kplug.io/applied";

/// The digest of `body` (before [`APPLIED_ANNOTATION`] is added to it): the
/// first 16 bytes of its SHA-256, in hex.
pub fn applied_digest(body: &Value) -> String {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    digest(&SHA256, &bytes).as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether applying `body` (with its [`APPLIED_ANNOTATION`]) to `live`
/// would change nothing: `live` carries the same digest and holds every
/// field of `body` with its value.
pub fn unchanged(body: &Value, live: &Value) -> bool {
    let digest_of = |object: &Value| object["metadata"]["annotations"][APPLIED_ANNOTATION].clone();
    digest_of(body).is_string() && digest_of(body) == digest_of(live) && holds(body, live)
}

/// Whether `live` has every field of `desired` with its value: objects key
/// by key, lists of one length item by item (what the server adds to an
/// item, such as a port's protocol, is allowed), anything else equal.
fn holds(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(want), Value::Object(have)) => want
            .iter()
            .all(|(key, value)| have.get(key).is_some_and(|live| holds(value, live))),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| holds(w, h))
        }
        (want, have) => want == have,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn annotated(mut body: Value) -> Value {
        let digest = applied_digest(&body);
        body["metadata"]["annotations"][APPLIED_ANNOTATION] = json!(digest);
        body
    }

    #[test]
    fn a_child_as_last_applied_is_unchanged_whatever_the_server_added() {
        let body = annotated(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "annotations": {}},
            "spec": {"ports": [{"port": 80}]},
        }));
        let mut live = body.clone();
        live["metadata"]["uid"] = json!("u-1");
        live["spec"]["ports"][0]["protocol"] = json!("TCP");
        live["spec"]["clusterIP"] = json!("10.0.0.1");
        assert!(unchanged(&body, &live));
    }

    #[test]
    fn a_new_body_a_changed_field_or_a_missing_digest_is_applied() {
        let body = annotated(json!({
            "kind": "ConfigMap", "metadata": {"name": "pages", "annotations": {}},
            "data": {"index.html": "one", "old.html": "gone soon"},
        }));
        let mut dropped = body.clone();
        dropped["data"]
            .as_object_mut()
            .expect("data")
            .remove("old.html");
        let dropped = annotated({
            let mut plain = dropped;
            plain["metadata"]["annotations"] = json!({});
            plain
        });
        assert!(
            !unchanged(&dropped, &body),
            "a dropped field: another digest, so the apply removes it"
        );
        let mut edited = body.clone();
        edited["data"]["index.html"] = json!("edited by hand");
        assert!(!unchanged(&body, &edited));
        let mut removed = body.clone();
        removed["data"]
            .as_object_mut()
            .expect("data")
            .remove("index.html");
        assert!(!unchanged(&body, &removed));
        let mut never_applied = body.clone();
        never_applied["metadata"]["annotations"] = json!({});
        assert!(!unchanged(&body, &never_applied));
        let mut shorter =
            annotated(json!({"kind": "X", "metadata": {"annotations": {}}, "l": [1, 2]}));
        let live = shorter.clone();
        shorter["l"] = json!([1]);
        assert!(!unchanged(&shorter, &live));
    }
}
