//! What the cluster-dns tests share: the server as a child process, a DNS
//! client (hickory's, over UDP or TCP), and waiting for an answer.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hickory_net::client::{Client, ClientHandle};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::tcp::TcpClientStream;
use hickory_net::udp::UdpClientStream;
use hickory_proto::op::{DnsResponse, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use kplug_test_support::{Lines, Process};

/// How long one query waits for its answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// kplug-cluster-dns as a child process, killed on drop.
pub struct DnsServer {
    pub process: Process,
    pub stderr: Lines,
    /// The address of its first `--listen` (port 0 resolved).
    pub addr: SocketAddr,
}

impl DnsServer {
    /// Starts the server with `args` (its first `--listen` must be
    /// `127.0.0.1:0`) and waits for it to say where it listens. With
    /// `resolv_conf`, the server runs in a mount namespace of its own
    /// where that file is `/etc/resolv.conf` (what a forwarding server
    /// would send other names to).
    pub fn start(args: &[&str], resolv_conf: Option<&Path>) -> Self {
        let binary = env!("CARGO_BIN_EXE_kplug-cluster-dns");
        let mut command = match resolv_conf {
            None => Command::new(binary),
            Some(file) => {
                let mut command = Command::new("unshare");
                command
                    .args([
                        "--mount",
                        "sh",
                        "-c",
                        // exec: the server keeps the PID that is killed.
                        r#"mount --bind "$RESOLV_CONF" /etc/resolv.conf && exec "$@""#,
                        "sh",
                        binary,
                    ])
                    .env("RESOLV_CONF", file);
                command
            }
        };
        command
            .args(args)
            .env(
                "RUST_LOG",
                "info,kplug_cluster_dns=debug,hickory_server=warn",
            )
            .stdin(Stdio::null());
        let (process, stderr) = Process::spawn_with_stderr(&mut command, "kplug-cluster-dns");
        let line = stderr.wait_for(
            Duration::from_secs(30),
            "kplug-cluster-dns to listen",
            |l| l.contains("listening on 127.0.0.1:"),
        );
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        Self {
            process,
            stderr,
            addr,
        }
    }

    /// Sends SIGTERM and asserts a clean exit within five seconds; when not,
    /// panics with the exit status and the server's log.
    pub fn stop(mut self) {
        let clean = self.process.terminate(Duration::from_secs(5));
        let status = self.process.child.try_wait();
        assert!(
            clean,
            "kplug-cluster-dns did not exit cleanly on SIGTERM ({status:?}; killed when still \
             running after 5 s); its log: {:#?}",
            self.stderr.drain()
        );
    }

    /// Resident memory, from /proc.
    pub fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.process.pid()))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    /// UDP without EDNS: answers of more than 512 bytes are truncated.
    UdpNoEdns,
    Tcp,
}

/// One answer, reduced to what the tests look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub rcode: ResponseCode,
    /// The answer section, `TYPE DATA` each, sorted.
    pub answers: Vec<String>,
    /// The types in the authority section.
    pub authority: Vec<RecordType>,
    pub authoritative: bool,
    pub recursion_available: bool,
    pub truncated: bool,
}

impl Reply {
    fn from(response: &DnsResponse) -> Self {
        let mut answers: Vec<String> = response
            .answers
            .iter()
            .map(|r| format!("{} {}", r.record_type(), r.data))
            .collect();
        answers.sort();
        Self {
            rcode: response.metadata.response_code,
            answers,
            authority: response
                .authorities
                .iter()
                .map(|r| r.record_type())
                .collect(),
            authoritative: response.metadata.authoritative,
            recursion_available: response.metadata.recursion_available,
            truncated: response.metadata.truncation,
        }
    }
}

/// A DNS client of one server.
pub struct Dns {
    runtime: tokio::runtime::Runtime,
    pub server: SocketAddr,
}

