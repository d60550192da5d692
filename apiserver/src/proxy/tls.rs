//! Mutual TLS from kplug to plugins (cluster mode). Without it any pod that
//! reaches a plugin's address could call `Reconcile` itself and bypass RBAC
//! on `plugins/reconcile`; with it the plugin accepts only kplug's client
//! certificate, and kplug sends objects only to a plugin whose serving
//! certificate the plugin CA signed for the name the plugin declared.
//!
//! The three files are re-read every `--cert-reload-interval`, as the
//! serving certificate is. A change that loads starts a new generation: the
//! proxy replaces a channel made with an older one when it next uses it, so
//! new connections use the new material while calls in flight finish on
//! the old channel.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::{ProxyError, Target};
use crate::identity::{Signer, SignerError};
use crate::server::serving_cert::reload_every;

/// kplug's client certificate and key, and the CA of plugins' serving
/// certificates; PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginTlsFiles {
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub ca: PathBuf,
}

/// Why the plugin TLS files do not load.
#[derive(Debug, thiserror::Error)]
pub enum PluginTlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key")]
    NoKey { path: PathBuf },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error("the certificate {cert} and the key {key} do not go together: {detail}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        detail: String,
    },
    #[error("kplug's plugin CA: {0}")]
    Signer(#[source] SignerError),
}

/// Where kplug's client certificate and the plugin CAs come from.
pub enum PluginTlsSource {
    /// Files the user's PKI made (`--plugin-client-cert-file` and friends).
    Files(PluginTlsFiles),
    /// kplug's plugin CA: kplug issues its own client certificate and
    /// trusts the signer's bundle.
    Signer(Arc<Signer>),
}

/// What a generation of the material was made from, to tell when the next
/// one is due.
enum Origin {
    /// The files' bytes (cert, key, CA), to tell a change from a re-read.
    Files([Vec<u8>; 3]),
    /// Issued by the signer at its `generation`; renewed after `renew_at`.
    Issued { generation: u64, renew_at: Instant },
}

/// One loaded generation of the material.
pub(super) struct Material {
    pub(super) generation: u64,
    origin: Origin,
    identity: Identity,
    ca: Certificate,
}

/// kplug's TLS material for dialing plugins, reloaded from its source.
pub struct PluginTls {
    source: PluginTlsSource,
    current: RwLock<Arc<Material>>,
    /// `current`'s generation, read on every call without the lock.
    generation: AtomicU64,
}

/// The common name of the client certificate kplug issues itself.
const CLIENT_NAME: &str = "kplug";

impl PluginTls {
    /// Reads and checks the material.
    pub fn load(source: PluginTlsSource) -> Result<Self, PluginTlsError> {
        let material = fresh(&source, 1)?;
        Ok(Self {
            source,
            current: RwLock::new(Arc::new(material)),
            generation: AtomicU64::new(1),
        })
    }

    /// Loads `source` when given; without it calls to plugins are
    /// plaintext, which this logs loudly, as it is insecure.
    pub fn start(source: Option<PluginTlsSource>) -> Result<Option<Arc<Self>>, PluginTlsError> {
        let Some(source) = source else {
            tracing::warn!(
                "calls to plugins are PLAINTEXT and unauthenticated: any pod that can reach a \
                 plugin's address can call it directly, bypassing RBAC on plugins/reconcile. \
                 Set --plugin-signing-cert-file, --plugin-signing-key-file and --plugin-ca-file \
                 (see docs/src/guides/deploy.md, \"Plugin TLS\")"
            );
            return Ok(None);
        };
        let tls = Self::load(source)?;
        match &tls.source {
            PluginTlsSource::Files(files) => tracing::info!(
                client_cert = %files.client_cert.display(),
                ca = %files.ca.display(),
                "calls to plugins use mutual TLS"
            ),
            PluginTlsSource::Signer(signer) => tracing::info!(
                signing_cert = %signer.files().cert.display(),
                ca = %signer.files().trust_bundle.display(),
                lifetime = ?signer.lifetime(),
                plugin_ca = %signer.names(),
                "calls to plugins use mutual TLS with certificates of kplug's plugin CA"
            ),
        }
        Ok(Some(Arc::new(tls)))
    }

