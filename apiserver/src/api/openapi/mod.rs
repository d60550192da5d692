//! The OpenAPI documents of `plugins.kplug.io/v1alpha1`: what `kubectl
//! explain` reads, and what kube-apiserver's aggregator fetches and merges.
//!
//! Served as kube-openapi serves them:
//!
//! - `GET /openapi/v2`: one Swagger 2.0 document, as JSON (what the
//!   aggregator asks for) or as gnostic's protobuf `openapi.v2.Document`
//!   (what kubectl asks for: before 1.29, `kubectl explain` fails without it
//!   even though it renders from v3). Any other Accept gets 406.
//! - `GET /openapi/v3`: the index, `{"paths": {"apis/<group>/<version>":
//!   {"serverRelativeURL": "/openapi/v3/apis/<group>/<version>?hash=<HASH>"}}}`.
//!   The aggregator merges these indexes and proxies the URLs to us.
//! - `GET /openapi/v3/apis/plugins.kplug.io/v1alpha1`: the OpenAPI 3.0
//!   document of the group-version (JSON only), with ETag `"<HASH>"`. With a
//!   matching `?hash=` it may be cached for good (`Cache-Control: public,
//!   immutable` and a year's `Expires`, so kubectl does not even revalidate
//!   it); with a stale one the client is redirected to the current URL.
//!
//! Every answer carries a strong ETag (quoted content hash) and honours
//! `If-None-Match` with 304.
//!
//! The schemas have one source, `schemas.json` here: an OpenAPI v3
//! `components` object with `#/components/schemas/` references. It is parsed
//! into `openapiv3` types for the v3 document ([`v3`]), the v2 document is
//! derived from the serialised v3 one ([`v2`]), then built into gnostic's
//! generated messages and encoded in protobuf ([`gnostic`]). [`serve`]
//! answers the requests from the bytes built here once. kubectl finds the
//! schema to explain through the `x-kubernetes-group-version-kind` of the
//! path operations and of the schemas, so both carry it.

pub mod gnostic;
mod serve;
mod v2;
mod v3;

#[cfg(test)]
mod tests;

pub use serve::router;

use serde_json::json;

use crate::v1alpha1::{GROUP, VERSION};
use serve::Served;

/// Name prefix of this group's schemas: the group reversed, then the version,
/// as Kubernetes names the schemas of custom resources.
const SCHEMA_PREFIX: &str = "io.kplug.plugins.v1alpha1.";
const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.";

const V3_SCHEMA_REF: &str = "#/components/schemas/";
const V2_SCHEMA_REF: &str = "#/definitions/";

const JSON: &str = "application/json";
const WATCH_JSON: &str = "application/json;stream=watch";
/// The protobuf form of the v2 document (gnostic's `openapi.v2.Document`).
const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
/// What kubectl asks for; answered as [`V2_PROTOBUF`], as kube-openapi does.
const V2_PROTOBUF_DEPRECATED: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

/// Why the OpenAPI documents could not be built. Every variant is a bug in
/// the embedded schemas or in this module, caught at start-up.
#[derive(Debug, thiserror::Error)]
pub enum OpenApiError {
    #[error("openapi/schemas.json is not a valid OpenAPI v3 components object")]
    Schemas(#[source] serde_json::Error),
    #[error("the OpenAPI v3 path item {path} is not valid")]
    PathItem {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot serialise the OpenAPI {document} document")]
    Serialize {
        document: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "OpenAPI {document} document: {location} refers to {reference}, which it does not define"
    )]
    UnresolvedRef {
        document: &'static str,
        location: String,
        reference: String,
    },
    #[error("cannot express {location} in Swagger 2.0: {reason}")]
    NotSwagger2 { location: String, reason: String },
    #[error("cannot encode {location} of the Swagger 2.0 document in protobuf: {reason}")]
    NotProtobuf { location: String, reason: String },
}

/// The OpenAPI documents kplug serves, built once at start-up.
#[derive(Debug)]
pub struct OpenApi {
    v2: Served,
    v2_protobuf: Served,
    v3_index: Served,
    v3_group_version: Served,
}

impl OpenApi {
    /// Builds the v3 group-version document from the embedded schemas (typed
    /// with `openapiv3`), derives the v2 document from it, and checks that
    /// every reference in both resolves.
    pub fn new() -> Result<Self, OpenApiError> {
        let document = v3::document()?;
        let v3_value =
            serde_json::to_value(&document).map_err(|source| OpenApiError::Serialize {
                document: "v3",
                source,
            })?;
        v2::check_refs("v3", &v3_value, V3_SCHEMA_REF, &["components", "schemas"])?;
        let v2_value = v2::swagger(&v3_value)?;
        v2::check_refs("v2", &v2_value, V2_SCHEMA_REF, &["definitions"])?;

        let v2 = Served::json("v2", &v2_value)?;
        let v2_protobuf = v2.alternative(gnostic::encode(&v2_value)?, V2_PROTOBUF);
        let v3_group_version = Served::json("v3", &document)?;
        let index = json!({
            "paths": {
                group_version_path(): {
                    "serverRelativeURL": group_version_url(&v3_group_version.hash),
                }
            }
        });
        Ok(Self {
            v2,
            v2_protobuf,
            v3_index: Served::json("v3 index", &index)?,
            v3_group_version,
        })
    }
}

/// `apis/<group>/<version>`: the key of the v3 index.
fn group_version_path() -> String {
    format!("apis/{GROUP}/{VERSION}")
}

fn group_version_url(hash: &str) -> String {
    format!("/openapi/v3/{}?hash={hash}", group_version_path())
}
