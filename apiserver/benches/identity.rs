//! What plugin identities cost kplug, in process (no network, no token
//! review: the part the identity adds, alone), timed on the one thread of a
//! current-thread runtime, where the work is all CPU:
//!
//! 1. an unchanged heartbeat that carries no certificate request (the
//!    steady state: the plugin holds its certificate and bundle), through
//!    the heartbeat service with kplug's plugin CA, beside the same service
//!    without one, in alternating rounds of the same run: the ratio is the
//!    result;
//! 2. a renewal: a heartbeat that carries a request, which kplug checks and
//!    signs (ECDSA P-256), in the same run, as a multiple of (1).
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to
//! stderr. Run with `cargo bench -p kplug-apiserver --bench identity`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kplug_apiserver::heartbeat::HeartbeatService;
use kplug_apiserver::identity::{Signer, SigningFiles, identity};
use kplug_apiserver::registry::{Registry, RegistryConfig};
use kplug_proto::v1alpha1::HeartbeatRequest;
use kplug_proto::v1alpha1::registry_server::Registry as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use ring::digest::{SHA256, digest};

#[path = "support/mod.rs"]
mod support;

use support::heartbeats;

const PLUGINS: usize = 1_000;
/// Passes over every plugin per round: enough heartbeats per round for a
/// clock read to be noise.
const PASSES: usize = 20;
const ROUNDS: usize = 9;
const RENEWALS: usize = 500;

/// The median of `values`.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A heartbeat service over a fresh registry holding [`PLUGINS`] plugins.
async fn service(signer: Option<Arc<Signer>>) -> Result<HeartbeatService> {
    let registry = Arc::new(Registry::new(RegistryConfig {
        max_interval: Duration::from_secs(300),
        status_refresh: Duration::from_secs(300),
        ..RegistryConfig::default()
    }));
    let service = HeartbeatService::new(registry, None).with_signer(signer);
    for index in 0..PLUGINS {
        let reply = service
            .heartbeat(tonic::Request::new(request(index, Vec::new(), Vec::new())))
            .await
            .context("registering")?;
        ensure!(reply.get_ref().accepted, "{:?}", reply.get_ref());
    }
    Ok(service)
}

fn request(index: usize, csr: Vec<u8>, bundle_sha256: Vec<u8>) -> HeartbeatRequest {
    HeartbeatRequest {
        certificate_request: csr,
        trust_bundle_sha256: bundle_sha256,
        ..heartbeats::declaration(index, Some(Duration::from_secs(300)))
    }
}

/// Time per unchanged heartbeat (µs) over [`PASSES`] passes of every plugin.
async fn round(service: &HeartbeatService, bundle_sha256: &[u8]) -> Result<f64> {
    let requests: Vec<_> = (0..PASSES * PLUGINS)
        .map(|index| request(index % PLUGINS, Vec::new(), bundle_sha256.to_vec()))
        .collect();
    let started = Instant::now();
    for message in requests {
        let reply = service.heartbeat(tonic::Request::new(message)).await?;
        ensure!(
            reply.get_ref().trust_bundle.is_empty(),
            "the bundle was sent again"
        );
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / (PASSES * PLUGINS) as f64)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "bench-plugin-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate()?;
    let ca = params.self_signed(&key)?.pem();
    let files = SigningFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        trust_bundle: dir.path().join("ca.crt"),
    };
    std::fs::write(&files.cert, &ca)?;
    std::fs::write(&files.key, key.serialize_pem())?;
    std::fs::write(&files.trust_bundle, &ca)?;
    let signer = Arc::new(Signer::load(files, Duration::from_secs(6 * 3600))?);
    let bundle_sha256 = digest(&SHA256, ca.as_bytes()).as_ref().to_vec();

    eprintln!("registering {PLUGINS} plugins on each service");
    let with = service(Some(signer.clone())).await?;
    let without = service(None).await?;
    let (mut with_us, mut without_us) = (Vec::new(), Vec::new());
    for round_index in 0..ROUNDS {
        // Alternate which goes first, so a drift of the machine hits both.
        if round_index % 2 == 0 {
            with_us.push(round(&with, &bundle_sha256).await?);
            without_us.push(round(&without, &[]).await?);
        } else {
            without_us.push(round(&without, &[]).await?);
            with_us.push(round(&with, &bundle_sha256).await?);
        }
    }
    let (with_us, without_us) = (median(with_us), median(without_us));

    eprintln!("signing {RENEWALS} renewals");
    let plugin_key = KeyPair::generate()?;
    let name = heartbeats::plugin_name(0);
    let csr = CertificateParams::new(vec![identity(&name)])?
        .serialize_request(&plugin_key)?
        .der()
        .to_vec();
    let started = Instant::now();
    for _ in 0..RENEWALS {
        let reply = with
            .heartbeat(tonic::Request::new(request(
                0,
                csr.clone(),
                bundle_sha256.clone(),
            )))
            .await?;
        ensure!(
            !reply.get_ref().certificate_chain.is_empty(),
            "no certificate"
        );
    }
    let renewal_us = started.elapsed().as_secs_f64() * 1e6 / RENEWALS as f64;

    println!("| Measure | With kplug's plugin CA | Without | Ratio |");
    println!("|---|---|---|---|");
    println!(
        "| Time per unchanged heartbeat, no request due (median of {ROUNDS} rounds of {}) | {with_us:.2} µs | {without_us:.2} µs | {:.2} |",
        PASSES * PLUGINS,
        with_us / without_us
    );
    println!(
        "| Time per renewal (a heartbeat with a request, checked and signed; {RENEWALS} in a row) | {renewal_us:.0} µs | | {:.0}x an unchanged heartbeat |",
        renewal_us / without_us
    );
    let heartbeats_per_renewal = (6.0 * 3600.0 * 2.0 / 3.0) / 10.0;
    println!(
        "\nWith the defaults (6 h certificates renewed at 4 h, heartbeats every 10 s), a renewal comes once per {heartbeats_per_renewal:.0} heartbeats: {:.2} % more heartbeat work per plugin instance.",
        100.0 * renewal_us / (heartbeats_per_renewal * without_us)
    );
    Ok(())
}
