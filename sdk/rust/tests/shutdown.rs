//! The shutdown order that loses no call when one of several instances of a
//! plugin stops: kplug told the instance is draining, calls arriving
//! meanwhile served, then the port closed and the calls in flight finished,
//! then the deregistration. Against a kplug from before instances, the
//! deregistration comes first instead. Every wait is bounded.

mod fake;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kplug_sdk::proto::v1alpha1::ReconcileRequest;
use kplug_sdk::proto::v1alpha1::plugin_client::PluginClient;
use kplug_sdk::{ApiRef, Config, Error, Outcome, Plugin, PluginInfo, Request, Server};
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use fake::{Options, PATIENCE, Registry};

/// Answers at once, except objects named `held`, which wait until the
/// test lets them go.
struct Holding {
    started: mpsc::UnboundedSender<String>,
    release: watch::Receiver<bool>,
    finished: Arc<Mutex<Option<Instant>>>,
}

impl Plugin for Holding {
    async fn reconcile(&self, request: Request) -> Outcome {
        let name = request.name().unwrap_or_default().to_owned();
        let _ = self.started.send(name.clone());
        if name == "held" {
            let mut release = self.release.clone();
            let _ = release.wait_for(|released| *released).await;
            *self.finished.lock().unwrap() = Some(Instant::now());
        }
        Outcome::success()
    }

    async fn finalize(&self, _: Request) -> Outcome {
        Outcome::success()
    }
}

fn call(name: &str) -> ReconcileRequest {
    let object =
        json!({"apiVersion": "example.com/v1", "kind": "Echo", "metadata": {"name": name}});
    ReconcileRequest {
        object: serde_json::to_vec(&object).unwrap().into(),
        ..Default::default()
    }
}

async fn connect(address: SocketAddr) -> Result<PluginClient<Channel>, tonic::transport::Error> {
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await?;
    Ok(PluginClient::new(channel))
}

/// A plugin serving against `registry`, with a call held in flight.
struct Running {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<Result<(), Error>>,
    starts: mpsc::UnboundedReceiver<String>,
    release: watch::Sender<bool>,
    finished: Arc<Mutex<Option<Instant>>>,
    held: JoinHandle<
        Result<tonic::Response<kplug_sdk::proto::v1alpha1::ReconcileResponse>, tonic::Status>,
    >,
}

impl Running {
    /// Serves as instance `pod-a`, waits for kplug's answer to its first
    /// heartbeat, and starts a held call.
    async fn start(registry: &mut Registry) -> Self {
        let (started, mut starts) = mpsc::unbounded_channel();
        let (release, released) = watch::channel(false);
        let finished = Arc::new(Mutex::new(None));
        let plugin = Holding {
            started,
            release: released,
            finished: Arc::clone(&finished),
        };
        let info = PluginInfo::new("echo", ApiRef::new("example.com", "echoes", "v1"));
        let config = Config::default()
            .registry(registry.url())
            .listen("127.0.0.1:0".parse().unwrap())
            .instance("pod-a")
            .drain_timeout(PATIENCE);
        let server = Server::bind(plugin, info, config).await.unwrap();
        assert_eq!(server.instance(), "pod-a");
        let address = server.local_addr();
        let mut status = server.heartbeat_status();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        let (heartbeat, _) = registry.heartbeat().await;
        assert_eq!(heartbeat.instance, "pod-a");
        assert!(!heartbeat.draining);
        tokio::time::timeout(PATIENCE, status.wait_for(|s| s.uid.is_some()))
            .await
            .expect("never registered")
            .unwrap();

        let mut client = connect(address).await.unwrap();
        let held = tokio::spawn(async move { client.reconcile(call("held")).await });
        let name = tokio::time::timeout(PATIENCE, starts.recv()).await.unwrap();
        assert_eq!(name.as_deref(), Some("held"));
        Self {
            address,
            stop: Some(stop),
            served,
            starts,
            release,
            finished,
            held,
        }
    }

    fn shut_down(&mut self) {
        let _ = self.stop.take().expect("shut down once").send(());
    }

    /// Lets the held call finish; it must succeed.
    async fn finish_held_call(&mut self) -> Instant {
        self.release.send_replace(true);
        let answer = tokio::time::timeout(PATIENCE, &mut self.held)
            .await
            .expect("the held call hung")
            .unwrap()
            .expect("the held call completes");
        assert!(answer.into_inner().success);
        self.finished
            .lock()
            .unwrap()
            .expect("the plugin finished it")
    }

    async fn wait(self) -> Result<(), Error> {
        tokio::time::timeout(PATIENCE, self.served)
            .await
            .expect("serve did not return in time")
            .expect("serve panicked")
    }
}

/// Waits until nothing accepts connections at `address` any more.
async fn wait_closed(address: SocketAddr) {
    tokio::time::timeout(PATIENCE, async {
        while tokio::net::TcpStream::connect(address).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the port stayed open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_tells_kplug_then_drains_calls_then_deregisters() {
    let mut registry = Registry::start(Options {
        hold_draining: true,
        ..Options::default()
    })
    .await;
    let mut running = Running::start(&mut registry).await;

    running.shut_down();
    // (a) kplug hears that the instance is draining. Its answer is held,
    // so the plugin stays in this step while the test looks.
    let (draining, _) = registry.draining_heartbeat().await;
    assert_eq!(draining.instance, "pod-a");
    assert_eq!(draining.address, running.address.to_string());
    // A call that kplug sent just before it took note is still served, on
    // a new connection too.
    let mut late = connect(running.address)
        .await
        .expect("still accepting while kplug takes note");
    late.reconcile(call("late"))
        .await
        .expect("a late call is served");
    assert_eq!(running.starts.recv().await.as_deref(), Some("late"));

    // (b) Once kplug took note, the port closes while the call in flight
    // goes on, and kplug has not been told to forget the instance.
    registry.release_draining();
    wait_closed(running.address).await;
    assert!(!running.held.is_finished());
    registry.assert_quiet();

    // (c) The call in flight finishes, then the deregistration.
    let finished = running.finish_held_call().await;
    let (deregistered, deregistered_at) = registry.deregistration_after_draining().await;
    assert_eq!(deregistered.instance, "pod-a");
    assert_eq!(deregistered.address, running.address.to_string());
    assert!(
        finished < deregistered_at,
        "deregistered before the call finished"
    );
    running.wait().await.expect("a clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kplug_without_instances_is_deregistered_from_first() {
    let mut registry = Registry::start(Options {
        instances: false,
        ..Options::default()
    })
    .await;
    let mut running = Running::start(&mut registry).await;

    running.shut_down();
    // No draining heartbeat, which it would ignore: the deregistration,
    // while the call is still in flight.
    let (deregistered, _) = registry.deregistration().await;
    assert_eq!(deregistered.instance, "pod-a");
    assert!(!running.held.is_finished());
    running.finish_held_call().await;
    running.wait().await.expect("a clean shutdown");
    registry.assert_quiet();
}

#[tokio::test]
async fn shutdown_is_prompt_when_kplug_is_gone() {
    let mut registry = Registry::start(Options::default()).await;
    let mut running = Running::start(&mut registry).await;
    // kplug goes away: the draining heartbeat and the deregistration fail.
    drop(registry);
    running.finish_held_call().await;

    let started = Instant::now();
    running.shut_down();
    running.wait().await.expect("a clean shutdown");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
}
