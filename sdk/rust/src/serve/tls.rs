//! Serving the Plugin service over TLS: the certificate, key and client CA
//! read from files, read again for every new connection so that rotated
//! material is used without a restart, and the accept loop that hands
//! tonic the connections whose handshake succeeded.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, mpsc, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

use crate::error::error_chain;
use crate::identity::Held;
use crate::{Config, Error};

/// Bounds a TLS handshake, so a client that connects and says nothing does
/// not hold a task for ever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed `accept` (e.g. out of file descriptors), how long to wait
/// before the next, so a lasting failure does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// Finished handshakes waiting for tonic to take them.
const BACKLOG: usize = 16;

/// The files TLS is served from.
#[derive(Clone, Debug)]
pub(super) struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// The files `config` names; `None` for plain gRPC.
    pub(super) fn from_config(config: &Config) -> Result<Option<Self>, Error> {
        let refuse = |reason: &str| Error::ServeTls {
            reason: reason.to_owned(),
        };
        let (cert, key) = match (&config.tls_cert_file, &config.tls_key_file) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            (None, None) if config.client_ca_file.is_some() => {
                return Err(refuse(
                    "--client-ca-file (KPLUG_CLIENT_CA_FILE) verifies callers over TLS only: set \
                     --tls-cert-file and --tls-key-file too",
                ));
            }
            (None, None) => return Ok(None),
            (Some(_), None) => {
                return Err(refuse(
                    "--tls-cert-file needs its private key: set --tls-key-file (KPLUG_TLS_KEY_FILE)",
                ));
            }
            (None, Some(_)) => {
                return Err(refuse(
                    "--tls-key-file needs its certificate: set --tls-cert-file (KPLUG_TLS_CERT_FILE)",
                ));
            }
        };
        match (&config.client_ca_file, config.allow_unauthenticated_clients) {
            (None, false) => Err(refuse(
                "serving TLS without --client-ca-file (KPLUG_CLIENT_CA_FILE) would accept calls from \
                 anyone who reaches the port: set it to the CA of kplug's client certificate, or pass \
                 --allow-unauthenticated-clients (KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS=true) to mean it",
            )),
            (Some(_), true) => Err(refuse(
                "--allow-unauthenticated-clients contradicts --client-ca-file, which requires client \
                 certificates; drop one",
            )),
            (client_ca, _) => Ok(Some(Self {
                cert,
                key,
                client_ca: client_ca.clone(),
            })),
        }
    }
}

/// Whether the plugin serves the identity kplug issues
/// (`--issued-identity`), checked against the rest of `config`.
pub(super) fn issued_identity(config: &Config) -> Result<bool, Error> {
    if !config.issued_identity {
        return Ok(false);
    }
    let refuse = |reason: &str| {
        Err(Error::ServeTls {
            reason: format!("--issued-identity (KPLUG_ISSUED_IDENTITY) {reason}"),
        })
    };
    if !config.registry.starts_with("https://") {
        return refuse(
            "asks kplug in cluster mode for a certificate: the registry must be https://",
        );
    }
    if config.token_file.is_none() {
        return refuse(
            "is granted to the plugin's ServiceAccount: set --token-file (KPLUG_TOKEN_FILE)",
        );
    }
    if config.tls_cert_file.is_some() || config.client_ca_file.is_some() {
        return refuse("replaces --tls-cert-file, --tls-key-file and --client-ca-file: drop them");
    }
    if config.allow_unauthenticated_clients {
        return refuse(
            "accepts only kplug's client certificate: drop --allow-unauthenticated-clients",
        );
    }
    if config.server_name.is_some() {
        return refuse(
            "certifies NAME.plugins.kplug.io, the name kplug verifies: drop --server-name",
        );
    }
    Ok(true)
}

/// A certificate, its key and the client CA, PEM.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Pem {
    pub(crate) cert: Vec<u8>,
    pub(crate) key: Vec<u8>,
    pub(crate) client_ca: Option<Vec<u8>>,
}

/// The TLS configuration served: from files, or the identity kplug issues.
pub(super) enum ServingTls {
    Files(Box<FileTls>),
    /// What kplug signed; `None` until its first answer.
    Issued(watch::Receiver<Option<Held>>),
}

impl ServingTls {
    /// Whether callers must present a client certificate.
    pub(super) fn verifies_clients(&self) -> bool {
        match self {
            Self::Files(files) => files.files.client_ca.is_some(),
            Self::Issued(_) => true,
        }
    }

    /// The configuration for a new connection. With an issued identity
    /// that kplug has not signed yet, the handshake waits for it (within
    /// the handshake timeout): the first heartbeat's answer brings it.
    async fn current(&self) -> Option<Arc<ServerConfig>> {
        match self {
            Self::Files(files) => Some(files.current().await),
            Self::Issued(held) => {
                let mut held = held.clone();
                let held = held.wait_for(Option::is_some).await.ok()?;
                held.as_ref().map(|held| Arc::clone(&held.config))
            }
        }
    }
}

/// The TLS configuration served from files, kept in step with them.
pub(super) struct FileTls {
    files: TlsFiles,
    state: Mutex<State>,
}

