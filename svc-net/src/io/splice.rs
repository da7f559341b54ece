//! A bidirectional copy that holds no buffer while the connection is idle.
//!
//! [`tokio::io::copy_bidirectional`] gives each direction a heap buffer for the connection's
//! whole life: 16 KiB per spliced connection even when nothing moves. For long-lived, mostly
//! idle links (an agent's Auth API link through the proxy stays open for days and carries a
//! heartbeat every 30 s) that is most of what the link costs. [`splice`] reads into a buffer
//! on the poll's own stack frame, writes straight from it, and moves bytes to the heap only
//! when the writer cannot take them at once; that heap copy is freed as soon as it is written.
//! At idle both directions hold nothing.

use std::{
    future::poll_fn,
    io,
    mem::MaybeUninit,
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most read from one side per poll.
const CHUNK: usize = 8 * 1024;

/// Copies bytes both ways between `a` and `b` until both directions have ended, like
/// [`tokio::io::copy_bidirectional`]: the end of one side's input shuts down the other side's
/// output, and the first error ends the splice. Returns the bytes copied from `a` to `b` and
/// from `b` to `a`.
///
/// Unlike it, a direction holds a buffer only while bytes it read wait for the writer.
pub async fn splice<A, B>(a: &mut A, b: &mut B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut a_to_b = Direction::default();
    let mut b_to_a = Direction::default();
    poll_fn(|cx| {
        let ab = a_to_b.poll(cx, a, b)?;
        let ba = b_to_a.poll(cx, b, a)?;
        let (Poll::Ready(ab), Poll::Ready(ba)) = (ab, ba) else {
            return Poll::Pending;
        };
        Poll::Ready(Ok((ab, ba)))
    })
    .await
}

/// One direction's state: bytes read but not yet written, and how far it got.
#[derive(Default)]
struct Direction {
    /// Bytes the writer did not take when they were read; `None` when all are written.
    pending: Option<Box<[u8]>>,
    /// How many bytes of `pending` are written.
    written: usize,
    /// Bytes written since the last flush.
    unflushed: bool,
    /// The reader reached its end.
    read_done: bool,
    /// The writer is shut down: this direction is over.
    done: bool,
    /// Bytes copied.
    amount: u64,
}

impl Direction {
    fn poll<R, W>(&mut self, cx: &mut Context<'_>, reader: &mut R, writer: &mut W) -> Poll<io::Result<u64>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(self.amount));
        }
        loop {
            // Whatever waits from an earlier read goes first.
            if let Some(pending) = &self.pending {
                while self.written < pending.len() {
                    let n = ready!(Pin::new(&mut *writer).poll_write(cx, &pending[self.written..]))?;
                    if n == 0 {
                        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                    }
                    self.written += n;
                    self.amount += n as u64;
                }
                self.pending = None;
                self.written = 0;
            }
            if self.read_done {
                if self.unflushed {
                    ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                    self.unflushed = false;
                }
                ready!(Pin::new(&mut *writer).poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(self.amount));
            }
            let mut chunk = [MaybeUninit::<u8>::uninit(); CHUNK];
            let mut buf = ReadBuf::uninit(&mut chunk);
            match Pin::new(&mut *reader).poll_read(cx, &mut buf) {
                Poll::Pending => {
                    // Nothing more to read now: push out what was written before waiting.
                    if self.unflushed {
                        ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                        self.unflushed = false;
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let read = buf.filled();
            if read.is_empty() {
                self.read_done = true;
                continue;
            }
            self.unflushed = true;
            let taken = match Pin::new(&mut *writer).poll_write(cx, read) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => 0,
            };
            self.amount += taken as u64;
            if taken < read.len() {
                // The writer is full: keep the rest (and only the rest) until it drains.
                self.pending = Some(read[taken..].into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    /// Sends `data` on `stream` and shuts its writing half while reading everything the other
    /// side sends until its end; returns what was read.
    async fn exchange(mut stream: tokio::io::DuplexStream, data: Vec<u8>) -> Vec<u8> {
        let (mut r, mut w) = tokio::io::split(&mut stream);
        let send = async {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let ((), n) = tokio::join!(send, r.read_to_end(&mut got));
        n.unwrap();
        got
    }

    /// Bytes in both directions arrive whole and in order, through pipes small enough that
    /// the writer is often full (the heap path), and each side's end reaches the other.
    #[tokio::test]
    async fn copies_both_ways_through_full_writers_and_passes_the_end_on() {
        let (client, mut near) = duplex(300);
        let (mut far, server) = duplex(300);
        let relay = tokio::spawn(async move { splice(&mut near, &mut far).await });

        let up: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = (0..150_000u32).map(|i| (i % 241) as u8).collect();
        let (up2, down2) = (up.clone(), down.clone());
        let client_side = tokio::spawn(exchange(client, up2));
        let server_side = tokio::spawn(exchange(server, down2));
        let deadline = std::time::Duration::from_secs(20);
        let got_down = tokio::time::timeout(deadline, client_side)
            .await
            .unwrap()
            .unwrap();
        let got_up = tokio::time::timeout(deadline, server_side)
            .await
            .unwrap()
            .unwrap();
        let (ab, ba) = tokio::time::timeout(deadline, relay)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(got_up, up);
        assert_eq!(got_down, down);
        assert_eq!((ab, ba), (up.len() as u64, down.len() as u64));
    }

    /// A stream whose reads fail.
    struct Failing;

    impl AsyncRead for Failing {
        fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()))
        }
    }

    impl AsyncWrite for Failing {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A side whose read fails ends the splice with that error, while the other side is idle.
    #[tokio::test]
    async fn an_error_ends_the_splice() {
        let (_client, mut near) = duplex(64);
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), splice(&mut near, &mut Failing))
            .await
            .unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::ConnectionReset);
    }
}
