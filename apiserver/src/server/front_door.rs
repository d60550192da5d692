//! How connections are let in and how long they may stay, for both
//! listeners: the API and the heartbeats.
//!
//! A connection must finish its TLS handshake and send a complete request
//! within `--request-header-timeout` of being accepted, or it is closed;
//! after that, one with no request in progress for
//! `--idle-connection-timeout` is closed (gracefully). HTTP/1.1 also has
//! hyper's header timeout on every request. At most `--max-connections` are
//! open per listener: the next one is closed as soon as it is accepted,
//! which answers at once instead of leaving it queued in the backlog.
//!
//! At shutdown the listener stops accepting and every open connection is
//! closed gracefully (HTTP/2 GOAWAY; HTTP/1.1 after its response): requests
//! in progress get `--shutdown-timeout` to finish, and [`serve`] returns
//! once every connection has ended or that time has passed.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::busy::{self, Stall};
use super::corked::Corked;
use crate::auth::{Auth, PeerIdentity};
use crate::config::ServingFlags;

/// Server pings on HTTP/2: a peer that vanished without closing (its watch
/// would otherwise hold the connection until the watch times out) is
/// dropped after the interval plus the timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Largest HTTP/2 header list. hyper's default (16 KiB) is less than a
/// front proxy asserting a user in a few hundred groups sends. HTTP/1.1
/// headers are bounded by hyper's read buffer (about 400 KiB, 100 headers).
const MAX_HEADER_LIST_BYTES: u32 = 64 << 10;

/// How long to wait before accepting again after an error that is not one
/// connection's (out of file descriptors, say): retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Beyond `--shutdown-timeout`, how long shutdown waits for connections
/// that should have closed themselves by then.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(1);

/// The limits of `ServingFlags`.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub request_header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_streams: u32,
    pub shutdown_timeout: Duration,
}

impl From<&ServingFlags> for Limits {
    fn from(flags: &ServingFlags) -> Self {
        Self {
            request_header_timeout: flags.request_header_timeout,
            idle_timeout: flags.idle_connection_timeout,
            max_connections: flags.max_connections as usize,
            max_streams: flags.max_streams_per_connection,
            shutdown_timeout: flags.shutdown_timeout,
        }
    }
}

/// One listener and what it serves.
pub struct Door {
    /// The `listener` label of the connection metrics.
    pub name: &'static str,
    pub listener: TcpListener,
    /// `None`: plain TCP (standalone heartbeats, h2c).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub app: Router,
    pub callers: Callers,
}

/// Who connects to a listener: that decides what a connection may keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callers {
    /// kubectl, kube-apiserver, operators: few connections, many requests.
    Clients,
    /// Every plugin instance, each holding one connection for as long as it
    /// runs and sending a request every interval: tens of thousands of
    /// connections, so what each keeps is what the fleet costs. A `date` on
    /// every answer (gRPC does not use it) is a new entry in the
    /// connection's HPACK table every second it answers, until the table
    /// holds 4 KiB of them: several KiB of memory per connection, growing
    /// for minutes (BENCHMARKS.md, "Soak").
    Fleet,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TimeoutLabels {
    listener: &'static str,
    /// `handshake`, `request` or `idle`.
    phase: &'static str,
}

/// Connection counts of both listeners.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    open: Family<ListenerLabels, Gauge>,
    refused: Family<ListenerLabels, Counter>,
    timed_out: Family<TimeoutLabels, Counter>,
}

impl ConnectionMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kplug_connections_open",
            "Connections open, by listener (api, heartbeats)",
            self.open.clone(),
        );
        registry.register(
            "kplug_connections_refused",
            "Connections closed as soon as accepted because --max-connections were open, by listener",
            self.refused.clone(),
        );
        registry.register(
            "kplug_connections_timed_out",
            "Connections closed for being too slow, by listener and phase: handshake (TLS), request (no complete request in time; on HTTP/1.1 also a keep-alive wait), idle (no request in progress)",
            self.timed_out.clone(),
        );
    }

    /// A listener's (open, refused) series, every series of it made to
    /// exist (at zero) from the start.
    fn announce(&self, listener: &'static str) -> (Gauge, Counter) {
        for phase in ["handshake", "request", "idle"] {
            self.timed_out
                .get_or_create(&TimeoutLabels { listener, phase })
                .inc_by(0);
        }
        let labels = ListenerLabels { listener };
        let open = self.open.get_or_create(&labels).clone();
        let refused = self.refused.get_or_create(&labels).clone();
        (open, refused)
    }

    fn timed_out(&self, listener: &'static str, phase: &'static str) {
        self.timed_out
            .get_or_create(&TimeoutLabels { listener, phase })
            .inc();
    }
}

/// Counts a connection open until dropped.
struct Open(Gauge);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// hyper's settings for every connection of a listener for `callers`.
fn http(limits: &Limits, callers: Callers) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    if callers == Callers::Fleet {
        builder.http2().auto_date_header(false);
    }
    builder
}

/// Errors of one connection that `accept` reports; the listener is fine.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// What a TLS connection runs over.
trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The client and kplug agreed on HTTP/2 (ALPN `h2`).
    fn speaks_h2(&mut self) {}
}

impl Transport for TcpStream {}

impl Transport for Corked<TcpStream> {
    fn speaks_h2(&mut self) {
        self.cork();
    }
}

