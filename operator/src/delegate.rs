//! Delegation: one `create reconciles.plugins.kplug.io`, through
//! kube-apiserver or straight to kplug (`direct`) with the same identity, so
//! the operator's own RBAC governs it, and the typed ways it can fail.

use std::time::Duration;

use http::{Method, Request, StatusCode, header};
use kplug_api::v1alpha1::{
    API_VERSION, ApiSelector, ObservedChild, Operation, RawObject, Reconcile, ReconcileSpec,
    ReconcileStatus,
};
use kplug_proto::trace::{TRACEPARENT, TraceParent};
use kube::Client;
use kube::api::DynamicObject;
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::debug;

use crate::config::ChildScope;

const GROUP_VERSION_PATH: &str = "/apis/plugins.kplug.io/v1alpha1";

/// How long to wait before a retry when kplug says to retry but not when.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What one delegation asks for.
#[derive(Debug)]
pub struct Delegation<'a> {
    pub operation: Operation,
    pub api: &'a ApiSelector,
    pub object: &'a DynamicObject,
    pub extensions: &'a [DynamicObject],
    pub preferred_implementation: Option<String>,
    pub required_implementation: Option<String>,
    /// The plugin versions that may serve (a semver range).
    pub version_constraint: Option<String>,
    pub timeout: Duration,
    /// Sent as the `traceparent` header, which kplug passes on to the plugin.
    pub traceparent: Option<TraceParent>,
    /// The children the operator applied for the object, as it sees them
    /// now, each under its key.
    pub observed_children: &'a [(String, DynamicObject)],
    /// Where the plugin's children may be.
    pub child_scope: ChildScope,
}

/// Why a delegation did not produce a plugin's answer.
#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    /// No Ready plugin (of the required implementation) or it cannot be
    /// reached: wait for one.
    #[error("{message}")]
    Unavailable {
        message: String,
        retry_after: Duration,
    },
    /// kplug could not be reached, so no plugin was asked: through
    /// kube-apiserver, a 503 without kplug's retry hint (no Ready kplug pod
    /// behind its Service, a connection that broke); on the direct path, a
    /// request that got no answer. The operator wakes such objects as soon
    /// as kplug answers again.
    #[error("{0}")]
    Unreachable(String),
    /// The plugin is at its concurrency bound.
    #[error("{message}")]
    TooManyRequests {
        message: String,
        retry_after: Duration,
    },
    /// The operator's identity may not create reconciles.
    #[error("{0}")]
    Forbidden(String),
    /// kplug is not installed or its APIService is not available.
    #[error(
        "the reconciles resource is not served ({0}): is kplug installed and its APIService Available?"
    )]
    NotServed(String),
    /// The plugin did not answer within the deadline.
    #[error("{0}")]
    Timeout(String),
    /// kplug refused the request as malformed or invalid.
    #[error("{0}")]
    Rejected(String),
    /// Any other Kubernetes `Status` error.
    #[error("{reason} ({code}): {message}")]
    Failed {
        code: u16,
        reason: String,
        message: String,
    },
    /// The request did not get an HTTP answer.
    #[error("calling kplug: {}", crate::words::kube_error(.0))]
    Transport(#[from] kube::Error),
    /// The answer was not a Reconcile or a Status.
    #[error("kplug's answer could not be decoded: {0}")]
    Decode(String),
}

impl DelegateError {
    /// The condition and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => "PluginUnavailable",
            Self::Unreachable(_) => "KplugUnavailable",
            Self::TooManyRequests { .. } => "TooManyRequests",
            Self::Forbidden(_) => "Forbidden",
            Self::NotServed(_) => "KplugNotServed",
            Self::Timeout(_) => "PluginTimeout",
            Self::Rejected(_) => "ReconcileRejected",
            Self::Failed { .. } | Self::Transport(_) | Self::Decode(_) => "DelegationFailed",
        }
    }

    /// What the operator does next, as the end of the message that reports
    /// the failure.
    pub fn next_step(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => {
                "retrying with backoff, or sooner when a plugin turns Ready"
            }
            Self::Unreachable(_) => "retrying as soon as kplug answers again",
            _ => crate::status::RETRYING,
        }
    }

    /// How long kplug asked to wait, when it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Unavailable { retry_after, .. } | Self::TooManyRequests { retry_after, .. } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }
}

