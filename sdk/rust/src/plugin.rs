//! What a plugin implements, and what it receives and answers.

use std::future::Future;
use std::time::Duration;

use kplug_proto::trace::TraceParent;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::time::Instant;

use crate::Child;

/// A kplug plugin: reconciles the objects of its API and cleans up after them.
///
/// Implement it with `async fn`; the futures must be `Send`, since calls run
/// on Tokio's multi-threaded runtime, each in its own task.
///
/// ```
/// use kplug_sdk::{Outcome, Plugin, Request, Severity};
/// use serde_json::json;
///
/// struct Hello;
///
/// impl Plugin for Hello {
///     async fn reconcile(&self, request: Request) -> Outcome {
///         let Some(name) = request.name() else {
///             return Outcome::failure("InvalidObject", "metadata.name is missing");
///         };
///         let greeting = format!("hello, {name}");
///         Outcome::success()
///             .result(Severity::Normal, "Greeted", &greeting)
///             .object_status(json!({ "greeting": greeting }))
///     }
///
///     async fn finalize(&self, _request: Request) -> Outcome {
///         Outcome::success().result(Severity::Normal, "Goodbye", "nothing to clean up")
///     }
/// }
/// ```
///
/// The SDK shields the server from the implementation: a panic becomes the
/// gRPC status `INTERNAL` for that call only, and a call that outlives the
/// caller's deadline is answered with `DEADLINE_EXCEEDED` and cancelled (its
/// future is dropped at its next `.await`). Failures the plugin understands,
/// such as an unreachable database, belong in [`Outcome::failure`] instead,
/// where they reach the operator with a reason.
pub trait Plugin: Send + Sync + 'static {
    /// Brings the world in line with the object's spec.
    ///
    /// When [`Request::dry_run`] is set it must change nothing and only
    /// report what it would do: the SDK announces the `DryRun` capability on
    /// the plugin's behalf.
    fn reconcile(&self, request: Request) -> impl Future<Output = Outcome> + Send;

    /// Cleans up what the object owns before it is deleted. Should succeed
    /// when there is nothing (left) to clean up, since it may be retried.
    /// The default has nothing to clean up: a plugin that keeps it declares
    /// so with [`PluginInfo::without_finalize`](crate::PluginInfo::without_finalize).
    fn finalize(&self, request: Request) -> impl Future<Output = Outcome> + Send {
        let _ = request;
        std::future::ready(Outcome::success())
    }
}

/// One Reconcile or Finalize call, decoded.
///
/// The SDK has checked that the object and every extension are JSON
/// objects. Numbers survive as they came as long as they fit in 64 bits
/// (`u64`, `i64`) or are floats, which covers everything Kubernetes stores.
///
/// Build one with [`Request::new`] to unit-test a plugin without gRPC.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Request {
    /// Unique per request; use it to correlate logs and de-duplicate retries.
    pub operation_id: String,
    /// The W3C trace context kplug sent with the call as `traceparent`
    /// gRPC metadata; `None` when it sent none or one that is not valid
    /// (which never fails the call). See [`trace_id`](Self::trace_id).
    pub trace_parent: Option<TraceParent>,
    /// When true the plugin must not change anything, only report what it
    /// would do.
    pub dry_run: bool,
    /// The custom resource.
    pub object: Value,
    /// The extension objects linked to it, in the caller's order.
    pub extensions: Vec<Value>,
    /// When the SDK answers `DEADLINE_EXCEEDED` and cancels the call: the
    /// caller's deadline less a small margin, so the answer still reaches
    /// it. `None` when the caller set no timeout.
    pub deadline: Option<Instant>,
    /// Who asked kplug for this call (kplug checked their rights on the
    /// object and each extension): for an audit log, or to refuse callers
    /// the plugin does not expect. `None` from a kplug that predates it.
    pub caller: Option<Caller>,
    /// The children earlier answers asked for, as the operator last
    /// observed them, by key; see [`observed_child`](Self::observed_child).
    pub observed_children: Vec<(String, Value)>,
}

/// A Kubernetes user, as kplug authenticated them: the `userInfo` an
/// admission webhook gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Caller {
    /// e.g. `system:serviceaccount:team-a:widgets-operator`.
    pub username: String,
    pub groups: Vec<String>,
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl Caller {
    /// A caller named `username`, in `groups`.
    pub fn new(username: impl Into<String>, groups: Vec<String>) -> Self {
        Self {
            username: username.into(),
            groups,
            extra: Default::default(),
        }
    }
}

