//! The handshake + authentication deadline every SSH server of this crate enforces (the proxy's
//! SSH entry, the node's SSH Service, the reverse-tunnel server): a peer that connects and stays
//! silent, stalls in key exchange or never authenticates is disconnected when the deadline
//! passes. russh's own inactivity timeout and keepalives cover the rest of the session.
//!
//! russh runs a session in a task of its own and cannot be told to drop a peer that is stuck
//! in key exchange (a disconnect request waits for the exchange), so the stream is wrapped in a
//! [`Severable`] that fails every read and write once the deadline cuts it: the session task
//! wakes, ends and closes the socket.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use russh::server::{Handler, RunningSession};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::oneshot,
    time::Instant,
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::io::Io;

/// A stream that fails with `ConnectionAborted` once its token is cancelled (waking whoever
/// waits on it).
/// Once the client has authenticated the stream is disarmed and reads and writes pass straight
/// through (no cancellation check on the data path).
pub(crate) struct Severable<S> {
    io: S,
    cut: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    disarmed: Arc<AtomicBool>,
}

impl<S> Severable<S> {
    fn new(io: S, token: CancellationToken, disarmed: Arc<AtomicBool>) -> Self {
        Self {
            io,
            cut: Some(Box::pin(token.cancelled_owned())),
            disarmed,
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(cut) = self.cut.as_mut() else {
            return Ok(());
        };
        if self.disarmed.load(Ordering::Acquire) {
            self.cut = None;
            return Ok(());
        }
        match cut.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the SSH handshake and authentication deadline passed",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Severable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Severable<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Why an SSH session did not reach authentication.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The version exchange, key exchange and authentication did not finish in time.
    Deadline {
        /// The deadline.
        after: Duration,
    },
    /// The session failed before authentication.
    Session(russh::Error),
}

/// Starts an SSH server session on `io` and waits until the handler reports an authenticated
/// client through `authenticated` (the value it sends is returned with the session), at most
/// `after` from now. At the deadline the stream is severed: the session ends and the socket
/// closes.
/// `Ok(None)`: the client went away before authenticating.
pub(crate) async fn authenticate_before<H, S, T>(
    config: Arc<russh::server::Config>,
    io: S,
    handler: H,
    authenticated: oneshot::Receiver<T>,
    after: Duration,
) -> Result<Option<(RunningSession<H>, T)>, StartError>
where
    H: Handler<Error = russh::Error> + Send + 'static,
    S: Io,
{
    let deadline = Instant::now() + after;
    let cut = CancellationToken::new();
    let disarmed = Arc::new(AtomicBool::new(false));
    let io = Severable::new(io, cut.clone(), disarmed.clone());
    let mut session =
        match tokio::time::timeout_at(deadline, russh::server::run_stream(config, io, handler)).await {
            Err(_) => return Err(StartError::Deadline { after }),
            Ok(Err(e)) => return Err(StartError::Session(e)),
            Ok(Ok(session)) => session,
        };
    tokio::select! {
        // An authentication that lands with the deadline wins.
        biased;
        r = authenticated => match r {
            Ok(value) => {
                disarmed.store(true, Ordering::Release);
                Ok(Some((session, value)))
            }
            // The handler is gone: the session ended before authentication.
            Err(_) => session.await.map(|()| None).map_err(StartError::Session),
        },
        r = &mut session => r.map(|()| None).map_err(StartError::Session),
        () = tokio::time::sleep_until(deadline) => {
            cut.cancel();
            Err(StartError::Deadline { after })
        }
    }
}
