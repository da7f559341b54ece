//! The proxy's SSH entry for clients: on the SSH listener (3023) and on the web port with ALPN
//! `svc-proxy-ssh` (SSH inside TLS). Authenticates the user certificate and serves the
//! `proxy:<host>:<port>` subsystem (and `direct-tcpip` to `<host>:<port>`) by dialing the
//! agent through the [`TunnelDialer`] and piping bytes. The client runs its own SSH session to
//! the agent over that pipe; the proxy never sees inside it.
//!
//! Before it dials, the entry asks its [`NodeAuthorizer`] whether the user (their certificate)
//! may log in to the node named (node name, host ID or UUID) as the SSH user they gave the
//! proxy; the answer names the one agent holding that node name, and the proxy dials that
//! agent's host ID — never "whichever tunnel claims the name". A refusal reaches the client on
//! stderr, naming the node and the reason. While the pipe is open the entry asks again every
//! [`ProxySshConfig::recheck_interval`]: on a refusal (a lock, a deleted user, a removed role)
//! it gives the node one more interval to end the session itself (the node re-checks too, and
//! its reason reaches the user inside the session), then closes the pipe, with the reason on
//! the channel's stderr. An open session so ends within two intervals.

use std::{collections::HashMap, future::Future, net::SocketAddr, sync::Arc, time::SystemTime};

use bytes::Bytes;
use russh::{
    Channel, ChannelId,
    keys::{Certificate, PrivateKey},
    server::{Auth, ChannelOpenHandle, Msg, Session},
};
use svc_core::auth::ServedKind;
use svc_core::identity::{UserIdentity, Verifier};

use crate::ssh::authz::NodeAuthorizer;
use tokio::io::copy_bidirectional_with_sizes;
use tower::{BoxError, Service};

use crate::ssh::SshError;
use crate::tls::{HandshakeDeadline, TlsConnection, TlsTerminate};
use crate::{
    io::{ConnFuture, ConnService, Connection, Io, conn_service},
    ssh::{Tunables, server_config},
    tunnel::{DialRequest, TunnelDialer},
};

/// What the proxy's SSH entry needs.
#[non_exhaustive]
pub struct ProxySshConfig {
    /// The proxy's SSH host key.
    pub host_key: PrivateKey,
    /// Its host-CA-signed certificate (role `proxy`).
    pub host_cert: Certificate,
    /// Verifies user certificates (trusts the cluster's user CA).
    pub verifier: Arc<Verifier>,
    /// Reaches agents.
    pub dialer: TunnelDialer,
    /// Decides, before every dial, whether the user may reach the node as the login.
    pub authorizer: Arc<dyn NodeAuthorizer>,
    /// TLS for ALPN `svc-proxy-ssh` (`ServerIdentity::server_config(&[alpn::PROXY_SSH])`).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Window and packet sizes.
    pub tunables: Tunables,
    /// How often an open session's access is asked again (default
    /// [`DEFAULT_RECHECK_INTERVAL`](crate::ssh::authz::DEFAULT_RECHECK_INTERVAL)); a refusal closes
    /// the session with the reason on stderr.
    pub recheck_interval: std::time::Duration,
}

impl ProxySshConfig {
    /// A configuration with default tunables and no TLS.
    pub fn new(
        host_key: PrivateKey,
        host_cert: Certificate,
        verifier: Arc<Verifier>,
        dialer: TunnelDialer,
        authorizer: Arc<dyn NodeAuthorizer>,
    ) -> Self {
        Self {
            host_key,
            host_cert,
            verifier,
            dialer,
            authorizer,
            tls: None,
            tunables: Tunables::default(),
            recheck_interval: crate::ssh::authz::DEFAULT_RECHECK_INTERVAL,
        }
    }

