use tokio::sync::broadcast;

use super::*;

/// The instance `instance` of `pg`, reached at 10.0.0.`host`:50052.
fn instance(instance: &str, host: u8) -> Declaration {
    Declaration {
        instance: instance.to_owned(),
        address: format!("10.0.0.{host}:50052"),
        ..declaration("pg")
    }
}

/// The events published since the last call, as (type, `ready/total`).
fn drained(feed: &mut broadcast::Receiver<Arc<Event>>) -> Vec<(EventType, String)> {
    std::iter::from_fn(|| feed.try_recv().ok())
        .map(|e| (e.event_type, object(&e.encoded).status.instances_summary()))
        .collect()
}

fn instance_names(plugin: &Plugin) -> Vec<&str> {
    plugin
        .status
        .instances
        .iter()
        .map(|i| i.name.as_str())
        .collect()
}

fn pg(registry: &Registry) -> Arc<Plugin> {
    registry.get("pg").expect("pg is registered")
}

#[test]
fn two_instances_make_one_plugin_described_by_the_newest() {
    let registry = Registry::new(config());
    let mut feed = registry.subscribe();
    let a = registry.heartbeat(instance("pg-a", 1), t0()).expect("a");
    let mut newer = instance("pg-b", 2);
    newer.version = "1.1.0".to_owned();
    newer.server_name = "pg.plugins.svc".to_owned();
    let b = registry.heartbeat(newer, t0() + secs(1)).expect("b");
    assert_eq!(a.uid, b.uid, "one registration");
    assert_eq!(
        drained(&mut feed),
        [
            (EventType::Added, "1/1".to_owned()),
            (EventType::Modified, "2/2".to_owned())
        ]
    );
    let plugin = pg(&registry);
    assert!(plugin.is_ready());
    assert_eq!(instance_names(&plugin), ["pg-a", "pg-b"]);
    assert_eq!(plugin.spec.address, "10.0.0.2:50052", "the newest's");
    assert_eq!(plugin.spec.version, "1.1.0");
    let b = &plugin.status.instances[1];
    assert_eq!(
        (
            b.version.as_str(),
            b.server_name.as_str(),
            b.ready,
            b.draining
        ),
        ("1.1.0", "pg.plugins.svc", true, false)
    );
    assert_eq!(plugin.status.instances[0].version, "1.0.0");
    assert_eq!(plugin.status.last_heartbeat_time.0, t0() + secs(1));
    assert_eq!(
        plugin.status.conditions[0].message,
        "2 of 2 instances are Ready"
    );
}

/// A new plugin is rendered between the read and the write lock, so
/// instances that register at once race to create it: each must land in the
/// one registration, whichever wins.
#[test]
fn instances_registering_at_once_make_one_plugin() {
    const INSTANCES: u8 = 8;
    for round in 0..50 {
        let registry = Registry::new(RegistryConfig {
            history: 64,
            ..config()
        });
        let mut feed = registry.subscribe();
        let start = std::sync::Barrier::new(usize::from(INSTANCES));
        let uids: Vec<String> = std::thread::scope(|threads| {
            let heartbeats: Vec<_> = (0..INSTANCES)
                .map(|i| {
                    let (registry, start) = (&registry, &start);
                    threads.spawn(move || {
                        start.wait();
                        registry.heartbeat(instance(&format!("pg-{i}"), i), t0())
                    })
                })
                .collect();
            heartbeats
                .into_iter()
                .map(|h| h.join().expect("no panic").expect("accepted").uid)
                .collect()
        });
        assert!(
            uids.iter().all(|uid| *uid == uids[0]),
            "round {round}: one registration, one uid: {uids:?}"
        );
        let mut names = instance_names(&pg(&registry))
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        names.sort();
        let expected: Vec<String> = (0..INSTANCES).map(|i| format!("pg-{i}")).collect();
        assert_eq!(names, expected, "round {round}");
        let events = drained(&mut feed);
        assert_eq!(events.len(), usize::from(INSTANCES), "round {round}");
        assert_eq!(events[0].0, EventType::Added, "round {round}");
        assert!(
            events[1..].iter().all(|e| e.0 == EventType::Modified),
            "round {round}: {events:?}"
        );
    }
}

