//! Which instance of a plugin a process is: named in every heartbeat and in
//! the deregistration; by default the pod's name from `POD_NAME`, else none
//! (the address names it); `--instance` (`KPLUG_INSTANCE`) wins.
//!
//! The defaults come from the environment, which a test cannot change in
//! its own process (that is `unsafe` and this crate forbids it), so those
//! tests run this test binary again as a child process with the environment
//! they need, where an ignored test checks the outcome.

mod fake;

use std::process::Command;

use kplug_sdk::{ApiRef, Config, PluginInfo, Server};
use tokio::sync::oneshot;

use fake::{Idle, Options, PATIENCE, Registry};

/// The ignored test the children run.
const CHILD: &str = "child_registers_as_the_expected_instance";
/// The instance the child must see.
const EXPECTED: &str = "KPLUG_TEST_EXPECTED_INSTANCE";

/// Serves `config` against a fake registry and returns the instance named
/// by the first heartbeat and by the deregistration.
async fn instance_sent(config: Config) -> (String, String) {
    let mut registry = Registry::start(Options::default()).await;
    let config = config
        .registry(registry.url())
        .listen("127.0.0.1:0".parse().unwrap());
    let info = PluginInfo::new("hello", ApiRef::new("example.com", "greetings", "v1"));
    let server = Server::bind(Idle, info, config).await.unwrap();
    let instance = server.instance().to_owned();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let (heartbeat, _) = registry.heartbeat().await;
    assert_eq!(heartbeat.instance, instance);
    stop.send(()).unwrap();
    let (deregistered, _) = registry.deregistration_after_draining().await;
    tokio::time::timeout(PATIENCE, served)
        .await
        .expect("shutdown hung")
        .unwrap()
        .unwrap();
    (heartbeat.instance, deregistered.instance)
}

#[tokio::test]
async fn an_explicit_instance_is_sent_in_heartbeats_and_the_deregistration() {
    let sent = instance_sent(Config::default().instance("hello-7d9f-x2x")).await;
    assert_eq!(sent, ("hello-7d9f-x2x".into(), "hello-7d9f-x2x".into()));
    // Empty: the address names the instance, as before instances.
    let sent = instance_sent(Config::default().instance("")).await;
    assert_eq!(sent, (String::new(), String::new()));
}

/// Runs [`CHILD`] in a child process whose environment holds only `env`,
/// expecting it to see `expected`.
fn run_child(env: &[(&str, &str)], expected: &str) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([CHILD, "--exact", "--ignored", "--nocapture"])
        .env_clear()
        .env(EXPECTED, expected)
        .envs(env.iter().copied());
    let output = command.output().expect("run the test binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the child failed:\n{stdout}\n{stderr}"
    );
    // It ran the test rather than filtering it out.
    assert!(stdout.contains("1 passed"), "{stdout}");
}

#[test]
fn pod_name_is_the_default_instance() {
    run_child(&[("POD_NAME", "hello-7d9f-x2x")], "hello-7d9f-x2x");
}

#[test]
fn without_pod_name_the_address_names_the_instance() {
    run_child(&[], "");
}

#[cfg(feature = "clap")]
#[test]
fn kplug_instance_wins_over_pod_name() {
    run_child(
        &[("POD_NAME", "hello-7d9f-x2x"), ("KPLUG_INSTANCE", "blue")],
        "blue",
    );
}

/// The configuration from the environment, as a plugin's command line
/// reads it (with clap), or the default.
fn config_from_environment() -> Config {
    #[cfg(feature = "clap")]
    {
        use clap::Parser;

        #[derive(Parser)]
        struct Args {
            #[command(flatten)]
            kplug: Config,
        }
        Args::try_parse_from(["plugin"]).unwrap().kplug
    }
    #[cfg(not(feature = "clap"))]
    Config::default()
}

#[tokio::test]
#[ignore = "run by the tests above, in a child process with the environment they set"]
async fn child_registers_as_the_expected_instance() {
    let expected = std::env::var(EXPECTED).expect("run by a parent test, which sets it");
    assert_eq!(
        instance_sent(config_from_environment()).await,
        (expected.clone(), expected)
    );
}
