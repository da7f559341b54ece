//! The stream handed to the caller after the proxy's `200`: the bytes the proxy sent after its
//! reply head come first, then the raw connection.
//!
//! A proxy may send the first tunnel bytes (an SSH banner, a TLS ServerHello) in the same segment
//! as its reply. Those bytes were read with the head; [`Tunneled`] yields them before reading the
//! connection again. No copy task, no extra buffer once they are drained: reads and writes go
//! straight to the inner stream.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use hyper_util::client::legacy::connect::{Connected, Connection};
use pin_project::pin_project;

/// A stream preceded by bytes already read from it.
///
/// Implements tokio's `AsyncRead`/`AsyncWrite` when the inner stream does, and hyper's
/// `rt::Read`/`rt::Write` (plus hyper-util's `Connection`) when the inner stream does.
#[pin_project]
#[derive(Debug)]
pub struct Tunneled<S> {
    #[pin]
    inner: S,
    leftover: Bytes,
}

impl<S> Tunneled<S> {
    /// `inner`, with `leftover` to be read first.
    pub fn new(inner: S, leftover: Bytes) -> Self {
        Self { inner, leftover }
    }

    /// The bytes not yet handed out.
    pub fn leftover(&self) -> &[u8] {
        &self.leftover
    }

    /// The inner stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner stream, mutably. Reading from it directly skips the leftover bytes.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner stream and the bytes not yet handed out.
    pub fn into_parts(self) -> (S, Bytes) {
        (self.inner, self.leftover)
    }
}

impl<S: tokio::io::AsyncRead> tokio::io::AsyncRead for Tunneled<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if !this.leftover.is_empty() {
            let n = this.leftover.len().min(buf.remaining());
            buf.put_slice(&this.leftover[..n]);
            this.leftover.advance(n);
            return Poll::Ready(Ok(()));
        }
        this.inner.poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite> tokio::io::AsyncWrite for Tunneled<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

impl<S: hyper::rt::Read> hyper::rt::Read for Tunneled<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if !this.leftover.is_empty() {
            let n = this.leftover.len().min(buf.remaining());
            buf.put_slice(&this.leftover[..n]);
            this.leftover.advance(n);
            return Poll::Ready(Ok(()));
        }
        this.inner.poll_read(cx, buf)
    }
}

impl<S: hyper::rt::Write> hyper::rt::Write for Tunneled<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

impl<S: Connection> Connection for Tunneled<S> {
    fn connected(&self) -> Connected {
        // The tunnel reaches the target itself, so hyper must send origin-form requests: this is
        // not a forward proxy connection (`Connected::proxy(false)`, the default).
        self.inner.connected()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn leftover_first_then_stream() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut t = Tunneled::new(a, Bytes::from_static(b"early "));
        b.write_all(b"later").await.unwrap();
        drop(b);
        let mut out = Vec::new();
        t.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"early later");
    }

    #[tokio::test]
    async fn small_reads_drain_leftover_in_pieces() {
        let (a, _b) = tokio::io::duplex(64);
        let mut t = Tunneled::new(a, Bytes::from_static(b"abcdef"));
        let mut two = [0u8; 2];
        t.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"ab");
        assert_eq!(t.leftover(), b"cdef");
    }
}