    /// The generation of the material in use; it grows with each reload
    /// that changes something.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(super) fn current(&self) -> Arc<Material> {
        self.current.read().clone()
    }

    /// Re-reads the files, or renews the issued client certificate when
    /// due or when the plugin CA changed; returns whether the material
    /// changed. Files that do not load (e.g. a certificate replaced before
    /// its key) keep the current material.
    pub fn reload(&self) -> Result<bool, PluginTlsError> {
        let next = {
            let current = self.current.read();
            let generation = current.generation + 1;
            match (&self.source, &current.origin) {
                (PluginTlsSource::Files(files), Origin::Files(loaded)) => {
                    let contents = read_all(files)?;
                    if *loaded == contents {
                        return Ok(false);
                    }
                    material(files, contents, generation)?
                }
                (
                    PluginTlsSource::Signer(signer),
                    Origin::Issued {
                        generation: issued_by,
                        renew_at,
                    },
                ) => {
                    let changed = signer.reload().map_err(PluginTlsError::Signer)?;
                    if !changed && *issued_by == signer.generation() && Instant::now() < *renew_at {
                        return Ok(false);
                    }
                    issued(signer, generation)?
                }
                // Never: a material's origin is its source's.
                _ => fresh(&self.source, generation)?,
            }
        };
        let mut current = self.current.write();
        self.generation.store(next.generation, Ordering::Release);
        *current = Arc::new(next);
        Ok(true)
    }

    /// Reloads every `period` until `shutdown` turns true.
    pub async fn follow(self: Arc<Self>, period: Duration, shutdown: watch::Receiver<bool>) {
        reload_every(
            period,
            shutdown,
            || self.reload(),
            || self.log_renewed(),
            |e| tracing::error!(error = %e, "plugin TLS material changed but does not load; keeping the current one"),
        )
        .await;
    }

    /// Names the plugin CA when kplug is one: a rotation (docs/src/guides/certificates.md)
    /// goes on once every replica logs the step's CAs.
    fn log_renewed(&self) {
        let plugin_ca = match &self.source {
            PluginTlsSource::Files(_) => None,
            PluginTlsSource::Signer(signer) => Some(signer.names()),
        };
        tracing::info!(
            generation = self.generation(),
            plugin_ca = plugin_ca.as_ref().map(tracing::field::display),
            "plugin TLS material renewed: new connections to plugins use it"
        );
    }
}

/// The material `source` holds now.
fn fresh(source: &PluginTlsSource, generation: u64) -> Result<Material, PluginTlsError> {
    match source {
        PluginTlsSource::Files(files) => material(files, read_all(files)?, generation),
        PluginTlsSource::Signer(signer) => issued(signer, generation),
    }
}

/// A client certificate from `signer`, and its bundle as the plugin CAs.
fn issued(signer: &Signer, generation: u64) -> Result<Material, PluginTlsError> {
    let client = signer
        .issue_client(CLIENT_NAME)
        .map_err(PluginTlsError::Signer)?;
    Ok(Material {
        generation,
        origin: Origin::Issued {
            generation: signer.generation(),
            renew_at: Instant::now() + signer.lifetime() * 2 / 3,
        },
        identity: Identity::from_pem(client.cert, client.key),
        ca: Certificate::from_pem(signer.trust_bundle().pem.as_bytes()),
    })
}

