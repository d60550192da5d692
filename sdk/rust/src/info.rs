//! What a plugin declares about itself in its heartbeats.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use kplug_proto::v1alpha1 as proto;

use crate::Error;

/// A plugin's self-description, sent with every heartbeat.
///
/// Required parts go through [`PluginInfo::new`]; the rest have chainable
/// setters. The fields stay public so a plugin can also read or adjust them
/// in place.
///
/// ```
/// use kplug_sdk::{ApiRef, PluginInfo};
///
/// # fn main() -> Result<(), kplug_sdk::Error> {
/// let info = PluginInfo::new("tables-postgres", "databasetables.myorg.org/v1alpha1".parse::<ApiRef>()?)
///     .version(env!("CARGO_PKG_VERSION"))
///     .implementation("PostgreSQL")
///     .address("tables-postgres.plugins.svc:50052")
///     .label("team", "storage");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PluginInfo {
    /// DNS-1123 subdomain; becomes the Plugin object's name in kplug.
    pub name: String,
    /// The plugin's own release, e.g. `1.4.2`.
    pub version: String,
    /// The custom resource the plugin reconciles.
    pub api: ApiRef,
    /// The implementation's name, e.g. `PostgreSQL`, used to select a plugin
    /// when several serve the same API.
    pub implementation: String,
    /// `host:port` where kplug reaches the plugin's gRPC service.
    pub address: String,
    /// Extension kinds the plugin understands.
    pub extensions: Vec<Extension>,
    /// Labels for the Plugin object, selectable with `kubectl -l`.
    pub labels: BTreeMap<String, String>,
    /// Features the plugin announces, e.g. `Reconcile`, `Finalize`, `DryRun`.
    pub capabilities: Vec<String>,
    /// A deleted object leaves the plugin nothing to clean up; see
    /// [`without_finalize`](Self::without_finalize).
    pub without_finalize: bool,
}

impl PluginInfo {
    /// A plugin called `name` that reconciles `api`.
    pub fn new(name: impl Into<String>, api: ApiRef) -> Self {
        Self {
            name: name.into(),
            api,
            ..Self::default()
        }
    }

    /// Sets the plugin's own release.
    #[must_use]
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// Sets the implementation's name.
    #[must_use]
    pub fn implementation(mut self, implementation: impl Into<String>) -> Self {
        self.implementation = implementation.into();
        self
    }

    /// Sets the `host:port` kplug dials to reach the plugin.
    #[must_use]
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = address.into();
        self
    }

    /// Adds an extension kind.
    #[must_use]
    pub fn extension(mut self, extension: Extension) -> Self {
        self.extensions.push(extension);
        self
    }

    /// Adds or replaces a label.
    #[must_use]
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Declares that a deleted object leaves nothing to clean up outside
    /// Kubernetes (its children are the operator's to remove): the server
    /// then announces no `Finalize` capability, the operator puts no
    /// finalizer of its own for it on the objects (one write fewer per
    /// object, and a delete waits for nobody), and kplug sends it no
    /// Finalize call.
    #[must_use]
    pub fn without_finalize(mut self) -> Self {
        self.without_finalize = true;
        self
    }

    /// Adds a capability.
    #[must_use]
    pub fn capability(mut self, capability: impl Into<String>) -> Self {
        self.capabilities.push(capability.into());
        self
    }

    /// The heartbeat that declares this plugin, asking for `interval`.
    pub(crate) fn heartbeat_request(&self, interval: Option<Duration>) -> proto::HeartbeatRequest {
        proto::HeartbeatRequest {
            name: self.name.clone(),
            version: self.version.clone(),
            api: Some(proto::PluginApi {
                group: self.api.group.clone(),
                resource: self.api.resource.clone(),
                version: self.api.version.clone(),
            }),
            implementation: self.implementation.clone(),
            address: self.address.clone(),
            extensions: self
                .extensions
                .iter()
                .map(|e| proto::ExtensionKind {
                    group: e.group.clone(),
                    kind: e.kind.clone(),
                    version: e.version.clone(),
                })
                .collect(),
            labels: self.labels.clone().into_iter().collect(),
            // An interval too large for the wire is as good as none: the
            // registry clamps it anyway.
            interval: interval.and_then(|d| prost_types::Duration::try_from(d).ok()),
            protocol: Some(proto::Protocol {
                version: proto::PROTOCOL_VERSION.to_owned(),
                sdk: crate::SDK.to_owned(),
                capabilities: self.capabilities.clone(),
            }),
            ..Default::default()
        }
    }
}

