use std::cmp::Ordering;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::v1alpha1::{PluginApi, PluginSpec, PluginStatus};

fn plugin(name: &str, resource: &str, implementation: &str, version: &str) -> Plugin {
    let ready = Condition {
        type_: CONDITION_READY.to_owned(),
        status: "True".to_owned(),
        reason: "HeartbeatReceived".to_owned(),
        message: String::new(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    };
    Plugin {
        api_version: crate::v1alpha1::API_VERSION.to_owned(),
        kind: Plugin::KIND.to_owned(),
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: PluginSpec {
            api: PluginApi {
                group: "myorg.org".to_owned(),
                resource: resource.to_owned(),
                version: "v1alpha1".to_owned(),
            },
            implementation: implementation.to_owned(),
            version: version.to_owned(),
            ..PluginSpec::default()
        },
        status: PluginStatus {
            conditions: vec![ready],
            last_heartbeat_time: Time(Timestamp::UNIX_EPOCH),
            expires_at: Time(Timestamp::UNIX_EPOCH),
            registered_by: None,
            instances: Vec::new(),
        },
    }
}

fn not_ready(mut plugin: Plugin) -> Plugin {
    plugin.status.conditions[0].status = "False".to_owned();
    plugin.status.conditions[0].message = "no heartbeat for 10s".to_owned();
    plugin
}

fn tables() -> ApiSelector {
    ApiSelector {
        group: "myorg.org".to_owned(),
        resource: "databasetables".to_owned(),
        version: String::new(),
    }
}

fn chosen(
    plugins: &[Plugin],
    implementation: Implementation<'_>,
) -> Result<(String, SelectionReason), SelectError> {
    choose(plugins, &tables(), implementation, None).map(|(p, s)| (p.name().to_owned(), s.reason))
}

#[test]
fn versions_compare_numerically() {
    assert_eq!(compare_versions("1.10.0", "1.9.2"), Ordering::Greater);
    assert_eq!(compare_versions("v2", "1.99"), Ordering::Greater);
    assert_eq!(compare_versions("1.0", "1.0.0"), Ordering::Less);
    assert_eq!(compare_versions("1.0.0", "1.0.0"), Ordering::Equal);
    assert_eq!(
        compare_versions("1.0.0-beta", "1.0.0-alpha"),
        Ordering::Greater
    );
    assert_eq!(compare_versions("1.0.0-rc.1", "1.0.0"), Ordering::Less);
    assert_eq!(
        compare_versions("1.0.0-rc.10", "1.0.0-rc.9"),
        Ordering::Greater
    );
    assert_eq!(compare_versions("1.0.0+build.5", "1.0.0"), Ordering::Equal);
}

#[test]
fn within_a_set_the_highest_version_then_the_smallest_name_wins() {
    let plugins = [
        plugin("b-pg", "databasetables", "PostgreSQL", "1.10.0"),
        plugin("a-pg", "databasetables", "PostgreSQL", "1.10.0"),
        plugin("old", "databasetables", "PostgreSQL", "1.9.9"),
    ];
    assert_eq!(best(&plugins).map(Plugin::name), Some("a-pg"));
    let (_, selection) = choose(
        &plugins,
        &tables(),
        Implementation::Preferred("MariaDB"),
        None,
    )
    .expect("chosen");
    assert_eq!(selection.reason, SelectionReason::Fallback);
    assert_eq!(
        selection.message,
        "no Ready plugin implements MariaDB; chose a-pg (PostgreSQL) by highest version, then name"
    );
}

#[test]
fn preferred_and_required_implementations_match_case_insensitively() {
    let plugins = [
        plugin("pg", "databasetables", "PostgreSQL", "2.0.0"),
        plugin("maria", "databasetables", "MariaDB", "1.0.0"),
    ];
    assert_eq!(
        chosen(&plugins, Implementation::Preferred("mariadb")),
        Ok(("maria".to_owned(), SelectionReason::PreferredImplementation))
    );
    assert_eq!(
        chosen(
            &plugins,
            Implementation::from_spec(Some("postgresql"), Some("MariaDB"))
        ),
        Ok(("pg".to_owned(), SelectionReason::RequiredImplementation))
    );
    assert_eq!(
        chosen(&plugins, Implementation::Required("Oracle")),
        Err(SelectError::NoneReadyOfImplementation {
            api: "databasetables.myorg.org".to_owned(),
            implementation: "Oracle".to_owned(),
        })
    );
    assert_eq!(
        chosen(&plugins, Implementation::Any),
        Ok(("pg".to_owned(), SelectionReason::Fallback))
    );
}

#[test]
fn plugins_not_ready_or_of_another_api_never_count() {
    let plugins = [
        plugin("queue", "queues", "MariaDB", "9.0.0"),
        not_ready(plugin("late", "databasetables", "MariaDB", "1.0.0")),
    ];
    assert_eq!(
        chosen(&plugins, Implementation::Preferred("MariaDB")),
        Err(SelectError::NoneReady(
            "databasetables.myorg.org".to_owned()
        ))
    );
}

#[test]
fn a_pinned_plugin_must_exist_serve_the_api_and_be_ready() {
    let plugins = [
        plugin("pg", "databasetables", "PostgreSQL", "1.0.0"),
        plugin("queue", "queues", "Rabbit", "1.0.0"),
        not_ready(plugin("late", "databasetables", "MariaDB", "1.0.0")),
    ];
    let select = |name| {
        select(
            &plugins,
            Some(&tables()),
            Implementation::Any,
            Some(name),
            None,
        )
    };
    assert_eq!(
        select("pg").map(|(p, s)| (p.name(), s.reason)),
        Ok(("pg", SelectionReason::Requested))
    );
    assert!(matches!(select("queue"), Err(SelectError::WrongApi { .. })));
    assert_eq!(
        select("ghost").err(),
        Some(SelectError::NotFound("ghost".to_owned()))
    );
    assert_eq!(
        select("late").err(),
        Some(SelectError::NotReady {
            name: "late".to_owned(),
            why: "no heartbeat for 10s".to_owned()
        })
    );
}

/// `plugin` served by one Ready instance per version in `versions`.
fn instances(mut plugin: Plugin, versions: &[&str]) -> Plugin {
    plugin.status.instances = versions
        .iter()
        .enumerate()
        .map(|(i, version)| crate::v1alpha1::PluginInstance {
            name: format!("{}-{i}", plugin.name()),
            address: format!("10.0.0.{i}:50051"),
            server_name: String::new(),
            version: (*version).to_owned(),
            ready: true,
            draining: false,
            last_heartbeat_time: Time(Timestamp::UNIX_EPOCH),
            canary_weight: 0,
            shadow_percent: 0,
        })
        .collect();
    plugin
}

fn range(text: &str) -> VersionConstraint {
    text.parse().expect("a constraint")
}

#[test]
fn a_constraint_takes_the_newest_ready_version_in_range_of_any_instance() {
    // `pg` is mid-rollout from 1.4.2 to 2.0.0; `maria` runs 1.9.0.
    let plugins = [
        instances(
            plugin("pg", "databasetables", "PostgreSQL", "2.0.0"),
            &["1.4.2", "2.0.0"],
        ),
        instances(
            plugin("maria", "databasetables", "MariaDB", "1.9.0"),
            &["1.9.0"],
        ),
    ];
    let choose = |implementation, text: &str| {
        choose(&plugins, &tables(), implementation, Some(&range(text)))
            .map(|(p, s)| (p.name().to_owned(), s.message))
    };
    assert_eq!(
        choose(Implementation::Any, ">=1.4, <2"),
        Ok((
            "maria".to_owned(),
            "chose maria (MariaDB) by highest version, then name; 1.9.0 is its newest Ready \
             version in >=1.4, <2"
                .to_owned()
        ))
    );
    assert_eq!(
        choose(Implementation::Required("PostgreSQL"), ">=1.4, <2"),
        Ok((
            "pg".to_owned(),
            "PostgreSQL is the required implementation and has a Ready plugin; 1.4.2 is its \
             newest Ready version in >=1.4, <2"
                .to_owned()
        ))
    );
    assert_eq!(
        choose(Implementation::Preferred("MariaDB"), ">=2").map(|(name, _)| name),
        Ok("pg".to_owned()),
        "the preferred implementation has no version in range"
    );
    assert_eq!(
        choose(Implementation::Any, "^3").map(|(name, _)| name),
        Err(SelectError::NoVersionInRange {
            of: "of databasetables.myorg.org".to_owned(),
            constraint: "^3".to_owned(),
            seen: "1.4.2 (pg), 1.9.0 (maria), 2.0.0 (pg)".to_owned(),
        })
    );
    let error = choose(Implementation::Required("MariaDB"), ">=2").expect_err("none");
    assert_eq!(
        error.to_string(),
        "no Ready plugin of implementation MariaDB serving databasetables.myorg.org has a \
         version in >=2 (Ready: 1.9.0 (maria))"
    );
}

#[test]
fn a_pinned_plugin_with_a_constraint_needs_a_ready_instance_in_range() {
    let plugins = [instances(
        plugin("pg", "databasetables", "PostgreSQL", "2.0.0"),
        &["1.4.2", "2.0.0"],
    )];
    let select = |text: &str| {
        select(
            &plugins,
            Some(&tables()),
            Implementation::Any,
            Some("pg"),
            Some(&range(text)),
        )
        .map(|(_, s)| s.message)
    };
    assert_eq!(
        select("<2"),
        Ok("plugin pg was requested by name; 1.4.2 is its newest Ready version in <2".to_owned())
    );
    assert_eq!(
        select(">=3").map_err(|e| e.to_string()),
        Err(
            "no Ready plugin named pg has a version in >=3 (Ready: 1.4.2 (pg), 2.0.0 (pg))"
                .to_owned()
        )
    );
}
