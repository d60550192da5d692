//! A client connection that sends what one poll of its HTTP/2 connection
//! task wrote in one system call.
//!
//! h2 flushes its connection after every DATA frame, and a frame is at most
//! 16 KiB with kubectl's and most clients' settings: a 10,000-plugin list
//! took about 900 `writev` calls of one TLS record each (BENCHMARKS.md).
//! Once HTTP/2 is agreed, [`Corked`] keeps what is written and turns a
//! flush of a full frame's worth or more into a promise: the task is woken
//! at once, and the next time it reads the connection everything written
//! since goes out together. h2's connection task reads on every poll, so
//! no byte waits for more data, only for the end of the poll that wrote it.
//!
//! A flush of less than that is sent at once. h2 flushes once a poll when
//! it has written every frame it had, so a short hold is the end of what
//! this poll had to send (a small answer, the last piece of a long one,
//! control frames), and nothing would join it. Waking the task instead
//! would cost every small answer a turn of the scheduler: Tokio takes a
//! task that wakes itself for a yield and wakes a parked worker to take it
//! over (BENCHMARKS.md, "Hop by hop").
//!
//! HTTP/1.1, whose dispatcher may wait on a response body without reading,
//! is never corked.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Past this many bytes held, a write sends them before taking more.
const HELD_LIMIT: usize = 64 * 1024;
/// A flush with less than this held sends it at once: less than one full
/// DATA frame (16 KiB of payload, HTTP/2's default and kubectl's, and its
/// 9-byte header) sealed in a TLS 1.3 record (22 bytes more).
const SEND_AT_ONCE_BELOW: usize = 16 * 1024 + 9 + 22;
/// The hold's one allocation: the limit and one more write, which is one
/// TLS record (at most 16 KiB and its overhead). One size for every hold,
/// so the allocator reuses the same block, and it is freed once sent, so an
/// idle connection holds none.
const HOLD_CAPACITY: usize = HELD_LIMIT + 32 * 1024;

pub struct Corked<S> {
    io: S,
    corking: bool,
    held: Vec<u8>,
    /// How much of `held` is sent already.
    sent: usize,
}

impl<S> Corked<S> {
    /// Passes everything through until [`Corked::cork`].
    pub fn new(io: S) -> Self {
        Self {
            io,
            corking: false,
            held: Vec::new(),
            sent: 0,
        }
    }

    /// From now on, flushes wait for the next read (see the module's text).
    pub fn cork(&mut self) {
        self.corking = true;
    }
}

impl<S: AsyncWrite + Unpin> Corked<S> {
    /// Sends everything held; `Pending` until the socket took it all.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.sent = 0;
        self.held = Vec::new();
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Corked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // The promise of the last flush. A socket that cannot take it all
        // now wakes this task when it can; reading goes on meanwhile.
        if let Poll::Ready(Err(e)) = self.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Corked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    // rustls hands over its pending records as a vector: passed through in
    // one call before the cork, held after it.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if !self.corking || self.held.len() >= HELD_LIMIT {
            ready!(self.poll_send(cx))?;
        }
        if !self.corking {
            return Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        }
        if self.held.capacity() == 0 {
            self.held.reserve_exact(HOLD_CAPACITY);
        }
        // Whole slices while they fit the block, at least one: below the
        // limit, one more record always fits.
        let mut taken = 0;
        for buf in bufs {
            if taken > 0 && self.held.len() + buf.len() > HOLD_CAPACITY {
                break;
            }
            self.held.extend_from_slice(buf);
            taken += buf.len();
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        self.corking || self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.corking {
            ready!(self.poll_send(cx))?;
            return Pin::new(&mut self.io).poll_flush(cx);
        }
        if self.held.len() < SEND_AT_ONCE_BELOW {
            ready!(self.poll_send(cx))?;
            return Pin::new(&mut self.io).poll_flush(cx);
        }
        cx.waker().wake_by_ref();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    const PATIENCE: Duration = Duration::from_secs(10);

    /// A connected pair over loopback: ours wrapped, the peer's bare.
    async fn pair() -> (Corked<TcpStream>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (ours, peer) = tokio::join!(TcpStream::connect(address), listener.accept());
        let ours = ours.expect("connect");
        ours.set_nodelay(true).expect("nodelay");
        (Corked::new(ours), peer.expect("accept").0)
    }

    /// Reads exactly `len` bytes from the peer.
    async fn receive(peer: &mut TcpStream, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        tokio::time::timeout(PATIENCE, peer.read_exact(&mut out))
            .await
            .expect("in time")
            .expect("read");
        out
    }

    /// Over loopback a sent byte is in the peer's queue when the send
    /// returns: nothing there means nothing was sent.
    fn nothing_waiting(peer: &TcpStream) -> bool {
        let mut byte = [0; 1];
        matches!(peer.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    #[tokio::test]
    async fn uncorked_writes_and_flushes_pass_through() {
        let (mut ours, mut peer) = pair().await;
        ours.write_all(b"handshake").await.expect("write");
        ours.flush().await.expect("flush");
        assert_eq!(receive(&mut peer, 9).await, b"handshake");
    }

    #[tokio::test]
    async fn corked_flushes_of_a_frame_or_more_wait_for_the_next_read() {
        let (mut ours, mut peer) = pair().await;
        ours.cork();
        let frame = vec![b'f'; SEND_AT_ONCE_BELOW];
        for _ in 0..2 {
            ours.write_all(&frame).await.expect("write");
            ours.flush().await.expect("flush");
        }
        ours.write_all(b"tail").await.expect("write");
        ours.flush().await.expect("flush");
        assert!(
            nothing_waiting(&peer),
            "flushes of full frames send nothing"
        );
        peer.write_all(b"ping").await.expect("peer writes");
        let mut ping = [0; 4];
        ours.read_exact(&mut ping).await.expect("read");
        assert_eq!(&ping, b"ping");
        let sent = receive(&mut peer, 2 * SEND_AT_ONCE_BELOW + 4).await;
        assert!(
            sent.ends_with(b"tail") && sent[..2 * SEND_AT_ONCE_BELOW].iter().all(|b| *b == b'f')
        );
    }

    #[tokio::test]
    async fn a_corked_flush_of_less_than_a_frame_sends_at_once() {
        let (mut ours, mut peer) = pair().await;
        ours.cork();
        for frame in [&b"one,"[..], b"two,"] {
            ours.write_all(frame).await.expect("write");
        }
        assert!(nothing_waiting(&peer), "writes alone send nothing");
        ours.flush().await.expect("flush");
        assert_eq!(receive(&mut peer, 8).await, b"one,two,");
    }

    #[tokio::test]
    async fn a_full_hold_is_sent_before_more_and_shutdown_sends_the_rest() {
        let (mut ours, mut peer) = pair().await;
        ours.cork();
        let reader = tokio::spawn(async move {
            let early = receive(&mut peer, HELD_LIMIT).await;
            (early, peer)
        });
        ours.write_all(&vec![b'x'; HELD_LIMIT])
            .await
            .expect("write");
        ours.write_all(b"tail").await.expect("write past the limit");
        let (early, mut peer) = reader.await.expect("reader");
        assert!(early.iter().all(|b| *b == b'x'));
        assert!(nothing_waiting(&peer), "the tail is held");
        ours.shutdown().await.expect("shutdown");
        let mut rest = Vec::new();
        tokio::time::timeout(PATIENCE, peer.read_to_end(&mut rest))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(rest, b"tail");
    }
}