impl Request {
    /// A request for `object` with no extensions, no deadline, not a dry run.
    pub fn new(object: Value) -> Self {
        Self {
            operation_id: String::new(),
            trace_parent: None,
            dry_run: false,
            object,
            extensions: Vec::new(),
            deadline: None,
            caller: None,
            observed_children: Vec::new(),
        }
    }

    /// Sets the caller, as if kplug had sent it.
    #[must_use]
    pub fn with_caller(mut self, caller: Caller) -> Self {
        self.caller = Some(caller);
        self
    }

    /// Adds an extension object.
    #[must_use]
    pub fn with_extension(mut self, extension: Value) -> Self {
        self.extensions.push(extension);
        self
    }

    /// Sets whether this is a dry run.
    #[must_use]
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Sets the operation id.
    #[must_use]
    pub fn with_operation_id(mut self, operation_id: impl Into<String>) -> Self {
        self.operation_id = operation_id.into();
        self
    }

    /// Sets the deadline.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the trace context, as if kplug had sent it.
    #[must_use]
    pub fn with_trace_parent(mut self, trace_parent: TraceParent) -> Self {
        self.trace_parent = Some(trace_parent);
        self
    }

    /// The operation id: unique per request; kplug logs it too.
    pub fn operation_id(&self) -> &str {
        &self.operation_id
    }

    /// The trace context the call came with, if a valid one; pass
    /// [`TraceParent::child`] on as `traceparent` to continue the trace in
    /// calls the plugin makes itself.
    pub fn trace_parent(&self) -> Option<&TraceParent> {
        self.trace_parent.as_ref()
    }

    /// The id of the trace the call belongs to, as 32 lowercase hex digits
    /// (e.g. `4bf92f3577b34da6a3ce929d0e0e4736`), the same id kplug and the
    /// operator log; `None` when the call came without a valid
    /// `traceparent`. The SDK already puts it (as `trace_id`) on the span
    /// the call runs in.
    pub fn trace_id(&self) -> Option<String> {
        self.trace_parent.as_ref().map(TraceParent::trace_id)
    }

    /// The object's `metadata.name`.
    pub fn name(&self) -> Option<&str> {
        self.object.pointer("/metadata/name")?.as_str()
    }

    /// The object's `metadata.namespace`; `None` for cluster-scoped objects.
    pub fn namespace(&self) -> Option<&str> {
        self.object.pointer("/metadata/namespace")?.as_str()
    }

    /// The object as a typed value, e.g. a struct with the fields the plugin
    /// reads. Unknown fields are ignored unless `T` denies them.
    ///
    /// # Errors
    ///
    /// When the object does not have the shape of `T`; the error names the
    /// offending field.
    pub fn object_as<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.object)
    }

    /// The first extension of kind `kind` whose `apiVersion` is
    /// `api_version_or_group`, or, when that has no `/`, whose API group is
    /// it. So both `("myorg.org/v1alpha1", "X")` and `("myorg.org", "X")`
    /// find an `X` of `myorg.org/v1alpha1`.
    pub fn extension(&self, api_version_or_group: &str, kind: &str) -> Option<&Value> {
        self.extensions.iter().find(|extension| {
            let api_version = extension["apiVersion"].as_str().unwrap_or_default();
            extension["kind"] == kind
                && if api_version_or_group.contains('/') {
                    api_version == api_version_or_group
                } else {
                    group_of(api_version) == api_version_or_group
                }
        })
    }

    /// [`extension`](Self::extension) as a typed value; `Ok(None)` when the
    /// request carries no such extension.
    ///
    /// # Errors
    ///
    /// When the extension does not have the shape of `T`.
    pub fn extension_as<T: DeserializeOwned>(
        &self,
        api_version_or_group: &str,
        kind: &str,
    ) -> Result<Option<T>, serde_json::Error> {
        self.extension(api_version_or_group, kind)
            .map(T::deserialize)
            .transpose()
    }

    /// Time left until [`deadline`](Self::deadline); zero once it has
    /// passed, `None` without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
    }
}

/// The group of an `apiVersion`: `myorg.org/v1alpha1` → `myorg.org`, and
/// the core group `v1` → the empty string.
fn group_of(api_version: &str) -> &str {
    api_version
        .rsplit_once('/')
        .map_or("", |(group, _version)| group)
}