impl Dns {
    pub fn new(server: SocketAddr) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime for the DNS client");
        Self { runtime, server }
    }

    /// Asks `name` (class IN) over `transport`; `Err` when no answer came.
    pub fn try_ask(
        &self,
        name: &str,
        qtype: RecordType,
        transport: Transport,
    ) -> Result<Reply, String> {
        let name = Name::from_ascii(name).map_err(|e| format!("{name:?}: {e}"))?;
        let server = self.server;
        self.runtime.block_on(async move {
            let provider = TokioRuntimeProvider::default();
            let mut client = match transport {
                Transport::Udp | Transport::UdpNoEdns => {
                    let stream = UdpClientStream::builder(server, provider)
                        .with_timeout(Some(QUERY_TIMEOUT))
                        .build();
                    let (client, background) = Client::<TokioRuntimeProvider>::from_sender(stream);
                    tokio::spawn(background);
                    client
                }
                Transport::Tcp => {
                    let (connect, handle) =
                        TcpClientStream::new(server, None, Some(QUERY_TIMEOUT), provider);
                    let stream = connect.await.map_err(|e| format!("connect: {e}"))?;
                    let (client, background) =
                        Client::<TokioRuntimeProvider>::with_timeout(stream, handle, QUERY_TIMEOUT);
                    tokio::spawn(background);
                    client
                }
            };
            if transport == Transport::UdpNoEdns {
                client.disable_edns();
            }
            let response = client
                .query(name, DNSClass::IN, qtype)
                .await
                .map_err(|e| format!("query: {e}"))?;
            Ok(Reply::from(&response))
        })
    }

    /// Asks over UDP; panics when no answer came.
    pub fn ask(&self, name: &str, qtype: RecordType) -> Reply {
        self.ask_over(name, qtype, Transport::Udp)
    }

    pub fn ask_over(&self, name: &str, qtype: RecordType, transport: Transport) -> Reply {
        self.try_ask(name, qtype, transport)
            .unwrap_or_else(|e| panic!("no answer from {} for {name} {qtype}: {e}", self.server))
    }

    /// Asks `name` over UDP until `want` holds of the reply, for at most
    /// `within`; returns how long that took. Panics with the last reply.
    pub fn wait_for(
        &self,
        name: &str,
        qtype: RecordType,
        within: Duration,
        want: impl Fn(&Reply) -> bool,
    ) -> Duration {
        let start = Instant::now();
        loop {
            let reply = self.try_ask(name, qtype, Transport::Udp);
            if reply.as_ref().is_ok_and(&want) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "{name} {qtype}: not the answer wanted within {within:?}; last: {reply:#?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `name` A (or AAAA) answers NOERROR with exactly these
    /// records (`TYPE DATA`, any order).
    pub fn wait_records(&self, name: &str, qtype: RecordType, want: &[&str]) -> Duration {
        let mut want: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
        want.sort();
        self.wait_for(name, qtype, Duration::from_secs(15), |r| {
            r.rcode == ResponseCode::NoError && r.answers == want
        })
    }

    /// Waits until `name` is NXDOMAIN.
    pub fn wait_nxdomain(&self, name: &str) -> Duration {
        self.wait_for(name, RecordType::A, Duration::from_secs(15), |r| {
            r.rcode == ResponseCode::NXDomain
        })
    }
}

/// A DNS server that never answers and counts what reaches it: the
/// "upstream" a forwarding server would send names outside its domain to.
pub struct Upstream {
    pub addr: SocketAddr,
    received: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Upstream {
    /// Listens on UDP and TCP at `addr`.
    pub fn start(addr: SocketAddr) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let received = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let udp = std::net::UdpSocket::bind(addr)
            .unwrap_or_else(|e| panic!("the fake upstream cannot bind udp {addr}: {e}"));
        udp.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("a read timeout");
        let tcp = std::net::TcpListener::bind(addr)
            .unwrap_or_else(|e| panic!("the fake upstream cannot bind tcp {addr}: {e}"));
        tcp.set_nonblocking(true).expect("a non-blocking listener");
        {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    if udp.recv_from(&mut buffer).is_ok() {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok(_) => {
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            });
        }
        Self {
            addr,
            received,
            stop,
        }
    }

    /// UDP datagrams and TCP connections received so far.
    pub fn received(&self) -> usize {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A loopback address of this test run's own, `127.<second>.x.y`, so that
/// port 53 on it is free even while another run (or the cluster) uses 53
/// elsewhere.
pub fn private_loopback(second: u8) -> std::net::IpAddr {
    let pid = std::process::id();
    let [_, _, x, y] = pid.to_be_bytes();
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, second, x, y.clamp(1, 254)))
}