/// A Kubernetes resource: `resource.group/version`, e.g.
/// `databasetables.myorg.org/v1alpha1`.
///
/// Parses from and displays as that string.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ApiRef {
    /// API group, e.g. `myorg.org`.
    pub group: String,
    /// Plural resource name, e.g. `databasetables`.
    pub resource: String,
    /// API version, e.g. `v1alpha1`.
    pub version: String,
}

impl ApiRef {
    /// The resource `resource` in `group/version`.
    pub fn new(
        group: impl Into<String>,
        resource: impl Into<String>,
        version: impl Into<String>,
    ) -> Self {
        Self {
            group: group.into(),
            resource: resource.into(),
            version: version.into(),
        }
    }
}

impl FromStr for ApiRef {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self, Error> {
        let invalid = |reason| Error::InvalidApiRef {
            value: value.to_owned(),
            reason,
        };
        let (qualified, version) = value
            .split_once('/')
            .ok_or_else(|| invalid("missing /version"))?;
        // Plugins reconcile custom resources, which always have a group, so a
        // bare `pods/v1` is a mistake rather than the core group.
        let (resource, group) = qualified
            .split_once('.')
            .ok_or_else(|| invalid("missing .group after the resource"))?;
        if resource.is_empty() {
            return Err(invalid("empty resource"));
        }
        if group.is_empty() {
            return Err(invalid("empty group"));
        }
        if version.is_empty() || version.contains('/') {
            return Err(invalid("version must be one non-empty segment"));
        }
        Ok(Self::new(group, resource, version))
    }
}

impl fmt::Display for ApiRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}/{}", self.resource, self.group, self.version)
    }
}

/// An extension kind a plugin understands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Extension {
    /// API group of the extension.
    pub group: String,
    /// Version within the group; empty means any.
    pub version: String,
    /// The extension's kind.
    pub kind: String,
}

impl Extension {
    /// The kind `kind` in any version of `group`.
    pub fn new(group: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            version: String::new(),
            kind: kind.into(),
        }
    }

    /// Restricts the extension to one version of its group.
    #[must_use]
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_api_refs() {
        let api: ApiRef = "databasetables.myorg.org/v1alpha1".parse().unwrap();
        assert_eq!(api, ApiRef::new("myorg.org", "databasetables", "v1alpha1"));
        assert_eq!(api.to_string(), "databasetables.myorg.org/v1alpha1");

        for bad in [
            "",
            "databasetables.myorg.org",
            "pods/v1",
            ".myorg.org/v1",
            "tables./v1",
            "tables.myorg.org/",
            "tables.myorg.org/v1/x",
        ] {
            assert!(
                matches!(bad.parse::<ApiRef>(), Err(Error::InvalidApiRef { .. })),
                "{bad:?} should not parse"
            );
        }
    }

    #[test]
    fn request_carries_declaration_and_protocol() {
        let info = PluginInfo::new("hello", ApiRef::new("example.com", "greetings", "v1"))
            .version("1.2.3")
            .implementation("Hello")
            .address("127.0.0.1:50052")
            .extension(Extension::new("ext.example.com", "Audit").version("v1"))
            .label("team", "a")
            .capability("Reconcile");
        let request = info.heartbeat_request(Some(Duration::from_secs(5)));
        assert_eq!(request.name, "hello");
        assert_eq!(request.version, "1.2.3");
        assert_eq!(request.api.unwrap().resource, "greetings");
        assert_eq!(request.extensions[0].kind, "Audit");
        assert_eq!(request.labels["team"], "a");
        assert_eq!(request.interval.unwrap().seconds, 5);
        let protocol = request.protocol.unwrap();
        assert_eq!(protocol.version, proto::PROTOCOL_VERSION);
        assert_eq!(
            protocol.sdk,
            format!("kplug-sdk-rust/{}", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(protocol.capabilities, ["Reconcile"]);
        assert!(info.heartbeat_request(None).interval.is_none());
    }
}
