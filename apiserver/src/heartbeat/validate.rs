//! Turns a heartbeat from the wire into a [`Declaration`], or says precisely
//! what is wrong with it.

use std::fmt::Display;
use std::time::Duration;

use kplug_api::validation;
use kplug_proto::v1alpha1::{HeartbeatRequest, PROTOCOL_VERSION};

use crate::identity;
use crate::registry::{Declaration, Registry};
use crate::v1alpha1::{ExtensionKind, PluginApi, Protocol, labels};

const MAX_VERSION_LEN: usize = 63;
const MAX_EXTENSIONS: usize = 64;
const MAX_LABELS: usize = 64;
const MAX_CAPABILITIES: usize = 32;
/// A canary takes part of the calls, never all: 100 would be a stable instance.
const MAX_CANARY_WEIGHT: u32 = 99;
const MAX_SHADOW_PERCENT: u32 = 100;

/// One invalid field, worded like Kubernetes field errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a heartbeat could not become a declaration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("invalid heartbeat: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Fields(Vec<FieldError>),
    #[error(
        "unsupported protocol version {0:?}: this server speaks {PROTOCOL_VERSION}; upgrade the \
         plugin SDK or the server"
    )]
    UnsupportedProtocol(String),
}

/// The field errors found so far. Fields are named with `impl Display`
/// (a `&str`, or `format_args!` for an indexed one), written out only for
/// an error: a valid heartbeat, the one that comes every few seconds,
/// formats no field name.
#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn check(&mut self, field: impl Display, value: &str, problem: Option<String>) {
        if let Some(problem) = problem {
            self.0.push(FieldError {
                field: field.to_string(),
                message: format!("Invalid value: {value:?}: {problem}"),
            });
        }
    }

    fn required(&mut self, field: impl Display, value: &str) -> bool {
        if value.is_empty() {
            self.0.push(FieldError {
                field: field.to_string(),
                message: "Required value".to_owned(),
            });
        }
        !value.is_empty()
    }

    fn too_many(&mut self, field: impl Display, count: usize, max: usize) {
        if count > max {
            self.0.push(FieldError {
                field: field.to_string(),
                message: format!("Too many: {count}: must have at most {max} items"),
            });
        }
    }
}

fn short_text(value: &str) -> Option<String> {
    let ok = value.len() <= MAX_VERSION_LEN
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c));
    (!ok).then(|| {
        format!(
            "must be at most {MAX_VERSION_LEN} characters of letters, digits, '-', '_', '.' or '+'"
        )
    })
}

/// A name to verify in a certificate: a DNS name, or an IP address for
/// certificates issued to one. Names under kplug's identity suffix are
/// plugin identities: plugin `plugin` may declare only its own.
fn server_name(value: &str, plugin: &str) -> Option<String> {
    if value.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    if let Some(problem) = validation::dns1123_subdomain(value) {
        return Some(format!("must be an IP address or a DNS name: {problem}"));
    }
    let own = identity::identity(plugin);
    identity::plugin_of(value)
        .is_some_and(|named| named != plugin)
        .then(|| {
            format!(
                "names under {} are plugin identities: plugin {plugin:?} may declare only {own:?}",
                identity::IDENTITY_SUFFIX
            )
        })
}

fn interval(duration: Option<&prost_types::Duration>) -> Result<Option<Duration>, String> {
    match duration {
        None => Ok(None),
        Some(d) if d.seconds == 0 && d.nanos == 0 => Ok(None),
        Some(d) => Duration::try_from(*d)
            .map(Some)
            .map_err(|_| "must be a positive duration".to_owned()),
    }
}

