//! Content negotiation: which representation a client asked for in `Accept`.

use axum::http::{HeaderMap, header};

use super::status::ApiError;

/// How a resource read is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    /// The objects themselves.
    Json,
    /// A server-side `Table` (what kubectl asks for), in the given
    /// `meta.k8s.io` version.
    Table(TableVersion),
}

/// The `meta.k8s.io` versions a Table can be served in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableVersion {
    V1,
    V1beta1,
}

impl TableVersion {
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "meta.k8s.io/v1",
            Self::V1beta1 => "meta.k8s.io/v1beta1",
        }
    }
}

/// How a discovery document is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryFormat {
    /// `APIGroupList`, `APIGroup`, `APIResourceList`.
    Legacy,
    /// Aggregated discovery `APIGroupDiscoveryList` in `apidiscovery.k8s.io/<version>`.
    Aggregated(&'static str),
}

const SUPPORTED: &str = "application/json, application/json;as=Table;v=v1;g=meta.k8s.io, \
                         application/json;as=Table;v=v1beta1;g=meta.k8s.io";

/// One entry of an Accept header: a media range, its parameters and its
/// quality.
#[derive(Debug)]
pub struct MediaRange<'a> {
    essence: &'a str,
    params: Vec<(&'a str, &'a str)>,
    quality: f32,
}

impl MediaRange<'_> {
    /// The value of parameter `name` (names compare case-insensitively),
    /// unquoted.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// Whether the range is `media_type` itself (`type/subtype`, which
    /// compare case-insensitively, RFC 9110 section 8.3.1).
    pub fn is(&self, media_type: &str) -> bool {
        self.essence.eq_ignore_ascii_case(media_type)
    }

    /// Whether JSON satisfies the range.
    pub fn accepts_json(&self) -> bool {
        ["application/json", "application/*", "*/*"]
            .into_iter()
            .any(|media_type| self.is(media_type))
    }

    /// Whether the client accepts the range at all (q > 0).
    pub fn acceptable(&self) -> bool {
        self.quality > 0.0
    }
}

/// Parses the Accept headers into media ranges, best first (stable for
/// equal q), the unacceptable (q = 0) ones included: an Accept of only those
/// is not an empty one. A parameter without `=` is ignored, and an
/// unreadable q is 0, as Kubernetes' own parser does.
pub fn media_ranges(headers: &HeaderMap) -> Vec<MediaRange<'_>> {
    let mut ranges: Vec<MediaRange<'_>> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|item| {
            let mut parts = item.split(';').map(str::trim);
            let essence = parts.next().filter(|e| !e.is_empty())?;
            let mut params = Vec::new();
            let mut quality = 1.0;
            for (key, value) in parts.filter_map(|part| part.split_once('=')) {
                let (key, value) = (key.trim(), value.trim().trim_matches('"'));
                if key.eq_ignore_ascii_case("q") {
                    quality = value.parse().unwrap_or(0.0);
                } else {
                    params.push((key, value));
                }
            }
            Some(MediaRange {
                essence,
                params,
                quality,
            })
        })
        .collect();
    ranges.sort_by(|a, b| b.quality.total_cmp(&a.quality));
    ranges
}

/// The acceptable ranges of the Accept headers, best first.
fn acceptable(headers: &HeaderMap) -> impl Iterator<Item = MediaRange<'_>> {
    media_ranges(headers)
        .into_iter()
        .filter(MediaRange::acceptable)
}

/// The representation of a resource read. No Accept header means JSON.
pub fn representation(headers: &HeaderMap) -> Result<Representation, ApiError> {
    if !headers.contains_key(header::ACCEPT) {
        return Ok(Representation::Json);
    }
    for range in acceptable(headers) {
        if !range.accepts_json() {
            continue;
        }
        match range.param("as") {
            None => return Ok(Representation::Json),
            Some("Table") if range.param("g") == Some("meta.k8s.io") => match range.param("v") {
                Some("v1") => return Ok(Representation::Table(TableVersion::V1)),
                Some("v1beta1") => return Ok(Representation::Table(TableVersion::V1beta1)),
                _ => continue,
            },
            Some(_) => continue,
        }
    }
    Err(ApiError::NotAcceptable(SUPPORTED.to_owned()))
}

