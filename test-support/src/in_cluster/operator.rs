//! `kplug-operator` for the benches' Widgets as a pod, in the shape of
//! examples/database-table/deploy/operator.yaml and operator-rbac.yaml: its
//! ServiceAccount bound to `kplug:operator` and `kplug:reader`, rights on
//! Widgets and Events, and one replica (no leader election, no metrics),
//! its reconciles through kube-apiserver or straight to kplug.

use super::{KPLUG_NS, WidgetsOperator};

/// Which way the operator's reconciles go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperatorRoute {
    /// `create reconciles` through kube-apiserver (the default).
    ThroughKubeApiserver,
    /// Straight to kplug's Service as its ServiceAccount (`--kplug-url`),
    /// trusting kplug with the ConfigMap `kplug-ca` of the hello install.
    StraightToKplug,
}

/// What the Deployment adds for `route`: arguments, volume mounts, volumes.
fn route_parts(route: OperatorRoute) -> (String, &'static str, &'static str) {
    match route {
        OperatorRoute::ThroughKubeApiserver => (String::new(), "", ""),
        OperatorRoute::StraightToKplug => (
            format!(
                "
        - --kplug-url=https://kplug.{KPLUG_NS}.svc
        - --kplug-ca-file=/var/run/kplug/ca/ca.crt"
            ),
            "
        volumeMounts:
        - {name: kplug-ca, mountPath: /var/run/kplug/ca, readOnly: true}",
            "
      volumes:
      - {name: kplug-ca, configMap: {name: kplug-ca}}",
        ),
    }
}

/// The Deployment's and the ServiceAccount's name, in namespace `plugins`.
pub(super) const NAME: &str = "widgets-operator";

/// The manifest of the operator `operator` describes, sending its
/// reconciles by `route`.
pub(super) fn manifest(operator: &WidgetsOperator, route: OperatorRoute) -> String {
    let WidgetsOperator {
        group,
        namespace,
        concurrency,
    } = operator;
    let (route_args, mounts, volumes) = route_parts(route);
    format!(
        r"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {NAME}, namespace: plugins}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: 'kplug:operator:{NAME}'}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kplug:operator'}}
subjects:
- {{kind: ServiceAccount, name: {NAME}, namespace: plugins}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: 'kplug:reader:{NAME}'}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kplug:reader'}}
subjects:
- {{kind: ServiceAccount, name: {NAME}, namespace: plugins}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {NAME}}}
rules:
- apiGroups: [{group}]
  resources: [widgets]
  verbs: [get, list, watch, update, patch]
- apiGroups: [{group}]
  resources: [widgets/status, widgets/finalizers]
  verbs: [get, update, patch]
- apiGroups: ['', events.k8s.io]
  resources: [events]
  verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {NAME}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {NAME}}}
subjects:
- {{kind: ServiceAccount, name: {NAME}, namespace: plugins}}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {NAME}
  namespace: plugins
  labels: {{app.kubernetes.io/name: {NAME}}}
spec:
  replicas: 1
  # One operator at a time, without leader election: the old one goes
  # before the new one starts.
  strategy: {{type: Recreate}}
  selector:
    matchLabels: {{app.kubernetes.io/name: {NAME}}}
  template:
    metadata:
      labels: {{app.kubernetes.io/name: {NAME}}}
    spec:
      serviceAccountName: {NAME}
      enableServiceLinks: false
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile: {{type: RuntimeDefault}}
      terminationGracePeriodSeconds: 40
      containers:
      - name: operator
        image: ghcr.io/kplug/kplug-operator:0.1.0
        imagePullPolicy: IfNotPresent
        args:
        - --resource=widgets.{group}
        - --namespace={namespace}
        - --concurrency={concurrency}
        - --leader-elect=false
        - --metrics-bind-address=0{route_args}
        env:
        - {{name: KPLUG_LOG, value: info}}
        resources:
          requests: {{cpu: 20m, memory: 32Mi}}
          limits: {{cpu: 500m, memory: 128Mi}}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {{drop: [ALL]}}{mounts}{volumes}
"
    )
}