/// The fields of a Kubernetes `Status` error body that matter here.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StatusBody {
    message: String,
    reason: String,
    details: Option<StatusDetails>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct StatusDetails {
    retry_after_seconds: Option<u64>,
}

fn raw(object: &impl serde::Serialize) -> Result<RawObject, DelegateError> {
    serde_json::to_string(object)
        .and_then(RawValue::from_string)
        .map_err(|e| DelegateError::Decode(format!("encoding the object: {e}")))
}

/// The object as a plugin should see it: its `managedFields` are the API
/// server's bookkeeping, often larger than the object itself.
fn without_managed_fields(object: &DynamicObject) -> DynamicObject {
    let mut object = object.clone();
    object.metadata.managed_fields = None;
    object
}

/// The `Reconcile` body for a delegation.
pub fn request_body(delegation: &Delegation<'_>) -> Result<Reconcile, DelegateError> {
    let timeout_seconds = i64::try_from(delegation.timeout.as_secs().max(1)).unwrap_or(i64::MAX);
    Ok(Reconcile {
        api_version: API_VERSION.to_owned(),
        kind: Reconcile::KIND.to_owned(),
        metadata: Default::default(),
        spec: ReconcileSpec {
            operation_name: Some(delegation.operation.as_str().to_owned()),
            dry_run: false,
            timeout_seconds: Some(timeout_seconds),
            object: Some(raw(&without_managed_fields(delegation.object))?),
            object_ref: None,
            extensions: delegation
                .extensions
                .iter()
                .map(|e| raw(&without_managed_fields(e)))
                .collect::<Result<_, _>>()?,
            api: Some(delegation.api.clone()),
            preferred_implementation: delegation.preferred_implementation.clone(),
            required_implementation: delegation.required_implementation.clone(),
            version_constraint: delegation.version_constraint.clone(),
            plugin: None,
            observed_children: delegation
                .observed_children
                .iter()
                .map(|(key, child)| {
                    Ok(ObservedChild {
                        key: key.clone(),
                        object: raw(&without_managed_fields(child))?,
                    })
                })
                .collect::<Result<_, DelegateError>>()?,
            // Unsaid for the object's namespace, kplug's default.
            child_scope: (delegation.child_scope == ChildScope::Cluster)
                .then_some(delegation.child_scope.into()),
        },
        status: None,
    })
}

/// Where the reconcile of `object` is created: in the object's namespace,
/// so that an operator bound by a RoleBinding there may delegate it, or at
/// the cluster scope for a cluster-scoped object.
pub fn reconciles_path(object: &DynamicObject) -> String {
    match object.metadata.namespace.as_deref() {
        Some(namespace) if !namespace.is_empty() => {
            format!("{GROUP_VERSION_PATH}/namespaces/{namespace}/reconciles")
        }
        _ => format!("{GROUP_VERSION_PATH}/reconciles"),
    }
}

