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
    pub async fn follow(self: Arc<Self>, period: Duration, shutdown: watch::Receiver<bool>) {
        reload_every(
            period,
            shutdown,
            || self.reload(),
            || tracing::info!("serving certificate reloaded"),
            |e| tracing::error!(error = %e, "serving certificate files changed but do not load; keeping the current certificate"),
        )
        .await;
    }
}

/// Calls `reload` every `period` until `shutdown` turns true; tells
/// `reloaded` when it changed something and `failed` when it did not load.
pub(crate) async fn reload_every<E>(
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
    reload: impl Fn() -> Result<bool, E>,
    reloaded: impl Fn(),
    failed: impl Fn(E),
) {
    let mut ticker = tokio::time::interval(period);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => match reload() {
                Ok(true) => reloaded(),
                Ok(false) => {}
                Err(e) => failed(e),
            },
            _ = shutdown.changed() => return,
        }
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::pki::CertificateAuthority;

    #[tokio::test]
    async fn follow_loads_changed_files_until_shutdown() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let ca = CertificateAuthority::generate("test-ca").expect("CA");
        let issue = || {
            ca.issue_serving(&["localhost".to_owned()], &[], time::Duration::days(1))
                .expect("serving certificate")
        };
        let first = issue();
        std::fs::write(&cert, &first.cert).expect("write cert");
        std::fs::write(&key, &first.key).expect("write key");
        let serving = Arc::new(ServingCert::from_files(cert.clone(), key.clone()).expect("load"));
        let (stop, stopped) = watch::channel(false);
        let follow = tokio::spawn(serving.clone().follow(Duration::from_millis(10), stopped));

        let second = issue();
        std::fs::write(&cert, &second.cert).expect("write cert");
        std::fs::write(&key, &second.key).expect("write key");
        let expected = [second.cert.as_bytes(), second.key.as_bytes()].concat();
        tokio::time::timeout(Duration::from_secs(5), async {
            while serving.current.read().1 != expected {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the new pair was loaded");

        stop.send(true).expect("stop");
        tokio::time::timeout(Duration::from_secs(5), follow)
            .await
            .expect("follow ended at shutdown")
            .expect("the follow task");
    }
}
