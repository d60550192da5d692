//! What a request asks to do, in the terms of a SubjectAccessReview.

use axum::http::Method;
use serde::Serialize;

use kplug_api::access::Right;

use crate::v1alpha1::{GROUP, VERSION};

/// The attributes an authorizer decides on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum Attributes {
    Resource {
        verb: String,
        /// The API group; empty for the core group.
        group: String,
        resource: String,
        subresource: String,
        /// Empty for the cluster scope.
        namespace: String,
        name: String,
    },
    NonResource {
        verb: String,
        path: String,
    },
}

/// What a request asks to do, borrowed from its method, path and query:
/// kube-apiserver's RequestInfo, parsed without allocating, for the
/// authorizer ([`Attributes`]) and the request metrics alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestInfo<'a> {
    Resource {
        verb: &'static str,
        /// As sent (percent-encoded); empty for the cluster scope.
        namespace: &'a str,
        resource: &'a str,
        /// Everything after the name, e.g. `reconcile`.
        subresource: &'a str,
        name: &'a str,
    },
    NonResource {
        method: &'a Method,
        path: &'a str,
    },
}

impl<'a> RequestInfo<'a> {
    pub fn parse(method: &'a Method, path: &'a str, query: Option<&str>) -> Self {
        let rest = path
            .strip_prefix("/apis/")
            .and_then(|rest| rest.strip_prefix(GROUP))
            .and_then(|rest| rest.strip_prefix('/'))
            .and_then(|rest| rest.strip_prefix(VERSION))
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|rest| !rest.is_empty());
        let Some(rest) = rest else {
            return Self::NonResource { method, path };
        };
        // `namespaces/{namespace}/...` scopes what follows, as in
        // kube-apiserver; `namespaces/{namespace}` alone would be the
        // Namespace itself, which kplug does not serve.
        let (namespace, rest) = match rest.strip_prefix("namespaces/") {
            Some(scoped) => match scoped.split_once('/') {
                Some((namespace, rest)) if !namespace.is_empty() && !rest.is_empty() => {
                    (namespace, rest)
                }
                _ => ("", rest),
            },
            None => ("", rest),
        };
        let (resource, rest) = rest.split_once('/').unwrap_or((rest, ""));
        let (name, subresource) = rest.split_once('/').unwrap_or((rest, ""));
        let watch = query.is_some_and(asks_to_watch);
        let verb = match (method, name.is_empty()) {
            (&Method::GET | &Method::HEAD, true) if watch => "watch",
            (&Method::GET | &Method::HEAD, true) => "list",
            (&Method::GET | &Method::HEAD, false) => "get",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, true) => "deletecollection",
            (&Method::DELETE, false) => "delete",
            _ => return Self::NonResource { method, path },
        };
        Self::Resource {
            verb,
            namespace,
            resource,
            subresource,
            name,
        }
    }
}

/// Whether a query asks for a watch, read from the values the handler will
/// see: decoded by `form_urlencoded`, the decoder behind axum's `Query`, so
/// that `watch=%74rue` or `w%61tch=1` is authorized as the watch it is
/// served as. Like kube-apiserver, any value but false, 0 or empty counts:
/// a value the handler then rejects is refused as a watch, never served as
/// one after being authorized as a list.
fn asks_to_watch(query: &str) -> bool {
    form_urlencoded::parse(query.as_bytes())
        .any(|(key, value)| key == "watch" && !matches!(&*value, "" | "false" | "0"))
}

/// A path segment as axum's `Path` decodes it for the handler.
fn decoded(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned()
}

impl Attributes {
    /// Classifies a request the way kube-apiserver's RequestInfo does. The
    /// name is percent-decoded as axum's `Path` decodes it for the handler.
    pub fn of_request(method: &Method, path: &str, query: Option<&str>) -> Self {
        match RequestInfo::parse(method, path, query) {
            RequestInfo::Resource {
                verb,
                namespace,
                resource,
                subresource,
                name,
            } => Self::Resource {
                verb: verb.to_owned(),
                group: GROUP.to_owned(),
                resource: resource.to_owned(),
                subresource: subresource.to_owned(),
                namespace: decoded(namespace),
                name: decoded(name),
            },
            RequestInfo::NonResource { method, path } => Self::NonResource {
                verb: method.as_str().to_lowercase(),
                path: path.to_owned(),
            },
        }
    }

