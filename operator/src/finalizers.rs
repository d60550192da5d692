//! Which of the operator's two finalizers an object needs, and the patch
//! that puts its list right. Each stands for one job that must be done
//! before the object may go:
//!
//! - the *finalize* finalizer (`--finalizer`): the plugin serving the
//!   object declares `Finalize`, so its Finalize call must succeed first;
//! - the *children* finalizer (`--children-finalizer`): the object's
//!   children need the operator to remove them, which their owner
//!   references alone would not do right: children in more than one wave
//!   (they go in reverse waves), children the object cannot own (other
//!   namespaces, cluster-scoped: only the inventory finds them), and
//!   children marked to be abandoned rather than deleted.
//!
//! An object that needs neither carries no finalizer of the operator's:
//! one write fewer when it is created, and its deletion waits for nobody
//! (kube-apiserver's garbage collector removes its owned children).
//! Kept apart as finalizers, not as a field of the status, so that the
//! object itself says what its deletion waits for, even while no plugin
//! is up to be asked.

use std::sync::Arc;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, TestOperation};
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::Value;

use kplug_api::v1alpha1::DesiredChild;

use crate::children::{ChildStatus, PRUNE, PRUNE_DISABLED};

/// The names of the operator's finalizers.
#[derive(Clone, Copy, Debug)]
pub struct Names<'a> {
    pub finalize: &'a str,
    pub children: &'a str,
}

/// Which jobs must be done before an object goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needed {
    /// The plugin's Finalize call.
    pub finalize: bool,
    /// Removing the children.
    pub children: bool,
}

impl Needed {
    /// Which of ours are in `finalizers`.
    pub fn held(finalizers: &[String], names: Names<'_>) -> Self {
        let has = |name: &str| finalizers.iter().any(|f| f == name);
        Self {
            finalize: has(names.finalize),
            children: has(names.children),
        }
    }

    pub fn any(self) -> bool {
        self.finalize || self.children
    }
}

/// Whether a plugin that may serve an object declares `Finalize`, among
/// `plugins` (the API's): those of the `required` implementation, else of
/// the `preferred` one while one of them is Ready (as kplug selects), else
/// any. A plugin that declares no capabilities handles everything.
pub fn may_finalize(
    plugins: &[Arc<DynamicObject>],
    required: Option<&str>,
    preferred: Option<&str>,
) -> bool {
    let implementation = |plugin: &DynamicObject| plugin.data["spec"]["implementation"].clone();
    let preferred_ready = preferred.filter(|preferred| {
        plugins
            .iter()
            .any(|p| implementation(p) == *preferred && crate::controller::is_ready(p))
    });
    let candidates = required.or(preferred_ready);
    plugins
        .iter()
        .filter(|p| candidates.is_none_or(|c| implementation(p) == c))
        .any(|plugin| {
            let capabilities = plugin.data["spec"]["protocol"]["capabilities"].as_array();
            capabilities.is_none_or(|c| c.is_empty() || c.iter().any(|c| c == "Finalize"))
        })
}

/// Whether the plugins of `implementation` among `plugins` are known to
/// handle no Finalize: there is one, and every one declares capabilities
/// without it. Not known while none is registered (it may be down).
pub fn declines_finalize(plugins: &[Arc<DynamicObject>], implementation: &str) -> bool {
    let mut of_it = plugins
        .iter()
        .filter(|p| p.data["spec"]["implementation"] == implementation)
        .peekable();
    of_it.peek().is_some()
        && of_it.all(|plugin| {
            let capabilities = plugin.data["spec"]["protocol"]["capabilities"].as_array();
            capabilities.is_some_and(|c| !c.is_empty() && !c.iter().any(|c| c == "Finalize"))
        })
}

/// Whether `parent`'s children, those an answer asks for (`desired`),
/// those its inventory lists and those last observed, need the operator to
/// remove them (see the module's text). With `elsewhere` (children allowed
/// outside the parent's namespace) any child may be one it cannot own: its
/// scope is only known once applied, and the finalizer must be there before.
pub fn children_need_removing(
    parent: &DynamicObject,
    desired: &[DesiredChild],
    inventory: &[ChildStatus],
    observed: &[(String, DynamicObject)],
    elsewhere: bool,
) -> bool {
    let mut waves = desired
        .iter()
        .map(|c| c.wave)
        .chain(inventory.iter().map(|l| l.wave));
    let first_wave = waves.next();
    let several_waves = waves.any(|w| Some(w) != first_wave);
    let any = first_wave.is_some();
    // A cluster-scoped parent can own children anywhere.
    let not_owned = parent
        .namespace()
        .is_some_and(|namespace| inventory.iter().any(|l| l.namespace != namespace));
    let abandoned = observed.iter().any(|(_, child)| {
        child.annotations().get(PRUNE).map(String::as_str) == Some(PRUNE_DISABLED)
    });
    several_waves || (elsewhere && any) || not_owned || abandoned
}

