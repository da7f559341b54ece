//! The handshake + authentication deadline every SSH server of this crate enforces (the proxy's
//! SSH entry, the node's SSH Service, the reverse-tunnel server): a peer that connects and stays
//! silent, stalls in key exchange or never authenticates is disconnected when the deadline
//! passes. russh's own inactivity timeout and keepalives cover the rest of the session.

use std::{sync::Arc, time::Duration};

use russh::server::{Handler, RunningSession};
use tokio::{sync::oneshot, time::Instant};

use crate::listen::Io;

/// How long a disconnect message may take to be written to a peer that is cut off.
const DISCONNECT_GRACE: Duration = Duration::from_secs(1);

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
/// `after` from now. At the deadline the session is disconnected (which closes the stream).
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
    let mut session =
        match tokio::time::timeout_at(deadline, russh::server::run_stream(config, io, handler)).await {
            Err(_) => return Err(StartError::Deadline { after }),
            Ok(Err(e)) => return Err(StartError::Session(e)),
            Ok(Ok(session)) => session,
        };
    tokio::select! {
        r = authenticated => match r {
            Ok(value) => Ok(Some((session, value))),
            // The handler is gone: the session ended before authentication.
            Err(_) => session.await.map(|()| None).map_err(StartError::Session),
        },
        r = &mut session => r.map(|()| None).map_err(StartError::Session),
        () = tokio::time::sleep_until(deadline) => {
            // The session runs in its own task: ask it to disconnect (it then drops the stream).
            let handle = session.handle();
            let _ = tokio::time::timeout(
                DISCONNECT_GRACE,
                handle.disconnect(
                    russh::Disconnect::ByApplication,
                    format!("authentication did not finish within {after:?}"),
                    String::new(),
                ),
            )
            .await;
            Err(StartError::Deadline { after })
        }
    }
}
