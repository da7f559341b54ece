//! The read buffer between a tunnel's TCP stream and TLS ([`IdleReadBuffer`]), and the TLS
//! stream above it that lets go of rustls' receive buffers when idle ([`IdleTls`]).

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A read buffer of `capacity` bytes that exists only while bytes flow: like
/// `tokio::io::BufReader` (one `recv` fills up to `capacity` and rustls' small reads copy out
/// of memory), but when the buffer is empty and the stream has nothing more to read, the
/// buffer is freed; the next read allocates it again (uninitialised, no zeroing).
///
/// An idle reverse tunnel therefore holds no read buffer: with `BufReader` each one held
/// 64 KiB for its whole life (the proxy's resident memory per idle tunnel fell from about 98 to
/// 81 KiB without it; docs/performance.md, "Scale").
pub(crate) struct IdleReadBuffer<R> {
    inner: R,
    buf: BytesMut,
    capacity: usize,
}

impl<R> IdleReadBuffer<R> {
    /// Wraps `inner`, reading up to `capacity` bytes at a time.
    pub(crate) fn new(capacity: usize, inner: R) -> Self {
        Self {
            inner,
            buf: BytesMut::new(),
            capacity,
        }
    }

    /// Like [`IdleReadBuffer::new`], with `prefix` (bytes already read from `inner`, such as a
    /// peeked TLS ClientHello) served first. The prefix's memory is let go of once it has been
    /// read and the stream is idle, like the buffer's: a replay buffer that stays referenced
    /// (an advanced `Bytes` keeps its whole allocation) would cost every idle tunnel its size.
    pub(crate) fn with_prefix(capacity: usize, prefix: Bytes, inner: R) -> Self {
        Self {
            inner,
            buf: BytesMut::from(prefix),
            capacity,
        }
    }

