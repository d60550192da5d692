//! A fake kplug registry for the serve, instance, replica, shutdown and TLS
//! tests: it records every call with when it came (heartbeats come as calls:
//! it answers a stream UNIMPLEMENTED, as kplug before streams did), optionally announces the
//! `Instances` capability, and can hold its answer to a draining heartbeat
//! until the test lets it go. Every wait is bounded, so a hang fails.
//! Beside it, a registry that never answers, and a plugin with nothing to
//! do. Each test file uses a part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kplug_sdk::proto::v1alpha1::registry_server::{Registry as RegistryService, RegistryServer};
use kplug_sdk::proto::v1alpha1::{
    DeregisterRequest, DeregisterResponse, HeartbeatRequest, HeartbeatResponse, PROTOCOL_VERSION,
    Protocol,
};
use kplug_sdk::{Outcome, Plugin, Request};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::{Identity, ServerTlsConfig};

/// Bounds every wait; far above anything a healthy run needs.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Something the fake received, and when.
#[derive(Debug)]
pub enum Call {
    Heartbeat(Box<HeartbeatRequest>, Instant),
    Deregister(DeregisterRequest, Instant),
}

/// How the fake behaves.
pub struct Options {
    /// The interval it asks for.
    pub interval: Duration,
    /// Announces the `Instances` capability, as kplug with instances does.
    pub instances: bool,
    /// Serves TLS with this certificate and key (PEM).
    pub tls: Option<(String, String)>,
    /// Holds the answer to the first draining heartbeat until
    /// [`Registry::release_draining`].
    pub hold_draining: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(3600),
            instances: true,
            tls: None,
            hold_draining: false,
        }
    }
}

struct Fake {
    interval: Duration,
    capabilities: Vec<String>,
    calls: mpsc::UnboundedSender<Call>,
    /// Held until released, before answering the first draining heartbeat.
    gate: Mutex<Option<oneshot::Receiver<()>>>,
}

#[tonic::async_trait]
impl RegistryService for Fake {
    async fn heartbeat(
        &self,
        request: tonic::Request<HeartbeatRequest>,
    ) -> Result<tonic::Response<HeartbeatResponse>, tonic::Status> {
        let request = request.into_inner();
        let draining = request.draining;
        let _ = self
            .calls
            .send(Call::Heartbeat(Box::new(request), Instant::now()));
        if draining {
            let gate = self.gate.lock().expect("gate lock").take();
            if let Some(gate) = gate {
                let _ = gate.await;
            }
        }
        Ok(tonic::Response::new(HeartbeatResponse {
            accepted: true,
            interval: self.interval.try_into().ok(),
            ttl: (self.interval * 3).try_into().ok(),
            uid: "uid-1".into(),
            server_protocol: Some(Protocol {
                version: PROTOCOL_VERSION.into(),
                sdk: "fake-registry".into(),
                capabilities: self.capabilities.clone(),
            }),
            ..Default::default()
        }))
    }

    type HeartbeatsStream = tokio_stream::Empty<Result<HeartbeatResponse, tonic::Status>>;

    /// Like a kplug from before heartbeat streams: heartbeats come as calls.
    async fn heartbeats(
        &self,
        _: tonic::Request<tonic::Streaming<HeartbeatRequest>>,
    ) -> Result<tonic::Response<Self::HeartbeatsStream>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "a registry before heartbeat streams",
        ))
    }

    async fn deregister(
        &self,
        request: tonic::Request<DeregisterRequest>,
    ) -> Result<tonic::Response<DeregisterResponse>, tonic::Status> {
        let _ = self
            .calls
            .send(Call::Deregister(request.into_inner(), Instant::now()));
        Ok(tonic::Response::new(DeregisterResponse { removed: true }))
    }
}

/// A fake registry, served until dropped; dropping it closes its port and
/// its connections at once, like a replica that went away.
pub struct Registry {
    pub addr: SocketAddr,
    calls: mpsc::UnboundedReceiver<Call>,
    gate: Option<oneshot::Sender<()>>,
    _served: AbortOnDropHandle<Result<(), tonic::transport::Error>>,
}

