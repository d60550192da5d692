//! Every way a command can fail, each with what to do about it: a person
//! reads these, so each says what went wrong and the next step.

use http::StatusCode;
use kplug_operator::ExtensionError;
use kube::core::Status;

use crate::connect::Asked;

/// The ClusterRole `deploy/clusterroles.yaml` ships for `create reconciles`.
const OPERATOR_ROLE: &str = "kplug:operator";
/// The ClusterRole for reading plugins (aggregated into `view`).
const READER_ROLE: &str = "kplug:reader";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line names something malformed.
    #[error("{0}")]
    Usage(String),
    #[error("cannot load the kubeconfig: {0}")]
    Config(String),
    #[error(
        "the server doesn't have a resource type \"{0}\"\n  `kubectl api-resources` lists the types it serves; is the CRD installed?"
    )]
    UnknownType(String),
    #[error(
        "{resource} \"{name}\" not found{}\n  check the name and the namespace (-n NAMESPACE; `kubectl get {resource} -A` lists all)",
        in_namespace(namespace.as_deref())
    )]
    NotFound {
        resource: String,
        name: String,
        namespace: Option<String>,
    },
    #[error(
        "you may not {verb} {resource}{}: {message}\n  {hint}; check with `kubectl auth can-i {verb} {resource}{}`",
        in_namespace(namespace.as_deref()),
        namespace.as_deref().map(|n| format!(" -n {n}")).unwrap_or_default()
    )]
    Forbidden {
        verb: String,
        resource: String,
        namespace: Option<String>,
        message: String,
        hint: String,
    },
    /// kplug refused a right on an object of the request (its field, e.g.
    /// `spec.object`): the message names the verb, resource and namespace.
    #[error(
        "you may not have a plugin act on {field}: {message}\n  kplug delegates only what a controller of the object may do (update its status to reconcile it, update its finalizers to finalize it, get it for a dry run, get each extension); ask a cluster admin for a Role or ClusterRole that grants the right named above"
    )]
    ObjectForbidden { field: String, message: String },
    #[error(
        "the cluster refused your credentials: {0}\n  check your kubeconfig's user (kubectl config view --minify) or log in again"
    )]
    Unauthorized(String),
    #[error("{0}\n  {hint}", hint = extension_hint(.0))]
    Extension(#[from] ExtensionError),
    #[error(
        "kplug is not installed: the cluster does not serve reconciles.plugins.kplug.io ({0})\n  install kplug (see its README, \"Install\"), then check `kubectl get apiservice v1alpha1.plugins.kplug.io`"
    )]
    KplugNotInstalled(String),
    #[error(
        "kplug's API is unavailable ({0})\n  its APIService is not Available: check `kubectl get apiservice v1alpha1.plugins.kplug.io` and kplug's pods (kubectl -n kplug-system get pods)"
    )]
    KplugUnavailable(String),
    #[error(
        "no Ready plugin can take it: {message}\n  start a plugin for {api} (or wait until one is Ready); `kubectl kplug plugins {api}` lists them"
    )]
    NoReadyPlugin { message: String, api: String },
    #[error("plugin \"{0}\" not found\n  `kubectl kplug plugins` lists the registered plugins")]
    PluginNotFound(String),
    #[error(
        "the plugin is at its limit of calls in flight: {message}\n  retry in {retry_after_seconds}s"
    )]
    TooManyRequests {
        message: String,
        retry_after_seconds: u64,
    },
    #[error("the plugin did not answer in time: {0}\n  retry, or give it longer with --timeout")]
    Timeout(String),
    #[error("kplug refused the request: {0}")]
    Rejected(String),
    /// `kubectl kplug render`'s plugin command did not start serving.
    #[error("the plugin did not start: {0}")]
    PluginNotStarted(String),
    /// `kubectl kplug render` got no answer it can print.
    #[error("{0}")]
    PluginAnswer(String),
    /// The plugin answered and reported a failure; its outcome is printed.
    #[error("the plugin reported a failure: {0}")]
    PluginFailed(String),
    #[error("the server answered {code} {reason}: {message}")]
    Server {
        code: u16,
        reason: String,
        message: String,
    },
    #[error("talking to the cluster: {0}")]
    Transport(String),
    #[error("writing the output: {0}")]
    Output(String),
}

fn in_namespace(namespace: Option<&str>) -> String {
    namespace
        .map(|n| format!(" in namespace \"{n}\""))
        .unwrap_or_default()
}

fn extension_hint(error: &ExtensionError) -> String {
    match error {
        ExtensionError::NotFound { reference } => format!(
            "create the extension object {} or fix the reference to it (--extensions-path says where references are)",
            reference.name
        ),
        ExtensionError::KindNotServed { .. } => {
            "install the CRD of the extension's kind, or fix the reference's apiVersion and kind".to_owned()
        }
        ExtensionError::Reference(_) => {
            "fix the object's extension references (apiVersion, kind, name), or point --extensions-path elsewhere".to_owned()
        }
        ExtensionError::Read { .. } => {
            "you need get rights on the extension's resource (`kubectl auth can-i get RESOURCE`)"
                .to_owned()
        }
        ExtensionError::InvalidObject(_) => "check the object's spec".to_owned(),
    }
}

