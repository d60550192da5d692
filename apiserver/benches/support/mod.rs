//! What the bench binaries share beyond `kplug-test-support` (which runs
//! the processes): the standalone server as measured, the admin HTTPS
//! client, CPU and memory accounting from `/proc`, latency statistics and
//! the Markdown helpers of the reports.
//!
//! Each bench compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kplug_test_support::StandaloneKplug;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

/// Upper bounds, so that a wedged server fails the run instead of hanging it.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Linux reports process CPU time in ticks of this many per second (USER_HZ).
const TICKS_PER_SECOND: u64 = 100;

// ---------------------------------------------------------------------------
// The server

/// `kplug-apiserver standalone` (from `kplug-test-support`, killed when
/// dropped) as the benches measure it: its addresses, CPU and memory.
pub struct Server {
    pub kplug: StandaloneKplug,
    pub api: SocketAddr,
    pub grpc: SocketAddr,
}

impl Server {
    /// Starts the server on 127.0.0.1 with a fresh state directory and
    /// `flags`, logging at `info` only (the tests' debug logging would be
    /// measured too), and waits for its serving banner.
    pub fn start(flags: &[&str]) -> Self {
        let kplug = StandaloneKplug::start_with(&[&["--log", "info"], flags].concat());
        let (api, grpc) = (kplug.api_address(), kplug.grpc_address());
        eprintln!(
            "started kplug-apiserver (pid {}): api {api}, grpc {grpc}",
            kplug.pid()
        );
        Self { kplug, api, grpc }
    }

    pub fn pid(&self) -> u32 {
        self.kplug.pid()
    }

    /// Resident memory now, in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid(), "VmRSS")
    }

    /// Peak resident memory so far, in KiB.
    pub fn peak_rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid(), "VmHWM")
    }

    pub fn cpu_time(&self) -> Result<Duration> {
        process_cpu_time(self.pid())
    }
}

pub fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in {path}"))
}

// ---------------------------------------------------------------------------
// CPU time

/// Sums `fields` of a `/proc/.../stat` file, in ticks; field 0 is the one
/// after the parenthesized command name (field 3, state, in proc(5)).
fn stat_ticks(stat_path: &str, fields: RangeInclusive<usize>) -> Result<u64> {
    let stat =
        std::fs::read_to_string(stat_path).with_context(|| format!("reading {stat_path}"))?;
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let values: Vec<&str> = after_name.split_whitespace().collect();
    fields
        .map(|index| {
            values
                .get(index)
                .and_then(|value| value.parse::<u64>().ok())
        })
        .sum::<Option<u64>>()
        .with_context(|| format!("malformed {stat_path}"))
}

fn ticks(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
}

/// User plus system CPU time of all threads of a process (utime, stime).
fn cpu_time(stat_path: &str) -> Result<Duration> {
    stat_ticks(stat_path, 11..=12).map(ticks)
}

/// CPU time of the process `pid`.
pub fn process_cpu_time(pid: u32) -> Result<Duration> {
    cpu_time(&format!("/proc/{pid}/stat"))
}

pub fn own_cpu_time() -> Result<Duration> {
    cpu_time("/proc/self/stat")
}

/// CPU time of the whole machine, to tell how much other work shared it.
pub struct CpuUsage {
    at: Instant,
    /// Busy time of all CPUs (everything but idle and iowait).
    machine_busy: Duration,
    /// This bench plus its servers, which are children it has waited for.
    own: Duration,
}

impl CpuUsage {
    pub fn now() -> Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        // cpu user nice system idle iowait irq softirq steal ...
        let totals: Vec<u64> = stat
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("cpu "))
            .context("no cpu line in /proc/stat")?
            .split_whitespace()
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .context("malformed /proc/stat")?;
        ensure!(totals.len() == 8, "malformed /proc/stat");
        let busy = totals[0] + totals[1] + totals[2] + totals[5] + totals[6] + totals[7];
        Ok(Self {
            at: Instant::now(),
            machine_busy: ticks(busy),
            // utime, stime, cutime, cstime
            own: ticks(stat_ticks("/proc/self/stat", 11..=14)?),
        })
    }

    /// CPU time other processes used since `before`, and the CPU time there was.
    pub fn others_since(&self, before: &Self) -> OtherLoad {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let busy = self.machine_busy.saturating_sub(before.machine_busy);
        let own = self.own.saturating_sub(before.own);
        OtherLoad {
            used: busy.saturating_sub(own),
            available: (self.at - before.at) * u32::try_from(cpus).unwrap_or(1),
        }
    }
}

/// Competition from other processes during the run.
pub struct OtherLoad {
    pub used: Duration,
    pub available: Duration,
}

// ---------------------------------------------------------------------------
// Tasks

pub async fn join_all<T: 'static>(mut tasks: JoinSet<Result<T>>) -> Result<Vec<T>> {
    let mut results = Vec::with_capacity(tasks.len());
    while let Some(joined) = tasks.join_next().await {
        results.push(joined.context("a load task panicked")??);
    }
    Ok(results)
}

// ---------------------------------------------------------------------------
// The API over HTTPS

/// One HTTP/2 connection over TLS to the API, as the admin user. Clones
/// share the connection (one more stream each).
#[derive(Clone)]
pub struct ApiClient {
    sender: SendRequest<Full<Bytes>>,
    base: String,
    /// Headers added to every request (e.g. front-proxy identity headers).
    default_headers: http::HeaderMap,
}

impl ApiClient {
    pub async fn connect(server: &Server) -> Result<Self> {
        Self::connect_with(
            server.api,
            ServerName::IpAddress(server.api.ip().into()),
            admin_tls_config(&server.kplug)?,
            http::HeaderMap::new(),
        )
        .await
    }

