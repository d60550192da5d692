use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn instance(name: &str, canary_weight: u32) -> PluginInstance {
    PluginInstance {
        name: name.to_owned(),
        address: format!("{name}:50051"),
        server_name: String::new(),
        version: "1.0.0".to_owned(),
        ready: true,
        draining: false,
        last_heartbeat_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        canary_weight,
        shadow_percent: 0,
    }
}

#[test]
fn buckets_are_fixed_by_plugin_and_object_and_spread_evenly() {
    // FNV-1a of "tables\0shop/users": a value every replica and release computes.
    assert_eq!(
        bucket("tables", "shop/users"),
        bucket("tables", "shop/users")
    );
    assert_ne!(
        (0..20)
            .map(|i| bucket("tables", &format!("o{i}")))
            .collect::<Vec<_>>(),
        (0..20)
            .map(|i| bucket("other", &format!("o{i}")))
            .collect::<Vec<_>>(),
        "another plugin's canary takes other objects"
    );
    let below_10 = (0..10_000)
        .filter(|i| bucket("tables", &format!("default/object-{i}")) < 10)
        .count();
    assert!(
        (900..1100).contains(&below_10),
        "{below_10} of 10,000 below 10"
    );
}

#[test]
fn an_object_goes_to_the_canary_when_its_bucket_is_below_the_weight() {
    let stable = instance("stable", 0);
    let canary = instance("canary", 10);
    let both = [&stable, &canary];
    for i in 0..200 {
        let key = format!("default/object-{i}");
        let expected = match bucket("tables", &key) < 10 {
            true => Track::Canary,
            false => Track::Stable,
        };
        assert_eq!(track("tables", &key, &both), expected, "{key}");
        // One side alone takes everything.
        assert_eq!(track("tables", &key, &[&stable]), Track::Stable);
        assert_eq!(track("tables", &key, &[&canary]), Track::Canary);
    }
    assert_eq!(weight([0, 10, 5]), Some(10));
    assert_eq!(weight([0]), None);
}

#[test]
fn a_canary_failing_half_its_calls_is_withdrawn_at_its_twentieth() {
    let mut judge = Judge::default();
    for _ in 0..180 {
        assert_eq!(judge.record(Track::Stable, Outcome::Succeeded), None);
    }
    for call in 1..MIN_CALLS {
        let outcome = match call % 2 {
            0 => Outcome::Failed,
            _ => Outcome::Succeeded,
        };
        assert_eq!(judge.record(Track::Canary, outcome), None, "call {call}");
    }
    assert_eq!(
        judge.record(Track::Canary, Outcome::Late),
        Some(Withdrawal {
            canary_calls: 20,
            canary_bad: 10,
            stable_calls: WINDOW,
            stable_bad: 0
        })
    );
    assert_eq!(
        Withdrawal {
            canary_calls: 20,
            canary_bad: 10,
            stable_calls: 100,
            stable_bad: 1
        }
        .to_string(),
        "10 of its last 20 calls failed or missed their deadline (50%), against 1 of 100 (1%) for the stable instances"
    );
}

#[test]
fn a_canary_as_good_as_the_stable_instances_stays() {
    let mut judge = Judge::default();
    // Both fail one call in ten: never withdrawn.
    for call in 0..1000 {
        let outcome = match call % 10 {
            0 => Outcome::Failed,
            _ => Outcome::Succeeded,
        };
        assert_eq!(judge.record(Track::Stable, outcome), None);
        assert_eq!(judge.record(Track::Canary, outcome), None, "call {call}");
    }
    // Worse, by less than the margin (one call in ten against none): stays.
    let mut judge = Judge::default();
    for call in 0..200 {
        let outcome = match call % 10 {
            0 => Outcome::Failed,
            _ => Outcome::Succeeded,
        };
        judge.record(Track::Stable, Outcome::Succeeded);
        assert_eq!(judge.record(Track::Canary, outcome), None, "call {call}");
    }
}

#[test]
fn a_new_canary_starts_afresh_against_the_stable_record() {
    let mut judge = Judge::default();
    for _ in 0..50 {
        judge.record(Track::Stable, Outcome::Succeeded);
    }
    for _ in 0..MIN_CALLS - 1 {
        assert_eq!(judge.record(Track::Canary, Outcome::Failed), None);
    }
    // The next version: its own calls count, from none.
    judge.new_canary();
    for call in 1..MIN_CALLS {
        assert_eq!(
            judge.record(Track::Canary, Outcome::Failed),
            None,
            "call {call}"
        );
    }
    let withdrawal = judge.record(Track::Canary, Outcome::Failed);
    assert_eq!(
        withdrawal,
        Some(Withdrawal {
            canary_calls: MIN_CALLS,
            canary_bad: MIN_CALLS,
            stable_calls: 50,
            stable_bad: 0
        })
    );
}
