//! The caller's rights on the objects of a reconcile, checked before any
//! plugin is called ([`kplug_api::access`] says which): in cluster mode,
//! with the same cached SubjectAccessReviews as every request, each object
//! in its own group, namespace and name. Standalone mode has no one to ask:
//! every caller with a certificate of kplug's CA may do everything there.

use std::sync::Arc;

use kplug_api::access::{self, Right};

use super::decode::{self, Names, Object, Spec};
use super::invalid;
use crate::api::status::ApiError;
use crate::auth::delegated::Delegated;
use crate::auth::resources::{ResolveError, Resources, ServedResource, split_api_version};
use crate::auth::{Attributes, AuthError, User};
use crate::v1alpha1::{Operation, Plugin};

/// Checks callers' rights on the objects they send.
pub struct ObjectAccess {
    delegated: Arc<Delegated>,
    resources: Resources,
}

impl ObjectAccess {
    pub fn new(delegated: Arc<Delegated>, resources: Resources) -> Self {
        Self {
            delegated,
            resources,
        }
    }

    /// `Ok` when `user` holds, on the object, on each extension and on each
    /// observed child of `spec`, the right [`kplug_api::access`] names for `operation`. The
    /// first object refused ends the check; its 403 names the object, the
    /// verb and the resource. `spec` was validated: every object has an
    /// apiVersion, a kind and a name.
    pub async fn check(
        &self,
        user: &User,
        plugin: &Plugin,
        operation: Operation,
        dry_run: bool,
        spec: &Spec<'_>,
    ) -> Result<(), ApiError> {
        if self.delegated.always_allowed(user) {
            return Ok(());
        }
        if let Some(object) = &spec.object {
            let right = access::on_object(operation, dry_run);
            self.check_one(user, "spec.object", object, right, Some(plugin))
                .await?;
        }
        for (i, extension) in spec.extensions.iter().enumerate() {
            let field = format!("spec.extensions[{i}]");
            self.check_one(user, &field, extension, access::ON_EXTENSION, None)
                .await?;
        }
        for (i, child) in spec.observed_children.iter().enumerate() {
            let field = format!("spec.observedChildren[{i}].object");
            // Validated: it reads, with its head.
            let Ok(object) = decode::stored_object(child.object.get().as_bytes()) else {
                continue;
            };
            self.check_one(user, &field, &object, access::ON_OBSERVED_CHILD, None)
                .await?;
        }
        Ok(())
    }

    /// One object. `plugin`, for the reconciled object: a kind the cluster
    /// does not serve in the plugin's own group is authorized as the
    /// plugin's resource (a plugin tested before its CRD is installed);
    /// any other kind not served is refused, since no right on it can be
    /// checked.
    async fn check_one(
        &self,
        user: &User,
        field: &str,
        object: &Object<'_>,
        right: Right,
        plugin: Option<&Plugin>,
    ) -> Result<(), ApiError> {
        let Names {
            api_version,
            kind,
            namespace,
            name,
        } = object.head.names();
        let (group, _) = split_api_version(&api_version);
        let (resource, namespace) = match self.resources.resolve(&api_version, &kind).await {
            // A cluster-scoped object has no namespace, whatever it says:
            // a right in that namespace grants nothing on it.
            Ok(served) if !served.namespaced => (served.plural, Default::default()),
            Ok(served) => (served.plural, namespace),
            Err(ResolveError::NotServed { .. })
                if plugin.is_some_and(|p| p.spec.api.group == group) =>
            {
                let plugin = plugin.map(|p| p.spec.api.resource.clone());
                (plugin.unwrap_or_default(), namespace)
            }
            Err(error @ ResolveError::NotServed { .. }) => {
                return Err(invalid(
                    &format!("{field}.kind"),
                    format!(
                        "Invalid value: {kind:?}: {error}, so kplug cannot check the caller's \
                         right to {} it",
                        right.verb
                    ),
                ));
            }
            Err(error @ ResolveError::Discovery { .. }) => {
                return Err(ApiError::Internal(error.to_string()));
            }
        };
        let target = Target {
            field,
            group,
            resource: &resource,
            namespace: &namespace,
            name: &name,
        };
        self.authorize(user, right, &target).await
    }

    /// The resource serving `kind` in `api_version`, by discovery (cached).
    pub async fn served(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<ServedResource, ResolveError> {
        self.resources.resolve(api_version, kind).await
    }

    /// `Ok` when `user` holds `right` on `target`; a refusal is a 403
    /// naming the target's field, verb and resource.
    pub async fn authorize(
        &self,
        user: &User,
        right: Right,
        target: &Target<'_>,
    ) -> Result<(), ApiError> {
        if self.delegated.always_allowed(user) {
            return Ok(());
        }
        let Target {
            field,
            group,
            resource,
            namespace,
            name,
        } = *target;
        let attributes = Attributes::object(right, group, resource, namespace, name);
        match self.delegated.authorize_object(user, &attributes).await {
            Ok(()) => Ok(()),
            Err(AuthError::Forbidden(message)) => Err(ApiError::ForbiddenObject {
                message,
                field: field.to_owned(),
                group: group.to_owned(),
                resource: resource.to_owned(),
                name: name.to_owned(),
            }),
            Err(other) => Err(other.into()),
        }
    }
}

/// An object a right is checked on: the request's field that names it, and
/// where it is served (an empty namespace for a cluster-scoped one).
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub field: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}
