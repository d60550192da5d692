//! What the apiserver bench binaries share beyond `kplug-test-support`
//! (which runs the processes, measures CPU, memory and latencies and
//! formats the reports): the standalone server as measured, the admin
//! HTTPS client and these benches' "Machine" section.
//!
//! Each bench compiles this module on its own and uses a part of it.
#![allow(dead_code)]

pub mod heartbeats;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kplug_test_support::measure::{OtherLoad, proc_status_kib, process_cpu_time};
use kplug_test_support::report::Machine;
use kplug_test_support::{StandaloneKplug, workspace_binary};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

/// Upper bounds, so that a wedged server fails the run instead of hanging it.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// The server

/// `kplug-apiserver standalone` (from `kplug-test-support`, killed when
/// dropped) as the benches measure it: its addresses, CPU and memory.
pub struct Server {
    pub kplug: StandaloneKplug,
    pub api: SocketAddr,
    pub grpc: SocketAddr,
}

impl Server {
    /// Starts the server on 127.0.0.1 with a fresh state directory and
    /// `flags`, logging at `info` only (the tests' debug logging would be
    /// measured too), and waits for its serving banner.
    pub fn start(flags: &[&str]) -> Self {
        Self::start_binary(&workspace_binary("kplug-apiserver"), flags)
    }

    /// Starts `binary` (another build of kplug) the same way.
    pub fn start_binary(binary: &Path, flags: &[&str]) -> Self {
        let state = tempfile::tempdir().expect("a temporary state directory");
        let kplug =
            StandaloneKplug::start_binary_in(binary, state, &[&["--log", "info"], flags].concat());
        let (api, grpc) = (kplug.api_address(), kplug.grpc_address());
        eprintln!(
            "started kplug-apiserver (pid {}): api {api}, grpc {grpc}",
            kplug.pid()
        );
        Self { kplug, api, grpc }
    }

    pub fn pid(&self) -> u32 {
        self.kplug.pid()
    }

    /// Resident memory now, in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid(), "VmRSS")
    }

    /// Peak resident memory so far, in KiB.
    pub fn peak_rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid(), "VmHWM")
    }

    pub fn cpu_time(&self) -> Result<Duration> {
        process_cpu_time(self.pid())
    }
}

// ---------------------------------------------------------------------------
// Tasks

pub async fn join_all<T: 'static>(mut tasks: JoinSet<Result<T>>) -> Result<Vec<T>> {
    let mut results = Vec::with_capacity(tasks.len());
    while let Some(joined) = tasks.join_next().await {
        results.push(joined.context("a load task panicked")??);
    }
    Ok(results)
}

// ---------------------------------------------------------------------------
// The API over HTTPS

/// One HTTP/2 connection over TLS to the API, as the admin user. Clones
/// share the connection (one more stream each).
#[derive(Clone)]
pub struct ApiClient {
    sender: SendRequest<Full<Bytes>>,
    base: String,
    /// Headers added to every request (e.g. front-proxy identity headers).
    default_headers: http::HeaderMap,
}

impl ApiClient {
    pub async fn connect(server: &Server) -> Result<Self> {
        Self::connect_with(
            server.api,
            ServerName::IpAddress(server.api.ip().into()),
            admin_tls_config(&server.kplug)?,
            http::HeaderMap::new(),
        )
        .await
    }

    /// One HTTP/2 connection over TLS to `address`, verified as `name`, with
    /// the identity in `config` (whose ALPN must offer h2), sending
    /// `default_headers` with every request.
    pub async fn connect_with(
        address: SocketAddr,
        name: ServerName<'static>,
        config: rustls::ClientConfig,
        default_headers: http::HeaderMap,
    ) -> Result<Self> {
        let tls = TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(address)
            .await
            .with_context(|| format!("connecting to {address}"))?;
        tcp.set_nodelay(true)?;
        let stream = tls
            .connect(name, tcp)
            .await
            .context("TLS handshake with the API")?;
        ensure!(
            stream.get_ref().1.alpn_protocol() == Some(b"h2"),
            "the API did not negotiate HTTP/2"
        );
        // Flow-control windows as Go's HTTP/2 transport (kubectl's) uses.
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(1 << 30)
            .handshake(TokioIo::new(stream))
            .await
            .context("HTTP/2 handshake with the API")?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("API connection ended: {e}");
            }
        });
        Ok(Self {
            sender,
            base: format!("https://{address}"),
            default_headers,
        })
    }

    /// GETs `path` and returns the whole body of a 200 response.
    pub async fn get(&mut self, path: &str, accept: &str) -> Result<Bytes> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.get_untimed(path, accept))
            .await
            .with_context(|| format!("GET {path} took longer than {REQUEST_TIMEOUT:?}"))?
    }

    async fn get_untimed(&mut self, path: &str, accept: &str) -> Result<Bytes> {
        let request = http::Request::get(format!("{}{path}", self.base))
            .header(http::header::ACCEPT, accept)
            // An empty Full is at its end: HEADERS with END_STREAM, no DATA.
            .body(Full::new(Bytes::new()))
            .context("building the request")?;
        let (status, _, body) = self.send(request, "GET", path).await?;
        if !status.is_success() {
            bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }

    /// POSTs a JSON `body` to `path` and returns the status and whole body
    /// of the response, whatever the status.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: Bytes,
    ) -> Result<(http::StatusCode, Bytes)> {
        let (status, _, body) = self.post_json_with_headers(path, body).await?;
        Ok((status, body))
    }

    /// As [`ApiClient::post_json`], with the response's headers.
    pub async fn post_json_with_headers(
        &mut self,
        path: &str,
        body: Bytes,
    ) -> Result<(http::StatusCode, http::HeaderMap, Bytes)> {
        let request = http::Request::post(format!("{}{path}", self.base))
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .context("building the request")?;
        tokio::time::timeout(REQUEST_TIMEOUT, self.send(request, "POST", path))
            .await
            .with_context(|| format!("POST {path} took longer than {REQUEST_TIMEOUT:?}"))?
    }

    /// GETs `path` (a watch) and returns the body of a 200 response
    /// unread, to be read as it streams; only the response's headers are
    /// bounded by [`REQUEST_TIMEOUT`].
    pub async fn get_streaming(&mut self, path: &str, accept: &str) -> Result<Incoming> {
        let request = http::Request::get(format!("{}{path}", self.base))
            .header(http::header::ACCEPT, accept)
            .body(Full::new(Bytes::new()))
            .context("building the request")?;
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.start(request, "GET", path))
            .await
            .with_context(|| format!("GET {path} took longer than {REQUEST_TIMEOUT:?}"))??;
        let status = response.status();
        if !status.is_success() {
            let body = response.into_body().collect().await.map(|b| b.to_bytes());
            bail!(
                "GET {path}: {status}: {}",
                String::from_utf8_lossy(&body.unwrap_or_default())
            );
        }
        Ok(response.into_body())
    }

    /// Sends `request` and returns the response once its headers are in.
    async fn start(
        &mut self,
        mut request: http::Request<Full<Bytes>>,
        method: &str,
        path: &str,
    ) -> Result<http::Response<Incoming>> {
        for (name, value) in &self.default_headers {
            request.headers_mut().insert(name, value.clone());
        }
        self.sender
            .ready()
            .await
            .context("the API connection closed")?;
        self.sender
            .send_request(request)
            .await
            .with_context(|| format!("{method} {path}"))
    }

    async fn send(
        &mut self,
        request: http::Request<Full<Bytes>>,
        method: &str,
        path: &str,
    ) -> Result<(http::StatusCode, http::HeaderMap, Bytes)> {
        let response = self.start(request, method, path).await?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .with_context(|| format!("reading the body of {method} {path}"))?
            .to_bytes();
        Ok((parts.status, parts.headers, body))
    }
}

