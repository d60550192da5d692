//! The rights a caller must hold on the objects of a reconcile before kplug
//! calls a plugin for it: those a controller of the object holds. Whoever
//! may create reconciles may only make a plugin act on objects they could
//! act on themselves (the confused deputy an aggregated API server must not
//! be), in each object's own namespace and name.
//!
//! | the request | on `spec.object` | on each extension | on each observed child |
//! |---|---|---|---|
//! | Reconcile | `update` `R/status` | `get` | `get` |
//! | Finalize | `update` `R/finalizers` | `get` | `get` |
//! | any dry run | `get` | `get` | `get` |
//!
//! An observed child (`spec.observedChildren`) is what the caller says it
//! saw: a caller who may not read it must not be able to feed a plugin a
//! made-up copy of it.
//!
//! A reconcile by reference (`spec.objectRef`) needs, besides, `get` on the
//! object it names: kplug reads the object and its extensions on the
//! caller's behalf and returns them in its answer, so it checks each right
//! to read before it reads, and a caller who may not read an object cannot
//! tell from kplug's answer whether it exists.
//!
//! `R/finalizers` is what kube-apiserver's OwnerReferencesPermissionEnforcement
//! checks before anyone may block an object's deletion, and what kubebuilder
//! grants every controller; Kubernetes serves no such endpoint, RBAC
//! authorizes it all the same.

use crate::v1alpha1::Operation;

/// A verb on a resource's subresource (empty: the resource itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Right {
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// What a reconcile's extensions need: to be read.
pub const ON_EXTENSION: Right = Right {
    verb: "get",
    subresource: "",
};

/// What each observed child needs: to be read.
pub const ON_OBSERVED_CHILD: Right = Right {
    verb: "get",
    subresource: "",
};

/// What the object named by `spec.objectRef` needs before kplug reads it.
pub const ON_REFERENCED_OBJECT: Right = Right {
    verb: "get",
    subresource: "",
};

/// What the reconciled object (`spec.object`) needs for `operation`.
pub fn on_object(operation: Operation, dry_run: bool) -> Right {
    match (operation, dry_run) {
        (_, true) => Right {
            verb: "get",
            subresource: "",
        },
        (Operation::Reconcile, false) => Right {
            verb: "update",
            subresource: "status",
        },
        (Operation::Finalize, false) => Right {
            verb: "update",
            subresource: "finalizers",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_needs_what_a_controller_of_the_object_holds() {
        let right = |verb, subresource| Right { verb, subresource };
        assert_eq!(
            on_object(Operation::Reconcile, false),
            right("update", "status")
        );
        assert_eq!(
            on_object(Operation::Finalize, false),
            right("update", "finalizers")
        );
        for operation in [Operation::Reconcile, Operation::Finalize] {
            assert_eq!(on_object(operation, true), right("get", ""));
        }
        assert_eq!(ON_EXTENSION, right("get", ""));
        assert_eq!(ON_OBSERVED_CHILD, right("get", ""));
        assert_eq!(ON_REFERENCED_OBJECT, right("get", ""));
    }
}