    /// Serves the TLS path with `tls`.
    pub fn with_tls(mut self, tls: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Replaces the tunables (keepalives of the sessions).
    pub fn with_tunables(mut self, tunables: Tunables) -> Self {
        self.tunables = tunables;
        self
    }
}

struct Inner {
    /// Replaced when the proxy's host certificates are renewed ([`ProxySsh::set_host_key`]).
    ssh: std::sync::RwLock<Arc<russh::server::Config>>,
    tunables: Tunables,
    verifier: Arc<Verifier>,
    dialer: TunnelDialer,
    authorizer: Arc<dyn NodeAuthorizer>,
    tls: Option<Arc<rustls::ServerConfig>>,
    handshake_timeout: std::time::Duration,
    auth_timeout: std::time::Duration,
    recheck_interval: std::time::Duration,
}

/// The proxy's SSH entry. Cheap to clone.
#[derive(Clone)]
pub struct ProxySsh {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProxySsh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProxySsh")
    }
}

/// Parses a `proxy:<host>:<port>` subsystem name (the port is optional; IPv6 hosts in
/// brackets).
pub(crate) fn parse_proxy_subsystem(name: &str) -> Option<(String, u16)> {
    let rest = name.strip_prefix("proxy:")?;
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p))
            if !h.is_empty() && p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']')) =>
        {
            (h, p.parse().ok()?)
        }
        _ => (rest, 0),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

impl ProxySsh {
    /// Builds the entry.
    pub fn new(config: ProxySshConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                ssh: std::sync::RwLock::new(Arc::new(server_config(
                    &config.tunables,
                    config.host_key,
                    Some(config.host_cert),
                ))),
                tunables: config.tunables.clone(),
                verifier: config.verifier,
                dialer: config.dialer,
                authorizer: config.authorizer,
                tls: config.tls,
                handshake_timeout: config.tunables.handshake_timeout,
                auth_timeout: config.tunables.auth_timeout,
                recheck_interval: config.recheck_interval,
            }),
        }
    }

    /// Presents `host_key` and its certificate `host_cert` to clients from now on (the proxy's
    /// renewed host certificates); sessions already open keep theirs.
    pub fn set_host_key(&self, host_key: PrivateKey, host_cert: Certificate) {
        let ssh = server_config(&self.inner.tunables, host_key, Some(host_cert));
        *self
            .inner
            .ssh
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(ssh);
    }

    /// The handler for the SSH listener (`ProxyBuilder::ssh`).
    pub fn plain_service(&self) -> ConnService {
        entry(self.clone(), false)
    }

    /// The handler for ALPN `svc-proxy-ssh` (`ProxyBuilder::route`): TLS terminated by
    /// [`TlsTerminate`] under the handshake timeout, then SSH inside it. Without a TLS
    /// configuration every such connection is closed with a log line.
    pub fn tls_service(&self) -> ConnService {
        match &self.inner.tls {
            Some(config) => conn_service(TlsTerminate::new(
                config.clone(),
                HandshakeDeadline::Timeout(self.inner.handshake_timeout),
                ssh_in_tls(self.clone()),
            )),
            None => entry(self.clone(), true),
        }
    }

    /// Serves one client connection until it closes.
    pub async fn serve_stream<S: Io>(
        &self,
        io: S,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Result<(), SshError> {
        let (authenticated, on_auth) = tokio::sync::oneshot::channel();
        let handler = EntryHandler {
            authenticated: Some(authenticated),
            inner: self.inner.clone(),
            peer,
            local,
            user: None,
            channels: HashMap::new(),
        };
        let after = self.inner.auth_timeout;
        let ssh = self
            .inner
            .ssh
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let started = crate::ssh::authenticate_before(ssh, io, handler, on_auth, after).await?;
        if let Some((session, ())) = started {
            session.await?;
        }
        Ok(())
    }
}

/// The connection handler of the SSH entry: plain SSH, or (`tls`, without a TLS
/// configuration) a refusal with a log line.
fn entry(ssh: ProxySsh, tls: bool) -> ConnService {
    conn_service(tower::service_fn(move |mut conn: Connection| {
        let ssh = ssh.clone();
        ConnFuture::new(async move {
            conn.classified();
            let (peer, local) = (conn.peer_addr, conn.local_addr);
            if tls {
                tracing::warn!(%peer, "an SSH-in-TLS client arrived but the SSH entry has no TLS configuration; closing");
                return Ok(());
            }
            let result = ssh.serve_stream(conn.io, peer, local).await;
            if let Err(e) = result {
                tracing::info!(%peer, error = %e, "SSH client connection ended with an error");
            }
            Ok(())
        })
    }))
}

