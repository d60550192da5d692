//! The serving certificate, reloaded from its files when they change so
//! that rotation needs no restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

use super::tls::TlsError;

/// Where the certificate comes from.
#[derive(Debug)]
enum Source {
    /// Generated in memory (standalone mode).
    Fixed,
    /// PEM files, checked for changes.
    Files { cert: PathBuf, key: PathBuf },
}

/// The certificate every handshake presents.
#[derive(Debug)]
pub struct ServingCert {
    source: Source,
    current: RwLock<(Arc<CertifiedKey>, Vec<u8>)>,
}

fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let certs: Vec<CertificateDer<'static>> =
        rustls_pemfile::certs(&mut &cert_pem[..]).collect::<Result<_, _>>()?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key: PrivateKeyDer<'static> =
        rustls_pemfile::private_key(&mut &key_pem[..])?.ok_or(TlsError::NoKey)?;
    let provider = rustls::crypto::ring::default_provider();
    Ok(CertifiedKey::from_der(certs, key, &provider)?)
}

impl ServingCert {
    /// A certificate that never changes.
    pub fn fixed(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let key = certified_key(cert_pem.as_bytes(), key_pem.as_bytes())?;
        Ok(Self {
            source: Source::Fixed,
            current: RwLock::new((Arc::new(key), Vec::new())),
        })
    }

    /// A certificate read from `cert` and `key`, PEM.
    pub fn from_files(cert: PathBuf, key: PathBuf) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = (std::fs::read(&cert)?, std::fs::read(&key)?);
        let certified = certified_key(&cert_pem, &key_pem)?;
        Ok(Self {
            current: RwLock::new((Arc::new(certified), [cert_pem, key_pem].concat())),
            source: Source::Files { cert, key },
        })
    }

    /// Re-reads the files; returns whether the certificate changed. A pair
    /// that does not load keeps the current certificate.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let Source::Files { cert, key } = &self.source else {
            return Ok(false);
        };
        let (cert_pem, key_pem) = (std::fs::read(cert)?, std::fs::read(key)?);
        let contents = [cert_pem.as_slice(), key_pem.as_slice()].concat();
        if self.current.read().1 == contents {
            return Ok(false);
        }
        let certified = certified_key(&cert_pem, &key_pem)?;
        *self.current.write() = (Arc::new(certified), contents);
        Ok(true)
    }

    /// Reloads every `period` until `shutdown` turns true.
    pub async fn follow(self: Arc<Self>, period: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(period);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => match self.reload() {
                    Ok(true) => tracing::info!("serving certificate reloaded"),
                    Ok(false) => {}
                    Err(e) => tracing::error!(error = %e, "serving certificate files changed but do not load; keeping the current certificate"),
                },
                _ = shutdown.changed() => return,
            }
        }
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().0.clone())
    }
}
