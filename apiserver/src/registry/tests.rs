use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::*;
use crate::v1alpha1::{Plugin, PluginApi, Protocol};

fn config() -> RegistryConfig {
    RegistryConfig {
        history: 4,
        ..RegistryConfig::default()
    }
}

fn declaration(name: &str) -> Declaration {
    Declaration {
        name: name.to_owned(),
        instance: String::new(),
        draining: false,
        version: "1.0.0".to_owned(),
        api: PluginApi {
            group: "myorg.org".to_owned(),
            resource: "databasetables".to_owned(),
            version: "v1alpha1".to_owned(),
        },
        implementation: "PostgreSQL".to_owned(),
        address: "127.0.0.1:50052".to_owned(),
        server_name: String::new(),
        canary_weight: 0,
        shadow_percent: 0,
        extensions: Vec::new(),
        labels: Labels::default(),
        interval: Duration::from_secs(5),
        protocol: Protocol {
            version: "v1alpha1".to_owned(),
            ..Protocol::default()
        },
        registered_by: None,
    }
}

/// A stored version's typed object, as the registry reads it back.
fn object(encoded: &Encoded) -> Plugin {
    encoded.object().expect("a stored version reads back")
}

/// The names on a page, in its order.
fn names(page: Page) -> Vec<String> {
    page.rows
        .iter()
        .map(|row| object(&row.encoded).name().to_owned())
        .collect()
}

fn t0() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn secs(s: i64) -> SignedDuration {
    SignedDuration::from_secs(s)
}

fn event_types(start: &WatchStart) -> Vec<(EventType, u64)> {
    start
        .initial
        .iter()
        .map(|e| (e.event_type, e.resource_version))
        .collect()
}

/// Each plugin's record is one boxed `Entry`, which jemalloc places in the
/// smallest of its size classes that holds it (..., 512, 640, ... bytes):
/// at 10,000 plugins one class more is 1.2 MiB more. A field that takes it
/// past 512 bytes belongs in a box of its own unless most plugins need it.
#[test]
fn a_plugins_record_fits_in_512_bytes() {
    assert!(
        size_of::<Entry>() <= 512,
        "Entry takes {} bytes",
        size_of::<Entry>()
    );
}

/// The canary record exists only while it holds something, and a
/// withdrawal outlives the canary instances it withdrew: when they come back
/// with the same version, they still take no calls.
#[test]
fn a_canary_record_lives_while_it_holds_something() {
    let mut lifecycle = Lifecycle::new(t0());
    lifecycle.set_canary_since(None);
    assert!(lifecycle.canary.is_none(), "no canary, no record");
    lifecycle.set_canary_since(Some(t0()));
    assert_eq!(lifecycle.canary_since(), Some(t0()));
    lifecycle.set_canary_since(None);
    assert!(lifecycle.canary.is_none(), "the canaries left");

    lifecycle.set_canary_since(Some(t0()));
    lifecycle.withdraw(Withdrawn {
        version: "2.0.0".to_owned(),
        withdrawal: Withdrawal {
            canary_calls: 10,
            canary_bad: 5,
            stable_calls: 90,
            stable_bad: 0,
        },
        at: t0() + secs(1),
    });
    lifecycle.set_canary_since(None);
    assert_eq!(lifecycle.canary_since(), None);
    assert_eq!(
        lifecycle.withdrawn().map(|w| w.version.as_str()),
        Some("2.0.0"),
        "the withdrawal is kept after its instances left"
    );
}

#[test]
fn first_heartbeat_registers_with_uid_and_labels() {
    let registry = Registry::new(config());
    let accepted = registry
        .heartbeat(declaration("pg"), t0())
        .expect("accepted");
    assert_eq!(accepted.interval, Duration::from_secs(5));
    assert_eq!(accepted.ttl, Duration::from_secs(15));
    let plugin = registry.get("pg").expect("registered");
    assert_eq!(plugin.metadata.uid.as_deref(), Some(accepted.uid.as_str()));
    assert_eq!(
        uuid::Uuid::parse_str(&accepted.uid).map(|uid| uid.hyphenated().to_string()),
        Ok(accepted.uid.clone()),
        "a uid as Kubernetes writes one: lowercase, hyphenated"
    );
    assert_eq!(
        plugin.metadata.resource_version.as_deref(),
        Some(registry.version(1).as_str())
    );
    let labels = plugin.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("kplug.io/api").map(String::as_str),
        Some("databasetables.myorg.org")
    );
    assert_eq!(
        labels.get("kplug.io/implementation").map(String::as_str),
        Some("postgresql")
    );
    assert!(plugin.is_ready());
    assert_eq!(plugin.status.expires_at.0, t0() + secs(15));
}