/// The Kubernetes `Status` of an API error, when the call got one.
pub fn api_status(error: &kube::Error) -> Option<&Status> {
    match error {
        kube::Error::Api(status) => Some(status),
        _ => None,
    }
}

impl Error {
    /// A client error on `verb resource` (e.g. `get databasetables.myorg.org`).
    pub fn from_kube(
        error: kube::Error,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> Self {
        let Some(status) = api_status(&error) else {
            return Self::Transport(error.to_string());
        };
        match status.code {
            401 => Self::Unauthorized(status.message.clone()),
            403 => Self::Forbidden {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                namespace: namespace.map(str::to_owned),
                message: status.message.clone(),
                hint: hint_for(resource, namespace),
            },
            code => Self::Server {
                code,
                reason: status.reason.clone(),
                message: status.message.clone(),
            },
        }
    }

    /// kplug's (or the aggregator's) answer to `create reconciles` or
    /// `list plugins`, when it was not a success. `body` is a `Status` from
    /// kube-apiserver or kplug, or plain text from the aggregator's proxy.
    pub fn from_kplug(code: StatusCode, body: &[u8], asked: &Asked<'_>) -> Self {
        let Asked {
            verb,
            resource,
            namespace,
            api,
        } = *asked;
        let status: Option<Status> = serde_json::from_slice(body)
            .ok()
            .filter(|s: &Status| !s.message.is_empty() || s.code != 0);
        let message = status.as_ref().map_or_else(
            || String::from_utf8_lossy(body).trim().to_owned(),
            |s| s.message.clone(),
        );
        let details = status.as_ref().and_then(|s| s.details.as_ref());
        match code {
            StatusCode::UNAUTHORIZED => Self::Unauthorized(message),
            // kplug names the object's field in a FieldValueForbidden cause.
            StatusCode::FORBIDDEN
                if let Some(field) = details
                    .into_iter()
                    .flat_map(|d| &d.causes)
                    .find(|c| c.reason == "FieldValueForbidden")
                    .map(|c| c.field.clone()) =>
            {
                Self::ObjectForbidden { field, message }
            }
            StatusCode::FORBIDDEN => Self::Forbidden {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                namespace: namespace.map(str::to_owned),
                message,
                hint: hint_for(resource, namespace),
            },
            // kplug says which plugin it did not find; kube-apiserver's 404
            // for a group nobody serves has no details.
            StatusCode::NOT_FOUND => match details.filter(|d| d.kind == "plugins") {
                Some(details) => Self::PluginNotFound(details.name.clone()),
                None => Self::KplugNotInstalled(message),
            },
            // kplug's own 503 is a Status with a retry hint; the aggregator
            // answers plain text when the APIService is unavailable.
            StatusCode::SERVICE_UNAVAILABLE
                if details.is_some_and(|d| d.retry_after_seconds > 0) =>
            {
                Self::NoReadyPlugin {
                    message,
                    api: api.to_owned(),
                }
            }
            StatusCode::SERVICE_UNAVAILABLE => Self::KplugUnavailable(message),
            StatusCode::TOO_MANY_REQUESTS => Self::TooManyRequests {
                message,
                retry_after_seconds: details
                    .map(|d| u64::from(d.retry_after_seconds))
                    .unwrap_or(1),
            },
            StatusCode::GATEWAY_TIMEOUT => Self::Timeout(message),
            StatusCode::BAD_REQUEST
            | StatusCode::UNPROCESSABLE_ENTITY
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::Rejected(message),
            other => Self::Server {
                code: other.as_u16(),
                reason: status.map(|s| s.reason).unwrap_or_default(),
                message,
            },
        }
    }
}

/// Which role grants a right, for kplug's own resources; a namespaced
/// right can also be bound in its namespace alone.
fn hint_for(resource: &str, namespace: Option<&str>) -> String {
    match (resource, namespace) {
        ("reconciles.plugins.kplug.io", Some(namespace)) => format!(
            "ask a cluster admin to bind the ClusterRole {OPERATOR_ROLE} (or edit) to you with a RoleBinding in the namespace \"{namespace}\" (or a ClusterRoleBinding)"
        ),
        ("reconciles.plugins.kplug.io", None) => format!(
            "ask a cluster admin to bind the ClusterRole {OPERATOR_ROLE} (or edit) to you with a ClusterRoleBinding"
        ),
        ("plugins.kplug.io", _) => format!(
            "ask a cluster admin to bind the ClusterRole {READER_ROLE} (or view) to you with a ClusterRoleBinding"
        ),
        _ => "ask a cluster admin for a Role or ClusterRole that grants it".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kplug(code: StatusCode, body: &str) -> String {
        let asked = Asked {
            verb: "create",
            resource: "reconciles.plugins.kplug.io",
            namespace: None,
            api: "databasetables.myorg.org",
        };
        Error::from_kplug(code, body.as_bytes(), &asked).to_string()
    }

    #[test]
    fn forbidden_names_the_verb_and_resource_and_the_role() {
        let text = kplug(
            StatusCode::FORBIDDEN,
            r#"{"kind":"Status","code":403,"reason":"Forbidden","message":"reconciles.plugins.kplug.io is forbidden: User \"nobody\" cannot create resource \"reconciles\""}"#,
        );
        assert!(
            text.starts_with("you may not create reconciles.plugins.kplug.io: "),
            "{text}"
        );
        assert!(text.contains("kplug:operator"), "{text}");
        assert!(
            text.contains("kubectl auth can-i create reconciles.plugins.kplug.io`"),
            "{text}"
        );
    }

    #[test]
    fn a_namespaced_refusal_offers_a_role_binding_there() {
        let asked = Asked {
            verb: "create",
            resource: "reconciles.plugins.kplug.io",
            namespace: Some("team-a"),
            api: "databasetables.myorg.org",
        };
        let body = r#"{"kind":"Status","code":403,"reason":"Forbidden","message":"reconciles.plugins.kplug.io is forbidden: User \"op\" cannot create resource \"reconciles\" in API group \"plugins.kplug.io\" in the namespace \"team-a\""}"#;
        let text = Error::from_kplug(StatusCode::FORBIDDEN, body.as_bytes(), &asked).to_string();
        assert!(
            text.starts_with(
                "you may not create reconciles.plugins.kplug.io in namespace \"team-a\": "
            ),
            "{text}"
        );
        assert!(
            text.contains("with a RoleBinding in the namespace \"team-a\""),
            "{text}"
        );
        assert!(
            text.contains("kubectl auth can-i create reconciles.plugins.kplug.io -n team-a`"),
            "{text}"
        );
    }

    #[test]
    fn an_object_refused_says_which_right_is_missing() {
        let text = kplug(
            StatusCode::FORBIDDEN,
            r#"{"kind":"Status","code":403,"reason":"Forbidden","message":"databasetables.myorg.org \"t\" is forbidden: User \"op\" cannot update resource \"databasetables/status\" in API group \"myorg.org\" in the namespace \"team-b\"","details":{"name":"t","group":"myorg.org","kind":"databasetables","causes":[{"reason":"FieldValueForbidden","field":"spec.object","message":"..."}]}}"#,
        );
        assert!(
            text.starts_with(
                "you may not have a plugin act on spec.object: databasetables.myorg.org \"t\" is forbidden: User \"op\" cannot update resource \"databasetables/status\""
            ),
            "{text}"
        );
        assert!(text.contains("update its status to reconcile it"), "{text}");
    }

    #[test]
    fn kplug_and_the_aggregator_are_told_apart() {
        let none_ready = kplug(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"kind":"Status","code":503,"reason":"ServiceUnavailable","message":"no Ready plugin serves databasetables.myorg.org","details":{"retryAfterSeconds":1}}"#,
        );
        assert!(
            none_ready.starts_with("no Ready plugin can take it: no Ready plugin serves"),
            "{none_ready}"
        );
        let unavailable = kplug(StatusCode::SERVICE_UNAVAILABLE, "service unavailable\n");
        assert!(
            unavailable.starts_with("kplug's API is unavailable (service unavailable)"),
            "{unavailable}"
        );
        let not_installed = kplug(
            StatusCode::NOT_FOUND,
            r#"{"kind":"Status","code":404,"reason":"NotFound","message":"the server could not find the requested resource","details":{}}"#,
        );
        assert!(
            not_installed.starts_with("kplug is not installed"),
            "{not_installed}"
        );
        let no_plugin = kplug(
            StatusCode::NOT_FOUND,
            r#"{"kind":"Status","code":404,"reason":"NotFound","message":"plugins.plugins.kplug.io \"ghost\" not found","details":{"name":"ghost","group":"plugins.kplug.io","kind":"plugins"}}"#,
        );
        assert!(
            no_plugin.starts_with("plugin \"ghost\" not found"),
            "{no_plugin}"
        );
    }

    #[test]
    fn not_found_says_where_it_looked() {
        let error = Error::NotFound {
            resource: "databasetables.myorg.org".into(),
            name: "users".into(),
            namespace: Some("shop".into()),
        };
        assert_eq!(
            error.to_string().lines().next(),
            Some("databasetables.myorg.org \"users\" not found in namespace \"shop\"")
        );
    }
}
