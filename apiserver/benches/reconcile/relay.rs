//! The floor of any proxy on this machine: a relay that terminates the
//! caller's TLS and HTTP/2 as kplug does (kplug's TLS configuration, a
//! serving certificate from its CA, the admin's client certificate
//! verified against that CA) and makes
//! the plugin's gRPC call, and nothing else: it decodes nothing, selects
//! nothing, checks nothing and renders nothing. The request's body is the
//! object's JSON, passed to the plugin as `object` as the direct route
//! passes it; the answer's body is the plugin's `objectStatus` bytes.
//!
//! It is the bench's own binary started again as a process of its own,
//! with a two-worker Tokio runtime (the shape of kplug's here), so that
//! the caller's hop to it crosses processes as the hop to kplug does and
//! its CPU time is its own.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

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
use kplug_test_support::measure::process_cpu_time;
use kplug_test_support::{Process, StandaloneKplug};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tonic::transport::Channel;

use crate::RECONCILE_TIMEOUT;
use crate::route::{connect_plugin_once_listening, plugin_request};
use crate::support::STARTUP_TIMEOUT;

/// The variable that makes the bench's binary a relay: the plugin's
/// address and kplug's state directory, separated by a space.
const RELAY_VARIABLE: &str = "KPLUG_BENCH_RELAY";

/// The relay: the bench's own binary, started again as a process of its
/// own, as kplug is one, so that a hop to it crosses processes as a hop
/// to kplug does and its CPU time can be read from `/proc`. Killed when
/// dropped; it also ends when its standard input closes with the bench.
pub struct RelayProcess {
    process: Process,
    pub address: SocketAddr,
}

impl RelayProcess {
    /// Starts the relay in front of the plugin at `plugin`, with the
    /// certificates of `kplug`'s state directory, once it listens.
    pub fn start(kplug: &StandaloneKplug, plugin: SocketAddr) -> Result<Self> {
        let binary = std::env::current_exe().context("the bench's own binary")?;
        let (process, stdout) = Process::spawn_with_stdout(
            Command::new(binary)
                .env(
                    RELAY_VARIABLE,
                    format!("{plugin} {}", kplug.state.path().display()),
                )
                .stdin(Stdio::piped()),
            "the relay",
        );
        let line = stdout.wait_for(STARTUP_TIMEOUT, "the relay's address", |line| {
            line.parse::<SocketAddr>().is_ok()
        });
        let address = line.parse().context("the relay's address")?;
        eprintln!("started the relay (pid {}) on {address}", process.pid());
        Ok(Self { process, address })
    }

    pub fn cpu_time(&self) -> Result<Duration> {
        process_cpu_time(self.process.pid())
    }
}

/// When the bench's binary was started as the relay, serves as the relay
/// and returns `Some` once its standard input closes.
pub fn serve_if_relay() -> Option<Result<()>> {
    let setting = std::env::var(RELAY_VARIABLE).ok()?;
    Some(serve_as_relay(&setting))
}

fn serve_as_relay(setting: &str) -> Result<()> {
    let (plugin, state) = setting
        .split_once(' ')
        .with_context(|| format!("{RELAY_VARIABLE} is not `PLUGIN_ADDRESS STATE_DIR`"))?;
    let plugin: SocketAddr = plugin.parse().context("the plugin's address")?;
    let tls = TlsAcceptor::from(server_config(Path::new(state))?);
    // Two workers, the shape of kplug's runtime on this machine.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("the relay's runtime")?;
    runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let client = connect_plugin_once_listening(plugin).await?;
        println!("{}", listener.local_addr()?);
        let mut stdin = tokio::io::stdin();
        let mut closed = [0u8; 1];
        tokio::select! {
            () = serve(listener, tls, client) => {}
            _ = stdin.read(&mut closed) => {}
        }
        Ok(())
    })
}

/// kplug's own TLS configuration (`server::tls`), with a serving
/// certificate for 127.0.0.1 from the CA of `kplug`'s state directory, and
/// client certificates verified against that CA by kplug's verifier, as
/// standalone kplug's.
fn server_config(state: &Path) -> Result<Arc<rustls::ServerConfig>> {
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
