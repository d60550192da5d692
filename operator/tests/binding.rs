//! `--binding FollowSelection`: every reconcile goes where kplug's
//! selection says, so an object moves to its preferred implementation as
//! soon as that has a Ready plugin (Sticky, the default, is covered by
//! database_table.rs: the object stays where its data is).

mod support;

use std::time::Duration;

use kplug_test_support::{wait_plugin_ready, wait_until};
use support::widgets::Widgets;

#[test]
fn follow_selection_moves_an_object_to_its_preferred_implementation() {
    let world = Widgets::start();
    let _first = world.plugin("widgets-a", "Alpha");
    let _operator = world.run_operator(&["--binding", "FollowSelection"]);

    let served_by = |implementation: &str, reason: &str, generation: u64| {
        wait_until(
            &format!("served by {implementation} ({reason})"),
            Duration::from_secs(30),
            || {
                let object = world.get("moving")?;
                let status = &object["status"];
                (status["implementation"] == implementation
                    && status["selection"]["reason"] == reason
                    && status["observedGeneration"] == generation)
                    .then_some(())
                    .ok_or_else(|| status.to_string())
            },
        );
    };
    world.apply("moving", "size: 1, preferredImplementation: Beta");
    served_by("Alpha", "Fallback", 1);
    let _second = world.plugin("widgets-b", "Beta");
    // Ready, not only listed: a listed Beta that is not Ready yet leaves
    // Alpha the only choice (Fallback), and generation 2 would prove nothing.
    wait_plugin_ready(&world.cluster, "widgets-b");
    world.apply("moving", "size: 2, preferredImplementation: Beta");
    served_by("Beta", "PreferredImplementation", 2);
}

#[test]
fn a_sticky_object_rebinds_only_when_its_binding_is_cleared() {
    let world = Widgets::start();
    let _first = world.plugin("widgets-a", "Alpha");
    let _operator = world.run_operator(&[]);
    let served = |implementation: &str, generation: u64| {
        wait_until(
            &format!("generation {generation} served by {implementation}"),
            Duration::from_secs(30),
            || {
                let object = world.get("pinned")?;
                let status = &object["status"];
                (status["implementation"] == implementation
                    && status["plugin"]["implementation"] == implementation
                    && status["observedGeneration"] == generation)
                    .then_some(())
                    .ok_or_else(|| status.to_string())
            },
        );
    };
    world.apply("pinned", "size: 1, preferredImplementation: Beta");
    served("Alpha", 1);
    let _second = world.plugin("widgets-b", "Beta");
    // Ready, not only listed: a listed Beta that is not Ready yet leaves
    // Alpha the only choice (Fallback), and generation 2 would prove nothing.
    wait_plugin_ready(&world.cluster, "widgets-b");
    world.apply("pinned", "size: 2, preferredImplementation: Beta");
    served("Alpha", 2);
    // The README's way to rebind: clear the binding, then nudge the object.
    world.clear_binding("pinned");
    world.request_reconcile("pinned", "now");
    served("Beta", 2);
    let object = world.get("pinned").expect("pinned");
    assert_eq!(
        object["status"]["selection"]["reason"],
        "PreferredImplementation"
    );
}
