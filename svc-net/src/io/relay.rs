//! A bidirectional copy between a byte stream and an SSH channel that hands the channel its
//! data, and takes the channel's data, as [`Bytes`] without copying them.
//!
//! [`tokio::io::copy_bidirectional`] over a channel's `AsyncRead`/`AsyncWrite` copies every
//! payload once more in each direction: the channel's writer copies what it is given into a
//! message of its own, and its reader copies each message into the caller's buffer. [`relay`]
//! reads the stream into a buffer that the message then shares (no copy, no zeroing: the read
//! fills uninitialised memory), and writes the channel's messages to the stream from the
//! memory they arrived in (with russh's change 9, the SSH packet's own read buffer).

use std::{
    future::poll_fn,
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

/// The buffer a read from the stream may fill: as large as an SSH channel's largest packet
/// carries in a few messages, so a bulk transfer moves in few, large messages.
const CHUNK: usize = 64 * 1024;

/// What [`relay`] needs of a channel: its data received and sent as [`Bytes`], and the end of
/// its sending half.
pub trait ByteChannel: Unpin {
    /// The next data received, as it arrived; `None` at the end of the stream.
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>>;
    /// Sends a part of `buf` without copying it; returns how many bytes were sent. After
    /// `Pending`, called again with the same bytes.
    fn poll_send(&mut self, cx: &mut Context<'_>, buf: &Bytes) -> Poll<io::Result<usize>>;
    /// Ends the sending half (SSH `EOF`).
    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

#[cfg(feature = "tunnel")]
impl<S> ByteChannel for russh::ChannelStream<S>
where
    S: From<(russh::ChannelId, russh::ChannelMsg)> + Send + Sync + 'static,
{
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        self.poll_read_bytes(cx)
    }

    fn poll_send(&mut self, cx: &mut Context<'_>, buf: &Bytes) -> Poll<io::Result<usize>> {
        self.poll_write_bytes(cx, buf)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self).poll_shutdown(cx)
    }
}

/// Copies bytes both ways between `stream` and `channel` until both directions have ended,
/// like [`tokio::io::copy_bidirectional`]: the end of one side's input ends the other side's
/// output (a stream's shutdown, a channel's `EOF`), and the first error ends the relay.
/// Returns the bytes copied from `stream` to `channel` and from `channel` to `stream`.
pub async fn relay<S, C>(stream: &mut S, channel: &mut C) -> io::Result<(u64, u64)>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
    C: ByteChannel + ?Sized,
{
    let mut up = Up::default();
    let mut down = Down::default();
    poll_fn(|cx| {
        let u = up.poll(cx, stream, channel)?;
        let d = down.poll(cx, channel, stream)?;
        let (Poll::Ready(u), Poll::Ready(d)) = (u, d) else {
            return Poll::Pending;
        };
        Poll::Ready(Ok((u, d)))
    })
    .await
}

/// From the stream to the channel.
#[derive(Default)]
struct Up {
    /// Where reads land; each read's bytes are split off and sent as they are.
    buf: BytesMut,
    /// Bytes read, not yet all taken by the channel.
    pending: Bytes,
    read_done: bool,
    done: bool,
    amount: u64,
}

impl Up {
    fn poll<S, C>(&mut self, cx: &mut Context<'_>, stream: &mut S, channel: &mut C) -> Poll<io::Result<u64>>
    where
        S: AsyncRead + Unpin + ?Sized,
        C: ByteChannel + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(self.amount));
        }
        loop {
            while !self.pending.is_empty() {
                let n = ready!(channel.poll_send(cx, &self.pending))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.pending.advance(n);
                self.amount += n as u64;
            }
            if self.read_done {
                ready!(channel.poll_finish(cx))?;
                self.done = true;
                // Nothing more is read: the buffer's memory goes now, not with the relay.
                self.buf = BytesMut::new();
                return Poll::Ready(Ok(self.amount));
            }
            if self.buf.capacity() - self.buf.len() < CHUNK / 4 {
                self.buf.reserve(CHUNK);
            }
            let n = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut *stream),
                cx,
                &mut self.buf
            ))?;
            if n == 0 {
                self.read_done = true;
            } else {
                self.pending = self.buf.split().freeze();
            }
        }
    }
}

