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
use std::time::Duration;

use parking_lot::RwLock;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::ProxyError;
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
}

/// One loaded generation of the files.
pub(super) struct Material {
    pub(super) generation: u64,
    /// The files' bytes (cert, key, CA), to tell a change from a re-read.
    contents: [Vec<u8>; 3],
    identity: Identity,
    ca: Certificate,
}

/// kplug's TLS material for dialing plugins, reloaded from its files.
pub struct PluginTls {
    files: PluginTlsFiles,
    current: RwLock<Arc<Material>>,
    /// `current`'s generation, read on every call without the lock.
    generation: AtomicU64,
}

impl PluginTls {
    /// Reads and checks the files.
    pub fn load(files: PluginTlsFiles) -> Result<Self, PluginTlsError> {
        let contents = read_all(&files)?;
        let material = material(&files, contents, 1)?;
        Ok(Self {
            files,
            current: RwLock::new(Arc::new(material)),
            generation: AtomicU64::new(1),
        })
    }

    /// Loads `files` when given; without them calls to plugins are
    /// plaintext, which this logs loudly, as it is insecure.
    pub fn start(files: Option<PluginTlsFiles>) -> Result<Option<Arc<Self>>, PluginTlsError> {
        let Some(files) = files else {
            tracing::warn!(
                "calls to plugins are PLAINTEXT and unauthenticated: any pod that can reach a \
                 plugin's address can call it directly, bypassing RBAC on plugins/reconcile. \
                 Set --plugin-client-cert-file, --plugin-client-key-file and --plugin-ca-file \
                 (see deploy/README.md, \"Plugin TLS\")"
            );
            return Ok(None);
        };
        let tls = Self::load(files)?;
        tracing::info!(
            client_cert = %tls.files.client_cert.display(),
            ca = %tls.files.ca.display(),
            "calls to plugins use mutual TLS"
        );
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

    /// Re-reads the files; returns whether the material changed. Files
    /// that do not load (e.g. a certificate replaced before its key) keep
    /// the current material.
    pub fn reload(&self) -> Result<bool, PluginTlsError> {
        let contents = read_all(&self.files)?;
        if self.current.read().contents == contents {
            return Ok(false);
        }
        let mut current = self.current.write();
        let material = material(&self.files, contents, current.generation + 1)?;
        self.generation
            .store(material.generation, Ordering::Release);
        *current = Arc::new(material);
        Ok(true)
    }

    /// Reloads every `period` until `shutdown` turns true.
    pub async fn follow(self: Arc<Self>, period: Duration, shutdown: watch::Receiver<bool>) {
        reload_every(
            period,
            shutdown,
            || self.reload(),
            || tracing::info!(generation = self.generation(), "plugin TLS files reloaded: new connections to plugins use them"),
            |e| tracing::error!(error = %e, "plugin TLS files changed but do not load; keeping the current ones"),
        )
        .await;
    }
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
        contents,
    })
}

/// How the plugin `plugin` at `address` is dialed: over TLS with `tls`,
/// verifying its certificate for `server_name` (empty: the host of
/// `address`); else plaintext HTTP/2.
pub(super) fn endpoint(
    plugin: &str,
    address: &str,
    server_name: &str,
    tls: Option<&Material>,
    handshake_timeout: Duration,
) -> Result<Endpoint, ProxyError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{address}")).map_err(|e| {
        ProxyError::InvalidAddress {
            plugin: plugin.to_owned(),
            address: address.to_owned(),
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
        plugin: plugin.to_owned(),
        address: address.to_owned(),
        detail: format!("cannot verify server name {server_name:?}: {}", causes(&e)),
    })
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