/// A plugin's answer to one call.
///
/// Build it with [`Outcome::success`] or [`Outcome::failure`] and the
/// chainable setters:
///
/// ```
/// use kplug_sdk::{Condition, ObjectRef, Outcome, Severity};
/// use serde_json::json;
/// use std::time::Duration;
///
/// let extension = ObjectRef::new("myorg.org/v1alpha1", "DatabaseTableMariaDbExtension", "users");
/// let outcome = Outcome::success()
///     .result(Severity::Normal, "TableCreated", "created table users")
///     .condition(Condition::new("Synced", true, "Reconciled", ""))
///     .object_status(json!({ "columns": 2 }))
///     .extension_status(extension, json!({ "storageEngine": "InnoDB" }))
///     .requeue_after(Duration::from_secs(300));
/// assert!(outcome.success);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Outcome {
    /// Whether the call achieved what was asked.
    pub success: bool,
    /// What happened, in order, for people and tools.
    pub results: Vec<ResultEntry>,
    /// Conditions to set on the object, Kubernetes-style.
    pub conditions: Vec<Condition>,
    /// Status for the object, merged by the caller; `None` for none.
    pub object_status: Option<Value>,
    /// Status for extension objects.
    pub extension_statuses: Vec<(ObjectRef, Value)>,
    /// Ask the caller to reconcile again after this long; `None` for never.
    pub requeue_after: Option<Duration>,
    /// The Kubernetes objects that should exist for the object, all of
    /// them; see [`Outcome::child`].
    pub children: Vec<Child>,
}

impl Outcome {
    /// A successful outcome with nothing reported yet.
    pub fn success() -> Self {
        Self {
            success: true,
            ..Self::default()
        }
    }

    /// A failed outcome with one [`Severity::Error`] result saying why.
    ///
    /// `reason` is CamelCase and machine-readable, e.g. `DatabaseUnreachable`.
    pub fn failure(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::default().result(Severity::Error, reason, message)
    }

    /// Adds a result.
    #[must_use]
    pub fn result(
        mut self,
        severity: Severity,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        self.results.push(ResultEntry {
            severity,
            reason: reason.into(),
            message: message.into(),
        });
        self
    }

    /// Adds a condition.
    #[must_use]
    pub fn condition(mut self, condition: Condition) -> Self {
        self.conditions.push(condition);
        self
    }

    /// Sets the object's status: a JSON object, nested at most 100 levels
    /// and at most 1.5 MiB encoded. kplug refuses an answer with any other
    /// status (the caller gets a `500` naming the field), since the
    /// operator could not write it into the object.
    #[must_use]
    pub fn object_status(mut self, status: Value) -> Self {
        self.object_status = Some(status);
        self
    }

    /// Adds the status of an extension object, one the plugin was sent, with
    /// the same rules as [`Outcome::object_status`].
    #[must_use]
    pub fn extension_status(mut self, extension: ObjectRef, status: Value) -> Self {
        self.extension_statuses.push((extension, status));
        self
    }

    /// Asks the caller to reconcile again after `after`.
    #[must_use]
    pub fn requeue_after(mut self, after: Duration) -> Self {
        self.requeue_after = Some(after);
        self
    }
}

/// One thing that happened during a call.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResultEntry {
    /// How much it matters.
    pub severity: Severity,
    /// CamelCase and machine-readable, e.g. `TableCreated`.
    pub reason: String,
    /// For people.
    pub message: String,
}

/// How much a [`ResultEntry`] matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Severity {
    /// Routine, e.g. a change made as asked.
    Normal,
    /// Worth a look, but the call did its job.
    Warning,
    /// Why the call failed.
    Error,
}

/// A Kubernetes-style condition for the object, e.g. `Synced`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Condition {
    /// The condition's type, e.g. `Synced`; CamelCase.
    pub condition_type: String,
    /// Whether it holds.
    pub status: ConditionStatus,
    /// CamelCase and machine-readable.
    pub reason: String,
    /// For people; may be empty.
    pub message: String,
}

impl Condition {
    /// A condition of type `condition_type`; `status` may be a `bool`.
    pub fn new(
        condition_type: impl Into<String>,
        status: impl Into<ConditionStatus>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            condition_type: condition_type.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Whether a [`Condition`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// `"True"`.
    True,
    /// `"False"`.
    False,
    /// `"Unknown"`.
    Unknown,
}

impl ConditionStatus {
    /// The Kubernetes spelling: `True`, `False` or `Unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(holds: bool) -> Self {
        if holds { Self::True } else { Self::False }
    }
}

/// Points at a Kubernetes object, e.g. the extension a status is for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ObjectRef {
    /// e.g. `myorg.org/v1alpha1`.
    pub api_version: String,
    /// e.g. `DatabaseTableMariaDbExtension`.
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl ObjectRef {
    /// The cluster-scoped object `name` of `kind` in `api_version`.
    pub fn new(
        api_version: impl Into<String>,
        kind: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: String::new(),
            name: name.into(),
        }
    }

