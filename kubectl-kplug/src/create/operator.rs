//! `kubectl kplug create operator`: the manifests of the zero-code
//! operator (`kplug-operator`) for one custom resource.
//!
//! Its rights are what the operator does and nothing more, each rule where
//! it is used: kplug's `kplug:operator` and `kplug:reader` (delegate, watch
//! plugins); on the resource, what the controller and the finalizer helper
//! call (get, list, watch, patch), its status (server-side apply) and the
//! `update` on its status and finalizers that kplug checks before it
//! reconciles or finalizes an object for anyone; on
//! each extension resource, reading and watching, and its status; on each
//! child resource, what applying, observing, watching, abandoning and
//! pruning children take (server-side apply creates with a patch, which
//! kube-apiserver authorizes as `create`); Events as kube-runtime's
//! Recorder writes them (events.k8s.io); its Lease in its own namespace;
//! and `system:auth-delegator`, with which it asks kube-apiserver who may
//! read its /metrics.

use serde_json::{Value, json};

use super::{
    GroupResource, binding, check_name, is_dns_label, is_dns_subdomain, parse_group_resource,
    restricted_container, restricted_pod, rules_by_group, shell_word,
};
use kplug_operator::ChildScope;

use crate::cli::CreateOperatorArgs;
use crate::error::Error;

/// Where the operator serves /metrics (its `--metrics-bind-address`).
const METRICS_PORT: u16 = 8443;

/// `RESOURCE.GROUP`: the operator's resource, a custom one, so in a group.
fn parse_resource(value: &str) -> Result<GroupResource<'_>, Error> {
    match value.split_once('.') {
        Some((resource, group)) if is_dns_label(resource) && is_dns_subdomain(group) => {
            Ok(GroupResource { group, resource })
        }
        _ => Err(Error::Usage(format!(
            "invalid RESOURCE.GROUP {value:?}: expected the custom resource's plural and \
             group in lowercase, e.g. websites.sites.example.com"
        ))),
    }
}

/// The operator's name: `--name`, else `RESOURCE-operator`.
fn name(args: &CreateOperatorArgs, resource: GroupResource<'_>) -> String {
    args.name
        .clone()
        .unwrap_or_else(|| format!("{}-operator", resource.resource))
}

/// Each of `values`, given with `flag`, parsed; or the first malformed one.
fn parse_all<'a>(flag: &str, values: &'a [String]) -> Result<Vec<GroupResource<'a>>, Error> {
    values
        .iter()
        .map(|value| parse_group_resource(flag, value))
        .collect()
}