    /// One HTTP/2 connection over TLS to `address`, verified as `name`, with
    /// the identity in `config` (whose ALPN must offer h2), sending
    /// `default_headers` with every request.
    pub async fn connect_with(
        address: SocketAddr,
        name: ServerName<'static>,
        config: rustls::ClientConfig,
        default_headers: http::HeaderMap,
    ) -> Result<Self> {
        let tls = TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(address)
            .await
            .with_context(|| format!("connecting to {address}"))?;
        tcp.set_nodelay(true)?;
        let stream = tls
            .connect(name, tcp)
            .await
            .context("TLS handshake with the API")?;
        ensure!(
            stream.get_ref().1.alpn_protocol() == Some(b"h2"),
            "the API did not negotiate HTTP/2"
        );
        // Flow-control windows as Go's HTTP/2 transport (kubectl's) uses.
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(1 << 30)
            .handshake(TokioIo::new(stream))
            .await
            .context("HTTP/2 handshake with the API")?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("API connection ended: {e}");
            }
        });
        Ok(Self {
            sender,
            base: format!("https://{address}"),
            default_headers,
        })
    }

    /// GETs `path` and returns the whole body of a 200 response.
    pub async fn get(&mut self, path: &str, accept: &str) -> Result<Bytes> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.get_untimed(path, accept))
            .await
            .with_context(|| format!("GET {path} took longer than {REQUEST_TIMEOUT:?}"))?
    }

    async fn get_untimed(&mut self, path: &str, accept: &str) -> Result<Bytes> {
        let request = http::Request::get(format!("{}{path}", self.base))
            .header(http::header::ACCEPT, accept)
            // An empty Full is at its end: HEADERS with END_STREAM, no DATA.
            .body(Full::new(Bytes::new()))
            .context("building the request")?;
        let (status, body) = self.send(request, "GET", path).await?;
        if !status.is_success() {
            bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }

    /// POSTs a JSON `body` to `path` and returns the status and whole body
    /// of the response, whatever the status.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: Bytes,
    ) -> Result<(http::StatusCode, Bytes)> {
        let request = http::Request::post(format!("{}{path}", self.base))
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .context("building the request")?;
        tokio::time::timeout(REQUEST_TIMEOUT, self.send(request, "POST", path))
            .await
            .with_context(|| format!("POST {path} took longer than {REQUEST_TIMEOUT:?}"))?
    }

    async fn send(
        &mut self,
        mut request: http::Request<Full<Bytes>>,
        method: &str,
        path: &str,
    ) -> Result<(http::StatusCode, Bytes)> {
        for (name, value) in &self.default_headers {
            request.headers_mut().insert(name, value.clone());
        }
        self.sender
            .ready()
            .await
            .context("the API connection closed")?;
        let response = self
            .sender
            .send_request(request)
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .with_context(|| format!("reading the body of {method} {path}"))?
            .to_bytes();
        Ok((status, body))
    }
}

/// rustls client config trusting the server's CA and presenting the admin
/// certificate from the kubeconfig that standalone mode wrote.
fn admin_tls_config(kplug: &StandaloneKplug) -> Result<rustls::ClientConfig> {
    let ca_path = kplug.state.path().join("ca.crt");
    let ca = std::fs::read(&ca_path).with_context(|| format!("reading {}", ca_path.display()))?;
    let (cert, key) = kplug.admin_pem();
    tls_config(&ca, &cert, &key)
}

/// rustls client config (ALPN h2) trusting the CA in `ca_pem` and
/// presenting the client certificate `cert_pem` with the key `key_pem`.
pub fn tls_config(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(cert.context("parsing the CA certificate")?)?;
    }
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<_, _>>()
        .context("parsing the client certificate")?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .context("parsing the client key")?
        .context("no private key in the client key PEM")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .context("the client certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

// ---------------------------------------------------------------------------
// Statistics and the report

/// Latency samples, sorted.
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Self(samples)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Nearest-rank percentile, `p` in 0..=100.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (p / 100.0 * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }
}

pub fn millis(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}

/// Whole microseconds, with thousands separators: "12,345 µs".
pub fn micros(duration: Duration) -> String {
    format!(
        "{} µs",
        thousands(duration.as_secs_f64().mul_add(1e6, 0.5) as usize)
    )
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

pub fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.2} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// 12345 → "12,345".
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

/// The "Machine" section: CPU, memory, kernel, competition from other
/// processes, the binaries measured (`(role, path)`) and the command.
pub fn print_machine(binaries: &[(&str, &Path)], command: &str, others: &OtherLoad) -> Result<()> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").context("reading /proc/cpuinfo")?;
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
        .map_or("unknown", |(_, model)| model.trim());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .context("reading the kernel release")?;
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = proc_meminfo_kib("MemTotal")?;
    println!("## Machine\n");
    println!("- CPU: {model}, {cpus} CPUs (`nproc`), shared by the server and the load generator");
    println!("- Memory: {}", mib(memory));
    println!("- Kernel: Linux {}", kernel.trim());
    println!(
        "- Other processes used {:.1} of the {:.1} CPU-seconds there were during the run ({:.0} %)",
        others.used.as_secs_f64(),
        others.available.as_secs_f64(),
        100.0 * others.used.as_secs_f64() / others.available.as_secs_f64().max(f64::EPSILON),
    );
    for (role, binary) in binaries {
        println!("- {role}: `{}` (release build)", binary.display());
    }
    println!("- Command: `{command}`");
    println!();
    Ok(())
}

fn proc_meminfo_kib(field: &str) -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in /proc/meminfo"))
}
