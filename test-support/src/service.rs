//! A stand-in for a Kubernetes Service in front of kplug's replicas: the
//! test machine has no kube-proxy. Each new connection goes to the first
//! backend that accepts it, as kube-proxy stops sending to a pod once its
//! endpoint is gone; bytes are copied both ways untouched (TLS included),
//! and a connection ends when either side ends it.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

/// How long a backend may take to accept before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A TCP forwarder on `127.0.0.1:port`; stops accepting on drop.
pub struct Service {
    pub port: u16,
    stopped: Arc<AtomicBool>,
}

impl Service {
    /// Forwards to `backends`, in order of preference.
    pub fn new(backends: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the Service's port");
        let port = listener
            .local_addr()
            .expect("the Service's local address")
            .port();
        let stopped = Arc::new(AtomicBool::new(false));
        let accepting = stopped.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let backends = backends.clone();
                thread::spawn(move || forward(client, &backends));
            }
        });
        Self { port, stopped }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn forward(client: TcpStream, backends: &[SocketAddr]) {
    let Some(backend) = backends
        .iter()
        .find_map(|address| TcpStream::connect_timeout(address, CONNECT_TIMEOUT).ok())
    else {
        // No endpoint: the client sees the connection refused-like close.
        return;
    };
    let (Ok(client_reader), Ok(backend_reader)) = (client.try_clone(), backend.try_clone()) else {
        return;
    };
    let upstream = thread::spawn(move || pipe(client_reader, backend));
    pipe(backend_reader, client);
    let _ = upstream.join();
}

/// Copies until `from` ends, then ends `to` both ways, so the other
/// direction's copy ends too.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