fn read_all(files: &PluginTlsFiles) -> Result<[Vec<u8>; 3], PluginTlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| PluginTlsError::Read {
            path: path.to_owned(),
            source,
        })
    };
    Ok([
        read(&files.client_cert)?,
        read(&files.client_key)?,
        read(&files.ca)?,
    ])
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PluginTlsError> {
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PluginTlsError::Invalid {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(PluginTlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Checks what tonic would otherwise accept silently or only at the first
/// connection: a key that is not the certificate's, a CA that is no trust
/// anchor.
fn material(
    files: &PluginTlsFiles,
    contents: [Vec<u8>; 3],
    generation: u64,
) -> Result<Material, PluginTlsError> {
    let [cert_pem, key_pem, ca_pem] = &contents;
    let chain = certificates(&files.client_cert, cert_pem)?;
    let key = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| PluginTlsError::Invalid {
            path: files.client_key.clone(),
            detail: e.to_string(),
        })?
        .ok_or_else(|| PluginTlsError::NoKey {
            path: files.client_key.clone(),
        })?;
    CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider()).map_err(|e| {
        PluginTlsError::Mismatch {
            cert: files.client_cert.clone(),
            key: files.client_key.clone(),
            detail: e.to_string(),
        }
    })?;
    let mut roots = RootCertStore::empty();
    for anchor in certificates(&files.ca, ca_pem)? {
        roots.add(anchor).map_err(|e| PluginTlsError::Invalid {
            path: files.ca.clone(),
            detail: format!("unusable as a CA certificate: {e}"),
        })?;
    }
    Ok(Material {
        generation,
        identity: Identity::from_pem(cert_pem, key_pem),
        ca: Certificate::from_pem(ca_pem),
        origin: Origin::Files(contents),
    })
}

/// How the instance `target` is dialed: over TLS with `tls`, verifying its
/// certificate for `server_name` (empty: the host of its address); else
/// plaintext HTTP/2.
pub(super) fn endpoint(
    target: &Target,
    server_name: &str,
    tls: Option<&Material>,
    handshake_timeout: Duration,
) -> Result<Endpoint, ProxyError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let address = &target.address;
    let endpoint = Endpoint::from_shared(format!("{scheme}://{address}")).map_err(|e| {
        ProxyError::InvalidAddress {
            plugin: target.plugin.clone(),
            address: address.clone(),
            detail: e.to_string(),
        }
    })?;
    let Some(tls) = tls else {
        return Ok(endpoint);
    };
    let mut config = ClientTlsConfig::new()
        .ca_certificate(tls.ca.clone())
        .identity(tls.identity.clone())
        .timeout(handshake_timeout);
    if !server_name.is_empty() {
        config = config.domain_name(server_name);
    }
    endpoint.tls_config(config).map_err(|e| ProxyError::Tls {
        target: target.clone(),
        detail: format!("cannot verify server name {server_name:?}: {}", causes(&e)),
    })
}

/// A name as rustls presents it (`DnsName("a.b")`), as people write it.
fn subject_name(presented: &str) -> &str {
    let unwrap = |prefix: &str, suffix: &str| {
        presented
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
    };
    unwrap("DnsName(\"", "\")")
        .or_else(|| unwrap("IpAddress(", ")"))
        .unwrap_or(presented)
}

/// The TLS failure behind a failed call, worded for whoever fixes it; `None`
/// when the call failed for another reason.
pub(super) fn failure(status: &tonic::Status) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(error) = source {
        let rustls = error.downcast_ref::<rustls::Error>().or_else(|| {
            error
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls) = rustls {
            return Some(describe(rustls));
        }
        source = error.source();
    }
    // The plugin's refusal of kplug's certificate arrives after kplug's side
    // of a TLS 1.3 handshake is done, inside the HTTP/2 connection, whose
    // errors keep only the text of the I/O error (rustls's alert).
    let text = causes(status);
    let transport = matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    );
    (transport && text.contains("received fatal alert")).then(|| refused(&text))
}

fn describe(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext {
            expected,
            presented,
        }) => {
            let names: Vec<&str> = presented.iter().map(|n| subject_name(n)).collect();
            format!(
                "the certificate there is for {}, not {:?}: either another plugin answers at \
                 that address (reused by another pod, or a wrong --advertise), or this plugin's \
                 certificate does not name it",
                if names.is_empty() {
                    "no name".to_owned()
                } else {
                    names.join(", ")
                },
                expected.to_str()
            )
        }
        rustls::Error::InvalidCertificate(_) => format!(
            "kplug does not accept the plugin's serving certificate: {error} (it must be signed \
             by a CA in --plugin-ca-file, for the plugin's declared server name or else the \
             host of its address)"
        ),
        rustls::Error::AlertReceived(_) => refused(&error.to_string()),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => format!(
            "TLS handshake failed: {error} (does the plugin serve TLS? Its SDK needs \
             KPLUG_TLS_CERT_FILE, KPLUG_TLS_KEY_FILE and KPLUG_CLIENT_CA_FILE)"
        ),
        _ => format!("TLS handshake failed: {error}"),
    }
}

fn refused(detail: &str) -> String {
    format!(
        "the plugin refused kplug's client certificate: {detail} (the plugin's \
         KPLUG_CLIENT_CA_FILE must hold the CA that signed --plugin-client-cert-file)"
    )
}

/// `error` and its causes, each once, as "a: b: c".
pub(super) fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    let mut source = Some(error);
    while let Some(error) = source {
        let message = error.to_string();
        // Wrappers often repeat their cause's message word for word.
        if !message.is_empty() && !text.ends_with(&message) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&message);
        }
        source = error.source();
    }
    text
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