struct State {
    /// What the configuration in use was built from.
    loaded: Pem,
    config: Arc<ServerConfig>,
    /// Contents that did not load, and why, so that they are neither
    /// retried nor reported with every connection.
    rejected: Option<(Pem, String)>,
}

impl FileTls {
    /// Reads and checks the files; at start, any problem is an error.
    pub(super) async fn load(files: TlsFiles) -> Result<Self, Error> {
        let pem = read(&files).await?;
        let config = build(&pem).map_err(|reason| Error::ServeTls { reason })?;
        Ok(Self {
            files,
            state: Mutex::new(State {
                loaded: pem,
                config: Arc::new(config),
                rejected: None,
            }),
        })
    }

    /// The configuration for a new connection: from the files as they are
    /// now when that loads, else the last one that did.
    async fn current(&self) -> Arc<ServerConfig> {
        let mut state = self.state.lock().await;
        let problem = match read(&self.files).await {
            Ok(pem) if pem == state.loaded => None,
            Ok(pem) if state.rejected.as_ref().is_some_and(|(r, _)| *r == pem) => None,
            Ok(pem) => match build(&pem) {
                Ok(config) => {
                    info!("serving the TLS certificate and client CA as changed on disk");
                    state.loaded = pem;
                    state.config = Arc::new(config);
                    state.rejected = None;
                    None
                }
                Err(reason) => {
                    state.rejected = Some((pem, reason.clone()));
                    Some(reason)
                }
            },
            Err(error) => Some(error_chain(&error)),
        };
        if let Some(problem) = problem {
            warn!(%problem, "cannot use the TLS files as they are now; keeping the previous ones");
        }
        Arc::clone(&state.config)
    }
}

async fn read(files: &TlsFiles) -> Result<Pem, Error> {
    async fn one(what: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
        tokio::fs::read(path)
            .await
            .map_err(|source| Error::ReadTlsFile {
                what,
                path: path.to_owned(),
                source,
            })
    }
    let client_ca = match &files.client_ca {
        Some(path) => Some(one("client CA", path).await?),
        None => None,
    };
    Ok(Pem {
        cert: one("certificate", &files.cert).await?,
        key: one("private key", &files.key).await?,
        client_ca,
    })
}