/// Classifies a non-success answer.
fn error_from(status: StatusCode, retry_header: Option<Duration>, body: &[u8]) -> DelegateError {
    let parsed: StatusBody = serde_json::from_slice(body).unwrap_or_else(|_| StatusBody {
        message: String::from_utf8_lossy(body).trim().to_owned(),
        ..Default::default()
    });
    let hinted = retry_header.is_some()
        || parsed
            .details
            .as_ref()
            .is_some_and(|d| d.retry_after_seconds.is_some());
    let retry_after = retry_header
        .or_else(|| {
            parsed
                .details
                .as_ref()
                .and_then(|d| d.retry_after_seconds)
                .map(Duration::from_secs)
        })
        .unwrap_or(DEFAULT_RETRY_AFTER);
    let message = parsed.message;
    match status {
        // kplug's own 503s always carry a retry hint; kube-apiserver's, when
        // it cannot reach kplug, never do.
        StatusCode::SERVICE_UNAVAILABLE if !hinted => {
            DelegateError::Unreachable(format!("kube-apiserver could not reach kplug: {message}"))
        }
        StatusCode::SERVICE_UNAVAILABLE => DelegateError::Unavailable {
            message,
            retry_after,
        },
        StatusCode::TOO_MANY_REQUESTS => DelegateError::TooManyRequests {
            message,
            retry_after,
        },
        StatusCode::FORBIDDEN => DelegateError::Forbidden(message),
        StatusCode::NOT_FOUND => DelegateError::NotServed(message),
        StatusCode::GATEWAY_TIMEOUT => DelegateError::Timeout(message),
        StatusCode::BAD_REQUEST
        | StatusCode::UNPROCESSABLE_ENTITY
        | StatusCode::PAYLOAD_TOO_LARGE
        | StatusCode::UNSUPPORTED_MEDIA_TYPE => DelegateError::Rejected(message),
        other => DelegateError::Failed {
            code: other.as_u16(),
            reason: parsed.reason,
            message,
        },
    }
}

/// Where an operator's reconciles go: through kube-apiserver's APIService,
/// or straight to kplug (`crate::direct`).
#[derive(Clone)]
pub struct Delegator {
    /// Without kube's retries: kplug's 503 and 429 are answers the operator
    /// acts on (conditions, wake-ups, its own backoff), not faults to retry
    /// for minutes inside one reconcile.
    client: Client,
    /// kplug's URL on the direct path.
    direct: Option<http::Uri>,
}

impl Delegator {
    /// Through kube-apiserver, with `client`'s identity.
    pub fn through_kube_apiserver(client: Client) -> Self {
        Self {
            client,
            direct: None,
        }
    }

    /// Straight to kplug at `url`, with a `client` made for it.
    pub fn direct(client: Client, url: http::Uri) -> Self {
        Self {
            client,
            direct: Some(url),
        }
    }

    /// The client the reconciles go through, for other requests to kplug
    /// by the same way (whether kplug answers again).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends one delegation and returns the plugin's answer.
    pub async fn delegate(
        &self,
        delegation: &Delegation<'_>,
    ) -> Result<ReconcileStatus, DelegateError> {
        let Some(url) = &self.direct else {
            return delegate(&self.client, delegation).await;
        };
        let mut tries = 1;
        loop {
            match delegate(&self.client, delegation).await {
                Err(DelegateError::Transport(error))
                    if is_refused(&error) && tries < REFUSED_CONNECTION_TRIES =>
                {
                    tries += 1;
                    debug!(%url, tries, "kplug refused the connection; trying a new one");
                }
                // No HTTP answer from kplug itself: as kube-apiserver's 503
                // when it cannot reach kplug.
                Err(DelegateError::Transport(error)) if is_unanswered(&error) => {
                    return Err(DelegateError::Unreachable(format!(
                        "kplug could not be reached at {url}: {}",
                        crate::words::kube_error(&error)
                    )));
                }
                answer => return answer,
            }
        }
    }
}

/// On the direct path, how many connections one delegation tries while
/// kplug's Service refuses them. kube-proxy sends each new connection to
/// one of kplug's endpoints; a replica that died before its endpoint was
/// removed refuses it, and another may take the next. A refused connection
/// carried no request, so trying again cannot reconcile twice.
const REFUSED_CONNECTION_TRIES: u32 = 3;

/// Whether the request got no HTTP answer (the connection was refused,
/// broke or timed out), rather than an answer the client could not use.
fn is_unanswered(error: &kube::Error) -> bool {
    matches!(error, kube::Error::HyperError(_) | kube::Error::Service(_))
}

