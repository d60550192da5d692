//! `kubectl kplug create`: the manifests of a plugin ([`plugin`]) or of the
//! zero-code operator for a resource ([`operator`]), printed for `kubectl
//! apply -f -` or a kustomization, like `kubectl create deployment
//! --dry-run=client -o yaml`. Pure: flags in, objects out.

pub mod operator;
pub mod plugin;

use std::collections::{BTreeMap, BTreeSet};

use kplug_api::validation::{dns1123_label, dns1123_subdomain};
use serde_json::{Value, json};

use crate::error::Error;

/// A lowercase RFC 1123 label: names, resources, versions, namespaces.
fn is_dns_label(text: &str) -> bool {
    dns1123_label(text).is_none()
}

/// A lowercase RFC 1123 subdomain: API groups, ServiceAccount names.
fn is_dns_subdomain(text: &str) -> bool {
    dns1123_subdomain(text).is_none()
}

/// `what`'s name `name` names every object it prints and is a label value,
/// so a DNS-1123 label.
fn check_name(what: &str, name: &str) -> Result<(), Error> {
    match dns1123_label(name) {
        None => Ok(()),
        Some(problem) => Err(Error::Usage(format!(
            "invalid {what} name {name:?}: {problem}"
        ))),
    }
}

/// A resource in an API group (`""` for the core group), as RBAC names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GroupResource<'a> {
    group: &'a str,
    resource: &'a str,
}

/// `flag`'s `RESOURCE.GROUP`, or `RESOURCE` for the core group.
fn parse_group_resource<'a>(flag: &str, value: &'a str) -> Result<GroupResource<'a>, Error> {
    let parsed = match value.split_once('.') {
        None => Some((value, "")),
        // A dot says a group follows: `tables.` is not the core group.
        Some((resource, group)) => is_dns_subdomain(group).then_some((resource, group)),
    };
    if let Some((resource, group)) = parsed
        && is_dns_label(resource)
    {
        Ok(GroupResource { group, resource })
    } else {
        Err(Error::Usage(format!(
            "invalid {flag} {value:?}: expected RESOURCE.GROUP in lowercase, \
             e.g. deployments.apps, or RESOURCE for the core group, e.g. configmaps"
        )))
    }
}

/// RBAC rules granting `verbs` on `resources`: one rule per API group, its
/// resources sorted once each, so that the output is the same whatever the
/// order and repeats of the flags.
fn rules_by_group<'a>(
    resources: impl IntoIterator<Item = GroupResource<'a>>,
    verbs: &[&str],
) -> Vec<Value> {
    let mut by_group: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in resources {
        by_group.entry(r.group).or_default().insert(r.resource);
    }
    by_group
        .into_iter()
        .map(|(group, resources)| {
            json!({"apiGroups": [group], "resources": resources, "verbs": verbs})
        })
        .collect()
}

/// A word as a shell reads it back: quoted only when it must be.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./_-".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The pod's security context: the restricted Pod Security Standard, as
/// the images run (uid and gid 65532).
fn restricted_pod() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// The container's security context under [`restricted_pod`].
fn restricted_container() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": {"drop": ["ALL"]},
    })
}

/// A ClusterRoleBinding or RoleBinding of `role` to the ServiceAccount
/// `namespace/account`.
fn binding(kind: &str, metadata: Value, role: (&str, &str), account: (&str, &str)) -> Value {
    let (role_kind, role_name) = role;
    let (namespace, name) = account;
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    })
}

/// The message of a usage error, for the tests of both commands.
#[cfg(test)]
fn usage_message(result: Result<Vec<Value>, Error>) -> String {
    match result {
        Err(Error::Usage(message)) => message,
        other => panic!("expected a usage error, got {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_only_when_a_shell_needs_it() {
        assert_eq!(shell_word("it's a b"), r"'it'\''s a b'");
        assert_eq!(
            shell_word("deployments.apps,services"),
            "deployments.apps,services"
        );
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn rules_group_resources_whatever_the_order_and_repeats() {
        let resources = ["services", "deployments.apps", "configmaps", "services"]
            .map(|r| parse_group_resource("--x", r).expect(r));
        assert_eq!(
            rules_by_group(resources, &["get"]),
            [
                json!({"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["get"]}),
                json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}),
            ]
        );
    }
}