/// The JSON patch that turns the finalizers `current` into those `needed`
/// asks for, keeping everyone else's in their order; `None` when they are.
/// It first tests the list it read, so that a list changed meanwhile fails
/// the patch (422) instead of losing someone's finalizer.
pub fn patch(current: &[String], names: Names<'_>, needed: Needed) -> Option<Patch> {
    let wanted = |name: &str| {
        (name == names.finalize && needed.finalize) || (name == names.children && needed.children)
    };
    let ours = |name: &str| name == names.finalize || name == names.children;
    let mut list: Vec<String> = current
        .iter()
        .filter(|f| !ours(f) || wanted(f))
        .cloned()
        .collect();
    for name in [names.finalize, names.children] {
        if wanted(name) && !list.iter().any(|f| f == name) {
            list.push(name.to_owned());
        }
    }
    if list == current {
        return None;
    }
    let read = match current.is_empty() {
        // kube-apiserver stores an empty list as no list.
        true => Value::Null,
        false => current.to_vec().into(),
    };
    Some(Patch(vec![
        PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "finalizers"]),
            value: read,
        }),
        PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "finalizers"]),
            value: list.into(),
        }),
    ]))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const NAMES: Names<'static> = Names {
        finalize: "kplug.io/finalize",
        children: "kplug.io/children",
    };

    fn object(finalizers: &[&str]) -> DynamicObject {
        let mut metadata = json!({"name": "a", "namespace": "team-a"});
        // As kube-apiserver stores it: no list rather than an empty one.
        if !finalizers.is_empty() {
            metadata["finalizers"] = json!(finalizers);
        }
        serde_json::from_value(json!({
            "apiVersion": "test.kplug.io/v1", "kind": "Widget", "metadata": metadata,
        }))
        .expect("an object")
    }

    fn line(namespace: &str, wave: i32) -> ChildStatus {
        ChildStatus {
            key: format!("{namespace}-{wave}"),
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: namespace.into(),
            name: "pages".into(),
            wave,
            ..ChildStatus::default()
        }
    }

    fn applied(patch: &Patch, to: &DynamicObject) -> Vec<String> {
        let mut document = serde_json::to_value(to).expect("JSON");
        json_patch::patch(&mut document, patch).expect("the patch applies");
        serde_json::from_value::<DynamicObject>(document)
            .expect("an object")
            .finalizers()
            .to_vec()
    }

    #[test]
    fn only_the_needed_finalizers_are_added_after_everyone_elses() {
        let object = object(&["example.com/keep"]);
        let needed = Needed {
            finalize: false,
            children: true,
        };
        let patch = patch(object.finalizers(), NAMES, needed).expect("a change");
        assert_eq!(
            applied(&patch, &object),
            ["example.com/keep", "kplug.io/children"]
        );
        assert_eq!(Needed::held(object.finalizers(), NAMES), Needed::default());
    }

    #[test]
    fn a_finalizer_no_longer_needed_is_removed_and_a_held_list_left_alone() {
        let object = object(&["kplug.io/finalize", "example.com/keep"]);
        let patch = patch(object.finalizers(), NAMES, Needed::default()).expect("a change");
        assert_eq!(applied(&patch, &object), ["example.com/keep"]);
        let needed = Needed {
            finalize: true,
            children: false,
        };
        assert_eq!(Needed::held(object.finalizers(), NAMES), needed);
        assert!(super::patch(object.finalizers(), NAMES, needed).is_none());
    }

    #[test]
    fn the_patch_fails_when_the_list_changed_since_it_was_read() {
        let needed = Needed {
            finalize: true,
            children: false,
        };
        let read = object(&["example.com/keep"]);
        let patch = patch(read.finalizers(), NAMES, needed).expect("a change");
        assert_eq!(
            applied(&patch, &read),
            ["example.com/keep", "kplug.io/finalize"]
        );
        let mut changed = serde_json::to_value(object(&["example.com/new"])).expect("JSON");
        assert!(json_patch::patch(&mut changed, &patch).is_err());
        // No list at all is tested as null, which kube-apiserver's JSON
        // patch takes for a missing field (kube-rs's finalizer helper does
        // the same; the json-patch crate here would refuse it).
        let first = super::patch(&[], NAMES, needed).expect("a change");
        let PatchOperation::Test(test) = &first.0[0] else {
            panic!("a test first: {first:?}");
        };
        assert_eq!(test.value, Value::Null);
    }

    fn plugin(implementation: &str, capabilities: &[&str], ready: bool) -> Arc<DynamicObject> {
        let status = if ready { "True" } else { "False" };
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Plugin",
                "metadata": {"name": implementation.to_lowercase()},
                "spec": {"implementation": implementation, "protocol": {"capabilities": capabilities}},
                "status": {"conditions": [{"type": "Ready", "status": status}]},
            }))
            .expect("a plugin"),
        )
    }

    #[test]
    fn the_plugins_that_may_serve_an_object_decide_whether_it_may_be_finalized() {
        let plugins = [
            plugin("Hello", &["Reconcile", "Finalize"], true),
            plugin("Lean", &["Reconcile"], true),
            plugin("Old", &[], false),
        ];
        assert!(!may_finalize(&[], None, None), "no plugin yet");
        assert!(may_finalize(&plugins, None, None), "any may serve it");
        assert!(
            !may_finalize(&plugins, None, Some("Lean")),
            "a Ready Lean is chosen"
        );
        assert!(
            may_finalize(&plugins, Some("Hello"), Some("Lean")),
            "bound to Hello"
        );
        assert!(
            may_finalize(&plugins, Some("Old"), None),
            "declares nothing: everything"
        );
        let lean_down = [
            plugin("Hello", &["Finalize"], true),
            plugin("Lean", &[], false),
        ];
        assert!(
            may_finalize(&lean_down, None, Some("Lean")),
            "the fallback may serve it"
        );
    }

    #[test]
    fn only_registered_plugins_that_all_leave_out_finalize_decline_it() {
        let plugins = [
            plugin("Lean", &["Reconcile"], true),
            plugin("Lean", &["Reconcile", "DryRun"], false),
            plugin("Mixed", &["Reconcile"], true),
            plugin("Mixed", &["Reconcile", "Finalize"], true),
            plugin("Old", &[], true),
        ];
        assert!(declines_finalize(&plugins, "Lean"));
        assert!(
            !declines_finalize(&plugins, "Mixed"),
            "one of them finalizes"
        );
        assert!(
            !declines_finalize(&plugins, "Old"),
            "declares nothing: everything"
        );
        assert!(
            !declines_finalize(&plugins, "Gone"),
            "none registered: it may be down"
        );
    }

    #[test]
    fn children_need_removing_in_waves_elsewhere_or_when_abandoned() {
        let parent = object(&[]);
        let need = |desired: &[DesiredChild], inventory: &[ChildStatus], elsewhere| {
            children_need_removing(&parent, desired, inventory, &[], elsewhere)
        };
        assert!(!need(&[], &[], true), "no children");
        let owned = [line("team-a", 0), line("team-a", 0)];
        assert!(
            !need(&[], &owned, false),
            "the garbage collector removes them"
        );
        assert!(need(&[], &owned, true), "any may turn out cluster-scoped");
        assert!(need(&[], &[line("team-a", 0), line("team-a", 1)], false));
        let wave_one = DesiredChild {
            key: "web".into(),
            object: json!({"apiVersion": "apps/v1", "kind": "Deployment"}),
            ready: None,
            wave: 1,
        };
        assert!(need(&[wave_one], &owned, false), "a new wave asked for");
        assert!(need(&[], &[line("", 0)], false), "cluster-scoped");
        assert!(need(&[], &[line("team-b", 0)], false), "another namespace");
        let kept: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "pages", "annotations": {PRUNE: PRUNE_DISABLED}},
        }))
        .expect("a child");
        let observed = [("pages".to_owned(), kept)];
        assert!(children_need_removing(
            &parent,
            &[],
            &owned,
            &observed,
            false
        ));
    }
}