/// `resources` with `/subresource` appended, as RBAC names subresources.
fn subresources(resources: &[GroupResource<'_>], subresource: &str) -> Vec<(String, String)> {
    resources
        .iter()
        .map(|r| (r.group.to_owned(), format!("{}/{subresource}", r.resource)))
        .collect()
}

fn rules_on(owned: &[(String, String)], verbs: &[&str]) -> Vec<Value> {
    let resources = owned
        .iter()
        .map(|(group, resource)| GroupResource { group, resource });
    rules_by_group(resources, verbs)
}

/// The command that prints these manifests again: every flag given, and
/// the namespace, which otherwise comes from the kubeconfig's context.
fn command(args: &CreateOperatorArgs, namespace: &str) -> String {
    let mut words = vec![
        "kubectl kplug create operator".to_owned(),
        shell_word(&args.resource),
    ];
    if let Some(name) = &args.name {
        words.push(format!("--name {}", shell_word(name)));
    }
    if args.image != CreateOperatorArgs::DEFAULT_IMAGE {
        words.push(format!("--image {}", shell_word(&args.image)));
    }
    if !args.watch_extension.is_empty() {
        let joined = args.watch_extension.join(",");
        words.push(format!("--watch-extension {}", shell_word(&joined)));
    }
    if !args.child_resource.is_empty() {
        let joined = args.child_resource.join(",");
        words.push(format!("--child-resource {}", shell_word(&joined)));
    }
    if let Some(finalizer) = &args.finalizer {
        words.push(format!("--finalizer {}", shell_word(finalizer)));
    }
    if args.child_scope == ChildScope::Cluster {
        words.push("--child-scope cluster".to_owned());
    }
    if args.replicas != CreateOperatorArgs::DEFAULT_REPLICAS {
        words.push(format!("--replicas {}", args.replicas));
    }
    words.push(format!("-n {}", shell_word(namespace)));
    words.join(" ")
}

/// The header comment: the command that printed it, and what the objects
/// need that they cannot carry.
pub fn preamble(args: &CreateOperatorArgs, namespace: &str) -> String {
    format!(
        "# kplug operator for {resource}: {command}\n\
         # Needs kplug (its ClusterRoles kplug:operator and kplug:reader) and the\n\
         # CustomResourceDefinition of {resource}, with a status subresource.\n",
        resource = args.resource,
        command = command(args, namespace),
    )
}

/// The operator's objects, in the order `kubectl apply` should create them.
pub fn manifests(args: &CreateOperatorArgs, namespace: &str) -> Result<Vec<Value>, Error> {
    let resource = parse_resource(&args.resource)?;
    let name = name(args, resource);
    check_name("operator", &name)?;
    if args.image.trim().is_empty() {
        return Err(Error::Usage(
            "--image must name kplug-operator's image".to_owned(),
        ));
    }
    if args.replicas == 0 {
        return Err(Error::Usage("--replicas must be at least 1".to_owned()));
    }
    let extensions = parse_all("--watch-extension", &args.watch_extension)?;
    let children = parse_all("--child-resource", &args.child_resource)?;
    let name = name.as_str();
    let labels = json!({
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": "kplug-operator",
    });
    let metadata = |object_name: &str| json!({"name": object_name, "labels": labels});
    let namespaced =
        |object_name: &str| json!({"name": object_name, "namespace": namespace, "labels": labels});
    let account = (namespace, name);

    let mut rules = rules_by_group([resource], &["get", "list", "watch", "patch"]);
    // kplug checks `update` on an object's status before it reconciles it,
    // and on its finalizers before it finalizes it, for whoever asks: the
    // rights of the object's controller. The latter is also what
    // OwnerReferencesPermissionEnforcement asks of a child's
    // blockOwnerDeletion.
    rules.extend(rules_on(
        &subresources(&[resource], "status"),
        &["get", "patch", "update"],
    ));
    rules.extend(rules_on(
        &subresources(&[resource], "finalizers"),
        &["update"],
    ));
    rules.extend(rules_by_group(
        extensions.iter().copied(),
        &["get", "list", "watch"],
    ));
    rules.extend(rules_on(
        &subresources(&extensions, "status"),
        &["get", "patch"],
    ));
    rules.extend(rules_by_group(
        children.iter().copied(),
        &["get", "list", "watch", "create", "patch", "delete"],
    ));
    rules.push(json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}));

    let mut operator_args = vec![
        format!("--resource={}", args.resource),
        format!("--field-manager={name}"),
    ];
    if !args.watch_extension.is_empty() {
        operator_args.push(format!(
            "--watch-extension={}",
            args.watch_extension.join(",")
        ));
    }
    if !args.child_resource.is_empty() {
        operator_args.push(format!(
            "--child-resource={}",
            args.child_resource.join(",")
        ));
    }
    if let Some(finalizer) = &args.finalizer {
        operator_args.push(format!("--finalizer={finalizer}"));
    }
    if args.child_scope == ChildScope::Cluster {
        operator_args.push("--child-scope=cluster".to_owned());
    }
    let leader_election = format!("{name}-leader-election");
    let kplug_operator = format!("kplug:operator:{name}");
    let kplug_reader = format!("kplug:reader:{name}");
    let auth_delegator = format!("{name}:auth-delegator");
    Ok(vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": namespaced(name)}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": metadata(name),
            "rules": rules,
        }),
        binding(
            "ClusterRoleBinding",
            metadata(name),
            ("ClusterRole", name),
            account,
        ),
        binding(
            "ClusterRoleBinding",
            metadata(&kplug_operator),
            ("ClusterRole", "kplug:operator"),
            account,
        ),
        binding(
            "ClusterRoleBinding",
            metadata(&kplug_reader),
            ("ClusterRole", "kplug:reader"),
            account,
        ),
        binding(
            "ClusterRoleBinding",
            metadata(&auth_delegator),
            ("ClusterRole", "system:auth-delegator"),
            account,
        ),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": namespaced(&leader_election),
            "rules": [{
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "list", "watch", "create", "update", "patch"],
            }],
        }),
        binding(
            "RoleBinding",
            namespaced(&leader_election),
            ("Role", &leader_election),
            account,
        ),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": namespaced(name),
            "spec": {
                "replicas": args.replicas,
                "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": name,
                        "enableServiceLinks": false,
                        "securityContext": restricted_pod(),
                        // Reconciles under way finish on SIGTERM, within
                        // the plugin's deadline (--reconcile-timeout, 30s).
                        "terminationGracePeriodSeconds": 40,
                        "containers": [{
                            "name": "operator",
                            "image": args.image,
                            "args": operator_args,
                            "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
                            "env": [
                                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            ],
                            "resources": {"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                            "securityContext": restricted_container(),
                        }],
                    },
                },
            },
        }),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(resource: &str) -> CreateOperatorArgs {
        CreateOperatorArgs {
            resource: resource.to_owned(),
            name: None,
            image: CreateOperatorArgs::DEFAULT_IMAGE.to_owned(),
            watch_extension: Vec::new(),
            child_resource: Vec::new(),
            finalizer: None,
            child_scope: ChildScope::Namespace,
            replicas: CreateOperatorArgs::DEFAULT_REPLICAS,
        }
    }

    fn websites() -> CreateOperatorArgs {
        let mut websites = args("websites.sites.example.com");
        websites.child_resource = ["configmaps", "deployments.apps", "services"]
            .map(str::to_owned)
            .to_vec();
        websites
    }

    fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {objects:#?}"))
    }

    fn usage_error(args: &CreateOperatorArgs) -> String {
        super::super::usage_message(manifests(args, "plugins"))
    }

    #[test]
    fn the_operator_may_do_what_it_does_to_its_resource_and_children_and_nothing_more() {
        let objects = manifests(&websites(), "plugins").expect("manifests");
        let role = object(&objects, "ClusterRole", "websites-operator");
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": ["sites.example.com"], "resources": ["websites"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": ["sites.example.com"], "resources": ["websites/status"], "verbs": ["get", "patch", "update"]},
                {"apiGroups": ["sites.example.com"], "resources": ["websites/finalizers"], "verbs": ["update"]},
                {"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            ])
        );
        let subject = json!([{"kind": "ServiceAccount", "name": "websites-operator", "namespace": "plugins"}]);
        for (binding, role) in [
            ("websites-operator", "websites-operator"),
            ("kplug:operator:websites-operator", "kplug:operator"),
            ("kplug:reader:websites-operator", "kplug:reader"),
            ("websites-operator:auth-delegator", "system:auth-delegator"),
        ] {
            let binding = object(&objects, "ClusterRoleBinding", binding);
            assert_eq!(binding["roleRef"]["name"], role);
            assert_eq!(binding["subjects"], subject);
        }
        let lease = object(&objects, "Role", "websites-operator-leader-election");
        assert_eq!(lease["metadata"]["namespace"], "plugins");
        assert_eq!(lease["rules"][0]["resources"], json!(["leases"]));
        let deployment = object(&objects, "Deployment", "websites-operator");
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            container["args"],
            json!([
                "--resource=websites.sites.example.com",
                "--field-manager=websites-operator",
                "--child-resource=configmaps,deployments.apps,services",
            ])
        );
        assert_eq!(
            container["image"],
            concat!("ghcr.io/kplug/kplug-operator:", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(objects[0]["kind"], "ServiceAccount");
    }

    #[test]
    fn extensions_are_read_and_their_status_written() {
        let mut tables = args("databasetables.myorg.org");
        tables.name = Some("tables".to_owned());
        tables.watch_extension = vec![
            "databasetablemariadbextensions.myorg.org".to_owned(),
            "databasetablepostgresqlextensions.myorg.org".to_owned(),
        ];
        tables.finalizer = Some("myorg.org/database-table".to_owned());
        tables.child_scope = ChildScope::Cluster;
        tables.replicas = 3;
        let objects = manifests(&tables, "team-a").expect("manifests");
        let role = object(&objects, "ClusterRole", "tables");
        let extensions = json!([
            "databasetablemariadbextensions",
            "databasetablepostgresqlextensions"
        ]);
        let rules = role["rules"].as_array().expect("rules");
        assert!(rules.contains(&json!({"apiGroups": ["myorg.org"], "resources": extensions, "verbs": ["get", "list", "watch"]})), "{rules:#?}");
        assert!(rules.contains(&json!({"apiGroups": ["myorg.org"], "resources": ["databasetablemariadbextensions/status", "databasetablepostgresqlextensions/status"], "verbs": ["get", "patch"]})), "{rules:#?}");
        // No child kinds: nothing to create or delete.
        assert!(!role.to_string().contains("delete"), "{role}");
        let deployment = object(&objects, "Deployment", "tables");
        assert_eq!(deployment["spec"]["replicas"], 3);
        let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
        assert_eq!(
            args,
            &json!([
                "--resource=databasetables.myorg.org",
                "--field-manager=tables",
                "--watch-extension=databasetablemariadbextensions.myorg.org,databasetablepostgresqlextensions.myorg.org",
                "--finalizer=myorg.org/database-table",
                "--child-scope=cluster",
            ])
        );
        assert_eq!(
            preamble(&tables, "team-a")
                .lines()
                .next()
                .unwrap_or_default(),
            "# kplug operator for databasetables.myorg.org: kubectl kplug create operator \
             databasetables.myorg.org --name tables --watch-extension \
             databasetablemariadbextensions.myorg.org,databasetablepostgresqlextensions.myorg.org \
             --finalizer myorg.org/database-table --child-scope cluster --replicas 3 -n team-a"
        );
    }

    #[test]
    fn malformed_flags_are_usage_errors_naming_the_flag_and_value() {
        for resource in [
            "websites",
            "Websites.example.com",
            "websites.",
            ".example.com",
            "a/b.c",
        ] {
            let message = usage_error(&args(resource));
            assert!(
                message.contains(&format!("invalid RESOURCE.GROUP {resource:?}")),
                "{message}"
            );
        }
        let long = format!("{}.example.com", "w".repeat(60));
        let message = usage_error(&args(&long));
        assert!(
            message.contains("invalid operator name") && message.contains("63"),
            "{message}"
        );
        let mut named = websites();
        named.name = Some("Web".to_owned());
        assert!(usage_error(&named).contains("invalid operator name \"Web\""));
        let mut child = websites();
        child.child_resource.push("deployments.apps/v1".to_owned());
        assert!(usage_error(&child).contains("invalid --child-resource \"deployments.apps/v1\""));
        let mut extension = websites();
        extension.watch_extension = vec!["Tables.myorg.org".to_owned()];
        assert!(usage_error(&extension).contains("invalid --watch-extension \"Tables.myorg.org\""));
        let mut none = websites();
        none.replicas = 0;
        assert!(usage_error(&none).contains("--replicas"));
    }
}