/// rustls client config trusting the server's CA and presenting the admin
/// certificate from the kubeconfig that standalone mode wrote.
pub fn admin_tls_config(kplug: &StandaloneKplug) -> Result<rustls::ClientConfig> {
    let ca_path = kplug.state.path().join("ca.crt");
    let ca = std::fs::read(&ca_path).with_context(|| format!("reading {}", ca_path.display()))?;
    let (cert, key) = kplug.admin_pem();
    tls_config(&ca, &cert, &key)
}

/// rustls client config (ALPN h2) trusting the CA in `ca_pem` and
/// presenting the client certificate `cert_pem` with the key `key_pem`.
pub fn tls_config(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<rustls::ClientConfig> {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<_, _>>()
        .context("parsing the client certificate")?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .context("parsing the client key")?
        .context("no private key in the client key PEM")?;
    let mut config = tls_builder(ca_pem)?
        .with_client_auth_cert(certs, key)
        .context("the client certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// rustls client config (ALPN h2) trusting the CA in `ca_pem`, without a
/// client certificate: for callers who send a bearer token.
pub fn tls_config_without_client_cert(ca_pem: &[u8]) -> Result<rustls::ClientConfig> {
    let mut config = tls_builder(ca_pem)?.with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

fn tls_builder(
    ca_pem: &[u8],
) -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(cert.context("parsing the CA certificate")?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots))
}

// ---------------------------------------------------------------------------
// The report

/// The "Machine" section of these benches' reports: CPU, memory, kernel,
/// competition from other processes, the binaries measured (`(role,
/// path)`) and the command.
pub fn print_machine(binaries: &[(&str, &Path)], command: &str, others: OtherLoad) -> Result<()> {
    print_machine_with_notes(binaries, command, others, &[])
}

/// [`print_machine`] with `notes` after the kernel.
pub fn print_machine_with_notes(
    binaries: &[(&str, &Path)],
    command: &str,
    others: OtherLoad,
    notes: &[String],
) -> Result<()> {
    Machine {
        heading: "## Machine",
        shared_by: "the server and the load generator",
        memory: true,
        notes,
        others: (others, "the run"),
        details: &[],
        binaries,
        binary_note: " (release build)",
        command,
    }
    .print()
}

// ---------------------------------------------------------------------------
// The baseline build

/// The environment variable naming an earlier commit whose build the
/// benches measure beside the current one, in the same run.
pub const BASELINE_VARIABLE: &str = "KPLUG_BASELINE";

/// The commit in `KPLUG_BASELINE` and kplug built at it, if it is set:
/// hack/baseline.sh builds it once into ~/.cache/kplug/baseline.
pub fn baseline_from_env() -> Result<Option<(std::path::PathBuf, String)>> {
    match std::env::var(BASELINE_VARIABLE) {
        Ok(rev) if !rev.is_empty() => Ok(Some((baseline_binary(&rev)?, rev))),
        _ => Ok(None),
    }
}

/// Builds (once) and locates kplug at `rev` with hack/baseline.sh.
pub fn baseline_binary(rev: &str) -> Result<std::path::PathBuf> {
    let output =
        std::process::Command::new(kplug_test_support::repo_root().join("hack/baseline.sh"))
            .arg(rev)
            .output()
            .context("running hack/baseline.sh")?;
    ensure!(
        output.status.success(),
        "hack/baseline.sh {rev} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(std::path::PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim(),
    ))
}
