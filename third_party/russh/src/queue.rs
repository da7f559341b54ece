//! svc: the session's and the channels' message queues, holding each message boxed
//! (SVC-PATCHES.md, change 3).
//!
//! Tokio's `mpsc` queues allocate their slots in blocks of 32 and allocate the first block when
//! the queue is made, so an idle queue costs 32 times the size of its message. russh's session
//! messages are large (the server's `Msg` 136 bytes, the client's 552 because of the
//! authentication method it may carry), which made the queues of an idle SSH session several
//! KiB each (the server 4.3 KiB per queue, the client 17.3 KiB). These queues carry the same
//! messages in a box of their own, so a block is 32 pointers: one small allocation per message
//! sent, in exchange for a few hundred bytes per idle queue.
//!
//! The types mirror the parts of tokio's API that russh uses, so callers send and receive the
//! message itself.

use std::task::{Context, Poll};

use tokio::sync::mpsc;
pub use tokio::sync::mpsc::error::{SendError, TryRecvError, TrySendError};

/// A bounded queue's sending half (see [`tokio::sync::mpsc::Sender`]).
pub struct Sender<T>(mpsc::Sender<Box<T>>);

/// A bounded queue's receiving half (see [`tokio::sync::mpsc::Receiver`]).
pub struct Receiver<T>(mpsc::Receiver<Box<T>>);

/// An unbounded queue's sending half (see [`tokio::sync::mpsc::UnboundedSender`]).
pub struct UnboundedSender<T>(mpsc::UnboundedSender<Box<T>>);

/// An unbounded queue's receiving half (see [`tokio::sync::mpsc::UnboundedReceiver`]).
pub struct UnboundedReceiver<T>(mpsc::UnboundedReceiver<Box<T>>);

/// A reserved place in a bounded queue (see [`tokio::sync::mpsc::OwnedPermit`]).
pub struct OwnedPermit<T>(mpsc::OwnedPermit<Box<T>>);

/// A bounded queue of `buffer` messages (see [`tokio::sync::mpsc::channel`]).
pub fn channel<T>(buffer: usize) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = mpsc::channel(buffer);
    (Sender(tx), Receiver(rx))
}

/// An unbounded queue (see [`tokio::sync::mpsc::unbounded_channel`]).
pub fn unbounded_channel<T>() -> (UnboundedSender<T>, UnboundedReceiver<T>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (UnboundedSender(tx), UnboundedReceiver(rx))
}

fn unbox_send_error<T>(e: SendError<Box<T>>) -> SendError<T> {
    SendError(*e.0)
}

fn unbox_try_send_error<T>(e: TrySendError<Box<T>>) -> TrySendError<T> {
    match e {
        TrySendError::Full(m) => TrySendError::Full(*m),
        TrySendError::Closed(m) => TrySendError::Closed(*m),
    }
}

impl<T> Sender<T> {
    /// Waits for room and sends `message`; gives it back when the receiver is gone.
    pub async fn send(&self, message: T) -> Result<(), SendError<T>> {
        self.0
            .send(Box::new(message))
            .await
            .map_err(unbox_send_error)
    }

    /// Sends `message` if there is room now.
    pub fn try_send(&self, message: T) -> Result<(), TrySendError<T>> {
        self.0
            .try_send(Box::new(message))
            .map_err(unbox_try_send_error)
    }

    /// Waits for room and keeps it for a message sent later.
    pub async fn reserve_owned(self) -> Result<OwnedPermit<T>, SendError<()>> {
        self.0.reserve_owned().await.map(OwnedPermit)
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    /// Completes when the receiver is gone.
    pub async fn closed(&self) {
        self.0.closed().await
    }
}

impl<T> OwnedPermit<T> {
    /// Sends `message` in the reserved place.
    pub fn send(self, message: T) -> Sender<T> {
        Sender(self.0.send(Box::new(message)))
    }
}

impl<T> Receiver<T> {
    /// The next message, or `None` once every sender is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<T> {
        self.0.recv().await.map(|m| *m)
    }

    /// The next message if one is queued.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.0.try_recv().map(|m| *m)
    }

    /// Polls for the next message.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.0.poll_recv(cx).map(|m| m.map(|m| *m))
    }

    /// Refuses further messages; those queued can still be received.
    pub fn close(&mut self) {
        self.0.close()
    }
}

impl<T> UnboundedSender<T> {
    /// Sends `message`; gives it back when the receiver is gone.
    pub fn send(&self, message: T) -> Result<(), SendError<T>> {
        self.0.send(Box::new(message)).map_err(unbox_send_error)
    }

}

impl<T> UnboundedReceiver<T> {
    /// The next message, or `None` once every sender is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<T> {
        self.0.recv().await.map(|m| *m)
    }

    /// The next message if one is queued.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.0.try_recv().map(|m| *m)
    }

    /// Refuses further messages; those queued can still be received.
    pub fn close(&mut self) {
        self.0.close()
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender(self.0.clone())
    }
}

impl<T> Clone for UnboundedSender<T> {
    fn clone(&self) -> Self {
        UnboundedSender(self.0.clone())
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<T> std::fmt::Debug for UnboundedSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<T> std::fmt::Debug for UnboundedReceiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<T> std::fmt::Debug for OwnedPermit<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_cross_in_order_and_come_back_when_refused() {
        let (tx, mut rx) = channel::<String>(2);
        tx.send("a".into()).await.unwrap();
        tx.try_send("b".into()).unwrap();
        assert!(matches!(tx.try_send("c".into()), Err(TrySendError::Full(m)) if m == "c"));
        assert_eq!(rx.recv().await.as_deref(), Some("a"));
        assert_eq!(rx.try_recv().as_deref(), Ok("b"));
        let permit = tx.clone().reserve_owned().await.unwrap();
        permit.send("d".into());
        assert_eq!(rx.recv().await.as_deref(), Some("d"));
        rx.close();
        assert_eq!(tx.send("e".into()).await.unwrap_err().0, "e");

        let (utx, mut urx) = unbounded_channel::<String>();
        utx.send("f".into()).unwrap();
        assert_eq!(urx.recv().await.as_deref(), Some("f"));
        drop(urx);
        assert_eq!(utx.send("g".into()).unwrap_err().0, "g");
    }
}
