//! A stream that replays bytes already read from it.
//!
//! Detection and the ClientHello peek read the first bytes of a connection; the chosen handler
//! must still see them. [`Rewind`] holds those bytes in front of the inner stream, so the
//! handler reads the connection from its first byte with no extra relay task or copy loop.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// An IO stream with bytes to replay before the inner stream's own.
#[derive(Debug)]
pub struct Rewind<T> {
    prefix: Bytes,
    inner: T,
}

impl<T> Rewind<T> {
    /// Wraps a stream with nothing to replay.
    pub fn new(inner: T) -> Self {
        Self {
            prefix: Bytes::new(),
            inner,
        }
    }

    /// Puts `bytes` in front of whatever is still to be replayed.
    pub fn rewind(&mut self, bytes: Bytes) {
        if self.prefix.is_empty() {
            self.prefix = bytes;
        } else if !bytes.is_empty() {
            let mut joined = BytesMut::with_capacity(bytes.len() + self.prefix.len());
            joined.extend_from_slice(&bytes);
            joined.extend_from_slice(&self.prefix);
            self.prefix = joined.freeze();
        }
    }

    /// The bytes still to be replayed.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The inner stream (the replay buffer is lost; take it first with [`Rewind::into_parts`]).
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The bytes still to be replayed and the inner stream.
    pub fn into_parts(self) -> (Bytes, T) {
        (self.prefix, self.inner)
    }
}

impl<T: AsyncRead + Unpin> Rewind<T> {
    /// Reads more bytes into `buf` (from the replay buffer first), returning how many; 0 at EOF.
    /// Used by peeking code, which then [`rewind`](Rewind::rewind)s all it read.
    pub async fn read_more(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len();
            buf.extend_from_slice(&self.prefix);
            self.prefix = Bytes::new();
            return Ok(n);
        }
        buf.reserve(1024);
        self.inner.read_buf(buf).await
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn replays_then_reads_through() {
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(b"world").await.unwrap();
        drop(a);
        let mut r = Rewind::new(b);
        r.rewind(Bytes::from_static(b"lo "));
        r.rewind(Bytes::from_static(b"hel"));
        let mut out = String::new();
        r.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }
}