    /// A plugin's right to heartbeat under `name`.
    pub fn heartbeat(name: &str) -> Self {
        Self::Resource {
            verb: "create".to_owned(),
            group: GROUP.to_owned(),
            resource: "plugins".to_owned(),
            subresource: "heartbeat".to_owned(),
            namespace: String::new(),
            name: name.to_owned(),
        }
    }

    /// `right` on the object `name` of `group`'s `resource` in `namespace`
    /// (empty: a cluster-scoped object).
    pub fn object(right: Right, group: &str, resource: &str, namespace: &str, name: &str) -> Self {
        Self::Resource {
            verb: right.verb.to_owned(),
            group: group.to_owned(),
            resource: resource.to_owned(),
            subresource: right.subresource.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The same right on every name: a SubjectAccessReview reads an empty
    /// name as "all", so an allowed review of these attributes answers for
    /// each name. `None` for attributes that name no object.
    pub fn on_every_name(&self) -> Option<Self> {
        match self {
            Self::Resource { name, .. } if !name.is_empty() => {
                let mut every = self.clone();
                if let Self::Resource { name, .. } = &mut every {
                    name.clear();
                }
                Some(every)
            }
            _ => None,
        }
    }

    /// The denial message, worded as kube-apiserver words it.
    pub fn forbidden(&self, user: &str, reason: &str) -> String {
        let because = if reason.is_empty() {
            String::new()
        } else {
            format!(": {reason}")
        };
        match self {
            Self::Resource {
                verb,
                group,
                resource,
                subresource,
                namespace,
                name,
            } => {
                let full = if subresource.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}/{subresource}")
                };
                let qualified = crate::kube_words::qualified_resource(resource, group);
                let object = if name.is_empty() {
                    qualified
                } else {
                    format!("{qualified} {name:?}")
                };
                let scope = if namespace.is_empty() {
                    "at the cluster scope".to_owned()
                } else {
                    format!("in the namespace {namespace:?}")
                };
                format!(
                    "{object} is forbidden: User {user:?} cannot {verb} resource {full:?} in API \
                     group {group:?} {scope}{because}"
                )
            }
            Self::NonResource { verb, path } => {
                format!("forbidden: User {user:?} cannot {verb} path {path:?}{because}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kplug_api::access::ON_EXTENSION;

    fn resource(verb: &str, resource: &str, subresource: &str, name: &str) -> Attributes {
        Attributes::Resource {
            verb: verb.to_owned(),
            group: GROUP.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            namespace: String::new(),
            name: name.to_owned(),
        }
    }

    #[test]
    fn requests_map_to_verbs_and_resources() {
        let p = "/apis/plugins.kplug.io/v1alpha1";
        let of = |m: Method, path: &str, q: Option<&str>| Attributes::of_request(&m, path, q);
        assert_eq!(
            of(Method::GET, &format!("{p}/plugins"), None),
            resource("list", "plugins", "", "")
        );
        assert_eq!(
            of(
                Method::GET,
                &format!("{p}/plugins"),
                Some("labelSelector=a&watch=true")
            ),
            resource("watch", "plugins", "", "")
        );
        assert_eq!(
            of(Method::GET, &format!("{p}/plugins/x"), None),
            resource("get", "plugins", "", "x")
        );
        assert_eq!(
            of(Method::DELETE, &format!("{p}/plugins/x"), None),
            resource("delete", "plugins", "", "x")
        );
        assert_eq!(
            of(Method::POST, &format!("{p}/plugins/x/reconcile"), None),
            resource("create", "plugins", "reconcile", "x")
        );
        assert_eq!(
            of(Method::POST, &format!("{p}/reconciles"), None),
            resource("create", "reconciles", "", "")
        );
        let in_team_a = |resource: &str| Attributes::Resource {
            verb: "create".to_owned(),
            group: GROUP.to_owned(),
            resource: resource.to_owned(),
            subresource: String::new(),
            namespace: "team-a".to_owned(),
            name: String::new(),
        };
        assert_eq!(
            of(
                Method::POST,
                &format!("{p}/namespaces/team-a/reconciles"),
                None
            ),
            in_team_a("reconciles")
        );
        assert_eq!(
            of(
                Method::POST,
                &format!("{p}/namespaces/te%61m-a/reconciles"),
                None
            ),
            in_team_a("reconciles")
        );
        // The Namespace itself, not a scope.
        assert_eq!(
            of(Method::GET, &format!("{p}/namespaces/team-a"), None),
            resource("get", "namespaces", "", "team-a")
        );
        assert_eq!(
            of(Method::GET, p, None),
            Attributes::NonResource {
                verb: "get".to_owned(),
                path: p.to_owned()
            }
        );
        assert_eq!(
            of(Method::GET, "/openapi/v2", None),
            Attributes::NonResource {
                verb: "get".to_owned(),
                path: "/openapi/v2".to_owned()
            }
        );
    }

    #[test]
    fn the_verb_comes_from_the_decoded_query() {
        let plugins = "/apis/plugins.kplug.io/v1alpha1/plugins";
        let verb = |query: &str| match Attributes::of_request(&Method::GET, plugins, Some(query)) {
            Attributes::Resource { verb, .. } => verb,
            other => panic!("{other:?}"),
        };
        for watch in [
            "watch=true",
            "watch=1",
            "watch=%74rue",
            "w%61tch=true",
            "watch=%31",
            "watch=TRUE",
            "watch=yes",
            "labelSelector=a%3Db&watch=true",
            "watch=false&watch=true",
        ] {
            assert_eq!(verb(watch), "watch", "{watch}");
        }
        for list in [
            "",
            "watch=false",
            "watch=0",
            "watch=",
            "watch",
            "labelSelector=watch%3Dtrue",
            "xwatch=true",
            "watch%3Dtrue",
        ] {
            assert_eq!(verb(list), "list", "{list}");
        }
        // The metrics read the same verb.
        assert!(matches!(
            RequestInfo::parse(&Method::GET, plugins, Some("watch=%74rue")),
            RequestInfo::Resource { verb: "watch", .. }
        ));
    }

    #[test]
    fn names_are_decoded_as_the_handler_sees_them() {
        let path = "/apis/plugins.kplug.io/v1alpha1/plugins/%68ello/reconcile";
        assert_eq!(
            Attributes::of_request(&Method::POST, path, None),
            resource("create", "plugins", "reconcile", "hello")
        );
    }

    #[test]
    fn every_name_keeps_all_but_the_name() {
        let one = Attributes::object(ON_EXTENSION, "", "configmaps", "team-b", "settings");
        assert_eq!(
            one.on_every_name(),
            Some(Attributes::object(
                ON_EXTENSION,
                "",
                "configmaps",
                "team-b",
                ""
            ))
        );
        assert_eq!(resource("list", "plugins", "", "").on_every_name(), None);
        let path = Attributes::NonResource {
            verb: "get".to_owned(),
            path: "/metrics".to_owned(),
        };
        assert_eq!(path.on_every_name(), None);
    }

    #[test]
    fn forbidden_messages_read_like_kubernetes() {
        assert_eq!(
            resource("list", "plugins", "", "").forbidden("someone", ""),
            "plugins.plugins.kplug.io is forbidden: User \"someone\" cannot list resource \"plugins\" in API group \"plugins.kplug.io\" at the cluster scope"
        );
        assert!(
            resource("create", "plugins", "reconcile", "db")
                .forbidden("op", "no RBAC policy matched")
                .ends_with("cannot create resource \"plugins/reconcile\" in API group \"plugins.kplug.io\" at the cluster scope: no RBAC policy matched")
        );
        // The objects of a reconcile, in their own group and namespace.
        let status = Right {
            verb: "update",
            subresource: "status",
        };
        assert_eq!(
            Attributes::object(status, "example.com", "widgets", "team-b", "w1")
                .forbidden("system:serviceaccount:team-a:op", ""),
            "widgets.example.com \"w1\" is forbidden: User \"system:serviceaccount:team-a:op\" cannot update resource \"widgets/status\" in API group \"example.com\" in the namespace \"team-b\""
        );
        assert_eq!(
            Attributes::object(ON_EXTENSION, "", "configmaps", "team-b", "settings")
                .forbidden("op", ""),
            "configmaps \"settings\" is forbidden: User \"op\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"team-b\""
        );
        assert_eq!(
            Attributes::object(status, "example.com", "greetings", "", "ada").forbidden("op", ""),
            "greetings.example.com \"ada\" is forbidden: User \"op\" cannot update resource \"greetings/status\" in API group \"example.com\" at the cluster scope"
        );
    }
}
