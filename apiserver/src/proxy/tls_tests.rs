//! The proxy against in-process plugins that serve TLS and require a client
//! certificate, as the SDKs do.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use jiff::Timestamp;
use kplug_proto::trace::TraceParent;
use kplug_proto::v1alpha1::ReconcileRequest;
use tonic::transport::ServerTlsConfig;

use super::*;
use crate::proxy::testing::{Answer, HOLD, Served, declaration, serve_plugin};
use crate::proxy::{Answered, Proxy, ProxyConfig, Route};
use crate::registry::{Declaration, Registry, RegistryConfig};
use crate::server::pki::{CertificateAuthority, Pem};
use crate::v1alpha1::{Operation, Plugin};

/// The name the test plugins' serving certificates are for.
const SERVER_NAME: &str = "plugin.test";

fn ca(name: &str) -> CertificateAuthority {
    CertificateAuthority::generate(name).expect("CA")
}

fn serving(ca: &CertificateAuthority) -> Pem {
    let ips = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
    ca.issue_serving(&[SERVER_NAME.to_owned()], &ips, time::Duration::days(1))
        .expect("serving certificate")
}

/// Serves a test plugin on loopback with `cert`, accepting clients whose
/// certificate `client_ca` signed; calls whose operation id is [`HOLD`]
/// wait for `release`.
async fn serve(cert: &Pem, client_ca: &CertificateAuthority) -> Served {
    let tls = ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(&cert.cert, &cert.key))
        .client_ca_root(tonic::transport::Certificate::from_pem(
            client_ca.cert_pem(),
        ));
    serve_plugin(Answer::Success, Some(tls)).await
}

/// kplug's files: a client certificate of `ca`, trusting `plugin_ca`.
fn write_files(dir: &Path, client: &Pem, plugin_ca: &CertificateAuthority) -> PluginTlsFiles {
    let files = PluginTlsFiles {
        client_cert: dir.join("client.crt"),
        client_key: dir.join("client.key"),
        ca: dir.join("ca.crt"),
    };
    std::fs::write(&files.client_key, &client.key).expect("write key");
    std::fs::write(&files.client_cert, &client.cert).expect("write cert");
    std::fs::write(&files.ca, plugin_ca.cert_pem()).expect("write CA");
    files
}

fn registered(registry: &Registry, name: &str, address: &str, server_name: &str) -> Arc<Plugin> {
    let declaration = Declaration {
        server_name: server_name.to_owned(),
        ..declaration(name, "", address)
    };
    registry
        .heartbeat(declaration, Timestamp::now())
        .expect("registered");
    registry.get(name).expect("plugin")
}

async fn call(proxy: &Proxy, plugin: &Plugin, id: &str) -> Result<Answered, ProxyError> {
    let request = ReconcileRequest {
        operation_id: id.to_owned(),
        ..ReconcileRequest::default()
    };
    proxy
        .call(
            plugin,
            Operation::Reconcile,
            request,
            Duration::from_secs(10),
            &TraceParent::new_root(),
            Route::default(),
        )
        .await
}

/// DER of the first certificate in `pem`.
fn der(pem: &str) -> Vec<u8> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .next()
        .expect("a certificate")
        .expect("PEM")
        .to_vec()
}

#[test]
fn files_that_do_not_go_together_never_replace_loaded_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = ca("plugin-ca");
    let first = ca.issue_client("kplug", &[]).expect("client");
    let files = write_files(dir.path(), &first, &ca);
    let tls = PluginTls::load(PluginTlsSource::Files(files.clone())).expect("load");
    assert_eq!(tls.generation(), 1);
    assert!(!tls.reload().expect("re-read"), "nothing changed");

    // A new certificate before its key: refused, the old pair stays.
    let second = ca.issue_client("kplug", &[]).expect("client");
    std::fs::write(&files.client_cert, &second.cert).expect("write");
    let error = tls.reload().expect_err("mismatched pair");
    assert!(matches!(error, PluginTlsError::Mismatch { .. }), "{error}");
    assert_eq!(tls.generation(), 1);
    std::fs::write(&files.client_key, &second.key).expect("write");
    assert!(tls.reload().expect("reload"), "the whole pair loads");
    assert_eq!(tls.generation(), 2);

    std::fs::write(&files.ca, "no PEM here").expect("write");
    let error = tls.reload().expect_err("no CA");
    assert!(
        matches!(error, PluginTlsError::NoCertificate { .. }),
        "{error}"
    );
    std::fs::remove_file(&files.client_key).expect("remove");
    let Err(error) = PluginTls::load(PluginTlsSource::Files(files)) else {
        panic!("loaded without a key file");
    };
    assert!(matches!(error, PluginTlsError::Read { .. }), "{error}");
}

