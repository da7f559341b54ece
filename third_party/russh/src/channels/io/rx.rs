use std::borrow::BorrowMut;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::AsyncRead;

use super::{ChannelMsg, ChannelReadHalf};

#[derive(Debug)]
pub struct ChannelRx<R> {
    channel: R,
    buffer: Option<(ChannelMsg, usize)>,

    ext: Option<u32>,
}

impl<R> ChannelRx<R> {
    pub fn new(channel: R, ext: Option<u32>) -> Self {
        Self {
            channel,
            buffer: None,
            ext,
        }
    }
}

impl<R> ChannelRx<R>
where
    R: BorrowMut<ChannelReadHalf> + Unpin,
{
    /// svc: the next data received (the rest of a message partly read, or the next message's
    /// data) as it arrived, without copying it; `None` at the end of the stream
    /// (SVC-PATCHES.md, change 10).
    pub fn poll_read_bytes(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<bytes::Bytes>>> {
        loop {
            let (msg, idx) = match self.buffer.take() {
                Some(msg) => msg,
                None => match ready!(self.channel.borrow_mut().receiver.poll_recv(cx)) {
                    Some(msg) => (msg, 0),
                    None => return Poll::Ready(Ok(None)),
                },
            };
            match (msg, self.ext) {
                (ChannelMsg::Data { data }, None) if idx < data.len() => {
                    return Poll::Ready(Ok(Some(data.slice(idx..))));
                }
                (ChannelMsg::ExtendedData { data, ext }, Some(target))
                    if ext == target && idx < data.len() =>
                {
                    return Poll::Ready(Ok(Some(data.slice(idx..))));
                }
                (ChannelMsg::Eof, _) => {
                    self.channel.borrow_mut().receiver.close();
                    return Poll::Ready(Ok(None));
                }
                // Empty data and other messages are skipped, as `poll_read` does.
                _ => {}
            }
        }
    }
}

impl<R> AsyncRead for ChannelRx<R>
where
    R: BorrowMut<ChannelReadHalf> + Unpin,
{
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let (msg, mut idx) = match self.buffer.take() {
            Some(msg) => msg,
            None => match ready!(self.channel.borrow_mut().receiver.poll_recv(cx)) {
                Some(msg) => (msg, 0),
                None => return Poll::Ready(Ok(())),
            },
        };

        match (&msg, self.ext) {
            (ChannelMsg::Data { data }, None) => {
                let readable = buf.remaining().min(data.len() - idx);

                // Clamped to maximum `buf.remaining()` and `data.len() - idx` with `.min`
                #[allow(clippy::indexing_slicing)]
                buf.put_slice(&data[idx..idx + readable]);
                idx += readable;

                if idx != data.len() {
                    self.buffer = Some((msg, idx));
                }

                Poll::Ready(Ok(()))
            }
            (ChannelMsg::ExtendedData { data, ext }, Some(target)) if *ext == target => {
                let readable = buf.remaining().min(data.len() - idx);

                // Clamped to maximum `buf.remaining()` and `data.len() - idx` with `.min`
                #[allow(clippy::indexing_slicing)]
                buf.put_slice(&data[idx..idx + readable]);
                idx += readable;

                if idx != data.len() {
                    self.buffer = Some((msg, idx));
                }

                Poll::Ready(Ok(()))
            }
            (ChannelMsg::Eof, _) => {
                self.channel.borrow_mut().receiver.close();

                Poll::Ready(Ok(()))
            }
            _ => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}
