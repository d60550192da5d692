//! Standalone mode's local state: certificates and a kubeconfig.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::pki::{CertificateAuthority, LEAF_VALIDITY, Pem, PkiError, write};

/// The admin user kubectl authenticates as. `system:masters` keeps the
/// kubeconfig meaningful against a real cluster's conventions too.
const ADMIN_USER: &str = "kplug-admin";
const ADMIN_GROUP: &str = "system:masters";

/// Everything standalone mode needs to serve and to be reached by kubectl.
pub struct LocalState {
    pub ca_pem: String,
    pub serving: Pem,
    pub kubeconfig: PathBuf,
}

/// Loads or makes the CA in `dir`, issues a serving certificate for
/// `listen` and an admin client certificate, and writes `dir/kubeconfig`.
pub fn prepare(dir: &Path, listen: SocketAddr) -> Result<LocalState, PkiError> {
    private_dir(dir).map_err(|source| PkiError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let ca = CertificateAuthority::load_or_generate(dir, "kplug-standalone-ca")?;
    let mut ips = vec![
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ];
    if !listen.ip().is_unspecified() && !ips.contains(&listen.ip()) {
        ips.push(listen.ip());
    }
    let serving = ca.issue_serving(&["localhost".to_owned()], &ips, LEAF_VALIDITY)?;
    let admin = ca.issue_client(ADMIN_USER, &[ADMIN_GROUP])?;
    let kubeconfig = dir.join("kubeconfig");
    write(
        &kubeconfig,
        &kubeconfig_yaml(&server_url(listen), ca.cert_pem(), &admin),
        true,
    )?;
    Ok(LocalState {
        ca_pem: ca.cert_pem().to_owned(),
        serving,
        kubeconfig,
    })
}

/// Creates `dir` (and missing parents) for the owner only: it holds the
/// CA key and the admin's credentials. An existing directory is left as
/// it is; the secrets in it are owner-only anyway.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// The URL kubectl should use for an address kplug listens on.
pub fn server_url(listen: SocketAddr) -> String {
    let host = match listen.ip() {
        ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
        IpAddr::V6(ip) => format!("[{ip}]"),
        IpAddr::V4(ip) => ip.to_string(),
    };
    format!("https://{host}:{}", listen.port())
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, admin: &Pem) -> String {
    let b64 = |pem: &str| STANDARD.encode(pem);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kplug
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {ADMIN_USER}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: kplug
  context:
    cluster: kplug
    user: {ADMIN_USER}
current-context: kplug
",
        ca = b64(ca_pem),
        cert = b64(&admin.cert),
        key = b64(&admin.key),
    )
}
