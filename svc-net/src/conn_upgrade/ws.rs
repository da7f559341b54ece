//! A byte stream carried in WebSocket binary frames (RFC 6455), for the WebSocket form of the
//! connection upgrade.
//!
//! Each write becomes one binary frame (the client's masked, as the RFC requires); reads return
//! the payloads of data frames in order. Ping and pong frames are skipped; a close frame ends
//! the stream (EOF). Shutting down sends a close frame, then shuts the stream down.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest payload one write puts in a frame.
const MAX_FRAME: usize = 16 * 1024;
/// The largest frame header this side accepts before its payload (14 bytes is the RFC's most).
const MAX_HEADER: usize = 14;

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;

/// Which end of the WebSocket this side is: clients mask what they send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The dialing side (masks its frames).
    Client,
    /// The accepting side.
    Server,
}

#[derive(Debug)]
enum ReadState {
    /// Waiting for a frame header.
    Header,
    /// Inside a data frame's payload.
    Data {
        left: u64,
        mask: Option<[u8; 4]>,
        pos: usize,
    },
    /// Inside a control frame's payload, which is dropped.
    Skip { left: u64 },
    /// A close frame arrived.
    Closed,
}

/// A stream whose bytes travel in WebSocket binary frames.
#[derive(Debug)]
pub struct WsStream<S> {
    inner: S,
    role: Role,
    rbuf: BytesMut,
    read: ReadState,
    wbuf: BytesMut,
    close_sent: bool,
}

impl<S> WsStream<S> {
    /// Frames `inner` as `role`; the WebSocket handshake is already done.
    pub fn new(inner: S, role: Role) -> Self {
        Self {
            inner,
            role,
            rbuf: BytesMut::with_capacity(8 * 1024),
            read: ReadState::Header,
            wbuf: BytesMut::new(),
            close_sent: false,
        }
    }

    fn frame(&mut self, opcode: u8, payload: &[u8]) {
        self.wbuf.put_u8(0x80 | opcode);
        let masked = if self.role == Role::Client { 0x80 } else { 0 };
        match payload.len() {
            n @ 0..=125 => self.wbuf.put_u8(masked | n as u8),
            n @ 126..=0xffff => {
                self.wbuf.put_u8(masked | 126);
                self.wbuf.put_u16(n as u16);
            }
            n => {
                self.wbuf.put_u8(masked | 127);
                self.wbuf.put_u64(n as u64);
            }
        }
        if self.role == Role::Client {
            let key: [u8; 4] = rand::random();
            self.wbuf.put_slice(&key);
            self.wbuf
                .extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        } else {
            self.wbuf.put_slice(payload);
        }
    }
}

/// A parsed frame header.
#[derive(Debug, PartialEq, Eq)]
struct FrameHeader {
    /// The first byte: FIN and opcode.
    b0: u8,
    /// The payload length.
    len: u64,
    /// The masking key, for masked frames.
    mask: Option<[u8; 4]>,
    /// How many bytes the header took.
    at: usize,
}

/// Parses a frame header at the front of `buf`, or `None` when more bytes are needed.
fn parse_header(buf: &[u8]) -> io::Result<Option<FrameHeader>> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let (b0, b1) = (buf[0], buf[1]);
    if b0 & 0x70 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "WebSocket frame with reserved bits set (no extension was negotiated)",
        ));
    }
    let masked = b1 & 0x80 != 0;
    let (len, mut at) = match b1 & 0x7f {
        126 if buf.len() >= 4 => (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4),
        127 if buf.len() >= 10 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            (u64::from_be_bytes(b), 10)
        }
        126 | 127 => return Ok(None),
        n => (u64::from(n), 2),
    };
    let mask = if masked {
        if buf.len() < at + 4 {
            return Ok(None);
        }
        let mut m = [0u8; 4];
        m.copy_from_slice(&buf[at..at + 4]);
        at += 4;
        Some(m)
    } else {
        None
    };
    Ok(Some(FrameHeader { b0, len, mask, at }))
}

