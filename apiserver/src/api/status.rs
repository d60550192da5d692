//! Errors as Kubernetes `Status` objects.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    ListMeta, Status, StatusCause, StatusDetails,
};

use crate::auth::AuthError;
use crate::v1alpha1::{GROUP, Plugin};

/// An API error: becomes a `Status` body with the matching HTTP code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("the server could not find the requested resource")]
    NoSuchRoute,
    /// A stored object a request names is not there: `resource` of `group`
    /// (empty for the core group) named `name`.
    #[error("{}", qualified_not_found(resource, group, name))]
    ObjectNotFound {
        group: String,
        resource: String,
        name: String,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("{message}")]
    Invalid {
        name: String,
        message: String,
        causes: Vec<(String, String)>,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    #[error("only the following media types are accepted: {0}")]
    NotAcceptable(String),
    #[error("the body of the request was in an unknown format - accepted media types include: {0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    Expired(String),
    #[error("{message}")]
    TooManyRequests { message: String, retry_after: u32 },
    #[error("{message}")]
    ServiceUnavailable { message: String, retry_after: u32 },
    #[error("the request body is too large: at most {0} bytes are accepted")]
    RequestEntityTooLarge(usize),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    /// The caller lacks a right on an object of the request body (`field`),
    /// `resource` of `group` named `name`.
    #[error("{message}")]
    ForbiddenObject {
        message: String,
        field: String,
        group: String,
        resource: String,
        name: String,
    },
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// A missing Plugin.
    pub fn plugin_not_found(name: &str) -> Self {
        Self::NotFound {
            kind: Plugin::PLURAL,
            name: name.to_owned(),
        }
    }

    /// The HTTP status code.
    pub fn code(&self) -> StatusCode {
        match self {
            Self::NotFound { .. } | Self::NoSuchRoute | Self::ObjectNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Expired(_) => StatusCode::GONE,
            Self::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::ServiceUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::RequestEntityTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) | Self::ForbiddenObject { .. } => StatusCode::FORBIDDEN,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `reason` field, as in `metav1.StatusReason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } | Self::NoSuchRoute | Self::ObjectNotFound { .. } => "NotFound",
            Self::BadRequest(_) => "BadRequest",
            Self::Invalid { .. } => "Invalid",
            Self::Conflict(_) => "Conflict",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::NotAcceptable(_) => "NotAcceptable",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Self::Expired(_) => "Expired",
            Self::TooManyRequests { .. } => "TooManyRequests",
            Self::ServiceUnavailable { .. } => "ServiceUnavailable",
            Self::RequestEntityTooLarge(_) => "RequestEntityTooLarge",
            Self::Timeout(_) => "Timeout",
            Self::Unauthorized(_) => "Unauthorized",
            Self::Forbidden(_) | Self::ForbiddenObject { .. } => "Forbidden",
            Self::Internal(_) => "InternalError",
        }
    }

    /// The error as a `Status` object.
    pub fn to_status(&self) -> Status {
        let details = match self {
            Self::NotFound { kind, name } => Some(naming(name, GROUP, kind)),
            Self::ObjectNotFound {
                group,
                resource,
                name,
            } => Some(naming(name, group, resource)),
            Self::Invalid { name, causes, .. } => Some(StatusDetails {
                name: Some(name.clone()),
                group: Some(GROUP.to_owned()),
                causes: Some(
                    causes
                        .iter()
                        .map(|(field, message)| StatusCause {
                            field: Some(field.clone()),
                            message: Some(message.clone()),
                            reason: Some("FieldValueInvalid".to_owned()),
                        })
                        .collect(),
                ),
                ..StatusDetails::default()
            }),
            // As kube-apiserver's NewForbidden, and the object's field.
            Self::ForbiddenObject {
                message,
                field,
                group,
                resource,
                name,
            } => Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    field: Some(field.clone()),
                    message: Some(message.clone()),
                    reason: Some("FieldValueForbidden".to_owned()),
                }]),
                ..naming(name, group, resource)
            }),
            Self::TooManyRequests { retry_after, .. }
            | Self::ServiceUnavailable { retry_after, .. } => Some(StatusDetails {
                retry_after_seconds: Some(i32::try_from(*retry_after).unwrap_or(i32::MAX)),
                ..StatusDetails::default()
            }),
            _ => None,
        };
        let message = match self {
            Self::NotFound { kind, name } => format!("{kind}.{GROUP} \"{name}\" not found"),
            other => other.to_string(),
        };
        Status {
            status: Some("Failure".to_owned()),
            code: Some(i32::from(self.code().as_u16())),
            reason: Some(self.reason().to_owned()),
            message: Some(message),
            details,
            metadata: ListMeta::default(),
        }
    }
}

/// The details that name an object: its name, group and resource (which
/// `StatusDetails` calls `kind`, as kube-apiserver fills it).
fn naming(name: &str, group: &str, resource: &str) -> StatusDetails {
    StatusDetails {
        name: Some(name.to_owned()),
        group: Some(group.to_owned()),
        kind: Some(resource.to_owned()),
        ..StatusDetails::default()
    }
}

/// kube-apiserver's words for a missing object: `widgets.example.com "w1"
/// not found`, `configmaps "settings" not found`.
fn qualified_not_found(resource: &str, group: &str, name: &str) -> String {
    let resource = crate::kube_words::qualified_resource(resource, group);
    format!("{resource} {name:?} not found")
}

/// A refused caller, as kube-apiserver answers one: `401` for an unknown
/// caller (with its `WWW-Authenticate` challenge), `403` for a denial, and
/// `500` when the decision could not be made.
impl From<AuthError> for ApiError {
    fn from(error: AuthError) -> Self {
        match error {
            AuthError::Unauthenticated(message) => Self::Unauthorized(message),
            AuthError::Forbidden(message) => Self::Forbidden(message),
            review @ AuthError::TokenReview(_) => Self::Unauthorized(review.to_string()),
            review @ AuthError::AccessReview(_) => Self::Internal(review.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.code(), Json(self.to_status())).into_response();
        match &self {
            Self::Unauthorized(_) => {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"kplug\""),
                );
            }
            Self::TooManyRequests { retry_after, .. }
            | Self::ServiceUnavailable { retry_after, .. } => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_names_the_object() {
        let status = ApiError::plugin_not_found("db").to_status();
        assert_eq!(status.code, Some(404));
        assert_eq!(status.reason.as_deref(), Some("NotFound"));
        assert_eq!(
            status.message.as_deref(),
            Some("plugins.plugins.kplug.io \"db\" not found")
        );
        let details = status.details.unwrap_or_default();
        assert_eq!(details.kind.as_deref(), Some("plugins"));
        assert_eq!(details.name.as_deref(), Some("db"));
    }

    #[test]
    fn a_missing_stored_object_is_named_as_kube_apiserver_names_it() {
        let missing = |group: &str, resource: &str| {
            ApiError::ObjectNotFound {
                group: group.to_owned(),
                resource: resource.to_owned(),
                name: "w1".to_owned(),
            }
            .to_status()
        };
        let status = missing("example.com", "widgets");
        assert_eq!(
            (status.code, status.reason.as_deref()),
            (Some(404), Some("NotFound"))
        );
        assert_eq!(
            status.message.as_deref(),
            Some("widgets.example.com \"w1\" not found")
        );
        let details = status.details.unwrap_or_default();
        assert_eq!(details.group.as_deref(), Some("example.com"));
        assert_eq!(details.kind.as_deref(), Some("widgets"));
        assert_eq!(details.name.as_deref(), Some("w1"));
        let core = missing("", "configmaps");
        assert_eq!(core.message.as_deref(), Some("configmaps \"w1\" not found"));
    }

    #[test]
    fn status_serializes_with_kind_and_api_version() {
        let json = serde_json::to_value(ApiError::MethodNotAllowed.to_status()).unwrap_or_default();
        assert_eq!(json["kind"], "Status");
        assert_eq!(json["apiVersion"], "v1");
        assert_eq!(json["code"], 405);
        assert_eq!(json["status"], "Failure");
    }

    /// Refusals keep the code, reason and message kube-apiserver would give.
    #[test]
    fn auth_errors_become_statuses() {
        let unreachable = || kube::Error::LinesCodecMaxLineLengthExceeded;
        let cases = [
            (
                AuthError::Unauthenticated("Unauthorized".to_owned()),
                401,
                "Unauthorized",
                "Unauthorized",
            ),
            (
                AuthError::TokenReview(unreachable()),
                401,
                "Unauthorized",
                "Unauthorized: the token could not be reviewed: Error finding newline character",
            ),
            (
                AuthError::Forbidden("user \"x\" cannot list resource \"plugins\"".to_owned()),
                403,
                "Forbidden",
                "user \"x\" cannot list resource \"plugins\"",
            ),
            (
                AuthError::AccessReview(unreachable()),
                500,
                "InternalError",
                "authorization check failed: Error finding newline character",
            ),
        ];
        for (error, code, reason, message) in cases {
            let status = ApiError::from(error).to_status();
            assert_eq!(status.code, Some(code), "{message}");
            assert_eq!(status.reason.as_deref(), Some(reason), "{message}");
            assert_eq!(status.message.as_deref(), Some(message));
        }
        let response =
            ApiError::from(AuthError::Unauthenticated("Unauthorized".to_owned())).into_response();
        assert_eq!(
            response.headers().get(header::WWW_AUTHENTICATE),
            Some(&HeaderValue::from_static("Bearer realm=\"kplug\""))
        );
    }
}
