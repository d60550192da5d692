//! Serving the documents built at start-up: routes, content negotiation,
//! ETags and `If-None-Match`, caching headers and the redirect of stale
//! `?hash=` URLs.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, EXPIRES, IF_NONE_MATCH, LOCATION, VARY};
use http::{HeaderMap, HeaderValue, StatusCode, Uri};
use jiff::fmt::rfc2822::DateTimePrinter;

use super::{
    JSON, OpenApi, OpenApiError, V2_PROTOBUF, V2_PROTOBUF_DEPRECATED, group_version_path,
    group_version_url,
};
use crate::api::negotiate;

/// A group-version document's URL may be cached this long when it names the
/// document's hash (kube-openapi: one year).
const IMMUTABLE_FOR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// One representation of a document as served.
#[derive(Debug)]
pub(super) struct Served {
    pub(super) body: Bytes,
    content_type: &'static str,
    /// Uppercase hex content hash of the JSON form, unquoted (the `?hash=`
    /// value).
    pub(super) hash: String,
    /// `"<hash>"`, the ETag header value.
    etag: String,
}

impl Served {
    /// The JSON form of `value`, tagged with its own hash.
    pub(super) fn json(
        document: &'static str,
        value: &impl serde::Serialize,
    ) -> Result<Self, OpenApiError> {
        let body = serde_json::to_vec(value)
            .map_err(|source| OpenApiError::Serialize { document, source })?;
        let hash = content_hash(&body);
        Ok(Self {
            body: Bytes::from(body),
            content_type: JSON,
            etag: format!("\"{hash}\""),
            hash,
        })
    }

    /// Another representation of the same document: kube-openapi tags every
    /// representation with the JSON form's hash (and sends `Vary: Accept`).
    pub(super) fn alternative(&self, body: Vec<u8>, content_type: &'static str) -> Self {
        Self {
            body: Bytes::from(body),
            content_type,
            hash: self.hash.clone(),
            etag: self.etag.clone(),
        }
    }
}

/// Routes: `GET /openapi/v2`, `GET /openapi/v3` and
/// `GET /openapi/v3/apis/plugins.kplug.io/v1alpha1` (and HEAD of each).
pub fn router(openapi: Arc<OpenApi>) -> Router {
    Router::new()
        .route("/openapi/v2", get(serve_v2))
        .route("/openapi/v3", get(serve_v3_index))
        .route(
            &format!("/openapi/v3/{}", group_version_path()),
            get(serve_v3_group_version),
        )
        .with_state(openapi)
}

async fn serve_v2(State(openapi): State<Arc<OpenApi>>, headers: HeaderMap) -> Response {
    match wanted_format(&headers, true) {
        Some(Format::Json) => respond(&openapi.v2, &headers, Caching::Revalidate, true),
        Some(Format::Protobuf) => {
            respond(&openapi.v2_protobuf, &headers, Caching::Revalidate, true)
        }
        None => not_acceptable(),
    }
}

/// kube-openapi serves the index whatever the Accept.
async fn serve_v3_index(State(openapi): State<Arc<OpenApi>>, headers: HeaderMap) -> Response {
    respond(&openapi.v3_index, &headers, Caching::Revalidate, false)
}

async fn serve_v3_group_version(
    State(openapi): State<Arc<OpenApi>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if wanted_format(&headers, false).is_none() {
        return not_acceptable();
    }
    let served = &openapi.v3_group_version;
    match query_param(&uri, "hash") {
        Some(hash) if hash == served.hash => respond(served, &headers, Caching::Immutable, true),
        // A stale (or mistyped) hash: send the client to the current URL.
        Some(_) => {
            let mut response = StatusCode::MOVED_PERMANENTLY.into_response();
            if let Ok(location) = HeaderValue::try_from(group_version_url(&served.hash)) {
                response.headers_mut().insert(LOCATION, location);
            }
            response
        }
        None => respond(served, &headers, Caching::Revalidate, true),
    }
}

#[derive(Clone, Copy)]
enum Caching {
    /// Clients revalidate with the ETag.
    Revalidate,
    /// The URL names the content: it never changes.
    Immutable,
}

/// 200 with the document, or 304 when `If-None-Match` names its ETag.
fn respond(served: &Served, request: &HeaderMap, caching: Caching, vary: bool) -> Response {
    let mut headers = HeaderMap::new();
    // Hex digits in quotes: always a valid header value.
    if let Ok(etag) = HeaderValue::from_str(&served.etag) {
        headers.insert(ETAG, etag);
    }
    if vary {
        // The representation depends on Accept (kube-openapi also serves
        // protobuf there): keep caches from mixing them up.
        headers.insert(VARY, HeaderValue::from_static("Accept"));
    }
    if let Caching::Immutable = caching {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
        if let Some(expires) = http_date(SystemTime::now() + IMMUTABLE_FOR)
            .and_then(|date| HeaderValue::try_from(date).ok())
        {
            headers.insert(EXPIRES, expires);
        }
    }
    if if_none_match(request, &served.etag) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(served.content_type));
    (StatusCode::OK, headers, served.body.clone()).into_response()
}