/// From the channel to the stream.
#[derive(Default)]
struct Down {
    /// A message's data, not yet all written.
    pending: Bytes,
    /// Bytes written since the last flush.
    unflushed: bool,
    read_done: bool,
    done: bool,
    amount: u64,
}

impl Down {
    fn poll<C, S>(&mut self, cx: &mut Context<'_>, channel: &mut C, stream: &mut S) -> Poll<io::Result<u64>>
    where
        C: ByteChannel + ?Sized,
        S: AsyncWrite + Unpin + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(self.amount));
        }
        loop {
            while !self.pending.is_empty() {
                let n = ready!(Pin::new(&mut *stream).poll_write(cx, &self.pending))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.pending.advance(n);
                self.amount += n as u64;
                self.unflushed = true;
            }
            if self.read_done {
                if self.unflushed {
                    ready!(Pin::new(&mut *stream).poll_flush(cx))?;
                    self.unflushed = false;
                }
                ready!(Pin::new(&mut *stream).poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(self.amount));
            }
            match channel.poll_recv(cx)? {
                Poll::Ready(Some(data)) => self.pending = data,
                Poll::Ready(None) => self.read_done = true,
                Poll::Pending => {
                    // Nothing more to read now: push out what was written before waiting.
                    if self.unflushed {
                        ready!(Pin::new(&mut *stream).poll_flush(cx))?;
                        self.unflushed = false;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    use super::*;

    /// A channel in memory: `incoming` is what it receives (then its end), `sent` what was
    /// sent on it; each write takes at most `packet` bytes and every other one waits once.
    #[derive(Default)]
    struct Memory {
        incoming: VecDeque<Bytes>,
        sent: Vec<Bytes>,
        eof_sent: bool,
        packet: usize,
        stall: bool,
    }

    impl ByteChannel for Memory {
        fn poll_recv(&mut self, _: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
            Poll::Ready(Ok(self.incoming.pop_front()))
        }

        fn poll_send(&mut self, cx: &mut Context<'_>, buf: &Bytes) -> Poll<io::Result<usize>> {
            assert!(!self.eof_sent, "data after EOF");
            self.stall = !self.stall;
            if self.stall {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = buf.len().min(self.packet);
            self.sent.push(buf.slice(..n));
            Poll::Ready(Ok(n))
        }

        fn poll_finish(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.eof_sent = true;
            Poll::Ready(Ok(()))
        }
    }

    /// Both directions arrive whole and in order through a small pipe (the stream is often
    /// full) and a channel that takes little per write; the channel's messages reach the
    /// stream as they are, each side's end reaches the other, and the counts are returned.
    #[tokio::test]
    async fn relays_both_ways_and_passes_each_end_on() {
        let down: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
        let up: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut channel = Memory {
            incoming: down.chunks(32 * 1024).map(Bytes::copy_from_slice).collect(),
            packet: 5_000,
            ..Memory::default()
        };
        let (mut near, mut far) = duplex(1_000);
        let up2 = up.clone();
        let peer = tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(&mut far);
            let send = async {
                w.write_all(&up2).await.unwrap();
                w.shutdown().await.unwrap();
            };
            let mut got = Vec::new();
            let ((), n) = tokio::join!(send, r.read_to_end(&mut got));
            n.unwrap();
            got
        });
        let deadline = std::time::Duration::from_secs(20);
        let counts = tokio::time::timeout(deadline, relay(&mut near, &mut channel))
            .await
            .expect("the relay ended before its deadline")
            .unwrap();
        drop(near);
        let got_down = tokio::time::timeout(deadline, peer).await.unwrap().unwrap();
        assert_eq!(got_down, down);
        let sent: Vec<u8> = channel.sent.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(sent, up);
        assert!(channel.sent.iter().all(|b| b.len() <= 5_000));
        assert!(channel.eof_sent);
        assert_eq!(counts, (up.len() as u64, down.len() as u64));
    }

    /// A stream whose reads fail ends the relay with that error.
    #[tokio::test]
    async fn a_failing_stream_ends_the_relay_with_its_error() {
        struct Failing;
        impl AsyncRead for Failing {
            fn poll_read(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                _: &mut tokio::io::ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
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
        let mut channel = Memory {
            packet: 10,
            ..Memory::default()
        };
        let err = relay(&mut Failing, &mut channel).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        assert!(channel.sent.is_empty());
    }
}
