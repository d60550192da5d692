//! The W3C trace context of a reconcile. Every delegation carries a
//! `traceparent` header to kplug, which passes it on to the plugin, so the
//! operator's, kplug's and the plugin's log lines of one reconcile share a
//! trace id.
//!
//! The trace is new for each reconcile, unless the object carries the
//! annotation `kplug.io/traceparent` with a valid W3C `traceparent`
//! (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`): then the
//! reconcile continues that trace, as a child span of it. Whoever changes
//! the object (a CI pipeline, a GitOps controller) can so follow its change
//! through the operator, kplug and the plugin. The annotation stays on the
//! object: every later reconcile of it (resyncs, retries) joins the same
//! trace until the annotation changes or goes. An invalid value is logged
//! and ignored.

use kplug_proto::trace::TraceParent;
use kube::ResourceExt;
use kube::api::DynamicObject;

/// The annotation whose `traceparent` a reconcile continues.
pub const TRACEPARENT_ANNOTATION: &str = "kplug.io/traceparent";

/// The trace context to send for a reconcile of `object`.
pub fn for_object(object: &DynamicObject) -> TraceParent {
    let Some(value) = object.annotations().get(TRACEPARENT_ANNOTATION) else {
        return TraceParent::new_root();
    };
    match value.parse::<TraceParent>() {
        Ok(parent) => parent.child(),
        Err(error) => {
            tracing::warn!(
                object = %object.name_any(), annotation = TRACEPARENT_ANNOTATION, %value, %error,
                "ignoring an invalid trace context: starting a new trace"
            );
            TraceParent::new_root()
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::api::{ApiResource, GroupVersionKind};

    use super::*;

    fn object(annotation: Option<&str>) -> DynamicObject {
        let resource =
            ApiResource::from_gvk(&GroupVersionKind::gvk("test.kplug.io", "v1", "Widget"));
        let mut object = DynamicObject::new("w", &resource);
        if let Some(value) = annotation {
            object
                .annotations_mut()
                .insert(TRACEPARENT_ANNOTATION.to_owned(), value.to_owned());
        }
        object
    }

    #[test]
    fn an_annotated_trace_is_continued_else_a_new_one_starts() {
        let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let continued = for_object(&object(Some(given)));
        assert_eq!(continued.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(
            continued.parent_id(),
            "00f067aa0ba902b7",
            "a span of its own"
        );
        let fresh = [
            for_object(&object(None)),
            for_object(&object(Some("00-nothex-00f067aa0ba902b7-01"))),
        ];
        for trace in fresh {
            assert_ne!(trace.trace_id(), continued.trace_id());
            assert!(trace.sampled());
        }
        assert_ne!(fresh[0].trace_id(), fresh[1].trace_id());
    }
}