fn not_acceptable() -> Response {
    (
        StatusCode::NOT_ACCEPTABLE,
        [(VARY, HeaderValue::from_static("Accept"))],
    )
        .into_response()
}

/// Whether `If-None-Match` names `etag` (weak comparison, as RFC 9110 asks
/// for this header) or is `*`.
fn if_none_match(request: &HeaderMap, etag: &str) -> bool {
    request
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Json,
    Protobuf,
}

/// The representation `Accept` asks for, as kube-openapi picks it: the
/// ranges by quality (q = 0 excluded), the first that JSON, or protobuf when
/// `protobuf` is offered, satisfies; media type parameters aside. No Accept,
/// or an empty one, means JSON.
fn wanted_format(request: &HeaderMap, protobuf: bool) -> Option<Format> {
    let ranges = negotiate::media_ranges(request);
    if ranges.is_empty() {
        // Anything goes (kube-openapi: */*).
        return Some(Format::Json);
    }
    ranges
        .iter()
        .filter(|range| range.acceptable())
        .find_map(|range| {
            if range.accepts_json() {
                Some(Format::Json)
            } else if protobuf && (range.is(V2_PROTOBUF) || range.is(V2_PROTOBUF_DEPRECATED)) {
                Some(Format::Protobuf)
            } else {
                None
            }
        })
}

/// The first value of query parameter `name` (no percent-decoding: the
/// values this module reads are hex).
fn query_param<'a>(uri: &'a Uri, name: &str) -> Option<&'a str> {
    uri.query()?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The first 128 bits of the SHA-256 of `data`, as 32 uppercase hex digits:
/// the format kplug's ETags and `?hash=` have always had (kube-openapi's are
/// a whole SHA-512), and plenty for change detection.
fn content_hash(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let hash: String = digest
        .as_ref()
        .iter()
        .take(16)
        .map(|byte| format!("{byte:02X}"))
        .collect();
    hash
}