#[test]
fn unchanged_heartbeats_are_quiet_until_the_status_refresh() {
    let registry = Registry::new(config());
    registry
        .heartbeat(declaration("pg"), t0())
        .expect("accepted");
    for s in 1..30 {
        registry
            .heartbeat(declaration("pg"), t0() + secs(s))
            .expect("accepted");
    }
    assert_eq!(
        registry.resource_version(),
        1,
        "no event for unchanged heartbeats"
    );
    assert_eq!(registry.last_seen("pg"), Some(t0() + secs(29)));
    registry
        .heartbeat(declaration("pg"), t0() + secs(30))
        .expect("accepted");
    assert_eq!(
        registry.resource_version(),
        2,
        "refresh after status_refresh"
    );
    let plugin = registry.get("pg").expect("registered");
    assert_eq!(plugin.status.last_heartbeat_time.0, t0() + secs(30));
}

#[test]
fn a_changed_declaration_is_modified_with_the_previous_object() {
    let registry = Registry::new(config());
    registry
        .heartbeat(declaration("pg"), t0())
        .expect("accepted");
    let watch = registry.watch(Some(1)).expect("watch");
    let mut feed = watch.feed;
    let mut changed = declaration("pg");
    changed.version = "1.1.0".to_owned();
    registry
        .heartbeat(changed, t0() + secs(1))
        .expect("accepted");
    let event = feed.try_recv().expect("an event");
    assert_eq!(event.event_type, EventType::Modified);
    assert_eq!(object(&event.encoded).spec.version, "1.1.0");
    let previous = event.previous.as_ref().map(|p| object(p).spec.version);
    assert_eq!(previous.as_deref(), Some("1.0.0"));
}

#[test]
fn only_changes_to_the_declaration_keep_the_previous_object() {
    let registry = Registry::new(config());
    registry
        .heartbeat(declaration("pg"), t0())
        .expect("accepted");
    let mut feed = registry.watch(Some(1)).expect("watch").feed;
    // A status refresh, then the plugin late (readiness): status only.
    registry
        .heartbeat(declaration("pg"), t0() + secs(30))
        .expect("accepted");
    registry.sweep(t0() + secs(41));
    let mut relabelled = declaration("pg");
    relabelled
        .labels
        .insert("tier".to_owned(), "gold".to_owned());
    registry
        .heartbeat(relabelled, t0() + secs(42))
        .expect("accepted");
    let mut moved = declaration("pg");
    moved.labels.insert("tier".to_owned(), "gold".to_owned());
    moved.address = "127.0.0.2:50052".to_owned();
    registry
        .heartbeat(moved, t0() + secs(43))
        .expect("accepted");

    let mut kept = Vec::new();
    while let Ok(event) = feed.try_recv() {
        assert_eq!(event.event_type, EventType::Modified);
        kept.push(event.previous.as_ref().map(|p| {
            let p = object(p);
            let labels = p.metadata.labels.unwrap_or_default();
            (labels.contains_key("tier"), p.spec.address)
        }));
    }
    assert_eq!(
        kept,
        [
            None,
            None,
            Some((false, "127.0.0.1:50052".to_owned())),
            Some((true, "127.0.0.1:50052".to_owned())),
        ]
    );
}

#[test]
fn another_identity_cannot_take_a_live_name() {
    let registry = Registry::new(config());
    let mut owner = declaration("pg");
    owner.registered_by = Some("system:serviceaccount:plugins:pg".to_owned());
    registry.heartbeat(owner, t0()).expect("accepted");
    let mut other = declaration("pg");
    other.registered_by = Some("system:serviceaccount:plugins:evil".to_owned());
    let refusal = registry.heartbeat(other, t0()).expect_err("refused");
    assert_eq!(refusal.reason(), "IdentityConflict");
}

