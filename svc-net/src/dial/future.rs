//! [`HttpConnectFuture`]: the CONNECT exchange as a named state machine.
//!
//! connect to the proxy → write the request → flush → read the reply head (bounded by
//! [`MAX_REPLY_HEAD`]) → hand over the stream with the bytes read past the head. One deadline
//! covers all of it. No task is spawned and nothing is boxed but the timer.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use pin_project::pin_project;
use svc_core::Addr;
use tokio::time::Sleep;
use tower::BoxError;
use tracing::trace;

use super::{
    Error, Tunneled,
    connect::{ProxyHop, connect_error},
    reply::{self, MAX_REPLY_HEAD},
};

#[pin_project(project = StateProj)]
enum State<F, IO> {
    Connecting {
        #[pin]
        connecting: F,
    },
    Writing {
        io: Option<IO>,
        request: Bytes,
        written: usize,
    },
    Flushing {
        io: Option<IO>,
    },
    Reading {
        io: Option<IO>,
        buf: Vec<u8>,
        filled: usize,
    },
    Failed {
        error: Option<Error>,
    },
    Done,
}

/// The future returned by [`HttpConnect`](super::HttpConnect): resolves to the tunnel.
#[pin_project]
pub struct HttpConnectFuture<F, IO> {
    #[pin]
    state: State<F, IO>,
    // Boxed so the future is `Unpin` when `F` is, as hyper-util's client requires.
    deadline: Option<Pin<Box<Sleep>>>,
    hop: Option<Arc<ProxyHop>>,
    target: Option<Addr>,
}

impl<F, IO> std::fmt::Debug for HttpConnectFuture<F, IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConnectFuture")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl<F, IO> HttpConnectFuture<F, IO> {
    pub(crate) fn new(connecting: F, hop: Arc<ProxyHop>, target: Addr) -> Self {
        Self {
            state: State::Connecting { connecting },
            deadline: Some(Box::pin(tokio::time::sleep(hop.timeout))),
            hop: Some(hop),
            target: Some(target),
        }
    }

    pub(crate) fn failed(error: Error) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            deadline: None,
            hop: None,
            target: None,
        }
    }
}

impl<F, IO, E> Future for HttpConnectFuture<F, IO>
where
    F: Future<Output = Result<IO, E>>,
    E: Into<BoxError>,
    IO: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    type Output = Result<Tunneled<IO>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let (Some(hop), Some(target)) = (this.hop.as_ref(), this.target.as_ref()) else {
            return match this.state.as_mut().project() {
                StateProj::Failed { error } => {
                    Poll::Ready(Err(error.take().unwrap_or_else(|| Error::InvalidTarget {
                        target: String::new(),
                        reason: "future polled after completion".into(),
                    })))
                }
                _ => Poll::Pending,
            };
        };
        match step(this.state.as_mut(), cx, hop, target) {
            Poll::Ready(out) => {
                this.state.set(State::Done);
                Poll::Ready(out)
            }
            Poll::Pending => {
                if let Some(deadline) = this.deadline.as_mut() {
                    ready!(deadline.as_mut().poll(cx));
                }
                let during = match &*this.state {
                    State::Connecting { .. } => format!("connecting to proxy {}", hop.display),
                    State::Writing { .. } | State::Flushing { .. } => {
                        format!("sending CONNECT {target} to proxy {}", hop.display)
                    }
                    _ => format!("waiting for proxy {} to answer CONNECT {target}", hop.display),
                };
                this.state.set(State::Done);
                Poll::Ready(Err(Error::Timeout {
                    during,
                    after: hop.timeout,
                }))
            }
        }
    }
}