/// An HTTP date (RFC 9110 IMF-fixdate), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`;
/// `None` for a time outside the years the format can express.
fn http_date(time: SystemTime) -> Option<String> {
    let timestamp = jiff::Timestamp::try_from(time).ok()?;
    DateTimePrinter::new()
        .timestamp_to_rfc9110_string(&timestamp)
        .ok()
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, to_bytes};
    use http::Request;
    use serde_json::Value;
    use tower::ServiceExt;

    use std::time::UNIX_EPOCH;

    use super::super::tests::openapi;
    use super::*;

    const KUBECTL_V2_ACCEPT: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

    async fn get(
        openapi: &Arc<OpenApi>,
        uri: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, HeaderMap, Bytes) {
        let mut request = Request::get(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = router(openapi.clone())
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, headers, body)
    }

    fn header(headers: &HeaderMap, name: http::HeaderName) -> &str {
        headers.get(name).unwrap().to_str().unwrap()
    }

    #[tokio::test]
    async fn index_names_the_group_version_document_by_its_hash() {
        let openapi = openapi();
        let (status, headers, body) = get(&openapi, "/openapi/v3", &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, CONTENT_TYPE), JSON);
        let index: Value = serde_json::from_slice(&body).unwrap();
        let paths = index["paths"].as_object().unwrap();
        assert_eq!(paths.len(), 1);
        let url = paths["apis/plugins.kplug.io/v1alpha1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        let hash = url
            .strip_prefix("/openapi/v3/apis/plugins.kplug.io/v1alpha1?hash=")
            .unwrap();
        assert_eq!(hash.len(), 32);
        assert!(
            hash.chars()
                .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
        );

        // kubectl appends its own parameters.
        let (status, headers, body) =
            get(&openapi, &format!("{url}&timeout=32s"), &[("accept", JSON)]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, ETAG), format!("\"{hash}\""));
        assert_eq!(header(&headers, CACHE_CONTROL), "public, immutable");
        assert!(header(&headers, EXPIRES).ends_with(" GMT"));
        assert_eq!(header(&headers, VARY), "Accept");
        assert_eq!(content_hash(&body), hash);

        // Without the hash: the same document, to be revalidated.
        let (status, headers, unhashed) =
            get(&openapi, "/openapi/v3/apis/plugins.kplug.io/v1alpha1", &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, ETAG), format!("\"{hash}\""));
        assert!(headers.get(CACHE_CONTROL).is_none());
        assert_eq!(unhashed, body);
    }

    #[tokio::test]
    async fn a_stale_hash_is_redirected() {
        let openapi = openapi();
        let (status, headers, _) = get(
            &openapi,
            "/openapi/v3/apis/plugins.kplug.io/v1alpha1?hash=0123",
            &[],
        )
        .await;
        assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
        assert_eq!(
            header(&headers, LOCATION),
            group_version_url(&openapi.v3_group_version.hash)
        );
    }

    #[tokio::test]
    async fn if_none_match_gives_304() {
        let openapi = openapi();
        let hashed = group_version_url(&openapi.v3_group_version.hash);
        for uri in [
            "/openapi/v2",
            "/openapi/v3",
            "/openapi/v3/apis/plugins.kplug.io/v1alpha1",
            hashed.as_str(),
        ] {
            let (status, headers, _) = get(&openapi, uri, &[]).await;
            assert_eq!(status, StatusCode::OK, "{uri}");
            let etag = header(&headers, ETAG).to_owned();
            assert!(
                etag.starts_with('"') && etag.ends_with('"'),
                "strong ETag: {etag}"
            );

            for matching in [
                etag.clone(),
                format!("W/{etag}"),
                format!("\"x\", {etag}"),
                "*".into(),
            ] {
                let (status, headers, body) =
                    get(&openapi, uri, &[("if-none-match", &matching)]).await;
                assert_eq!(status, StatusCode::NOT_MODIFIED, "{uri} {matching}");
                assert_eq!(header(&headers, ETAG), etag);
                assert!(body.is_empty());
            }
            let (status, _, _) = get(&openapi, uri, &[("if-none-match", "\"other\"")]).await;
            assert_eq!(status, StatusCode::OK, "{uri}");
        }
    }

    #[tokio::test]
    async fn v2_is_served_as_json_or_as_kubectl_s_protobuf() {
        let openapi = openapi();
        // kube-apiserver's aggregator.
        let (status, headers, body) = get(&openapi, "/openapi/v2", &[("accept", JSON)]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, CONTENT_TYPE), JSON);
        assert_eq!(body, openapi.v2.body);
        let etag = header(&headers, ETAG).to_owned();

        // kubectl (and client-go's OpenAPISchema).
        for accept in [
            KUBECTL_V2_ACCEPT,
            V2_PROTOBUF,
            "application/json;q=0.5, application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        ] {
            let (status, headers, body) = get(&openapi, "/openapi/v2", &[("accept", accept)]).await;
            assert_eq!(status, StatusCode::OK, "{accept}");
            assert_eq!(header(&headers, CONTENT_TYPE), V2_PROTOBUF);
            assert_eq!(header(&headers, ETAG), etag);
            assert_eq!(body, openapi.v2_protobuf.body);
        }

        for accept in ["*/*", "application/*", "text/html, */*;q=0.1", ""] {
            let (status, headers, _) = get(&openapi, "/openapi/v2", &[("accept", accept)]).await;
            assert_eq!(status, StatusCode::OK, "{accept}");
            assert_eq!(header(&headers, CONTENT_TYPE), JSON, "{accept}");
        }
        for accept in ["text/html", "application/json;q=0", "application/yaml"] {
            let (status, _, _) = get(&openapi, "/openapi/v2", &[("accept", accept)]).await;
            assert_eq!(status, StatusCode::NOT_ACCEPTABLE, "{accept}");
        }
        // v3 in protobuf is not served.
        let (status, _, _) = get(
            &openapi,
            "/openapi/v3/apis/plugins.kplug.io/v1alpha1",
            &[(
                "accept",
                "application/com.github.proto-openapi.spec.v3.v1.0+protobuf",
            )],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_ACCEPTABLE);
    }

    /// SHA-256 test vectors (FIPS 180-2), their first 128 bits.
    #[test]
    fn content_hash_is_sha256_truncated_to_128_bits() {
        assert_eq!(content_hash(b""), "E3B0C44298FC1C149AFBF4C8996FB924");
        assert_eq!(content_hash(b"abc"), "BA7816BF8F01CFEA414140DE5DAE2223");
    }

    #[test]
    fn http_dates() {
        let at = |secs| http_date(UNIX_EPOCH + Duration::from_secs(secs)).unwrap();
        assert_eq!(at(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(at(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(at(0), "Thu, 01 Jan 1970 00:00:00 GMT");
    }
}