impl Registry {
    /// Serves on `listener`.
    pub async fn serve(listener: TcpListener, options: Options) -> Self {
        let addr = listener.local_addr().expect("the listener's address");
        let (calls_tx, calls) = mpsc::unbounded_channel();
        let (gate, held) = oneshot::channel();
        let fake = Fake {
            interval: options.interval,
            capabilities: if options.instances {
                vec!["Instances".into()]
            } else {
                Vec::new()
            },
            calls: calls_tx,
            gate: Mutex::new(options.hold_draining.then_some(held)),
        };
        let mut builder = tonic::transport::Server::builder();
        if let Some((cert, key)) = options.tls {
            let tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
            builder = builder.tls_config(tls).expect("a usable TLS identity");
        }
        // With a shutdown signal, even one that never comes, tonic closes
        // the open connections when the server is aborted; without, they
        // would outlive it.
        let served = tokio::spawn(
            builder
                .add_service(RegistryServer::new(fake))
                .serve_with_incoming_shutdown(
                    TcpListenerStream::new(listener),
                    std::future::pending::<()>(),
                ),
        );
        Self {
            addr,
            calls,
            gate: Some(gate),
            _served: AbortOnDropHandle::new(served),
        }
    }

    /// Serves on a free port of 127.0.0.1.
    pub async fn start(options: Options) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        Self::serve(listener, options).await
    }

    /// `http://` and the address.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Lets the answer to the draining heartbeat go, if held.
    pub fn release_draining(&mut self) {
        if let Some(gate) = self.gate.take() {
            let _ = gate.send(());
        }
    }

    pub async fn next(&mut self) -> Call {
        tokio::time::timeout(PATIENCE, self.calls.recv())
            .await
            .expect("the registry heard nothing in time")
            .expect("the registry stopped")
    }

    /// The next call, which must be a heartbeat.
    pub async fn heartbeat(&mut self) -> (HeartbeatRequest, Instant) {
        match self.next().await {
            Call::Heartbeat(request, at) => (*request, at),
            other => panic!("expected a heartbeat, got {other:?}"),
        }
    }

    /// Skips heartbeats until one that says the instance is draining.
    pub async fn draining_heartbeat(&mut self) -> (HeartbeatRequest, Instant) {
        loop {
            match self.next().await {
                Call::Heartbeat(request, at) if request.draining => return (*request, at),
                Call::Heartbeat(..) => {}
                other => panic!("expected a draining heartbeat, got {other:?}"),
            }
        }
    }

    /// Skips heartbeats until the deregistration; none may say draining.
    pub async fn deregistration(&mut self) -> (DeregisterRequest, Instant) {
        loop {
            match self.next().await {
                Call::Deregister(request, at) => return (request, at),
                Call::Heartbeat(request, _) => {
                    assert!(!request.draining, "told a draining heartbeat: {request:?}");
                }
            }
        }
    }

    /// Skips draining heartbeats until the deregistration.
    pub async fn deregistration_after_draining(&mut self) -> (DeregisterRequest, Instant) {
        loop {
            match self.next().await {
                Call::Deregister(request, at) => return (request, at),
                Call::Heartbeat(request, _) => {
                    assert!(
                        request.draining,
                        "a heartbeat after draining began says otherwise"
                    );
                }
            }
        }
    }

    /// A call received and not read yet, if any.
    pub fn try_next(&mut self) -> Option<Call> {
        self.calls.try_recv().ok()
    }

    /// Nothing was received that has not been read.
    pub fn assert_quiet(&mut self) {
        if let Ok(call) = self.calls.try_recv() {
            panic!("expected no more calls, got {call:?}");
        }
    }
}

/// Accepts connections on `listener` but never speaks HTTP/2, like a
/// wedged kplug; the receiver hears of the first connection. The task
/// holds the connections open.
pub fn wedged(listener: TcpListener) -> (oneshot::Receiver<()>, JoinHandle<()>) {
    let (connected, first_connection) = oneshot::channel();
    let hold = tokio::spawn(async move {
        let mut connected = Some(connected);
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
            if let Some(connected) = connected.take() {
                let _ = connected.send(());
            }
        }
    });
    (first_connection, hold)
}

/// A plugin with nothing to do: every call succeeds.
pub struct Idle;

impl Plugin for Idle {
    async fn reconcile(&self, _: Request) -> Outcome {
        Outcome::success()
    }

    async fn finalize(&self, _: Request) -> Outcome {
        Outcome::success()
    }
}
