//! `Widget`, a generic custom resource for tests and benches of operators:
//! namespaced, version v1, a status subresource, and spec and status that
//! keep whatever they are given.

/// The CustomResourceDefinition of `widgets.GROUP`.
pub fn widget_crd(group: &str) -> String {
    format!(
        r"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: widgets.{group}}}
spec:
  group: {group}
  scope: Namespaced
  names: {{kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {{status: {{}}}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
          status: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"
    )
}