struct EntryHandler {
    /// Fired once the client authenticates (ends the handshake deadline).
    authenticated: Option<tokio::sync::oneshot::Sender<()>>,
    inner: Arc<Inner>,
    peer: SocketAddr,
    local: SocketAddr,
    user: Option<(UserIdentity, Certificate, String)>,
    channels: HashMap<ChannelId, Channel<Msg>>,
}

impl EntryHandler {
    /// Asks the authorizer whether the signed-in user may reach `host` as the login they gave
    /// the proxy; the dial request names the host ID of the one agent holding the name.
    async fn authorized_request(&self, host: &str, port: u16) -> Result<DialRequest, String> {
        let Some((user, cert, login)) = &self.user else {
            return Err("not authenticated".into());
        };
        match self
            .inner
            .authorizer
            .clone()
            .authorize(cert.clone(), host.to_owned(), login.clone())
            .await
        {
            Ok(route) => Ok(self.request(&route.server_id, host, port)),
            Err(denied) => {
                tracing::warn!(peer = %self.peer, user = %user.username, node = host, %login, reason = %denied, "SSH access to a node refused at the proxy");
                Err(denied)
            }
        }
    }

    /// Resolves when the user's access to `host` is refused on a periodic re-check (a lock, a
    /// deleted user, a removed role): the refusal text.
    fn refused_later(&self, host: &str) -> impl Future<Output = String> + Send + 'static {
        let (cert, login) = match &self.user {
            Some((_, cert, login)) => (Some(cert.clone()), login.clone()),
            None => (None, String::new()),
        };
        let authorizer = self.inner.authorizer.clone();
        let every = self.inner.recheck_interval;
        let host = host.to_owned();
        async move {
            match cert {
                Some(cert) => crate::ssh::authz::refused_later(authorizer, cert, host, login, every).await,
                None => "not authenticated".to_owned(),
            }
        }
    }

    fn request(&self, server_id: &str, host: &str, port: u16) -> DialRequest {
        DialRequest {
            address: format!("{host}:{}", if port == 0 { 3022 } else { port }),
            server_id: server_id.to_owned(),
            conn_type: ServedKind::Node,
            client_src_addr: self.peer.to_string(),
            client_dst_addr: self.local.to_string(),
            db_route: None,
        }
    }
}

impl russh::server::Handler for EntryHandler {
    type Error = russh::Error;