#[test]
fn deregistering_an_instance_keeps_the_plugin_until_the_last_goes() {
    let registry = Registry::new(config());
    registry.heartbeat(instance("pg-a", 1), t0()).expect("a");
    registry.heartbeat(instance("pg-b", 2), t0()).expect("b");
    let mut feed = registry.subscribe();

    assert!(
        !registry.deregister("pg", "pg-b", "10.0.0.1:50052", t0()),
        "the instance and its address must match"
    );
    assert!(!registry.deregister("pg", "pg-c", "10.0.0.2:50052", t0()));
    assert!(registry.deregister("pg", "pg-b", "10.0.0.2:50052", t0() + secs(1)));
    let plugin = pg(&registry);
    assert!(plugin.is_ready());
    assert_eq!(instance_names(&plugin), ["pg-a"]);
    assert_eq!(plugin.spec.address, "10.0.0.1:50052");
    assert_eq!(
        drained(&mut feed),
        [(EventType::Modified, "1/1".to_owned())]
    );

    // Deregistering without an instance matches by address.
    assert!(registry.deregister("pg", "", "10.0.0.1:50052", t0() + secs(2)));
    assert!(registry.get("pg").is_none());
    assert_eq!(drained(&mut feed), [(EventType::Deleted, "1/1".to_owned())]);
}

#[test]
fn instances_turn_late_and_expire_each_on_its_own_clock() {
    let registry = Registry::new(config()); // interval 5s: late at 10s, expired at 15s
    registry.heartbeat(instance("pg-a", 1), t0()).expect("a");
    registry.heartbeat(instance("pg-b", 2), t0()).expect("b");
    for s in [4, 8, 12, 16, 20] {
        registry
            .heartbeat(instance("pg-b", 2), t0() + secs(s))
            .expect("b");
    }
    assert_eq!(registry.sweep(t0() + secs(9)), 0);
    assert_eq!(pg(&registry).status.instances_summary(), "2/2");

    assert_eq!(registry.sweep(t0() + secs(10)), 0);
    let plugin = pg(&registry);
    assert!(plugin.is_ready(), "b still heartbeats");
    assert_eq!(plugin.status.instances_summary(), "1/2");
    assert!(!plugin.status.instances[0].ready, "a is late");
    assert_eq!(
        plugin.status.conditions[0].message,
        "1 of 2 instances are Ready"
    );

    assert_eq!(registry.sweep(t0() + secs(15)), 0, "the plugin stays");
    let plugin = pg(&registry);
    assert_eq!(instance_names(&plugin), ["pg-b"], "a expired");
    assert_eq!(registry.census().expired, 0, "no plugin expired");

    // b stops at 20s: late at 30s, then the plugin expires with it.
    assert_eq!(registry.sweep(t0() + secs(30)), 0);
    let plugin = pg(&registry);
    assert!(!plugin.is_ready());
    assert_eq!(plugin.status.conditions[0].reason, "HeartbeatLate");
    assert_eq!(registry.sweep(t0() + secs(35)), 1);
    assert!(registry.get("pg").is_none());
    assert_eq!(registry.census().expired, 1);
}

#[test]
fn a_late_instance_that_heartbeats_again_is_ready_again() {
    let registry = Registry::new(config());
    registry.heartbeat(instance("pg-a", 1), t0()).expect("a");
    registry.heartbeat(instance("pg-b", 2), t0()).expect("b");
    registry.sweep(t0() + secs(10));
    assert!(!pg(&registry).is_ready(), "both late");
    registry
        .heartbeat(instance("pg-a", 1), t0() + secs(11))
        .expect("a");
    let plugin = pg(&registry);
    assert!(plugin.is_ready());
    assert_eq!(plugin.status.instances_summary(), "1/2");
    assert_eq!(
        plugin.status.conditions[0].last_transition_time.0,
        t0() + secs(11)
    );
}

#[test]
fn a_draining_instance_takes_no_calls_and_is_not_counted_ready() {
    let registry = Registry::new(config());
    registry.heartbeat(instance("pg-a", 1), t0()).expect("a");
    registry.heartbeat(instance("pg-b", 2), t0()).expect("b");
    let draining = |name: &str, host: u8| Declaration {
        draining: true,
        ..instance(name, host)
    };
    registry
        .heartbeat(draining("pg-b", 2), t0() + secs(1))
        .expect("b drains");
    let plugin = pg(&registry);
    assert!(plugin.is_ready());
    assert_eq!(plugin.status.instances_summary(), "1/2");
    let b = &plugin.status.instances[1];
    assert_eq!((b.ready, b.draining), (false, true));
    let serving: Vec<&str> = plugin
        .status
        .serving_instances()
        .map(|i| i.name.as_str())
        .collect();
    assert_eq!(serving, ["pg-a"]);

    registry
        .heartbeat(draining("pg-a", 1), t0() + secs(2))
        .expect("a drains");
    let plugin = pg(&registry);
    assert!(!plugin.is_ready(), "nothing takes calls");
    assert_eq!(plugin.status.conditions[0].reason, "Draining");
    assert_eq!(plugin.status.instances_summary(), "0/2");
    assert!(matches!(
        registry.select(None, Implementation::Any, Some("pg"), None),
        Err(SelectError::NotReady { .. })
    ));
}

