//! Clients built by hand, TCP, TLS and HTTP, so that a test can stop where
//! a real client never would, and see when the server hangs up.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A runtime for the clients; the test thread blocks on it.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Raises this process's soft limit on open files towards `wanted` (kplug,
/// a child, inherits it); returns the limit in force.
pub fn raise_open_files_limit(wanted: u64) -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    if current < wanted {
        limit.current = Some(limit.maximum.map_or(wanted, |max| max.min(wanted)));
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            eprintln!("cannot raise the open files limit: {e}");
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// TLS trusting only the CA in `ca` (PEM), offering `alpn`.
pub fn connector(ca: &Path, alpn: &[&[u8]]) -> TlsConnector {
    let pem = std::fs::read(ca).unwrap_or_else(|e| panic!("{}: {e}", ca.display()));
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots
            .add(cert.expect("a PEM certificate"))
            .expect("a CA certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

/// A finished TLS handshake with `address`, whose certificate names `localhost`.
pub async fn tls(address: SocketAddr, connector: &TlsConnector) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(address).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("a server name");
    connector
        .connect(name, tcp)
        .await
        .expect("the TLS handshake")
}

/// When the server closed `stream`: reads (and drops) whatever it sends
/// until end of file or an error such as a reset.
pub async fn closed(mut stream: impl AsyncRead + Unpin) -> Instant {
    let mut buffer = [0; 4096];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return Instant::now(),
            Ok(_) => {}
        }
    }
}

/// A connection the client keeps open and unused.
pub struct Idle {
    /// Just before its one request was sent: the server's idle timer starts
    /// after this.
    pub sent: Instant,
    /// When its one request was answered, read to the end by this client:
    /// the server's idle timer started before this.
    pub answered: Instant,
    /// Ends with the connection, with when.
    pub ended: JoinHandle<Instant>,
    /// The client's handle: dropping it would close the connection from
    /// this side.
    _sender: Box<dyn std::any::Any + Send>,
}

/// One `GET path` answered 200 on a new HTTP/2 (`h2`) or HTTP/1.1
/// connection, which then stays open with nothing more to do.
pub async fn one_request_then_idle(address: SocketAddr, ca: &Path, h2: bool, path: &str) -> Idle {
    let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
    let io = TokioIo::new(tls(address, &connector(ca, &[alpn])).await);
    let request = hyper::Request::get(path)
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .expect("a request");
    let sent = Instant::now();
    let (status, ended, sender): (_, _, Box<dyn std::any::Any + Send>) = if h2 {
        let (mut send, connection) = http2::handshake(TokioExecutor::new(), io)
            .await
            .expect("the HTTP/2 handshake");
        let ended = tokio::spawn(async move {
            let _ = connection.await;
            Instant::now()
        });
        let response = send.send_request(request).await.expect("an answer");
        let status = response.status();
        let _ = response.into_body().collect().await;
        (status, ended, Box::new(send))
    } else {
        let (mut send, connection) = http1::handshake(io).await.expect("HTTP/1.1");
        let ended = tokio::spawn(async move {
            let _ = connection.await;
            Instant::now()
        });
        let response = send.send_request(request).await.expect("an answer");
        let status = response.status();
        // Read to the end, so that the connection is idle and reusable.
        let _ = response.into_body().collect().await;
        (status, ended, Box::new(send))
    };
    assert_eq!(status, 200, "GET {path}");
    Idle {
        sent,
        answered: Instant::now(),
        ended,
        _sender: sender,
    }
}

/// Whether `elapsed` is at least `at_least` (the close came from the
/// timeout, not earlier) and at most `at_least + slack`.
pub fn within(elapsed: Duration, at_least: Duration, slack: Duration) -> bool {
    elapsed >= at_least && elapsed <= at_least + slack
}