#[test]
fn late_plugins_turn_unready_then_expire_and_return_as_new_objects() {
    let registry = Registry::new(config());
    let first = registry
        .heartbeat(declaration("pg"), t0())
        .expect("accepted");
    assert_eq!(registry.sweep(t0() + secs(9)), 0);
    assert!(registry.get("pg").is_some_and(|p| p.is_ready()));
    registry.sweep(t0() + secs(10));
    let late = registry.get("pg").expect("still registered");
    assert!(!late.is_ready(), "late after two intervals");
    assert_eq!(late.status.conditions[0].reason, "HeartbeatLate");

    // A heartbeat makes it Ready again, same registration.
    let again = registry
        .heartbeat(declaration("pg"), t0() + secs(11))
        .expect("accepted");
    assert_eq!(again.uid, first.uid);
    assert!(registry.get("pg").is_some_and(|p| p.is_ready()));

    assert_eq!(registry.sweep(t0() + secs(11 + 14)), 0);
    assert_eq!(registry.sweep(t0() + secs(11 + 15)), 1);
    assert!(registry.get("pg").is_none());

    let back = registry
        .heartbeat(declaration("pg"), t0() + secs(40))
        .expect("accepted");
    assert_ne!(
        back.uid, first.uid,
        "an expired plugin comes back as a new object"
    );
}

#[test]
fn a_heartbeat_racing_the_sweep_keeps_the_plugin() {
    let registry = Registry::new(config());
    registry
        .heartbeat(declaration("pg"), t0())
        .expect("accepted");
    registry
        .heartbeat(declaration("pg"), t0() + secs(14))
        .expect("accepted");
    assert_eq!(registry.sweep(t0() + secs(16)), 0);
    assert!(registry.get("pg").is_some());
}

#[test]
fn delete_checks_preconditions_and_emits_deleted() {
    let registry = Registry::new(config());
    let accepted = registry
        .heartbeat(declaration("pg"), t0())
        .expect("accepted");
    let wrong_uid = Preconditions {
        uid: Some("nope".to_owned()),
        resource_version: None,
    };
    assert!(matches!(
        registry.delete("pg", &wrong_uid),
        Err(DeleteError::Conflict(_))
    ));
    let wrong_rv = Preconditions {
        uid: None,
        resource_version: Some("7".to_owned()),
    };
    assert!(matches!(
        registry.delete("pg", &wrong_rv),
        Err(DeleteError::Conflict(_))
    ));
    // The uid as the heartbeat's reply and metadata.uid give it.
    let right_uid = Preconditions {
        uid: Some(accepted.uid),
        resource_version: None,
    };
    let deleted = registry.delete("pg", &right_uid).expect("deleted");
    assert_eq!(
        object(&deleted).metadata.resource_version.as_deref(),
        Some(registry.version(2).as_str())
    );
    assert!(matches!(
        registry.delete("pg", &Preconditions::default()),
        Err(DeleteError::NotFound(_))
    ));
}

#[test]
fn deregister_needs_the_registered_address() {
    let registry = Registry::new(config());
    registry
        .heartbeat(declaration("pg"), t0())
        .expect("accepted");
    assert!(!registry.deregister("pg", "", "10.0.0.1:1", t0()));
    assert!(registry.deregister("pg", "", "127.0.0.1:50052", t0()));
    assert!(!registry.deregister("pg", "", "127.0.0.1:50052", t0()));
    assert!(registry.is_empty());
}

