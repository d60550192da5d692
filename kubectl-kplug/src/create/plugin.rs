//! `kubectl kplug create plugin`: the manifests of one plugin.
//!
//! What a plugin needs and nothing more: its ServiceAccount; RBAC letting
//! that ServiceAccount heartbeat as this plugin's name only; a Deployment
//! of `--replicas` pods (POD_NAME and POD_IP from the downward API, a
//! projected ServiceAccount token, kplug's trust bundle from the ConfigMap
//! kplug keeps in the namespace, and the identity kplug issues, so no
//! certificate is made by hand); a PodDisruptionBudget keeping one pod up.
//!
//! With `--api`, also what kplug itself needs for this plugin: a ClusterRole
//! `kplug:read:<name>` bound to kplug's own ServiceAccount, with `get` on
//! the API's resource and on each `--extension-resource`, since kplug reads
//! those objects for reconciles by reference (`spec.objectRef`). Only `get`
//! (kplug reads single named objects) and only those kinds, so that kplug
//! can read what its plugins serve and nothing else in the cluster.

use kplug_proto::v1alpha1::TOKEN_AUDIENCE;
use serde_json::{Value, json};

use super::{
    GroupResource, binding, check_name, is_dns_label, is_dns_subdomain, parse_group_resource,
    restricted_container, restricted_pod, rules_by_group, shell_word,
};
use crate::cli::CreatePluginArgs;
use crate::error::Error;

/// Where the SDK finds the projected token, kplug's CA and its scratch space.
const TOKEN_DIR: &str = "/var/run/secrets/kplug";
const TRUST_DIR: &str = "/var/run/kplug/trust";
/// The ConfigMap kplug keeps in namespaces labelled for it.
const TRUST_CONFIG_MAP: &str = "kplug-trust";
const TRUST_LABEL: &str = "plugins.kplug.io/trust=enabled";

/// `--api RESOURCE.GROUP/VERSION`: the plugin's resource. Plugins serve
/// custom resources, which always have a group.
fn parse_api(value: &str) -> Result<GroupResource<'_>, Error> {
    let parsed = value.split_once('/').and_then(|(qualified, version)| {
        let (resource, group) = qualified.split_once('.')?;
        (is_dns_label(resource) && is_dns_subdomain(group) && is_dns_label(version))
            .then_some(GroupResource { group, resource })
    });
    parsed.ok_or_else(|| {
        Error::Usage(format!(
            "invalid --api {value:?}: expected RESOURCE.GROUP/VERSION in lowercase, \
             e.g. databasetables.myorg.org/v1alpha1"
        ))
    })
}

/// kplug's own ServiceAccount, the subject of kplug:read:<name>.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ServiceAccount<'a> {
    namespace: &'a str,
    name: &'a str,
}

/// `--kplug-service-account NAMESPACE/NAME`.
fn parse_service_account(value: &str) -> Result<ServiceAccount<'_>, Error> {
    match value.split_once('/') {
        Some((namespace, name)) if is_dns_label(namespace) && is_dns_subdomain(name) => {
            Ok(ServiceAccount { namespace, name })
        }
        _ => Err(Error::Usage(format!(
            "invalid --kplug-service-account {value:?}: expected NAMESPACE/NAME, \
             e.g. {}",
            CreatePluginArgs::DEFAULT_KPLUG_SERVICE_ACCOUNT
        ))),
    }
}

/// The command that prints these manifests again: every flag given, and
/// the namespace, which otherwise comes from the kubeconfig's context.
fn command(args: &CreatePluginArgs, namespace: &str) -> String {
    let mut words = vec![
        "kubectl kplug create plugin".to_owned(),
        shell_word(&args.name),
        format!("--image {}", shell_word(&args.image)),
    ];
    if let Some(api) = &args.api {
        words.push(format!("--api {}", shell_word(api)));
    }
    for resource in &args.extension_resource {
        words.push(format!("--extension-resource {}", shell_word(resource)));
    }
    if args.kplug_service_account != CreatePluginArgs::DEFAULT_KPLUG_SERVICE_ACCOUNT {
        let account = shell_word(&args.kplug_service_account);
        words.push(format!("--kplug-service-account {account}"));
    }
    if args.replicas != CreatePluginArgs::DEFAULT_REPLICAS {
        words.push(format!("--replicas {}", args.replicas));
    }
    if args.port != CreatePluginArgs::DEFAULT_PORT {
        words.push(format!("--port {}", args.port));
    }
    if args.registry != CreatePluginArgs::DEFAULT_REGISTRY {
        words.push(format!("--registry {}", shell_word(&args.registry)));
    }
    if args.pdb_v1beta1 {
        words.push("--pdb-v1beta1".to_owned());
    }
    words.push(format!("-n {}", shell_word(namespace)));
    words.join(" ")
}