#[tokio::test]
async fn rotation_replaces_the_channel_and_calls_in_flight_finish_on_the_old_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = ca("plugin-ca");
    let mut plugin = serve(&serving(&ca), &ca).await;
    let old = ca.issue_client("kplug", &[]).expect("client");
    let tls = Arc::new(
        PluginTls::load(PluginTlsSource::Files(write_files(dir.path(), &old, &ca))).expect("load"),
    );
    let proxy = Arc::new(Proxy::new(ProxyConfig::default()).with_tls(Some(tls.clone())));
    let registry = Registry::new(RegistryConfig::default());
    let target = registered(&registry, "hello", &plugin.address, SERVER_NAME);

    let held = tokio::spawn({
        let (proxy, target) = (proxy.clone(), target.clone());
        async move { call(&proxy, &target, HOLD).await }
    });
    let seen = plugin.seen.recv().await.expect("the held call arrives");
    assert!(
        seen == der(&old.cert),
        "kplug presents its client certificate"
    );

    let new = ca.issue_client("kplug", &[]).expect("client");
    write_files(dir.path(), &new, &ca);
    assert!(tls.reload().expect("reload"), "new files, new generation");
    let answer = call(&proxy, &target, "after")
        .await
        .expect("a call after rotation");
    assert!(answer.response.success);
    let seen = plugin.seen.recv().await.expect("the new call arrives");
    assert!(
        seen == der(&new.cert),
        "a new connection, with the new certificate"
    );
    assert_eq!(proxy.channels(), 1, "the channel was replaced, not added");

    plugin.release.notify_one();
    let answer = held
        .await
        .expect("the held call's task")
        .expect("the held call finishes on the old channel");
    assert!(answer.response.success);
}

#[tokio::test]
async fn tls_failures_are_typed_and_say_what_to_fix() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, other) = (ca("plugin-ca"), ca("other-ca"));
    let plugin = serve(&serving(&ca), &ca).await;
    let client = ca.issue_client("kplug", &[]).expect("client");
    let tls = PluginTls::load(PluginTlsSource::Files(write_files(
        dir.path(),
        &client,
        &ca,
    )))
    .expect("load");
    let proxy = Proxy::new(ProxyConfig::default()).with_tls(Some(Arc::new(tls)));
    let registry = Registry::new(RegistryConfig::default());

    let named = registered(&registry, "named", &plugin.address, SERVER_NAME);
    call(&proxy, &named, "ok").await.expect("the declared name");
    // No name: the address's host, an IP address the certificate lists.
    let by_ip = registered(&registry, "by-ip", &plugin.address, "");
    call(&proxy, &by_ip, "ok")
        .await
        .expect("the address's host");

    let wrong = registered(&registry, "wrong", &plugin.address, "other.test");
    let error = call(&proxy, &wrong, "x").await.expect_err("another name");
    assert!(
        matches!(&error, ProxyError::Tls { detail, .. } if detail.contains("the certificate there is for plugin.test, 127.0.0.1, not \"other.test\"")),
        "{error}"
    );

    let stranger = serve(&serving(&other), &ca).await;
    let untrusted = registered(&registry, "untrusted", &stranger.address, SERVER_NAME);
    let error = call(&proxy, &untrusted, "x").await.expect_err("unknown CA");
    assert!(
        matches!(&error, ProxyError::Tls { detail, .. }
            if detail.contains("UnknownIssuer") && detail.contains("--plugin-ca-file")),
        "{error}"
    );

    // With TLS 1.3 kplug learns of the plugin's refusal from an alert after
    // its side of the handshake; a plugin that closes the connection first
    // leaves only "connection closed" (Unavailable). Some attempt reads it.
    let picky = serve(&serving(&ca), &other).await;
    let refusing = registered(&registry, "refusing", &picky.address, SERVER_NAME);
    let mut refused = None;
    for _ in 0..50 {
        match call(&proxy, &refusing, "x").await {
            Ok(_) => panic!("a plugin that trusts another CA answered kplug"),
            Err(ProxyError::Tls { detail, .. }) => {
                refused = Some(detail);
                break;
            }
            Err(ProxyError::Unavailable { .. }) => {}
            Err(other) => panic!("{other}"),
        }
    }
    let detail = refused.expect("the refusal named as one");
    assert!(
        detail.contains("refused kplug's client certificate"),
        "{detail}"
    );
}