/// Reads more raw bytes from `inner` into `rbuf`; `Ok(0)` is EOF.
fn fill<S: AsyncRead + Unpin>(
    inner: &mut S,
    rbuf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    let mut chunk = [0u8; 8 * 1024];
    let mut rb = ReadBuf::new(&mut chunk);
    ready!(Pin::new(inner).poll_read(cx, &mut rb))?;
    let n = rb.filled().len();
    rbuf.extend_from_slice(rb.filled());
    Poll::Ready(Ok(n))
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.wbuf.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.wbuf))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.wbuf.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.read {
                ReadState::Closed => return Poll::Ready(Ok(())),
                ReadState::Header => {
                    let Some(FrameHeader { b0, len, mask, at }) = parse_header(&this.rbuf)? else {
                        if this.rbuf.len() >= MAX_HEADER {
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "malformed WebSocket frame header",
                            )));
                        }
                        if ready!(fill(&mut this.inner, &mut this.rbuf, cx))? == 0 {
                            // EOF between frames ends the stream.
                            return Poll::Ready(Ok(()));
                        }
                        continue;
                    };
                    this.rbuf.advance(at);
                    this.read = match b0 & 0x0f {
                        OP_CONTINUATION | OP_BINARY | OP_TEXT => ReadState::Data {
                            left: len,
                            mask,
                            pos: 0,
                        },
                        OP_CLOSE => ReadState::Closed,
                        _ => ReadState::Skip { left: len },
                    };
                }
                ReadState::Skip { left } => {
                    if *left == 0 {
                        this.read = ReadState::Header;
                        continue;
                    }
                    if this.rbuf.is_empty() && ready!(fill(&mut this.inner, &mut this.rbuf, cx))? == 0 {
                        return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                    }
                    let n = (*left).min(this.rbuf.len() as u64) as usize;
                    this.rbuf.advance(n);
                    *left -= n as u64;
                }
                ReadState::Data { left, mask, pos } => {
                    if *left == 0 {
                        this.read = ReadState::Header;
                        continue;
                    }
                    if out.remaining() == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    if this.rbuf.is_empty() && ready!(fill(&mut this.inner, &mut this.rbuf, cx))? == 0 {
                        return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                    }
                    let n = (*left).min(this.rbuf.len() as u64).min(out.remaining() as u64) as usize;
                    let mut chunk = this.rbuf.split_to(n);
                    if let Some(m) = mask {
                        for b in chunk.iter_mut() {
                            *b ^= m[*pos % 4];
                            *pos += 1;
                        }
                    }
                    *left -= n as u64;
                    out.put_slice(&chunk);
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(MAX_FRAME);
        this.frame(OP_BINARY, &buf[..n]);
        // The frame is ours now; push what the stream takes without waiting for the rest.
        if let Poll::Ready(Err(e)) = this.drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        if !this.close_sent {
            this.close_sent = true;
            this.frame(OP_CLOSE, &[]);
            ready!(this.drain(cx))?;
        }
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_cross_in_both_directions_and_close_ends_the_stream() {
        let (a, b) = tokio::io::duplex(1024);
        let mut client = WsStream::new(a, Role::Client);
        let mut server = WsStream::new(b, Role::Server);
        let big: Vec<u8> = (0..70_000u32).map(|i| i as u8).collect();
        let writer = tokio::spawn(async move {
            client.write_all(b"hello").await.expect("client write");
            client.write_all(&big).await.expect("client write big");
            client.shutdown().await.expect("client close");
            big
        });
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.expect("server read");
        let big = writer.await.expect("writer");
        assert_eq!(&got[..5], b"hello");
        assert_eq!(&got[5..], &big[..]);
    }

    #[test]
    fn reserved_bits_are_refused() {
        assert!(parse_header(&[0xc2, 0x00]).is_err());
        assert_eq!(parse_header(&[0x82]).expect("short header"), None);
        let header = parse_header(&[0x82, 0xfe, 0x01, 0x00, 1, 2, 3, 4])
            .expect("header")
            .expect("complete");
        assert_eq!(
            header,
            FrameHeader {
                b0: 0x82,
                len: 256,
                mask: Some([1, 2, 3, 4]),
                at: 8
            }
        );
    }
}