/// The header comment: the command that printed it, and what the objects
/// need that they cannot carry.
pub fn preamble(args: &CreatePluginArgs, namespace: &str) -> String {
    let name = &args.name;
    let mut text = format!(
        "# kplug plugin {name}: {command}\n\
         # Needs kplug with its plugin CA (docs/src/guides/install-plugin.md) and, once per\n\
         # namespace, the label that makes kplug keep ConfigMap {TRUST_CONFIG_MAP} here:\n\
         #   kubectl label namespace {namespace} {TRUST_LABEL}\n",
        command = command(args, namespace),
    );
    if args.api.is_some() {
        text.push_str(&format!(
            "# kplug:read:{name}: kplug's ServiceAccount ({account}) may get the\n\
             # objects of --api and --extension-resource, which kplug reads itself for\n\
             # reconciles by reference (spec.objectRef).\n",
            account = args.kplug_service_account,
        ));
    }
    text
}

/// The plugin's objects, in the order `kubectl apply` should create them.
pub fn manifests(args: &CreatePluginArgs, namespace: &str) -> Result<Vec<Value>, Error> {
    check_name("plugin", &args.name)?;
    if args.image.trim().is_empty() {
        return Err(Error::Usage(
            "--image must name the plugin's image".to_owned(),
        ));
    }
    if args.replicas == 0 {
        return Err(Error::Usage("--replicas must be at least 1".to_owned()));
    }
    // What kplug reads for this plugin's reconciles by reference: the API's
    // objects and their extensions, so the extensions need the API.
    let api = args.api.as_deref().map(parse_api).transpose()?;
    let read = match (api, args.extension_resource.as_slice()) {
        (None, []) => None,
        (None, [first, ..]) => {
            return Err(Error::Usage(format!(
                "--extension-resource {first} needs --api: extensions are those of the \
                 objects of the plugin's API, which kplug reads for reconciles by reference"
            )));
        }
        (Some(api), extensions) => {
            let mut resources = vec![api];
            for extension in extensions {
                resources.push(parse_group_resource("--extension-resource", extension)?);
            }
            Some(resources)
        }
    };
    let kplug = parse_service_account(&args.kplug_service_account)?;
    let name = args.name.as_str();
    let role = format!("kplug:plugin:{name}");
    let labels = json!({
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": "kplug-plugin",
    });
    let mut deployment_metadata = json!({"name": name, "namespace": namespace, "labels": labels});
    if let Some(api) = &args.api {
        deployment_metadata["annotations"] = json!({"plugins.kplug.io/api": api});
    }
    let port = args.port;
    let env = json!([
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "KPLUG_NAME", "value": name},
        {"name": "KPLUG_REGISTRY", "value": args.registry},
        {"name": "KPLUG_REGISTRY_CA_FILE", "value": format!("{TRUST_DIR}/ca.crt")},
        {"name": "KPLUG_TOKEN_FILE", "value": format!("{TOKEN_DIR}/token")},
        {"name": "KPLUG_ISSUED_IDENTITY", "value": "true"},
        {"name": "KPLUG_LISTEN", "value": format!("0.0.0.0:{port}")},
        {"name": "KPLUG_ADVERTISE", "value": format!("$(POD_IP):{port}")},
    ]);
    let pdb_api = if args.pdb_v1beta1 {
        "policy/v1beta1"
    } else {
        "policy/v1"
    };
    let mut objects = vec![
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role, "labels": labels},
            "rules": [{
                "apiGroups": ["plugins.kplug.io"],
                "resources": ["plugins/heartbeat"],
                "resourceNames": [name],
                "verbs": ["create"],
            }],
        }),
        binding(
            "ClusterRoleBinding",
            json!({"name": role, "labels": labels}),
            ("ClusterRole", &role),
            (namespace, name),
        ),
    ];
    if let Some(resources) = read {
        let read_role = format!("kplug:read:{name}");
        objects.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": read_role, "labels": labels},
            "rules": rules_by_group(resources, &["get"]),
        }));
        objects.push(binding(
            "ClusterRoleBinding",
            json!({"name": read_role, "labels": labels}),
            ("ClusterRole", &read_role),
            (kplug.namespace, kplug.name),
        ));
    }
    objects.extend([
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": deployment_metadata,
            "spec": {
                "replicas": args.replicas,
                "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": name,
                        "automountServiceAccountToken": false,
                        "enableServiceLinks": false,
                        "securityContext": restricted_pod(),
                        "containers": [{
                            "name": "plugin",
                            "image": args.image,
                            "env": env,
                            "ports": [{"name": "grpc", "containerPort": port, "protocol": "TCP"}],
                            "readinessProbe": {"tcpSocket": {"port": "grpc"}, "periodSeconds": 5},
                            "livenessProbe": {"tcpSocket": {"port": "grpc"}, "initialDelaySeconds": 5, "periodSeconds": 10},
                            "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                            "securityContext": restricted_container(),
                            "volumeMounts": [
                                {"name": "kplug-token", "mountPath": TOKEN_DIR, "readOnly": true},
                                {"name": "kplug-trust", "mountPath": TRUST_DIR, "readOnly": true},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                        }],
                        "volumes": [
                            {"name": "kplug-token", "projected": {"sources": [
                                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600, "audience": TOKEN_AUDIENCE}},
                            ]}},
                            {"name": "kplug-trust", "configMap": {"name": TRUST_CONFIG_MAP}},
                            {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
                        ],
                    },
                },
            },
        }),
        json!({
            "apiVersion": pdb_api,
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": name}}},
        }),
    ]);
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(name: &str) -> CreatePluginArgs {
        CreatePluginArgs {
            name: name.to_owned(),
            image: "ghcr.io/example/hello:1.0".to_owned(),
            api: Some("greetings.example.com/v1".to_owned()),
            replicas: 2,
            port: 50051,
            extension_resource: Vec::new(),
            kplug_service_account: CreatePluginArgs::DEFAULT_KPLUG_SERVICE_ACCOUNT.to_owned(),
            registry: "https://kplug-registry.kplug-system.svc:8444".to_owned(),
            pdb_v1beta1: false,
        }
    }

    fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    fn usage_error(args: &CreatePluginArgs) -> String {
        super::super::usage_message(manifests(args, "plugins"))
    }

    #[test]
    fn the_serviceaccount_may_heartbeat_as_its_own_name_only() {
        let objects = manifests(&args("hello"), "plugins").expect("manifests");
        let kinds: Vec<_> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "ClusterRole",
                "ClusterRoleBinding",
                "Deployment",
                "PodDisruptionBudget"
            ]
        );
        assert_eq!(objects[1]["rules"][0]["resourceNames"], json!(["hello"]));
        assert_eq!(objects[1]["rules"][0]["verbs"], json!(["create"]));
        assert_eq!(
            objects[2]["subjects"][0],
            json!({"kind": "ServiceAccount", "name": "hello", "namespace": "plugins"})
        );
        let pod = &objects[5]["spec"]["template"]["spec"];
        let env = pod["containers"][0]["env"].as_array().expect("env");
        let value = |name: &str| {
            env.iter()
                .find(|e| e["name"] == name)
                .map(|e| e["value"].clone())
        };
        assert_eq!(value("KPLUG_ISSUED_IDENTITY"), Some(json!("true")));
        assert_eq!(value("KPLUG_ADVERTISE"), Some(json!("$(POD_IP):50051")));
        // POD_IP is defined before the variable that refers to it.
        let position = |name: &str| env.iter().position(|e| e["name"] == name);
        assert!(position("POD_IP") < position("KPLUG_ADVERTISE"));
        assert_eq!(pod["volumes"][1]["configMap"]["name"], "kplug-trust");
        assert_eq!(
            objects[5]["metadata"]["annotations"]["plugins.kplug.io/api"],
            "greetings.example.com/v1"
        );
        assert_eq!(objects[6]["apiVersion"], "policy/v1");
    }

    #[test]
    fn names_kubernetes_would_refuse_are_refused_here() {
        for name in ["", "Hello", "a.b", "-a", "a-", &"a".repeat(64)] {
            let error = manifests(&args(name), "plugins").expect_err(name);
            let said = error.to_string();
            assert!(
                said.contains(&format!("invalid plugin name {name:?}")),
                "{said}"
            );
            assert!(
                said.contains("RFC 1123 label") || said.contains("no more than 63"),
                "{said}"
            );
        }
        let mut no_replicas = args("hello");
        no_replicas.replicas = 0;
        assert!(manifests(&no_replicas, "plugins").is_err());
    }

    #[test]
    fn kplug_may_get_the_apis_objects_and_their_extensions_grouped_by_group() {
        let mut tables = args("tables");
        tables.api = Some("databasetables.myorg.org/v1alpha1".to_owned());
        tables.extension_resource = [
            "databasetablepostgresqlextensions.myorg.org",
            "configmaps",
            "databasetablemariadbextensions.myorg.org",
            "databasetables.myorg.org",
            "configmaps",
        ]
        .map(str::to_owned)
        .to_vec();
        let objects = manifests(&tables, "plugins").expect("manifests");
        let role = object(&objects, "ClusterRole", "kplug:read:tables").expect("read role");
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
                {
                    "apiGroups": ["myorg.org"],
                    "resources": [
                        "databasetablemariadbextensions",
                        "databasetablepostgresqlextensions",
                        "databasetables",
                    ],
                    "verbs": ["get"],
                },
            ])
        );
        assert_eq!(role["metadata"]["labels"], objects[0]["metadata"]["labels"]);
        // Right after the plugin's own role and binding.
        assert_eq!(objects[3]["metadata"]["name"], "kplug:read:tables");
        assert_eq!(objects[4]["metadata"]["name"], "kplug:read:tables");
        let binding = &objects[4];
        assert_eq!(binding["kind"], "ClusterRoleBinding");
        assert_eq!(binding["roleRef"]["name"], "kplug:read:tables");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "kplug", "namespace": "kplug-system"}])
        );
    }

    #[test]
    fn the_read_role_is_bound_to_the_kplug_serviceaccount_given() {
        let mut hello = args("hello");
        hello.kplug_service_account = "platform/kplug-main".to_owned();
        let objects = manifests(&hello, "plugins").expect("manifests");
        let binding =
            object(&objects, "ClusterRoleBinding", "kplug:read:hello").expect("read binding");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "kplug-main", "namespace": "platform"}])
        );
        let role = object(&objects, "ClusterRole", "kplug:read:hello").expect("read role");
        assert_eq!(
            role["rules"],
            json!([{"apiGroups": ["example.com"], "resources": ["greetings"], "verbs": ["get"]}])
        );
        assert!(
            preamble(&hello, "plugins").contains("--kplug-service-account platform/kplug-main")
        );
    }

    #[test]
    fn without_api_kplug_is_granted_nothing() {
        let mut hello = args("hello");
        hello.api = None;
        let objects = manifests(&hello, "plugins").expect("manifests");
        assert!(
            objects.iter().all(|o| !o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .starts_with("kplug:read:")),
            "{objects:?}"
        );
        assert_eq!(objects.len(), 5);
        assert!(!preamble(&hello, "plugins").contains("kplug:read:"));
    }

    #[test]
    fn malformed_flags_are_usage_errors_naming_the_flag_and_value() {
        let mut orphan = args("hello");
        orphan.api = None;
        orphan.extension_resource = vec!["configmaps".to_owned()];
        let message = usage_error(&orphan);
        assert!(
            message.contains("--extension-resource configmaps needs --api"),
            "{message}"
        );

        for api in [
            "greetings.example.com",
            "greetings/v1",
            ".example.com/v1",
            "greetings./v1",
            "greetings.example.com/",
            "greetings.example.com/v1/x",
            "Greetings.example.com/v1",
            "greetings.example..com/v1",
        ] {
            let mut bad = args("hello");
            bad.api = Some(api.to_owned());
            let message = usage_error(&bad);
            assert!(
                message.contains(&format!("invalid --api {api:?}")),
                "{message}"
            );
        }

        for extension in [
            "",
            ".myorg.org",
            "tables.",
            "Tables.myorg.org",
            "tables.myorg.org/v1",
            "a..b",
        ] {
            let mut bad = args("hello");
            bad.extension_resource = vec!["configmaps".to_owned(), extension.to_owned()];
            let message = usage_error(&bad);
            assert!(
                message.contains(&format!("invalid --extension-resource {extension:?}")),
                "{message}"
            );
        }

        for account in [
            "kplug",
            "/kplug",
            "kplug-system/",
            "kplug-system/kplug/x",
            "Kplug/kplug",
        ] {
            let mut bad = args("hello");
            bad.kplug_service_account = account.to_owned();
            let message = usage_error(&bad);
            assert!(
                message.contains(&format!("invalid --kplug-service-account {account:?}")),
                "{message}"
            );
        }
    }

    #[test]
    fn the_preamble_prints_the_command_that_prints_it_again() {
        let mut tables = args("tables");
        tables.api = Some("databasetables.myorg.org/v1alpha1".to_owned());
        tables.extension_resource = vec!["databasetablemariadbextensions.myorg.org".to_owned()];
        tables.replicas = 3;
        let first = preamble(&tables, "plugins");
        let first = first.lines().next().unwrap_or_default();
        assert_eq!(
            first,
            "# kplug plugin tables: kubectl kplug create plugin tables --image ghcr.io/example/hello:1.0 \
             --api databasetables.myorg.org/v1alpha1 \
             --extension-resource databasetablemariadbextensions.myorg.org --replicas 3 -n plugins"
        );
    }
}