#[test]
fn list_is_ordered_filtered_and_pages_after_a_name() {
    let registry = Registry::new(config());
    for name in ["c", "a", "b"] {
        registry
            .heartbeat(declaration(name), t0())
            .expect("accepted");
    }
    let all = usize::MAX;
    assert_eq!(
        names(registry.page(None, all, |_, _| true)),
        ["a", "b", "c"]
    );
    assert_eq!(
        names(registry.page(Some("a"), all, |_, _| true)),
        ["b", "c"]
    );
    let not_b = |name: &str, e: &Encoded| name == object(e).name() && name != "b";
    assert_eq!(names(registry.page(None, all, not_b)), ["a", "c"]);
    assert_eq!(registry.page(None, all, |_, _| true).resource_version, 3);
    assert_eq!(
        registry
            .objects()
            .iter()
            .map(Plugin::name)
            .collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
}

#[test]
fn pages_stop_at_the_limit_and_count_the_rest() {
    let registry = Registry::new(config());
    for name in ["c", "a", "d", "b"] {
        registry
            .heartbeat(declaration(name), t0())
            .expect("accepted");
    }
    let page = registry.page(Some("a"), 2, |name, _| name != "c");
    assert_eq!(page.rows.len(), 2);
    assert_eq!(page.last_name.as_deref(), Some("d"));
    assert_eq!(page.remaining, 0);
    let page = registry.page(None, 1, |_, _| true);
    assert_eq!(page.last_name.as_deref(), Some("a"));
    assert_eq!(page.remaining, 3);
    assert_eq!(page.resource_version, 4);
    let row = registry.get_row("a").expect("a row");
    assert_eq!(page.rows[0].encoded.to_json(), row.encoded.to_json());
    assert_eq!(page.rows[0].last_seen, t0());
}

#[test]
fn watches_resume_from_history_and_expire_beyond_it() {
    let registry = Registry::new(config()); // history of 4
    for name in ["a", "b", "c"] {
        registry
            .heartbeat(declaration(name), t0())
            .expect("accepted");
    }
    let from_start = registry.watch(None).expect("watch");
    assert_eq!(from_start.initial.len(), 3);
    assert!(
        from_start
            .initial
            .iter()
            .all(|e| e.event_type == EventType::Added)
    );

    let resumed = registry.watch(Some(1)).expect("watch");
    assert_eq!(
        event_types(&resumed),
        [(EventType::Added, 2), (EventType::Added, 3)]
    );

    for name in ["d", "e", "f"] {
        registry
            .heartbeat(declaration(name), t0())
            .expect("accepted");
    }
    // Events 1 and 2 were dropped from the 4-event history.
    assert_eq!(
        registry.watch(Some(1)).err(),
        Some(WatchError::Expired {
            requested: 1,
            oldest: 2
        })
    );
    let still = registry
        .watch(Some(2))
        .expect("watch from the compacted edge");
    assert_eq!(still.initial.len(), 4);
    assert_eq!(
        registry.watch(Some(99)).err(),
        Some(WatchError::TooLarge {
            requested: 99,
            current: 6
        })
    );
}

#[test]
fn intervals_are_clamped() {
    let registry = Registry::new(config());
    assert_eq!(registry.effective_interval(None), Duration::from_secs(10));
    assert_eq!(
        registry.effective_interval(Some(Duration::from_millis(10))),
        Duration::from_secs(1)
    );
    assert_eq!(
        registry.effective_interval(Some(Duration::from_secs(3600))),
        Duration::from_secs(300)
    );
}

/// Several processes serving one plugin.
mod instances;

mod selection {
    use super::*;
    use crate::v1alpha1::{ApiSelector, SelectionReason};

    fn plugin(name: &str, implementation: &str, version: &str, port: u16) -> Declaration {
        Declaration {
            implementation: implementation.to_owned(),
            version: version.to_owned(),
            address: format!("127.0.0.1:{port}"),
            ..declaration(name)
        }
    }

    fn tables() -> ApiSelector {
        ApiSelector {
            group: "myorg.org".to_owned(),
            resource: "databasetables".to_owned(),
            version: String::new(),
        }
    }

    fn registry_with(plugins: &[Declaration]) -> Registry {
        let registry = Registry::new(config());
        for p in plugins {
            registry.heartbeat(p.clone(), t0()).expect("accepted");
        }
        registry
    }

    fn chosen(registry: &Registry, preferred: Option<&str>) -> (String, SelectionReason) {
        let (plugin, selection) = registry
            .select(
                Some(&tables()),
                Implementation::from_spec(None, preferred),
                None,
                None,
            )
            .expect("selected");
        (plugin.name().to_owned(), selection.reason)
    }

    #[test]
    fn the_preferred_implementation_wins_case_insensitively() {
        let registry = registry_with(&[
            plugin("pg", "PostgreSQL", "2.0.0", 1),
            plugin("maria", "MariaDB", "1.0.0", 2),
        ]);
        assert_eq!(
            chosen(&registry, Some("mariadb")),
            ("maria".to_owned(), SelectionReason::PreferredImplementation)
        );
    }

    #[test]
    fn without_the_preferred_one_the_fallback_is_highest_version_then_name() {
        let registry = registry_with(&[
            plugin("b-pg", "PostgreSQL", "1.10.0", 1),
            plugin("a-pg", "PostgreSQL", "1.10.0", 2),
            plugin("old", "PostgreSQL", "1.9.9", 3),
        ]);
        assert_eq!(
            chosen(&registry, Some("MariaDB")),
            ("a-pg".to_owned(), SelectionReason::Fallback)
        );
        assert_eq!(
            chosen(&registry, None),
            ("a-pg".to_owned(), SelectionReason::Fallback)
        );
        let (_, selection) = registry
            .select(
                Some(&tables()),
                Implementation::Preferred("MariaDB"),
                None,
                None,
            )
            .expect("selected");
        assert!(
            selection
                .message
                .contains("no Ready plugin implements MariaDB"),
            "{}",
            selection.message
        );
    }

    #[test]
    fn a_plugin_competes_with_its_newest_instances_version_and_is_returned_as_stored() {
        let registry = registry_with(&[plugin("b", "PostgreSQL", "2.0.0", 1)]);
        for (instance, version, port) in [("a-1", "1.0.0", 2), ("a-2", "3.0.0", 3)] {
            let declaration = Declaration {
                instance: instance.to_owned(),
                ..plugin("a", "PostgreSQL", version, port)
            };
            registry.heartbeat(declaration, t0()).expect("accepted");
        }
        let (plugin, _) = registry
            .select(Some(&tables()), Implementation::Any, None, None)
            .expect("selected");
        assert_eq!(
            (plugin.name(), plugin.spec.version.as_str()),
            ("a", "3.0.0")
        );
        assert_eq!(Some(&*plugin), registry.get("a").as_deref());
    }

    #[test]
    fn a_required_implementation_never_falls_back() {
        let registry = registry_with(&[
            plugin("pg", "PostgreSQL", "2.0.0", 1),
            plugin("maria", "MariaDB", "1.0.0", 2),
        ]);
        let (plugin, selection) = registry
            .select(
                Some(&tables()),
                Implementation::from_spec(Some("postgresql"), Some("MariaDB")),
                None,
                None,
            )
            .expect("selected");
        assert_eq!(
            (plugin.name(), selection.reason),
            ("pg", SelectionReason::RequiredImplementation)
        );
        assert_eq!(
            registry
                .select(
                    Some(&tables()),
                    Implementation::Required("Oracle"),
                    None,
                    None
                )
                .err(),
            Some(SelectError::NoneReadyOfImplementation {
                api: "databasetables.myorg.org".to_owned(),
                implementation: "Oracle".to_owned(),
            })
        );
        assert_eq!(
            Implementation::from_spec(Some(""), Some("MariaDB")),
            Implementation::Preferred("MariaDB")
        );
    }

    #[test]
    fn plugins_that_are_not_ready_or_serve_another_api_are_never_chosen() {
        let mut other_api = plugin("other", "MariaDB", "9.0.0", 1);
        other_api.api.resource = "queues".to_owned();
        let registry = registry_with(&[other_api, plugin("late", "MariaDB", "1.0.0", 2)]);
        registry.sweep(t0() + secs(10)); // "late" misses two intervals
        assert_eq!(
            registry
                .select(
                    Some(&tables()),
                    Implementation::Preferred("MariaDB"),
                    None,
                    None
                )
                .err(),
            Some(SelectError::NoneReady(
                "databasetables.myorg.org".to_owned()
            ))
        );
    }

    #[test]
    fn a_pinned_plugin_must_exist_be_ready_and_serve_the_api() {
        let mut queue = plugin("queue", "Rabbit", "1.0.0", 1);
        queue.api.resource = "queues".to_owned();
        let registry = registry_with(&[plugin("pg", "PostgreSQL", "1.0.0", 2), queue]);
        let (plugin, selection) = registry
            .select(
                Some(&tables()),
                Implementation::Preferred("MariaDB"),
                Some("pg"),
                None,
            )
            .expect("pinned");
        assert_eq!(
            (plugin.name(), selection.reason),
            ("pg", SelectionReason::Requested)
        );
        assert!(matches!(
            registry.select(Some(&tables()), Implementation::Any, Some("queue"), None),
            Err(SelectError::WrongApi { .. })
        ));
        assert_eq!(
            registry
                .select(None, Implementation::Any, Some("ghost"), None)
                .err(),
            Some(SelectError::NotFound("ghost".to_owned()))
        );
        registry.sweep(t0() + secs(10));
        assert!(matches!(
            registry.select(None, Implementation::Any, Some("pg"), None),
            Err(SelectError::NotReady { .. })
        ));
    }
}