/// The format of a discovery read. Aggregated discovery is served only when
/// asked for, and an answer is never the legacy form under an aggregated Accept.
pub fn discovery_format(headers: &HeaderMap) -> Result<DiscoveryFormat, ApiError> {
    if !headers.contains_key(header::ACCEPT) {
        return Ok(DiscoveryFormat::Legacy);
    }
    for range in acceptable(headers) {
        if !range.accepts_json() {
            continue;
        }
        match (range.param("as"), range.param("g"), range.param("v")) {
            (None, _, _) => return Ok(DiscoveryFormat::Legacy),
            (Some("APIGroupDiscoveryList"), Some("apidiscovery.k8s.io"), Some("v2")) => {
                return Ok(DiscoveryFormat::Aggregated("v2"));
            }
            (Some("APIGroupDiscoveryList"), Some("apidiscovery.k8s.io"), Some("v2beta1")) => {
                return Ok(DiscoveryFormat::Aggregated("v2beta1"));
            }
            _ => continue,
        }
    }
    Err(ApiError::NotAcceptable(
        "application/json, application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, \
         application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            .to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn accept(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn kubectl_get_gets_a_table() {
        let headers = accept(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
        );
        assert_eq!(
            representation(&headers),
            Ok(Representation::Table(TableVersion::V1))
        );
    }

    #[test]
    fn plain_and_missing_accept_get_json() {
        assert_eq!(representation(&HeaderMap::new()), Ok(Representation::Json));
        assert_eq!(representation(&accept("*/*")), Ok(Representation::Json));
        assert_eq!(
            representation(&accept("application/json;stream=watch")),
            Ok(Representation::Json)
        );
    }

    #[test]
    fn protobuf_only_is_not_acceptable() {
        let err = representation(&accept("application/vnd.kubernetes.protobuf"));
        assert!(matches!(err, Err(ApiError::NotAcceptable(_))));
        let err = representation(&accept("application/json;as=Unknown;g=x;v=v1"));
        assert!(matches!(err, Err(ApiError::NotAcceptable(_))));
    }

    #[test]
    fn quality_orders_choices() {
        let headers = accept("application/json;q=0.5,application/json;as=Table;v=v1;g=meta.k8s.io");
        assert_eq!(
            representation(&headers),
            Ok(Representation::Table(TableVersion::V1))
        );
    }

    /// The parser OpenAPI serving shares: media types compare
    /// case-insensitively (RFC 9110), a parameter without a value is ignored
    /// (as Kubernetes' parser ignores it), and q = 0 ranges are read but
    /// never chosen.
    #[test]
    fn one_parser_reads_every_accept() {
        assert_eq!(
            representation(&accept("Application/JSON")),
            Ok(Representation::Json)
        );
        assert_eq!(
            representation(&accept("application/json;charset")),
            Ok(Representation::Json)
        );
        let headers = accept("application/json;q=0, text/html;q=\"0.5\"");
        let ranges = media_ranges(&headers);
        assert_eq!(ranges.len(), 2);
        assert!(ranges[0].is("TEXT/html") && ranges[0].acceptable());
        assert!(ranges[1].accepts_json() && !ranges[1].acceptable());
        assert!(representation(&headers).is_err());
        assert!(media_ranges(&accept("")).is_empty());
    }

    #[test]
    fn aggregated_discovery_when_asked() {
        let headers = accept(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
        );
        assert_eq!(
            discovery_format(&headers),
            Ok(DiscoveryFormat::Aggregated("v2"))
        );
        let headers =
            accept("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList");
        assert_eq!(
            discovery_format(&headers),
            Ok(DiscoveryFormat::Aggregated("v2beta1"))
        );
        let headers =
            accept("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList");
        assert!(discovery_format(&headers).is_err());
        assert_eq!(
            discovery_format(&accept("application/json")),
            Ok(DiscoveryFormat::Legacy)
        );
    }
}
