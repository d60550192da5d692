//! `kubectl kplug create plugin`: the manifests of one plugin, printed for
//! `kubectl apply -f -` or a kustomization, like `kubectl create deployment
//! --dry-run=client -o yaml`. Pure: flags in, objects out.
//!
//! What a plugin needs and nothing more: its ServiceAccount; RBAC letting
//! that ServiceAccount heartbeat as this plugin's name only; a Deployment
//! of `--replicas` pods (POD_NAME and POD_IP from the downward API, a
//! projected ServiceAccount token, kplug's trust bundle from the ConfigMap
//! kplug keeps in the namespace, and the identity kplug issues, so no
//! certificate is made by hand); a PodDisruptionBudget keeping one pod up.

use kplug_proto::v1alpha1::TOKEN_AUDIENCE;
use serde_json::{Value, json};

use crate::cli::CreatePluginArgs;
use crate::error::Error;

/// Where the SDK finds the projected token, kplug's CA and its scratch space.
const TOKEN_DIR: &str = "/var/run/secrets/kplug";
const TRUST_DIR: &str = "/var/run/kplug/trust";
/// The ConfigMap kplug keeps in namespaces labelled for it.
const TRUST_CONFIG_MAP: &str = "kplug-trust";
const TRUST_LABEL: &str = "plugins.kplug.io/trust=enabled";

/// A DNS-1123 label: the plugin's name names every object and is a label value.
fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "invalid plugin name {name:?}: a lowercase RFC 1123 label must consist of lower case \
             alphanumeric characters or '-', start and end with an alphanumeric character, and be \
             at most 63 characters"
        )))
    }
}

/// The header comment: what the objects need that they cannot carry.
pub fn preamble(args: &CreatePluginArgs, namespace: &str) -> String {
    format!(
        "# kplug plugin {name}: kubectl kplug create plugin {name} --image {image}\n\
         # Needs kplug with its plugin CA (README.md, \"Installing a plugin\") and, once per\n\
         # namespace, the label that makes kplug keep ConfigMap {TRUST_CONFIG_MAP} here:\n\
         #   kubectl label namespace {namespace} {TRUST_LABEL}\n",
        name = args.name,
        image = args.image,
    )
}

/// The plugin's objects, in the order `kubectl apply` should create them.
pub fn manifests(args: &CreatePluginArgs, namespace: &str) -> Result<Vec<Value>, Error> {
    check_name(&args.name)?;
    if args.image.trim().is_empty() {
        return Err(Error::Usage(
            "--image must name the plugin's image".to_owned(),
        ));
    }
    if args.replicas == 0 {
        return Err(Error::Usage("--replicas must be at least 1".to_owned()));
    }
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
    Ok(vec![
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
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }),
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
                        "securityContext": {
                            "runAsNonRoot": true,
                            "runAsUser": 65532,
                            "runAsGroup": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [{
                            "name": "plugin",
                            "image": args.image,
                            "env": env,
                            "ports": [{"name": "grpc", "containerPort": port, "protocol": "TCP"}],
                            "readinessProbe": {"tcpSocket": {"port": "grpc"}, "periodSeconds": 5},
                            "livenessProbe": {"tcpSocket": {"port": "grpc"}, "initialDelaySeconds": 5, "periodSeconds": 10},
                            "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"]},
                            },
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
    ])
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
            registry: "https://kplug-registry.kplug-system.svc:8444".to_owned(),
            pdb_v1beta1: false,
        }
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
        let pod = &objects[3]["spec"]["template"]["spec"];
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
            objects[3]["metadata"]["annotations"]["plugins.kplug.io/api"],
            "greetings.example.com/v1"
        );
        assert_eq!(objects[4]["apiVersion"], "policy/v1");
    }

    #[test]
    fn names_kubernetes_would_refuse_are_refused_here() {
        for name in ["", "Hello", "a.b", "-a", "a-", &"a".repeat(64)] {
            let error = manifests(&args(name), "plugins").expect_err(name);
            assert!(error.to_string().contains("RFC 1123 label"), "{error}");
        }
        let mut no_replicas = args("hello");
        no_replicas.replicas = 0;
        assert!(manifests(&no_replicas, "plugins").is_err());
    }
}