/// Validates `request` and clamps its interval to what `registry` accepts.
/// `registered_by` is the authenticated identity, when there is one.
pub fn declaration(
    request: HeartbeatRequest,
    registry: &Registry,
    registered_by: Option<String>,
) -> Result<Declaration, Invalid> {
    let protocol = request.protocol.unwrap_or_default();
    if !protocol.version.is_empty() && protocol.version != PROTOCOL_VERSION {
        return Err(Invalid::UnsupportedProtocol(protocol.version));
    }
    let mut errors = Errors::default();
    if errors.required("name", &request.name) {
        errors.check(
            "name",
            &request.name,
            validation::dns1123_subdomain(&request.name),
        );
    }
    if errors.required("version", &request.version) {
        errors.check("version", &request.version, short_text(&request.version));
    }
    let api = request.api.unwrap_or_default();
    if errors.required("api.group", &api.group) {
        errors.check(
            "api.group",
            &api.group,
            validation::dns1123_subdomain(&api.group),
        );
    }
    if errors.required("api.resource", &api.resource) {
        errors.check(
            "api.resource",
            &api.resource,
            validation::dns1123_label(&api.resource),
        );
    }
    if errors.required("api.version", &api.version) {
        errors.check(
            "api.version",
            &api.version,
            validation::dns1123_label(&api.version),
        );
    }
    if errors.required("implementation", &request.implementation) {
        errors.check(
            "implementation",
            &request.implementation,
            validation::label_value(&request.implementation),
        );
    }
    if errors.required("address", &request.address) {
        errors.check(
            "address",
            &request.address,
            validation::host_port(&request.address),
        );
    }
    if !request.instance.is_empty() {
        errors.check(
            "instance",
            &request.instance,
            validation::dns1123_subdomain(&request.instance),
        );
    }
    if !request.server_name.is_empty() {
        errors.check(
            "serverName",
            &request.server_name,
            server_name(&request.server_name, &request.name),
        );
    }
    if request.canary_weight > MAX_CANARY_WEIGHT {
        errors.0.push(FieldError {
            field: "canaryWeight".to_owned(),
            message: format!(
                "Invalid value: {}: must be between 0 and {MAX_CANARY_WEIGHT}, inclusive (the \
                 percentage of objects a canary takes; 0 for a stable instance)",
                request.canary_weight
            ),
        });
    }
    if request.shadow_percent > MAX_SHADOW_PERCENT {
        errors.0.push(FieldError {
            field: "shadowPercent".to_owned(),
            message: format!(
                "Invalid value: {}: must be between 0 and {MAX_SHADOW_PERCENT}, inclusive (the \
                 percentage of reconciles a shadow receives a copy of; 0 for an instance that \
                 serves callers)",
                request.shadow_percent
            ),
        });
    } else if request.shadow_percent > 0 && request.canary_weight > 0 {
        errors.0.push(FieldError {
            field: "shadowPercent".to_owned(),
            message: format!(
                "Invalid value: {}: must be 0 when canaryWeight is set (a shadow serves no caller)",
                request.shadow_percent
            ),
        });
    }
    errors.too_many("extensions", request.extensions.len(), MAX_EXTENSIONS);
    for (i, extension) in request.extensions.iter().enumerate() {
        if errors.required(format_args!("extensions[{i}].group"), &extension.group) {
            errors.check(
                format_args!("extensions[{i}].group"),
                &extension.group,
                validation::dns1123_subdomain(&extension.group),
            );
        }
        if errors.required(format_args!("extensions[{i}].kind"), &extension.kind) {
            errors.check(
                format_args!("extensions[{i}].kind"),
                &extension.kind,
                validation::kind_name(&extension.kind),
            );
        }
        if !extension.version.is_empty() {
            errors.check(
                format_args!("extensions[{i}].version"),
                &extension.version,
                validation::dns1123_label(&extension.version),
            );
        }
    }
    errors.too_many("labels", request.labels.len(), MAX_LABELS);
    for (key, value) in &request.labels {
        errors.check(
            format_args!("labels[{key}]"),
            key,
            validation::label_key(key),
        );
        errors.check(
            format_args!("labels[{key}]"),
            value,
            validation::label_value(value),
        );
        if key.starts_with(labels::RESERVED_PREFIX) {
            errors.check(
                format_args!("labels[{key}]"),
                key,
                Some(format!(
                    "the prefix {:?} is reserved for kplug",
                    labels::RESERVED_PREFIX
                )),
            );
        }
    }
    errors.too_many(
        "protocol.capabilities",
        protocol.capabilities.len(),
        MAX_CAPABILITIES,
    );
    for (i, capability) in protocol.capabilities.iter().enumerate() {
        errors.check(
            format_args!("protocol.capabilities[{i}]"),
            capability,
            validation::kind_name(capability),
        );
    }
    if !protocol.sdk.is_empty() && protocol.sdk.len() > 128 {
        errors.check(
            "protocol.sdk",
            &protocol.sdk,
            Some("must be at most 128 characters".to_owned()),
        );
    }
    let requested = match interval(request.interval.as_ref()) {
        Ok(requested) => requested,
        Err(problem) => {
            errors.0.push(FieldError {
                field: "interval".to_owned(),
                message: format!("Invalid value: {:?}: {problem}", request.interval),
            });
            None
        }
    };
    if !errors.0.is_empty() {
        return Err(Invalid::Fields(errors.0));
    }
    Ok(Declaration {
        name: request.name,
        instance: request.instance,
        draining: request.draining,
        version: request.version,
        api: PluginApi {
            group: api.group,
            resource: api.resource,
            version: api.version,
        },
        implementation: request.implementation,
        address: request.address,
        server_name: request.server_name,
        canary_weight: request.canary_weight,
        shadow_percent: request.shadow_percent,
        extensions: request
            .extensions
            .into_iter()
            .map(|e| ExtensionKind {
                group: e.group,
                version: e.version,
                kind: e.kind,
            })
            .collect(),
        labels: request.labels.into_iter().collect(),
        interval: registry.effective_interval(requested),
        protocol: Protocol {
            version: PROTOCOL_VERSION.to_owned(),
            sdk: protocol.sdk,
            capabilities: protocol.capabilities,
        },
        registered_by,
    })
}