/// A rustls configuration serving HTTP/2 with the certificate and key,
/// verifying clients against the client CA when there is one.
pub(crate) fn build(pem: &Pem) -> Result<ServerConfig, String> {
    let certificates = |what: &str, bytes: &[u8]| {
        let certificates = rustls_pemfile::certs(&mut &bytes[..])
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the {what} is not valid PEM: {e}"))?;
        if certificates.is_empty() {
            return Err(format!(
                "the {what} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            ));
        }
        Ok(certificates)
    };
    let chain = certificates("certificate file", &pem.cert)?;
    let key = rustls_pemfile::private_key(&mut &pem.key[..])
        .map_err(|e| format!("the private key file is not valid PEM: {e}"))?
        .ok_or("the private key file holds no PEM private key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &pem.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates("client CA file", ca)? {
                roots.add(certificate).map_err(|e| {
                    format!("the client CA file holds an unusable certificate: {e}")
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("cannot verify clients with the client CA: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and private key do not go together: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The connections accepted on `listener` whose TLS handshake succeeded.
/// Listening ends, closing the socket, when the stream is dropped: tonic
/// drops it when it stops accepting.
pub(super) fn incoming(
    listener: TcpListener,
    tls: Arc<ServingTls>,
) -> ReceiverStream<io::Result<TlsStream<TcpStream>>> {
    let (connections, incoming) = mpsc::channel(BACKLOG);
    tokio::spawn(async move {
        // Dropped with the loop, which aborts handshakes under way.
        let mut handshakes = JoinSet::new();
        loop {
            tokio::select! {
                () = connections.closed() => return,
                Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        handshakes.spawn(handshake(
                            stream,
                            peer,
                            Arc::clone(&tls),
                            connections.clone(),
                        ));
                    }
                    Err(error) => {
                        warn!(%error, "cannot accept a connection");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    }
                },
            }
        }
    });
    ReceiverStream::new(incoming)
}

/// Completes the handshake of `stream` and hands it on; a client refused
/// (e.g. without a certificate from the client CA) is logged.
async fn handshake(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Arc<ServingTls>,
    connections: mpsc::Sender<io::Result<TlsStream<TcpStream>>>,
) {
    let accept = async {
        let config = tls.current().await.ok_or_else(|| {
            io::Error::other("no certificate: the heartbeats that bring it have stopped")
        })?;
        TlsAcceptor::from(config).accept(stream).await
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept).await {
        Ok(Ok(stream)) => {
            let _ = connections.send(Ok(stream)).await;
        }
        // A TCP probe (the kubelet's tcpSocket, a load balancer's check)
        // connects and closes: every few seconds, and nobody was refused.
        Ok(Err(error)) if closed_before_hello(&error) => {
            debug!(%peer, "connection closed before its TLS handshake");
        }
        Ok(Err(error)) => info!(%peer, %error, "TLS handshake failed; connection refused"),
        Err(_) => debug!(%peer, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out"),
    }
}

/// Whether a failed handshake is a connection its client closed before
/// saying anything.
fn closed_before_hello(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::UnexpectedEof
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn config() -> Config {
        Config::default()
    }

    fn reason(config: &Config) -> String {
        match TlsFiles::from_config(config) {
            Err(Error::ServeTls { reason }) => reason,
            other => panic!("expected a TLS error, got {other:?}"),
        }
    }

    #[test]
    fn tls_settings_must_add_up() {
        assert!(TlsFiles::from_config(&config()).unwrap().is_none());
        // Harmless without TLS.
        let allow = config().allow_unauthenticated_clients(true);
        assert!(TlsFiles::from_config(&allow).unwrap().is_none());

        let tls = config().tls("tls.crt", "tls.key");
        assert!(reason(&tls).contains("--allow-unauthenticated-clients"));
        assert!(reason(&tls).contains("KPLUG_CLIENT_CA_FILE"));
        let files = TlsFiles::from_config(&tls.clone().client_ca_file("ca.crt"))
            .unwrap()
            .unwrap();
        assert_eq!(files.client_ca.as_deref(), Some(Path::new("ca.crt")));
        let open = TlsFiles::from_config(&tls.clone().allow_unauthenticated_clients(true))
            .unwrap()
            .unwrap();
        assert!(open.client_ca.is_none());
        let both = tls
            .client_ca_file("ca.crt")
            .allow_unauthenticated_clients(true);
        assert!(reason(&both).contains("contradicts"));

        let mut half = config().client_ca_file("ca.crt");
        half.tls_cert_file = Some("tls.crt".into());
        assert!(reason(&half).contains("--tls-key-file"));
        half.tls_cert_file = None;
        half.tls_key_file = Some("tls.key".into());
        assert!(reason(&half).contains("--tls-cert-file"));
        half.tls_key_file = None;
        assert!(reason(&half).contains("over TLS only"));
    }

    #[test]
    fn an_issued_identity_needs_cluster_mode_and_nothing_it_replaces() {
        let cluster = config()
            .registry("https://kplug.kplug-system.svc:8444")
            .token_file("/var/run/secrets/kplug/token")
            .issued_identity(true);
        assert!(issued_identity(&cluster).expect("cluster mode"));
        assert!(!issued_identity(&config()).expect("off by default"));
        let refused = |config: Config| match issued_identity(&config) {
            Err(Error::ServeTls { reason }) => reason,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let plain = config().token_file("/t").issued_identity(true);
        assert!(refused(plain).contains("the registry must be https://"));
        let mut tokenless = cluster.clone();
        tokenless.token_file = None;
        assert!(refused(tokenless).contains("--token-file"));
        assert!(refused(cluster.clone().tls("tls.crt", "tls.key")).contains("--tls-cert-file"));
        assert!(refused(cluster.clone().client_ca_file("ca.crt")).contains("drop them"));
        let open = cluster.clone().allow_unauthenticated_clients(true);
        assert!(refused(open).contains("--allow-unauthenticated-clients"));
        let mut named = cluster;
        named.server_name = Some("hello.plugins.svc".to_owned());
        assert!(refused(named).contains("drop --server-name"));
    }

    #[test]
    fn material_must_be_pem_that_goes_together() {
        let pem = |cert: &str, key: &str| Pem {
            cert: cert.as_bytes().to_vec(),
            key: key.as_bytes().to_vec(),
            client_ca: None,
        };
        let reason = |pem: &Pem| build(pem).err().unwrap_or_default();
        assert!(reason(&pem("", "")).contains("certificate file holds no PEM certificate"));
        let broken = "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
        assert!(reason(&pem(broken, "")).contains("not valid PEM"));
    }

    /// The error a real handshake ends with when the client sends `first`,
    /// then closes.
    async fn handshake_error(first: &[u8]) -> io::Error {
        let key = rcgen::KeyPair::generate().expect("a key");
        let certificate = rcgen::CertificateParams::new(vec!["plugin.test".to_owned()])
            .expect("names")
            .self_signed(&key)
            .expect("a certificate");
        let config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(
                    vec![certificate.der().clone()],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
                )
                .expect("a server config");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let first = first.to_vec();
        let client = tokio::spawn(async move {
            let mut stream = TcpStream::connect(address).await.expect("connect");
            stream.write_all(&first).await.expect("write");
            stream.shutdown().await.expect("close");
        });
        let (stream, _) = listener.accept().await.expect("accept");
        let error = TlsAcceptor::from(Arc::new(config))
            .accept(stream)
            .await
            .expect_err("the handshake fails");
        client.await.expect("the client");
        error
    }

    #[tokio::test]
    async fn a_probe_that_connects_and_closes_is_not_a_refused_client() {
        assert!(closed_before_hello(&handshake_error(b"").await));
        // A client speaking something else than TLS is refused, and says so.
        let plain_http = handshake_error(b"GET / HTTP/1.1\r\nHost: plugin\r\n\r\n").await;
        assert!(!closed_before_hello(&plain_http), "{plain_http}");
    }
}
