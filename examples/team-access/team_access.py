"""A kplug plugin whose children are not in its object's namespace: a TeamAccess
(``teamaccesses.platform.example.com``) becomes a ClusterRole of what the team
may read (cluster-scoped, wave 0) and a RoleBinding of it to the team's group
in each of its namespaces (wave 1).

    python team_access.py --registry 127.0.0.1:50051 --listen 127.0.0.1:0

The operator that applies them runs with ``--child-scope=cluster``: the
TeamAccess cannot own them through owner references, so the operator tracks
them by label and the TeamAccess's ``status.children``, and removes them,
RoleBindings first, before the TeamAccess goes.
"""

import kplug

#: What a team may read in its namespaces.
READ_RULES = [
    {"apiGroups": [""], "resources": ["pods", "services", "configmaps"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
]


class TeamAccess(kplug.Plugin):
    """Grants a group read access to namespaces."""

    name = "team-access"
    api = "teamaccesses.platform.example.com/v1alpha1"
    implementation = "RBAC"
    version = "0.1.0"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        group = request.spec.get("group")
        namespaces = request.spec.get("namespaces") or []
        if not group or not namespaces:
            return kplug.Outcome.failure("InvalidTeamAccess", "spec.group and spec.namespaces are required")
        # Named after the object, whose namespace keeps it unique.
        role = f"team-access.{request.namespace}.{request.name}"
        outcome = kplug.Outcome.success(
            "AccessDesired", f"{group} may read {len(namespaces)} namespace(s)", object_status={"clusterRole": role}
        )
        outcome.add_child(
            "role",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": READ_RULES,
            },
        )
        for namespace in sorted(set(namespaces)):
            outcome.add_child(
                f"binding-{namespace}",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": f"team-access-{request.name}", "namespace": namespace},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
                },
                wave=1,
            )
        return outcome


if __name__ == "__main__":
    kplug.run(TeamAccess())