    /// Whether a buffer is allocated (for tests).
    #[cfg(test)]
    fn holds_buffer(&self) -> bool {
        self.buf.capacity() > 0
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for IdleReadBuffer<R> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, dst: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            // A read at least as large as the buffer gains nothing from it.
            if dst.remaining() >= this.capacity {
                this.buf = BytesMut::new();
                return Pin::new(&mut this.inner).poll_read(cx, dst);
            }
            if this.buf.capacity() < this.capacity {
                this.buf.reserve(this.capacity);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.buf) {
                Poll::Pending => {
                    // Nothing buffered and nothing to read: the connection is idle.
                    this.buf = BytesMut::new();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    this.buf = BytesMut::new();
                    return Poll::Ready(Err(e));
                }
                // End of stream: nothing is copied, the caller sees it as a read of 0 bytes.
                Poll::Ready(Ok(0)) => {
                    this.buf = BytesMut::new();
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(_)) => {}
            }
        }
        let n = dst.remaining().min(this.buf.len());
        dst.put_slice(&this.buf[..n]);
        this.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<R: AsyncWrite + Unpin> AsyncWrite for IdleReadBuffer<R> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A server-side TLS stream that gives back rustls' receive buffers whenever a read finds
/// nothing more to read (the connection is idle, or between bursts): rustls keeps the buffer it
/// reads records into (4 KiB) and its handshake reassembly room (0.6 KiB) for the connection's
/// whole life, used or not, which an idle tunnel does not need. Buffers that hold part of a
/// record are kept. The next read allocates again: one 4 KiB allocation per wake-up with data,
/// not per record.
///
/// `release_unused_buffers` is a change to the vendored rustls (`third_party/rustls`).
pub(crate) struct IdleTls<IO>(tokio_rustls::server::TlsStream<IO>);

impl<IO> IdleTls<IO> {
    /// Wraps an established server-side TLS stream.
    pub(crate) fn new(tls: tokio_rustls::server::TlsStream<IO>) -> Self {
        Self(tls)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for IdleTls<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.0).poll_read(cx, buf);
        if polled.is_pending() {
            this.0.get_mut().1.release_unused_buffers();
        }
        polled
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for IdleTls<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn small_reads_are_served_from_one_fill_and_the_buffer_goes_when_idle() {
        let (mut far, near) = tokio::io::duplex(1 << 20);
        let mut r = IdleReadBuffer::new(64 * 1024, near);
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        far.write_all(&data).await.unwrap();
        let mut got = Vec::new();
        let mut small = [0u8; 100];
        while got.len() < data.len() {
            let n = r.read(&mut small).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got, data, "bytes arrive in order and complete");
        // Everything was consumed: the next read finds nothing and frees the buffer.
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), r.read(&mut small)).await;
        assert!(pending.is_err(), "no data: the read waits");
        assert!(!r.holds_buffer(), "an idle reader holds no buffer");
        // A large read bypasses the buffer; end of stream reads as 0.
        far.write_all(&data).await.unwrap();
        drop(far);
        let mut big = vec![0u8; 128 * 1024];
        let mut total = 0;
        loop {
            let n = r.read(&mut big).await.unwrap();
            if n == 0 {
                break;
            }
            total += n;
        }
        assert_eq!(total, data.len());
        assert!(!r.holds_buffer());
    }

    #[tokio::test]
    async fn a_prefix_is_read_first_and_let_go_of_when_idle() {
        let (mut far, near) = tokio::io::duplex(1024);
        let mut peeked = BytesMut::with_capacity(2048);
        peeked.extend_from_slice(b"hello ");
        let mut r = IdleReadBuffer::with_prefix(64 * 1024, peeked.freeze(), near);
        assert!(r.holds_buffer(), "the prefix is held until read");
        far.write_all(b"world").await.unwrap();
        let mut got = Vec::new();
        let mut small = [0u8; 4];
        while got.len() < 11 {
            let n = r.read(&mut small).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got, b"hello world", "the prefix, then the stream");
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), r.read(&mut small)).await;
        assert!(pending.is_err(), "no data: the read waits");
        assert!(!r.holds_buffer(), "neither prefix nor buffer is held when idle");
    }

    /// A TLS server stream (wrapped in [`IdleTls`]) and its client over an in-memory pipe; the
    /// client's raw side is returned as well, to send partial records.
    async fn tls_pair() -> (
        IdleTls<tokio::io::DuplexStream>,
        tokio_rustls::client::TlsStream<tokio::io::DuplexStream>,
    ) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["tunnel.test".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der().clone();
        let server = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![der.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let (a, b) = tokio::io::duplex(1 << 20);
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server));
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client));
        let name = rustls::pki_types::ServerName::try_from("tunnel.test").unwrap();
        let (s, c) = tokio::join!(acceptor.accept(a), connector.connect(name, b));
        (IdleTls::new(s.unwrap()), c.unwrap())
    }

    #[tokio::test]
    async fn idle_tls_reads_every_byte_across_idle_periods_and_split_records() {
        let (mut server, mut client) = tls_pair().await;
        let mut buf = vec![0u8; 100_000];
        for round in 0..5u8 {
            // Idle: the read waits, and the receive buffers are given back meanwhile.
            let waiting =
                tokio::time::timeout(std::time::Duration::from_millis(20), server.read(&mut buf)).await;
            assert!(waiting.is_err(), "round {round}: no data, the read waits");
            // A burst larger than rustls' 4 KiB reads and its records, then small writes.
            let data: Vec<u8> = (0..70_000u32).map(|i| (i as u8).wrapping_add(round)).collect();
            client.write_all(&data).await.unwrap();
            client.write_all(b"tail").await.unwrap();
            client.flush().await.unwrap();
            let mut got = Vec::new();
            while got.len() < data.len() + 4 {
                let n = server.read(&mut buf).await.unwrap();
                assert!(n > 0, "round {round}: the stream ended early");
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(
                &got[..data.len()],
                &data[..],
                "round {round}: the burst arrives whole and in order"
            );
            assert_eq!(&got[data.len()..], b"tail");
        }
        // A record that arrives in two pieces, with the read waiting in between: the buffer
        // holding the first piece is kept.
        let (mut server, client) = tls_pair().await;
        let (mut raw, mut conn) = client.into_inner();
        std::io::Write::write_all(&mut conn.writer(), b"split record").unwrap();
        let mut record = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut record).unwrap();
        }
        let half = record.len() / 2;
        raw.write_all(&record[..half]).await.unwrap();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), server.read(&mut buf)).await;
        assert!(waiting.is_err(), "half a record: the read waits");
        raw.write_all(&record[half..]).await.unwrap();
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"split record");
    }

    #[tokio::test]
    async fn writes_pass_through() {
        let (mut far, near) = tokio::io::duplex(1024);
        let mut r = IdleReadBuffer::new(64 * 1024, near);
        r.write_all(b"hello").await.unwrap();
        r.flush().await.unwrap();
        let mut got = [0u8; 5];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
    }
}