/// Whether the connection was refused, so that no request was sent.
fn is_refused(error: &kube::Error) -> bool {
    let first: &(dyn std::error::Error + 'static) = error;
    std::iter::successors(Some(first), |cause| cause.source()).any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// Sends one delegation with `client` and returns the plugin's answer.
async fn delegate(
    client: &Client,
    delegation: &Delegation<'_>,
) -> Result<ReconcileStatus, DelegateError> {
    let body = serde_json::to_vec(&request_body(delegation)?)
        .map_err(|e| DelegateError::Decode(format!("encoding the request: {e}")))?;
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(reconciles_path(delegation.object))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json");
    if let Some(traceparent) = &delegation.traceparent {
        request = request.header(TRACEPARENT, traceparent.to_string());
    }
    let request = request
        .body(body.into())
        .map_err(|e| DelegateError::Decode(format!("building the request: {e}")))?;
    let response = client.send(request).await?;
    let status = response.status();
    let retry_header = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .map(Duration::from_secs);
    let bytes = response.into_body().collect_bytes().await?;
    if !status.is_success() {
        return Err(error_from(status, retry_header, &bytes));
    }
    let answer: Reconcile = serde_json::from_slice(&bytes)
        .map_err(|e| DelegateError::Decode(format!("decoding the Reconcile: {e}")))?;
    answer
        .status
        .ok_or_else(|| DelegateError::Decode("the Reconcile has no status".to_owned()))
}

#[cfg(test)]
mod tests {
    use kube::api::ApiResource;
    use serde_json::json;

    use super::*;

    /// The error of a GET to `url` with a client as the direct path's.
    async fn error_at(url: &str) -> kube::Error {
        let mut config = kube::Config::new(url.parse().expect("URL"));
        config.accept_invalid_certs = true;
        let client = Client::try_from(config).expect("client");
        let request = Request::get("/version").body(Vec::new()).expect("request");
        client
            .request_text(request)
            .await
            .expect_err("no server to answer")
    }

    #[tokio::test]
    async fn only_a_refused_connection_is_tried_again() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = closed.local_addr().expect("address").port();
        drop(closed);
        let refused = error_at(&format!("https://127.0.0.1:{port}")).await;
        assert!(is_refused(&refused), "{refused:?}");
        assert!(is_unanswered(&refused));

        // A server that takes the connection and closes it: the request may
        // have reached it.
        let hangs_up = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = hangs_up.local_addr().expect("address").port();
        tokio::spawn(async move {
            while let Ok((connection, _)) = hangs_up.accept().await {
                drop(connection);
            }
        });
        let closed = error_at(&format!("https://127.0.0.1:{port}")).await;
        assert!(!is_refused(&closed), "{closed:?}");
        assert!(is_unanswered(&closed), "{closed:?}");
    }

    #[test]
    fn reconciles_are_created_in_the_objects_namespace() {
        let resource = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "example.com",
            "v1",
            "Widget",
        ));
        let namespaced = DynamicObject::new("w", &resource).within("team-a");
        assert_eq!(
            reconciles_path(&namespaced),
            "/apis/plugins.kplug.io/v1alpha1/namespaces/team-a/reconciles"
        );
        let cluster_scoped = DynamicObject::new("w", &resource);
        assert_eq!(
            reconciles_path(&cluster_scoped),
            "/apis/plugins.kplug.io/v1alpha1/reconciles"
        );
    }

    #[test]
    fn the_body_carries_the_object_without_managed_fields() {
        let resource = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "myorg.org",
            "v1alpha1",
            "DatabaseTable",
        ));
        let mut object = DynamicObject::new("users", &resource).within("default");
        object.metadata.managed_fields = Some(vec![Default::default()]);
        object.data = json!({"spec": {"serverName": "db", "big": 18446744073709551615u64}});
        let api = ApiSelector {
            group: "myorg.org".into(),
            resource: "databasetables".into(),
            version: String::new(),
        };
        let body = request_body(&Delegation {
            operation: Operation::Finalize,
            api: &api,
            object: &object,
            extensions: &[],
            preferred_implementation: Some("MariaDB".into()),
            required_implementation: Some("PostgreSQL".into()),
            version_constraint: Some(">=1.4, >=1.0.0, <2.0.0".into()),
            timeout: Duration::from_millis(1500),
            traceparent: None,
            observed_children: &[],
            child_scope: ChildScope::Namespace,
        })
        .expect("encodes");
        let json = serde_json::to_value(&body).expect("serializes");
        assert_eq!(json["spec"]["operation"], "Finalize");
        assert_eq!(json["spec"]["timeoutSeconds"], 1);
        assert_eq!(json["spec"]["requiredImplementation"], "PostgreSQL");
        assert_eq!(json["spec"]["versionConstraint"], ">=1.4, >=1.0.0, <2.0.0");
        assert_eq!(
            json["spec"]["api"],
            json!({"group": "myorg.org", "resource": "databasetables"})
        );
        assert_eq!(json["spec"]["object"]["metadata"]["name"], "users");
        assert!(
            json["spec"]["object"]["metadata"]
                .get("managedFields")
                .is_none()
        );
        assert_eq!(
            json["spec"]["object"]["spec"]["big"],
            json!(18446744073709551615u64)
        );
    }

    #[test]
    fn status_errors_are_typed_with_their_retry_hint() {
        let body = json!({"kind": "Status", "code": 503, "reason": "ServiceUnavailable",
            "message": "no Ready plugin serves databasetables.myorg.org",
            "details": {"retryAfterSeconds": 3}})
        .to_string();
        let error = error_from(StatusCode::SERVICE_UNAVAILABLE, None, body.as_bytes());
        assert_eq!(error.reason(), "PluginUnavailable");
        assert_eq!(error.retry_after(), Some(Duration::from_secs(3)));
        assert!(error.to_string().contains("no Ready plugin"));
        let header_wins = error_from(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Duration::from_secs(7)),
            body.as_bytes(),
        );
        assert_eq!(header_wins.retry_after(), Some(Duration::from_secs(7)));
        let cases = [
            (StatusCode::FORBIDDEN, "Forbidden"),
            (StatusCode::NOT_FOUND, "KplugNotServed"),
            (StatusCode::GATEWAY_TIMEOUT, "PluginTimeout"),
            (StatusCode::UNPROCESSABLE_ENTITY, "ReconcileRejected"),
            (StatusCode::INTERNAL_SERVER_ERROR, "DelegationFailed"),
        ];
        for (code, reason) in cases {
            assert_eq!(
                error_from(code, None, b"not json").reason(),
                reason,
                "{code}"
            );
        }
        assert_eq!(
            error_from(StatusCode::FORBIDDEN, None, b"plain text refusal").to_string(),
            "plain text refusal"
        );
    }

    #[test]
    fn a_503_without_kplugs_retry_hint_is_kube_apiserver_not_reaching_kplug() {
        // What kube-apiserver 1.20's aggregator answers with no Ready kplug
        // endpoint, and when its connection to kplug breaks.
        for body in [
            &b"service unavailable\n"[..],
            br#"{"kind":"Status","code":503,"reason":"ServiceUnavailable","message":"error trying to reach service: unexpected EOF"}"#,
        ] {
            let error = error_from(StatusCode::SERVICE_UNAVAILABLE, None, body);
            assert_eq!(error.reason(), "KplugUnavailable", "{error}");
            assert_eq!(error.retry_after(), None);
        }
        let kplugs = error_from(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(Duration::from_secs(1)),
            b"{}",
        );
        assert_eq!(kplugs.reason(), "PluginUnavailable");
    }
}
