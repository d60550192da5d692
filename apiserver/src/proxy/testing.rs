//! What the proxy's tests share: plugins declared by hand, and a test
//! plugin served in process on loopback, with or without TLS.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kplug_proto::v1alpha1::plugin_server::{Plugin as PluginService, PluginServer};
use kplug_proto::v1alpha1::{ReconcileRequest, ReconcileResponse};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

use crate::registry::{Declaration, Labels};
use crate::v1alpha1::{PluginApi, Protocol};

/// `instance` of the plugin `name` at `address` (no server name, a
/// minute's interval), for `things.example.com/v1`.
pub(super) fn declaration(name: &str, instance: &str, address: &str) -> Declaration {
    Declaration {
        name: name.to_owned(),
        instance: instance.to_owned(),
        draining: false,
        version: "1.0.0".to_owned(),
        api: PluginApi {
            group: "example.com".to_owned(),
            resource: "things".to_owned(),
            version: "v1".to_owned(),
        },
        implementation: "Test".to_owned(),
        address: address.to_owned(),
        server_name: String::new(),
        canary_weight: 0,
        shadow_percent: 0,
        extensions: Vec::new(),
        labels: Labels::default(),
        interval: Duration::from_secs(60),
        protocol: Protocol::default(),
        registered_by: None,
    }
}

/// A loopback address with nothing listening.
pub(super) fn closed_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(1);
    format!("127.0.0.1:{port}")
}

/// A listener on a free loopback port, and its address.
pub(super) async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    (listener, address)
}

/// How a test plugin answers.
#[derive(Clone, Copy)]
pub(super) enum Answer {
    Success,
    /// `UNAVAILABLE`, from the plugin's own code: it ran.
    Unavailable,
    /// Success once `release` is notified.
    Held,
}

/// An operation id that makes a test plugin wait for `release` before it
/// answers, whatever its [`Answer`].
pub(super) const HOLD: &str = "hold";

/// Counts its calls, reports the client certificate of each on `seen`,
/// and answers as `answer` says.
struct TestPlugin {
    calls: Arc<AtomicUsize>,
    answer: Answer,
    release: Arc<Notify>,
    seen: mpsc::UnboundedSender<Vec<u8>>,
}

#[tonic::async_trait]
impl PluginService for TestPlugin {
    async fn reconcile(
        &self,
        request: Request<ReconcileRequest>,
    ) -> Result<Response<ReconcileResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let client = request
            .peer_certs()
            .and_then(|chain| chain.first().map(|cert| cert.to_vec()))
            .unwrap_or_default();
        let _ = self.seen.send(client);
        match self.answer {
            Answer::Success => {}
            Answer::Unavailable => return Err(Status::unavailable("the database is down")),
            Answer::Held => self.release.notified().await,
        }
        if request.get_ref().operation_id == HOLD {
            self.release.notified().await;
        }
        Ok(Response::new(ReconcileResponse {
            success: true,
            ..ReconcileResponse::default()
        }))
    }

    async fn finalize(
        &self,
        request: Request<ReconcileRequest>,
    ) -> Result<Response<ReconcileResponse>, Status> {
        self.reconcile(request).await
    }
}

/// A plugin listening on loopback: where, how many calls it saw, the
/// client certificate (DER; empty without one) of each, and what lets its
/// held calls go.
pub(super) struct Served {
    pub(super) address: String,
    pub(super) calls: Arc<AtomicUsize>,
    pub(super) seen: mpsc::UnboundedReceiver<Vec<u8>>,
    pub(super) release: Arc<Notify>,
}

impl Served {
    /// Nothing served yet at `address`: what a hand-made server fills in.
    pub(super) fn at(address: String) -> Self {
        Self {
            address,
            calls: Arc::new(AtomicUsize::new(0)),
            seen: mpsc::unbounded_channel().1,
            release: Arc::new(Notify::new()),
        }
    }

    pub(super) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Serves a test plugin answering with `answer`, over `tls` if given.
pub(super) async fn serve_plugin(answer: Answer, tls: Option<ServerTlsConfig>) -> Served {
    let (listener, address) = listener().await;
    let (seen, seen_rx) = mpsc::unbounded_channel();
    let served = Served {
        seen: seen_rx,
        ..Served::at(address)
    };
    let plugin = TestPlugin {
        calls: served.calls.clone(),
        answer,
        release: served.release.clone(),
        seen,
    };
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).expect("server TLS");
    }
    let server = builder
        .add_service(PluginServer::new(plugin))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);
    served
}