/// What every connection of one listener shares.
struct Shared {
    name: &'static str,
    app: Router,
    auth: Arc<Auth>,
    acceptor: Option<TlsAcceptor>,
    callers: Callers,
    http: auto::Builder<TokioExecutor>,
    limits: Limits,
    metrics: ConnectionMetrics,
    shutdown: watch::Receiver<bool>,
}

/// Accepts connections on `door` and serves its app on each until
/// `shutdown` turns true; then closes them gracefully and returns when they
/// have ended, or after `--shutdown-timeout`.
pub async fn serve(
    door: Door,
    auth: Arc<Auth>,
    limits: Limits,
    metrics: ConnectionMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let Door {
        name,
        listener,
        tls,
        app,
        callers,
    } = door;
    let (open, refused) = metrics.announce(name);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let shared = Arc::new(Shared {
        name,
        app,
        auth,
        acceptor: tls.map(TlsAcceptor::from),
        callers,
        http: http(&limits, callers),
        limits,
        metrics,
        shutdown: shutdown.clone(),
    });
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::warn!(listener = name, error = %e, "accepting a connection failed");
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                        _ = shutdown.changed() => break,
                    }
                }
            },
            _ = shutdown.changed() => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refused.inc();
            tracing::debug!(listener = name, %remote, "connection refused: --max-connections are open");
            drop(stream);
            continue;
        };
        // Without it, small responses wait for the peer's delayed ACK (40 ms).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%remote, error = %e, "setting TCP_NODELAY failed");
        }
        open.inc();
        let counted = Open(open.clone());
        let shared = shared.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _counted = counted;
            shared.connection(stream, remote).await;
        });
    }
    drop(listener);
    // Every connection holds a permit until it ends: all of them back means
    // every connection has closed. Each bounds its own close by the same
    // timeout; this only guards against one that never returns.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let closed = tokio::time::timeout(
        limits.shutdown_timeout + SHUTDOWN_SLACK,
        permits.acquire_many(all),
    )
    .await;
    if closed.is_err() {
        tracing::warn!(
            listener = name,
            "connections still open after --shutdown-timeout: closing them"
        );
    }
}

impl Shared {
    async fn connection(&self, stream: TcpStream, remote: std::net::SocketAddr) {
        // The handshake and the first request share one deadline.
        let first_by = Instant::now() + self.limits.request_header_timeout;
        match (&self.acceptor, self.callers) {
            (None, _) => {
                self.serve_http(stream, PeerIdentity::Anonymous, first_by, remote)
                    .await;
            }
            // Clients read large lists; the fleet's answers are small, and
            // its connections many.
            (Some(acceptor), Callers::Clients) => {
                self.serve_tls(acceptor, Corked::new(stream), first_by, remote)
                    .await;
            }
            (Some(acceptor), Callers::Fleet) => {
                self.serve_tls(acceptor, stream, first_by, remote).await;
            }
        }
    }

    async fn serve_tls(
        &self,
        acceptor: &TlsAcceptor,
        io: impl Transport,
        first_by: Instant,
        remote: std::net::SocketAddr,
    ) {
        let mut tls = match tokio::time::timeout_at(first_by, acceptor.accept(io)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(%remote, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                self.metrics.timed_out(self.name, "handshake");
                tracing::debug!(%remote, "TLS handshake timed out");
                return;
            }
        };
        let (transport, session) = tls.get_mut();
        if session.alpn_protocol() == Some(b"h2") {
            transport.speaks_h2();
        }
        let peer = tls
            .get_ref()
            .1
            .peer_certificates()
            .map_or(PeerIdentity::Anonymous, |chain| self.auth.identify(chain));
        self.serve_http(tls, peer, first_by, remote).await;
    }

    async fn serve_http<I>(
        &self,
        io: I,
        peer: PeerIdentity,
        first_by: Instant,
        remote: std::net::SocketAddr,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (service, activity) = busy::track(self.app.clone(), peer);
        let connection = self
            .http
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(connection);
        let stalled = activity.stalled(first_by, self.limits.idle_timeout);
        let mut shutdown = self.shutdown.clone();
        let result = tokio::select! {
            result = connection.as_mut() => result,
            // Requests in progress finish; new ones go elsewhere (GOAWAY).
            () = async { drop(shutdown.wait_for(|stop| *stop).await) } => {
                connection.as_mut().graceful_shutdown();
                match tokio::time::timeout(self.limits.shutdown_timeout, connection.as_mut()).await {
                    Ok(result) => result,
                    Err(_) => {
                        tracing::debug!(%remote, "requests still in progress after --shutdown-timeout: closing");
                        return;
                    }
                }
            }
            stall = stalled => match stall {
                // Nothing was served: nothing to finish either.
                Stall::FirstRequest => {
                    self.metrics.timed_out(self.name, "request");
                    tracing::debug!(%remote, "no complete request in time: closing");
                    return;
                }
                // Graceful (HTTP/2 GOAWAY) so that clients do not reuse it;
                // bounded, as a peer may never acknowledge.
                Stall::Idle => {
                    self.metrics.timed_out(self.name, "idle");
                    tracing::debug!(%remote, "idle: closing");
                    connection.as_mut().graceful_shutdown();
                    let grace = self.limits.request_header_timeout;
                    match tokio::time::timeout(grace, connection.as_mut()).await {
                        Ok(result) => result,
                        Err(_) => return,
                    }
                }
            },
        };
        if let Err(e) = result {
            if e.downcast_ref::<hyper::Error>()
                .is_some_and(hyper::Error::is_timeout)
            {
                self.metrics.timed_out(self.name, "request");
            }
            tracing::debug!(%remote, error = %e, "connection ended with an error");
        }
    }
}
