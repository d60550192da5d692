//! Entry points of the fuzz targets in `fuzz/` (the `fuzzing` feature):
//! each takes arbitrary bytes, runs one of kplug's parsers of untrusted
//! input, and panics where the parser breaks a promise: a panic of its own,
//! a disagreement with serde_json, a round trip that changes the value, an
//! error that is not a Kubernetes one.

use axum::extract::Query;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use kplug_proto::v1alpha1::HeartbeatRequest;
use prost::Message;

use crate::api::negotiate;
use crate::api::options::{ListOptions, ListQuery, encode_continue};
use crate::api::reconcile::differential;
use crate::api::selector::{FieldSelector, LabelSelector};
use crate::api::status::ApiError;
use crate::heartbeat::validate::{self, Invalid};
use crate::registry::{Registry, RegistryConfig};

/// The reconcile body decoder accepts and rejects as serde_json does, with
/// the same values and messages ([`differential::check`]).
pub fn reconcile_body(data: &[u8]) {
    if let Err(disagreement) = differential::check(data) {
        panic!("{disagreement}");
    }
}

/// A selector that parses prints in a form that parses back the same.
pub fn selectors(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(selector) = LabelSelector::parse(text) {
        let printed = selector.to_string();
        match LabelSelector::parse(&printed) {
            Ok(again) => assert_eq!(again, selector, "{text:?} printed as {printed:?}"),
            Err(e) => panic!("{text:?} printed as {printed:?}, which does not parse: {e}"),
        }
    }
    if let Ok(selector) = FieldSelector::parse(text) {
        let printed = selector.to_string();
        match FieldSelector::parse(&printed) {
            Ok(again) => assert_eq!(again.to_string(), printed, "{text:?}"),
            Err(e) => panic!("{text:?} printed as {printed:?}, which does not parse: {e}"),
        }
    }
}

/// Any Accept header gets a representation or a 406.
pub fn accept(data: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::ACCEPT, value);
    for refused in [
        negotiate::representation(&headers).err(),
        negotiate::discovery_format(&headers).err(),
    ]
    .into_iter()
    .flatten()
    {
        assert_eq!(refused.code(), StatusCode::NOT_ACCEPTABLE, "{data:?}");
    }
}

/// Any list query gets options or a 400; a `continue` token kplug issued
/// reads back as the version and name it was made of.
pub fn list_query(data: &[u8]) {
    if let Some(rest) = data.strip_prefix(b"token:") {
        let text = String::from_utf8_lossy(rest);
        let (version, start) = text.split_once('/').unwrap_or((&text, ""));
        let token = encode_continue(version.to_owned(), start);
        let options = list_options(&format!("continue={token}"))
            .unwrap_or_else(|e| panic!("kplug's own token {token} refused: {e:?}"));
        assert_eq!(options.continue_version.as_deref(), Some(version));
        assert_eq!(options.start_after.as_deref(), Some(start));
        return;
    }
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(refused) = list_options(query) {
        assert_eq!(
            refused.code(),
            StatusCode::BAD_REQUEST,
            "{query:?}: {refused:?}"
        );
    }
}

fn list_options(query: &str) -> Result<ListOptions, ApiError> {
    let Ok(uri) = format!("/?{query}").parse::<http::Uri>() else {
        // Not a request line hyper would pass on.
        return ListOptions::try_from(ListQuery::default());
    };
    let Query(parsed) =
        Query::<ListQuery>::try_from_uri(&uri).map_err(|e| ApiError::BadRequest(e.body_text()))?;
    ListOptions::try_from(parsed)
}

/// A duration flag parses, or is refused, without a panic.
pub fn duration(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kplug_proto::duration::parse(text);
    }
}

/// A `traceparent` that parses prints as one that parses back the same.
pub fn traceparent(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(parent) = text.parse::<kplug_proto::trace::TraceParent>() {
        let printed = parent.to_string();
        let again: kplug_proto::trace::TraceParent = printed
            .parse()
            .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}: {e}"));
        assert!(again == parent, "{text:?} printed as {printed:?}");
    }
}

/// Any heartbeat message that decodes is a declaration or Kubernetes field
/// errors: a field path and apimachinery's wording.
pub fn heartbeat(data: &[u8]) {
    let Ok(request) = HeartbeatRequest::decode(data) else {
        return;
    };
    let registry = Registry::new(RegistryConfig::default());
    match validate::declaration(request, &registry, None) {
        Ok(_) | Err(Invalid::UnsupportedProtocol(_)) => {}
        Err(Invalid::Fields(errors)) => {
            assert!(!errors.is_empty());
            for error in errors {
                let worded = [
                    "Required value",
                    "Invalid value: ",
                    "Too many: ",
                    "Too long: ",
                ]
                .iter()
                .any(|start| error.message.starts_with(start));
                assert!(
                    !error.field.is_empty() && worded,
                    "not a Kubernetes field error: {error}"
                );
            }
        }
    }
}