/// Drives the exchange as far as it goes without blocking.
fn step<F, IO, E>(
    mut state: Pin<&mut State<F, IO>>,
    cx: &mut Context<'_>,
    hop: &ProxyHop,
    target: &Addr,
) -> Poll<Result<Tunneled<IO>, Error>>
where
    F: Future<Output = Result<IO, E>>,
    E: Into<BoxError>,
    IO: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    let io_err = |during: &str, source| Error::Io {
        during: format!("{during} proxy {} for CONNECT {target}", hop.display),
        source,
    };
    loop {
        match state.as_mut().project() {
            StateProj::Connecting { connecting } => {
                let io = ready!(connecting.poll(cx)).map_err(|e| connect_error(&hop.display, e.into()))?;
                trace!(proxy = %hop.display, %target, "connected to proxy, sending CONNECT");
                state.set(State::Writing {
                    io: Some(io),
                    request: hop.request(target),
                    written: 0,
                });
            }
            StateProj::Writing { io, request, written } => {
                let Some(stream) = io.as_mut() else {
                    return Poll::Ready(Err(io_err(
                        "lost the stream to",
                        std::io::ErrorKind::Other.into(),
                    )));
                };
                while *written < request.len() {
                    let n = ready!(Pin::new(&mut *stream).poll_write(cx, &request[*written..]))
                        .map_err(|e| io_err("writing to", e))?;
                    if n == 0 {
                        return Poll::Ready(Err(io_err("writing to", std::io::ErrorKind::WriteZero.into())));
                    }
                    *written += n;
                }
                let io = io.take();
                state.set(State::Flushing { io });
            }
            StateProj::Flushing { io } => {
                let Some(stream) = io.as_mut() else {
                    return Poll::Ready(Err(io_err(
                        "lost the stream to",
                        std::io::ErrorKind::Other.into(),
                    )));
                };
                ready!(Pin::new(&mut *stream).poll_flush(cx)).map_err(|e| io_err("writing to", e))?;
                let io = io.take();
                state.set(State::Reading {
                    io,
                    // The head is read into this buffer and no further: a proxy cannot make us
                    // hold more than the limit.
                    buf: vec![0; MAX_REPLY_HEAD],
                    filled: 0,
                });
            }
            StateProj::Reading { io, buf, filled } => {
                let Some(stream) = io.as_mut() else {
                    return Poll::Ready(Err(io_err(
                        "lost the stream to",
                        std::io::ErrorKind::Other.into(),
                    )));
                };
                loop {
                    let mut rb = hyper::rt::ReadBuf::new(&mut buf[*filled..]);
                    ready!(Pin::new(&mut *stream).poll_read(cx, rb.unfilled()))
                        .map_err(|e| io_err("reading the reply of", e))?;
                    let n = rb.filled().len();
                    if n == 0 {
                        return Poll::Ready(Err(Error::MalformedReply {
                            proxy: hop.display.clone(),
                            target: target.to_string(),
                            reason: format!(
                                "connection closed after {filled} bytes, before the end of the reply head"
                            ),
                        }));
                    }
                    *filled += n;
                    let head = reply::parse(&buf[..*filled]).map_err(|e| Error::MalformedReply {
                        proxy: hop.display.clone(),
                        target: target.to_string(),
                        reason: e.to_string(),
                    })?;
                    match head {
                        Some(head) => {
                            trace!(proxy = %hop.display, %target, status = head.status, "proxy answered CONNECT");
                            return Poll::Ready(match head.status {
                                200..=299 => {
                                    let leftover = Bytes::copy_from_slice(&buf[head.len..*filled]);
                                    match io.take() {
                                        Some(stream) => Ok(Tunneled::new(stream, leftover)),
                                        None => Err(io_err(
                                            "lost the stream to",
                                            std::io::ErrorKind::Other.into(),
                                        )),
                                    }
                                }
                                401 | 407 => Err(Error::ProxyAuthRequired {
                                    proxy: hop.display.clone(),
                                    target: target.to_string(),
                                    status: head.status,
                                }),
                                status => Err(Error::ProxyRefused {
                                    proxy: hop.display.clone(),
                                    target: target.to_string(),
                                    status,
                                    reason: head.reason,
                                }),
                            });
                        }
                        None if *filled == buf.len() => {
                            return Poll::Ready(Err(Error::ReplyTooLarge {
                                proxy: hop.display.clone(),
                                target: target.to_string(),
                                limit: MAX_REPLY_HEAD,
                            }));
                        }
                        None => {}
                    }
                }
            }
            StateProj::Failed { error } => {
                return Poll::Ready(Err(error.take().unwrap_or_else(|| Error::InvalidTarget {
                    target: target.to_string(),
                    reason: "future polled after completion".into(),
                })));
            }
            StateProj::Done => {
                return Poll::Ready(Err(Error::InvalidTarget {
                    target: target.to_string(),
                    reason: "future polled after completion".into(),
                }));
            }
        }
    }
}