#[test]
fn heartbeats_without_an_instance_are_told_apart_by_address() {
    let registry = Registry::new(config());
    let old = |host: u8| instance("", host);
    registry.heartbeat(old(1), t0()).expect("first");
    registry.heartbeat(old(1), t0() + secs(1)).expect("again");
    assert_eq!(instance_names(&pg(&registry)), ["10.0.0.1:50052"]);
    assert_eq!(registry.resource_version(), 1, "the same instance");

    registry.heartbeat(old(2), t0() + secs(2)).expect("another");
    assert_eq!(
        instance_names(&pg(&registry)),
        ["10.0.0.1:50052", "10.0.0.2:50052"]
    );
    assert!(registry.deregister("pg", "", "10.0.0.1:50052", t0() + secs(3)));
    assert_eq!(instance_names(&pg(&registry)), ["10.0.0.2:50052"]);
}

#[test]
fn a_named_instance_at_a_new_address_has_moved() {
    let registry = Registry::new(config());
    registry.heartbeat(instance("pg-a", 1), t0()).expect("a");
    let mut feed = registry.subscribe();
    registry
        .heartbeat(instance("pg-a", 9), t0() + secs(1))
        .expect("a moved");
    assert_eq!(
        drained(&mut feed),
        [(EventType::Modified, "1/1".to_owned())]
    );
    let plugin = pg(&registry);
    assert_eq!(instance_names(&plugin), ["pg-a"]);
    assert_eq!(plugin.status.instances[0].address, "10.0.0.9:50052");
    assert_eq!(plugin.spec.address, "10.0.0.9:50052");
}

#[test]
fn an_instance_of_another_api_or_implementation_is_refused() {
    let registry = Registry::new(config());
    registry.heartbeat(instance("pg-a", 1), t0()).expect("a");
    let mut queue = instance("pg-b", 2);
    queue.api.resource = "queues".to_owned();
    let refusal = registry
        .heartbeat(queue, t0() + secs(1))
        .expect_err("another API");
    assert_eq!(refusal.reason(), "DeclarationConflict");
    let message = refusal.to_string();
    for part in [
        "databasetables.myorg.org/v1alpha1 (PostgreSQL)",
        "queues.myorg.org/v1alpha1 (PostgreSQL)",
        "use another plugin name",
        "kubectl delete plugin pg",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }

    let mut maria = instance("pg-b", 2);
    maria.implementation = "MariaDB".to_owned();
    let refusal = registry.heartbeat(maria, t0()).expect_err("another one");
    assert_eq!(refusal.reason(), "DeclarationConflict");
    assert_eq!(registry.resource_version(), 1, "nothing changed");
    assert_eq!(instance_names(&pg(&registry)), ["pg-a"]);

    // Alone, an instance may change what it serves.
    let mut alone = instance("pg-a", 1);
    alone.api.resource = "queues".to_owned();
    registry.heartbeat(alone, t0() + secs(2)).expect("alone");
    assert_eq!(pg(&registry).spec.api.resource, "queues");
}

#[test]
fn every_instance_must_come_from_the_plugin_s_identity() {
    let registry = Registry::new(config());
    let owned = |name: &str, host: u8, by: &str| Declaration {
        registered_by: Some(by.to_owned()),
        ..instance(name, host)
    };
    registry
        .heartbeat(owned("pg-a", 1, "system:serviceaccount:plugins:pg"), t0())
        .expect("a");
    let refusal = registry
        .heartbeat(owned("pg-b", 2, "system:serviceaccount:plugins:evil"), t0())
        .expect_err("another identity");
    assert_eq!(refusal.reason(), "IdentityConflict");
    registry
        .heartbeat(owned("pg-b", 2, "system:serviceaccount:plugins:pg"), t0())
        .expect("the same identity");
}