    /// Places the object in `namespace`.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The reference to `object`, from its `apiVersion`, `kind` and
    /// `metadata`; `None` when one of `apiVersion`, `kind` or
    /// `metadata.name` is missing.
    ///
    /// ```
    /// use kplug_sdk::ObjectRef;
    /// use serde_json::json;
    ///
    /// let object = json!({"apiVersion": "myorg.org/v1alpha1", "kind": "X", "metadata": {"name": "a"}});
    /// assert_eq!(ObjectRef::of(&object), Some(ObjectRef::new("myorg.org/v1alpha1", "X", "a")));
    /// ```
    pub fn of(object: &Value) -> Option<Self> {
        let text = |pointer| object.pointer(pointer).and_then(Value::as_str);
        Some(Self {
            api_version: text("/apiVersion")?.to_owned(),
            kind: text("/kind")?.to_owned(),
            namespace: text("/metadata/namespace").unwrap_or_default().to_owned(),
            name: text("/metadata/name")?.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> Request {
        Request::new(json!({
            "apiVersion": "myorg.org/v1alpha1",
            "kind": "DatabaseTable",
            "metadata": {"name": "users", "namespace": "db"},
            "spec": {"columns": [{"name": "id", "type": "uint64"}]},
        }))
        .with_extension(json!({"apiVersion": "other.org/v1", "kind": "Ext", "metadata": {"name": "x"}}))
        .with_extension(json!({"apiVersion": "myorg.org/v1alpha1", "kind": "Ext", "metadata": {"name": "users"}, "spec": {"n": 1}}))
        .with_extension(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "core"}}))
    }

    #[test]
    fn finds_extensions_by_api_version_or_group() {
        let request = request();
        let by_version = request.extension("myorg.org/v1alpha1", "Ext").unwrap();
        assert_eq!(by_version["metadata"]["name"], "users");
        let by_group = request.extension("myorg.org", "Ext").unwrap();
        assert_eq!(by_group, by_version);
        assert_eq!(
            request.extension("other.org", "Ext").unwrap()["metadata"]["name"],
            "x"
        );
        assert!(request.extension("myorg.org/v1", "Ext").is_none());
        assert!(request.extension("myorg.org", "Other").is_none());
        assert!(request.extension("myorg", "Ext").is_none());
        // The core group is the empty string.
        assert!(request.extension("", "ConfigMap").is_some());
    }

    #[test]
    fn typed_access() {
        #[derive(serde::Deserialize)]
        struct Spec {
            n: u32,
        }
        #[derive(serde::Deserialize)]
        struct Ext {
            spec: Spec,
        }
        #[derive(Debug, serde::Deserialize)]
        struct Strict {
            #[allow(dead_code)]
            spec: Vec<String>,
        }
        let request = request();
        assert_eq!(request.name(), Some("users"));
        assert_eq!(request.namespace(), Some("db"));
        let ext: Ext = request.extension_as("myorg.org", "Ext").unwrap().unwrap();
        assert_eq!(ext.spec.n, 1);
        assert!(
            request
                .extension_as::<Ext>("none.org", "Ext")
                .unwrap()
                .is_none()
        );
        let err = request.object_as::<Strict>().unwrap_err();
        assert!(err.to_string().contains("expected a sequence"), "{err}");
    }

    #[test]
    fn remaining_time() {
        let request = request();
        assert_eq!(request.remaining(), None);
        let soon = request
            .clone()
            .with_deadline(Instant::now() + Duration::from_secs(60));
        assert!(soon.remaining().unwrap() > Duration::from_secs(50));
        let past = request.with_deadline(Instant::now() - Duration::from_millis(1));
        assert_eq!(past.remaining(), Some(Duration::ZERO));
    }

    #[test]
    fn trace_context() {
        let request = request().with_operation_id("op-7");
        assert_eq!(request.operation_id(), "op-7");
        assert_eq!(request.trace_parent(), None);
        assert_eq!(request.trace_id(), None);
        let parent: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap();
        let traced = request.with_trace_parent(parent);
        assert_eq!(traced.trace_parent(), Some(&parent));
        assert_eq!(
            traced.trace_id().as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
    }

    #[test]
    fn failure_carries_an_error_result() {
        let outcome = Outcome::failure("Broken", "it broke");
        assert!(!outcome.success);
        assert_eq!(
            outcome.results,
            [ResultEntry {
                severity: Severity::Error,
                reason: "Broken".into(),
                message: "it broke".into()
            }]
        );
        assert_eq!(
            Condition::new("Synced", false, "Broken", "").status,
            ConditionStatus::False
        );
    }
}