    async fn auth_openssh_certificate(
        &mut self,
        user: &str,
        certificate: &Certificate,
    ) -> Result<Auth, Self::Error> {
        match self
            .inner
            .verifier
            .verify_user_ssh(certificate, SystemTime::now())
        {
            Ok(identity) => {
                tracing::info!(peer = %self.peer, ssh_user = user, user = %identity.username, "SSH client authenticated at the proxy");
                self.user = Some((identity, certificate.clone(), user.to_owned()));
                if let Some(tx) = self.authenticated.take() {
                    let _ = tx.send(());
                }
                Ok(Auth::Accept)
            }
            Err(e) => {
                tracing::warn!(peer = %self.peer, ssh_user = user, error = %e, "SSH client refused: bad user certificate");
                Ok(Auth::reject())
            }
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.channels.insert(channel.id(), channel);
        reply.accept().await;
        Ok(())
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some((host, port)) = parse_proxy_subsystem(name) else {
            tracing::info!(peer = %self.peer, subsystem = name, "refusing an unknown subsystem");
            return session.channel_failure(channel);
        };
        let Some(ch) = self.channels.remove(&channel) else {
            return session.channel_failure(channel);
        };
        let req = match self.authorized_request(&host, port).await {
            Ok(req) => req,
            Err(denied) => {
                session.channel_failure(channel)?;
                session.extended_data(channel, 1, Bytes::from(format!("svc: {denied}\n")))?;
                session.exit_status_request(channel, 1)?;
                session.close(channel)?;
                return Ok(());
            }
        };
        match self.inner.dialer.dial(req).await {
            Ok(mut stream) => {
                session.channel_success(channel)?;
                let refused = self.refused_later(&host);
                let grace = self.inner.recheck_interval;
                let handle = session.handle();
                let (peer, node) = (self.peer, host.clone());
                tokio::spawn(async move {
                    let mut ch = ch.into_stream();
                    let pipe = copy_bidirectional_with_sizes(&mut ch, &mut stream, 64 * 1024, 64 * 1024);
                    tokio::pin!(pipe);
                    tokio::select! {
                        _ = &mut pipe => {}
                        denied = refused => {
                            // The node asks on its own schedule and closes the session with the
                            // reason inside it, where the user sees it: give it one interval,
                            // then close the pipe regardless.
                            if tokio::time::timeout(grace, &mut pipe).await.is_ok() {
                                return;
                            }
                            tracing::warn!(%peer, %node, reason = %denied, "open SSH session closed at the proxy: access revoked");
                            let text = format!("\r\nsvc: session closed: {denied}\r\n");
                            let _ = handle.extended_data(channel, 1, Bytes::from(text)).await;
                            let _ = handle.exit_status_request(channel, 1).await;
                            let _ = handle.eof(channel).await;
                            let _ = handle.close(channel).await;
                        }
                    }
                });
            }
            Err(e) => {
                tracing::info!(peer = %self.peer, node = %host, error = %e, "dialing a node for an SSH client failed");
                session.channel_failure(channel)?;
                session.extended_data(channel, 1, Bytes::from(format!("svc: {e}\n")))?;
                session.exit_status_request(channel, 1)?;
                session.close(channel)?;
            }
        }
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host_to_connect: &str,
        port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let port = u16::try_from(port_to_connect).unwrap_or(0);
        let req = match self.authorized_request(host_to_connect, port).await {
            Ok(req) => req,
            Err(denied) => {
                reply
                    .reject(russh::ChannelOpenFailure::Other {
                        code: 1,
                        reason: denied,
                    })
                    .await;
                return Ok(());
            }
        };
        match self.inner.dialer.dial(req).await {
            Ok(mut stream) => {
                reply.accept().await;
                let refused = self.refused_later(host_to_connect);
                let grace = self.inner.recheck_interval;
                let handle = session.handle();
                let (peer, node, id) = (self.peer, host_to_connect.to_owned(), channel.id());
                tokio::spawn(async move {
                    let mut ch = channel.into_stream();
                    let pipe = copy_bidirectional_with_sizes(&mut ch, &mut stream, 64 * 1024, 64 * 1024);
                    tokio::pin!(pipe);
                    tokio::select! {
                        _ = &mut pipe => {}
                        denied = refused => {
                            // As for the subsystem: the node gets one interval to say why.
                            if tokio::time::timeout(grace, &mut pipe).await.is_ok() {
                                return;
                            }
                            tracing::warn!(%peer, %node, reason = %denied, "open SSH tunnel closed at the proxy: access revoked");
                            let _ = handle.close(id).await;
                        }
                    }
                });
            }
            Err(e) => {
                tracing::info!(peer = %self.peer, node = host_to_connect, error = %e, "direct-tcpip to a node failed");
                reply
                    .reject(russh::ChannelOpenFailure::Other {
                        code: 2,
                        reason: e.to_string(),
                    })
                    .await;
            }
        }
        Ok(())
    }
}

/// SSH inside a TLS connection [`TlsTerminate`] has terminated (ALPN `svc-proxy-ssh`).
fn ssh_in_tls(
    ssh: ProxySsh,
) -> impl Service<TlsConnection, Response = (), Error = BoxError, Future = ConnFuture> + Clone {
    tower::service_fn(move |conn: TlsConnection| {
        let ssh = ssh.clone();
        ConnFuture::new(async move {
            let peer = conn.peer_addr;
            if let Err(e) = ssh.serve_stream(conn.io, peer, conn.local_addr).await {
                tracing::info!(%peer, error = %e, "SSH client connection ended with an error");
            }
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_subsystem_names() {
        assert_eq!(
            parse_proxy_subsystem("proxy:node-1:3022"),
            Some(("node-1".into(), 3022))
        );
        assert_eq!(parse_proxy_subsystem("proxy:node-1"), Some(("node-1".into(), 0)));
        assert_eq!(parse_proxy_subsystem("proxy:[::1]:22"), Some(("::1".into(), 22)));
        assert_eq!(parse_proxy_subsystem("proxy:"), None);
        assert_eq!(parse_proxy_subsystem("sftp"), None);
    }
}