#[test]
fn caps_refuse_new_plugins_and_instances_with_reasons() {
    let registry = Registry::new(RegistryConfig {
        max_plugins: 2,
        max_instances: 2,
        ..config()
    });
    registry.heartbeat(declaration("a"), t0()).expect("a");
    registry.heartbeat(instance("pg-a", 1), t0()).expect("pg-a");
    let refusal = registry
        .heartbeat(declaration("c"), t0())
        .expect_err("a third plugin");
    assert_eq!(refusal.reason(), "TooManyPlugins");
    assert!(refusal.to_string().contains("--max-plugins"), "{refusal}");

    registry.heartbeat(instance("pg-b", 2), t0()).expect("pg-b");
    let refusal = registry
        .heartbeat(instance("pg-c", 3), t0())
        .expect_err("a third instance");
    assert_eq!(refusal.reason(), "TooManyInstances");
    assert!(refusal.to_string().contains("\"pg-c\""), "{refusal}");
    assert_eq!(registry.resource_version(), 3, "refusals change nothing");

    // Known instances still heartbeat, changed or not.
    registry
        .heartbeat(instance("pg-b", 2), t0() + secs(1))
        .expect("pg-b again");
    registry
        .heartbeat(instance("pg-b", 4), t0() + secs(1))
        .expect("pg-b moved");
    // Room again once one leaves.
    assert!(registry.deregister("pg", "pg-b", "10.0.0.4:50052", t0()));
    registry.heartbeat(instance("pg-c", 3), t0()).expect("pg-c");
    assert!(registry.deregister("a", "", "127.0.0.1:50052", t0()));
    registry.heartbeat(declaration("c"), t0()).expect("c");
}

#[test]
fn two_versions_heartbeating_in_turn_do_not_flap_the_spec() {
    let registry = Registry::new(config());
    registry.heartbeat(instance("pg-a", 1), t0()).expect("a");
    let newer = || Declaration {
        version: "2.0.0".to_owned(),
        ..instance("pg-b", 2)
    };
    registry.heartbeat(newer(), t0()).expect("b");
    let mut feed = registry.subscribe();
    for s in 1..29 {
        registry
            .heartbeat(instance("pg-a", 1), t0() + secs(s))
            .expect("a");
        registry.heartbeat(newer(), t0() + secs(s)).expect("b");
    }
    assert!(drained(&mut feed).is_empty(), "no event per heartbeat");
    assert_eq!(pg(&registry).spec.version, "2.0.0");

    // Past the status refresh, one event refreshes both instances' times.
    for s in 30..59 {
        registry
            .heartbeat(instance("pg-a", 1), t0() + secs(s))
            .expect("a");
        registry.heartbeat(newer(), t0() + secs(s)).expect("b");
    }
    assert_eq!(
        drained(&mut feed),
        [(EventType::Modified, "2/2".to_owned())]
    );
    let plugin = pg(&registry);
    assert_eq!(plugin.spec.version, "2.0.0");
    let times: Vec<Timestamp> = plugin
        .status
        .instances
        .iter()
        .map(|i| i.last_heartbeat_time.0)
        .collect();
    // b's last heartbeat before a's at 30s was at 28s.
    assert_eq!(times, [t0() + secs(30), t0() + secs(28)]);
}

#[test]
fn a_shadow_neither_readies_nor_describes_the_plugin_and_its_record_goes_with_it() {
    let registry = Registry::new(config());
    let shadow = Declaration {
        version: "2.0.0".to_owned(),
        shadow_percent: 100,
        ..instance("pg-shadow", 9)
    };
    registry
        .heartbeat(shadow.clone(), t0())
        .expect("the shadow");
    let plugin = pg(&registry);
    assert!(!plugin.is_ready(), "a shadow alone serves nobody");
    assert_eq!(plugin.spec.version, "2.0.0", "nothing else describes it");
    assert_eq!(plugin.status.serving_instances().count(), 0);

    registry
        .heartbeat(instance("pg-a", 1), t0() + secs(1))
        .expect("a");
    registry
        .heartbeat(shadow, t0() + secs(2))
        .expect("the shadow again");
    let plugin = pg(&registry);
    assert!(plugin.is_ready());
    assert_eq!(
        plugin.spec.address, "10.0.0.1:50052",
        "the newest that serves"
    );
    assert_eq!(plugin.spec.version, "1.0.0");
    let serving: Vec<&str> = plugin
        .status
        .serving_instances()
        .map(|i| i.name.as_str())
        .collect();
    assert_eq!(serving, ["pg-a"]);
    assert_eq!(plugin.status.instances_summary(), "2/2");

    registry.shadow_outcome("pg", Comparison::Same, t0() + secs(3));
    let record = registry.shadow("pg").expect("pg's record");
    assert_eq!((record.status.compared, record.status.same), (1, 1));
    assert_eq!(record.status.shadows.len(), 1);
    registry
        .delete("pg", &Preconditions::default())
        .expect("deleted");
    // A copy that comes back after the plugin went keeps nothing.
    registry.shadow_outcome("pg", Comparison::Same, t0() + secs(4));
    assert!(registry.shadow("pg").is_none());
    registry
        .heartbeat(instance("pg-a", 1), t0() + secs(5))
        .expect("a again");
    let record = registry.shadow("pg").expect("pg's record");
    assert_eq!(
        record.status.compared, 0,
        "a new registration starts afresh"
    );
}
