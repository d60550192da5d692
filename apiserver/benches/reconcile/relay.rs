//! The floor of any proxy on this machine: a relay that terminates the
//! caller's TLS and HTTP/2 as kplug does (kplug's TLS configuration, a
//! serving certificate from its CA, the admin's client certificate
//! verified against that CA) and makes
//! the plugin's gRPC call, and nothing else: it decodes nothing, selects
//! nothing, checks nothing and renders nothing. The request's body is the
//! object's JSON, passed to the plugin as `object` as the direct route
//! passes it; the answer's body is the plugin's `objectStatus` bytes.
//!
//! It runs in the bench's process on a Tokio runtime of its own with two
//! workers, the shape of kplug's, so that its latency is two real hops:
//! only its CPU time cannot be told from the bench's, so it is measured
//! one call at a time, not in the throughput runs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kplug_apiserver::auth::verifier::{optional_client_auth, roots};
use kplug_apiserver::server::pki::CertificateAuthority;
use kplug_apiserver::server::serving_cert::ServingCert;
use kplug_apiserver::server::tls;
use kplug_proto::v1alpha1::plugin_client::PluginClient;
use kplug_test_support::StandaloneKplug;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;
use tonic::transport::Channel;

use crate::RECONCILE_TIMEOUT;
use crate::route::{connect_plugin, plugin_request};

/// The relay, serving until dropped.
pub struct Relay {
    pub address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// Starts the relay in front of the plugin at `plugin`, with the
    /// certificates of `kplug`'s state directory, once it listens.
    pub async fn start(kplug: &StandaloneKplug, plugin: SocketAddr) -> Result<Self> {
        let tls = TlsAcceptor::from(server_config(kplug)?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("relay")
            .enable_all()
            .build()
            .context("the relay's runtime")?;
        let (listening, on_listening) = oneshot::channel();
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("relay".to_owned())
            .spawn(move || {
                runtime.block_on(async {
                    let ready = async {
                        let listener = TcpListener::bind("127.0.0.1:0").await?;
                        anyhow::Ok((listener, connect_plugin(plugin).await?))
                    };
                    let (listener, client) = match ready.await {
                        Ok(ready) => ready,
                        Err(error) => {
                            let _ = listening.send(Err(error));
                            return;
                        }
                    };
                    let _ = listening.send(listener.local_addr().map_err(Into::into));
                    tokio::select! {
                        () = serve(listener, tls, client) => {}
                        _ = stopped => {}
                    }
                });
            })
            .context("the relay's thread")?;
        // Stops and joins the thread if it never listens.
        let mut relay = Self {
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            stop: Some(stop),
            thread: Some(thread),
        };
        relay.address = on_listening.await.context("the relay's thread ended")??;
        Ok(relay)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// kplug's own TLS configuration (`server::tls`), with a serving
/// certificate for 127.0.0.1 from the CA of `kplug`'s state directory, and
/// client certificates verified against that CA by kplug's verifier, as
/// standalone kplug's.
fn server_config(kplug: &StandaloneKplug) -> Result<Arc<rustls::ServerConfig>> {
    let state = kplug.state.path();
    let ca = CertificateAuthority::load(&state.join("ca.crt"), &state.join("ca.key"))?
        .context("no CA in kplug's state directory")?;
    let serving = ca.issue_serving(
        &["localhost".to_owned()],
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
        time::Duration::days(1),
    )?;
    let verifier = optional_client_auth(roots(ca.cert_pem())?);
    let cert = ServingCert::fixed(&serving.cert, &serving.key)?;
    Ok(tls::server_config(Arc::new(cert), verifier)?)
}

async fn serve(listener: TcpListener, tls: TlsAcceptor, client: PluginClient<Channel>) {
    loop {
        // The bench connects once; a failed accept ends the relay, and its
        // caller's next call fails, rather than a loop of failing accepts.
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                eprintln!("the relay stopped accepting: {error}");
                return;
            }
        };
        let (tls, client) = (tls.clone(), client.clone());
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let Ok(stream) = tls.accept(tcp).await else {
                return;
            };
            let service = service_fn(move |request| relay(request, client.clone()));
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The body to the plugin as `object`, its `objectStatus` back.
async fn relay(
    request: Request<Incoming>,
    mut client: PluginClient<Channel>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let answer = async {
        let object = request.into_body().collect().await?.to_bytes();
        let mut call = tonic::Request::new(plugin_request(object, 0));
        call.set_timeout(RECONCILE_TIMEOUT);
        let reply = client.reconcile(call).await?.into_inner();
        anyhow::Ok(Bytes::from(reply.object_status))
    };
    Ok(match answer.await {
        Ok(status) => Response::new(Full::new(status)),
        Err(error) => {
            let mut response = Response::new(Full::new(Bytes::from(error.to_string())));
            *response.status_mut() = StatusCode::BAD_GATEWAY;
            response
        }
    })
}
