//! The agent's SSH Service: a real SSH server (russh) reached through the reverse tunnel (one
//! session per dial request with `conn_type: node`) or on its own listener (3022) when the
//! agent joined directly.
//!
//! Authentication: OpenSSH user certificates signed by the cluster's user CA
//! ([`Verifier::verify_user_ssh`]); the requested login must be one of the certificate's
//! principals (the user's allowed logins) and an OS account. Then node RBAC: the server asks
//! its [`NodeAuthorizer`] about itself (its host ID) — the user's current roles against this
//! node's labels and the login — and a refused user starts nothing: every shell or command
//! request gets the refusal text on stderr, exit status 1 and a closed channel (authentication
//! itself is accepted only so the refusal can be shown; its forwarding requests and sftp are
//! refused too; other channel types are not served). When the authorizer cannot decide, the answer
//! is a refusal. The server presents the agent's host certificate. Sessions: `exec` and `shell`, with a PTY when asked (`pty-process`),
//! `env`, `window-change`, exit status; closing the channel kills the child.
//!
//! Port forwarding: `direct-tcpip` channels (`ssh -L`, and `ssh -D`'s SOCKS connections) are
//! connected from the agent host; `tcpip-forward` requests (`ssh -R`) listen on the agent host's
//! loopback interface and open `forwarded-tcpip` channels back for each connection;
//! `cancel-tcpip-forward` stops such a listener. Each request is checked when it arrives: the
//! user's certificate must carry `permit-port-forwarding` (the role option `port_forwarding`,
//! default allowed) and node RBAC must have let the user in; a refused request is logged with
//! the user, roles and login. Agent forwarding (`auth-agent-req@openssh.com`) needs
//! `permit-agent-forwarding` (the role option `forward_agent`, default not allowed): the
//! session's programs get `SSH_AUTH_SOCK`, a socket in a directory only the login can enter,
//! whose connections go to the client's agent on `auth-agent@openssh.com` channels.
//!
//! The `sftp` subsystem (OpenSSH `sftp`, and `scp` since OpenSSH 9) runs as a process of its
//! own started with the login's uid, gid and groups ([`sftp`]): file access is the login
//! user's, never the agent's.
//!
//! While programs run, the server asks its authorizer again every
//! [`SshServerConfig::recheck_interval`]: when the answer becomes a refusal (the user or the
//! node was locked, the user deleted, a role removed), every program of the connection is
//! killed and its channel gets `svc: session closed: <reason>` and exit status 1; its forwarded
//! connections, remote-forward listeners and agent socket close with them.

use std::{
    collections::HashMap,
    net::SocketAddr,
    process::Stdio,
    sync::{Arc, OnceLock},
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use russh::{
    Channel, ChannelId, ChannelMsg, Pty,
    keys::{Certificate, PrivateKey},
    server::{Auth, ChannelOpenHandle, Msg, Session},
};
use svc_core::auth::ServedKind;
use svc_core::identity::{SshPermits, UserIdentity, Verifier};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpListener,
    sync::mpsc,
};
use tokio_util::sync::CancellationToken;

mod passwd;
pub mod sftp;
use tower::BoxError;

use crate::ssh::{SshError, authz::NodeAuthorizer};
use crate::{
    io::{BoxIo, Io},
    tunnel::{DialRequest, Tunables, dial_service_fn},
};

/// What the SSH Service needs.
#[non_exhaustive]
pub struct SshServerConfig {
    /// The agent's SSH host key.
    pub host_key: PrivateKey,
    /// Its host-CA-signed certificate.
    pub host_cert: Certificate,
    /// Verifies user certificates (trusts the cluster's user CA).
    pub verifier: Arc<Verifier>,
    /// This node's host ID: what it asks the authorizer about.
    pub host_id: String,
    /// Decides whether a user may log in here as a login (node RBAC, the second check).
    pub authorizer: Arc<dyn NodeAuthorizer>,
    /// Decides for sessions that came through the cluster's proxy (the tunnel, or the proxy's
    /// mutual-TLS dial), which the proxy already authorized; `None`: [`authorizer`](Self::authorizer).
    pub proxied_authorizer: Option<Arc<dyn NodeAuthorizer>>,
    /// Window and packet sizes.
    pub tunables: Tunables,
    /// How often an open session's access is asked again (default
    /// [`DEFAULT_RECHECK_INTERVAL`](crate::ssh::authz::DEFAULT_RECHECK_INTERVAL)); a refusal ends
    /// every program of the connection, with the reason on stderr.
    pub recheck_interval: Duration,
    /// How the `sftp` subsystem is started; `None`: the subsystem is refused.
    pub sftp: Option<sftp::SftpLauncher>,
}

impl SshServerConfig {
    /// A configuration with default tunables.
    pub fn new(
        host_key: PrivateKey,
        host_cert: Certificate,
        verifier: Arc<Verifier>,
        host_id: impl Into<String>,
        authorizer: Arc<dyn NodeAuthorizer>,
    ) -> Self {
        Self {
            host_key,
            host_cert,
            verifier,
            host_id: host_id.into(),
            authorizer,
            proxied_authorizer: None,
            tunables: Tunables::default(),
            recheck_interval: crate::ssh::authz::DEFAULT_RECHECK_INTERVAL,
            sftp: None,
        }
    }

    /// Serves the `sftp` subsystem with `launcher`.
    pub fn with_sftp(mut self, launcher: sftp::SftpLauncher) -> Self {
        self.sftp = Some(launcher);
        self
    }

    /// Decides sessions that came through the cluster's proxy with `authorizer`.
    pub fn with_proxied_authorizer(mut self, authorizer: Arc<dyn NodeAuthorizer>) -> Self {
        self.proxied_authorizer = Some(authorizer);
        self
    }
}

/// The SSH Service. Cheap to clone.
#[derive(Clone)]
pub struct SshServer {
    config: Arc<russh::server::Config>,
    auth_timeout: std::time::Duration,
    verifier: Arc<Verifier>,
    host_id: Arc<str>,
    authorizer: Arc<dyn NodeAuthorizer>,
    proxied_authorizer: Arc<dyn NodeAuthorizer>,
    recheck_interval: Duration,
    sftp: Option<Arc<sftp::SftpLauncher>>,
}

impl std::fmt::Debug for SshServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SshServer")
    }
}

impl SshServer {
    /// Builds the server.
    pub fn new(config: SshServerConfig) -> Self {
        let ssh = crate::ssh::server_config(&config.tunables, config.host_key, Some(config.host_cert));
        Self {
            config: Arc::new(ssh),
            auth_timeout: config.tunables.auth_timeout,
            verifier: config.verifier,
            host_id: config.host_id.into(),
            proxied_authorizer: config
                .proxied_authorizer
                .unwrap_or_else(|| config.authorizer.clone()),
            authorizer: config.authorizer,
            recheck_interval: config.recheck_interval,
            sftp: config.sftp.map(Arc::new),
        }
    }

    /// Serves one SSH connection on `io` until it closes. The client must finish the handshake
    /// and authenticate within [`Tunables::auth_timeout`] or it is disconnected.
    pub async fn serve_stream<S: Io>(&self, io: S, peer: Option<SocketAddr>) -> Result<(), SshError> {
        self.serve_stream_with(io, peer, self.authorizer.clone()).await
    }

    async fn serve_stream_with<S: Io>(
        &self,
        io: S,
        peer: Option<SocketAddr>,
        authorizer: Arc<dyn NodeAuthorizer>,
    ) -> Result<(), SshError> {
        let (authenticated, on_auth) = tokio::sync::oneshot::channel();
        let handler = NodeHandler {
            authenticated: Some(authenticated),
            verifier: self.verifier.clone(),
            host_id: self.host_id.clone(),
            authorizer,
            recheck_interval: self.recheck_interval,
            peer,
            denied: None,
            user: None,
            asked: None,
            conn: CancellationToken::new(),
            revoked: Arc::new(OnceLock::new()),
            watching: false,
            channels: HashMap::new(),
            permits: SshPermits {
                port_forwarding: false,
                agent_forwarding: false,
            },
            forwards: HashMap::new(),
            sftp: self.sftp.clone(),
            agent_sock: None,
        };
        let started =
            crate::ssh::authenticate_before(self.config.clone(), io, handler, on_auth, self.auth_timeout)
                .await?;
        if let Some((session, ())) = started {
            session.await?;
        }
        Ok(())
    }

    /// Serves the direct listener (3022) until `shutdown`, through the crate's one accept loop
    /// ([`listen::serve`](crate::listen::serve): connection cap, accept backoff, drain).
    pub async fn serve_listener(&self, listener: TcpListener, shutdown: CancellationToken) {
        self.serve_listener_with(listener, crate::listen::ListenOptions::default(), shutdown)
            .await;
    }

    /// Like [`serve_listener`](Self::serve_listener), with the accept loop's limits.
    pub async fn serve_listener_with(
        &self,
        listener: TcpListener,
        options: crate::listen::ListenOptions,
        shutdown: CancellationToken,
    ) {
        crate::listen::serve(listener, self.conn_handler(), options, shutdown).await;
    }

    /// The handler of one plain SSH connection (a listener's, or one a multiplexer detected).
    pub(crate) fn conn_handler(&self) -> crate::io::ConnService {
        let this = self.clone();
        crate::io::conn_service(tower::service_fn(move |mut conn: crate::io::Connection| {
            let this = this.clone();
            async move {
                // Nothing more to classify: the SSH deadline starts now.
                conn.classified();
                let peer = conn.peer_addr;
                if let Err(e) = this.serve_stream(conn.io, Some(peer)).await {
                    tracing::info!(%peer, error = %e, "SSH connection ended with an error");
                }
                Ok::<(), BoxError>(())
            }
        }))
    }

    /// The service a [`TunnelAgent`](crate::tunnel::TunnelAgent) serves `node` dial requests
    /// with: each request gets an SSH session on one end of an in-memory pipe whose other end
    /// is returned. Requests of other kinds are refused.
    pub fn dial_service(&self) -> crate::tunnel::DialService {
        let this = self.clone();
        dial_service_fn(move |req: DialRequest| {
            let this = this.clone();
            async move {
                if req.conn_type != ServedKind::Node {
                    return Err::<BoxIo, BoxError>(
                        format!("this agent serves SSH only, not {:?} connections", req.conn_type).into(),
                    );
                }
                let (ours, theirs) = tokio::io::duplex(256 * 1024);
                let peer = req.client_src_addr.parse().ok();
                tokio::spawn(async move {
                    // Through the cluster's proxy, which decided first.
                    let authorizer = this.proxied_authorizer.clone();
                    if let Err(e) = this.serve_stream_with(ours, peer, authorizer).await {
                        tracing::info!(client = %req.client_src_addr, error = %e, "tunnelled SSH session ended with an error");
                    }
                });
                Ok(Box::new(theirs) as BoxIo)
            }
        })
    }
}

struct ChanState {
    channel: Option<Channel<Msg>>,
    pty: Option<(String, u16, u16)>,
    env: Vec<(String, String)>,
    resize: Option<mpsc::UnboundedSender<(u16, u16)>>,
    kill: CancellationToken,
}

struct NodeHandler {
    /// Fired once the client authenticates (ends the handshake deadline).
    authenticated: Option<tokio::sync::oneshot::Sender<()>>,
    verifier: Arc<Verifier>,
    host_id: Arc<str>,
    authorizer: Arc<dyn NodeAuthorizer>,
    recheck_interval: Duration,
    peer: Option<SocketAddr>,
    /// Node RBAC refused the authenticated user: the text every session request gets.
    denied: Option<String>,
    user: Option<(UserIdentity, passwd::Account)>,
    /// The certificate and login that were authorized: what the periodic re-check asks about.
    asked: Option<(Certificate, String)>,
    /// Cancelled when the connection ends or its access is revoked: every channel's `kill`
    /// is a child of it.
    conn: CancellationToken,
    /// Why access was revoked, once it was: the programs' last words.
    revoked: Arc<OnceLock<String>>,
    /// Whether the periodic re-check runs.
    watching: bool,
    channels: HashMap<ChannelId, ChanState>,
    /// What the certificate permits besides sessions (port and agent forwarding).
    permits: SshPermits,
    /// Remote forwards (`tcpip-forward`) by the address and port asked for: cancelling the
    /// token closes the listener.
    forwards: HashMap<(String, u32), CancellationToken>,
    sftp: Option<Arc<sftp::SftpLauncher>>,
    /// The forwarded agent's socket, once a session asked for it (one per connection).
    agent_sock: Option<std::path::PathBuf>,
}

/// Whether the agent switches to the login's account for its programs: only when it runs as
/// root; otherwise the login must be the account the agent runs as.
fn must_switch(account: &passwd::Account) -> Result<bool, String> {
    match passwd::current_uid() {
        Some(0) => Ok(account.uid != 0),
        Some(uid) if uid == account.uid => Ok(false),
        _ => Err(format!(
            "the agent runs unprivileged and cannot start a session as {:?}",
            account.name
        )),
    }
}

/// How long connecting a `direct-tcpip` channel's target may take.
const FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Copies between a forwarding channel and its local connection (TCP, or the agent socket)
/// until either side ends or `kill` fires.
async fn splice<S: AsyncRead + AsyncWrite + Unpin>(
    channel: Channel<Msg>,
    mut local: S,
    kill: CancellationToken,
) {
    let mut stream = channel.into_stream();
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut stream, &mut local) => {}
        _ = kill.cancelled() => {}
    }
    let _ = stream.shutdown().await;
}

/// Listens on a Unix socket for the login's programs (`SSH_AUTH_SOCK`) and carries each
/// connection to the client's agent on an `auth-agent@openssh.com` channel. The socket lives in
/// a fresh directory of mode 0700 owned by the login; both are removed when `stop` fires.
fn forward_agent(
    account: &passwd::Account,
    handle: russh::server::Handle,
    stop: CancellationToken,
) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("svc-agent-{:016x}", rand::random::<u64>()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let sock = dir.join("agent.sock");
    let bound = (|| {
        let listener = tokio::net::UnixListener::bind(&sock)?;
        if passwd::current_uid() == Some(0) {
            std::os::unix::fs::chown(&dir, Some(account.uid), Some(account.gid))?;
            std::os::unix::fs::chown(&sock, Some(account.uid), Some(account.gid))?;
        }
        Ok::<_, std::io::Error>(listener)
    })();
    let listener = match bound {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let cleanup = dir.clone();
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((conn, _)) => conn,
                    Err(e) => {
                        tracing::debug!(error = %e, "agent socket: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = stop.cancelled() => break,
            };
            let (handle, kill) = (handle.clone(), stop.child_token());
            tokio::spawn(async move {
                match handle.channel_open_agent().await {
                    Ok(channel) => splice(channel, conn, kill).await,
                    Err(e) => tracing::info!(error = %e, "agent forwarding: the client refused the channel"),
                }
            });
        }
        let _ = std::fs::remove_dir_all(&cleanup);
    });
    Ok(sock)
}

/// The address a remote forward listens on: the loopback interface (OpenSSH's `GatewayPorts
/// no`), in the family asked for.
fn forward_bind_addr(address: &str, port: u32) -> Result<SocketAddr, String> {
    let port = u16::try_from(port).map_err(|_| format!("port {port} is out of range"))?;
    let ip: std::net::IpAddr = match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(_)) => std::net::Ipv6Addr::LOCALHOST.into(),
        _ => std::net::Ipv4Addr::LOCALHOST.into(),
    };
    Ok(SocketAddr::new(ip, port))
}

/// Environment variables a client may set (OpenSSH's `AcceptEnv` spirit: locale and
/// terminal, never loader or path variables).
fn env_allowed(name: &str) -> bool {
    name == "LANG"
        || name.starts_with("LC_")
        || name == "TERM"
        || name == "COLORTERM"
        || name.starts_with("SVC_")
}

fn dim(v: u32) -> u16 {
    u16::try_from(v).unwrap_or(u16::MAX)
}

impl NodeHandler {
    /// Starts the periodic re-check of the connection's access, once: a refusal records the
    /// reason and ends every program (their channels get it on stderr).
    fn watch(&mut self) {
        if self.watching {
            return;
        }
        let Some((cert, login)) = self.asked.clone() else {
            return;
        };
        self.watching = true;
        let (authorizer, node, every) = (
            self.authorizer.clone(),
            self.host_id.to_string(),
            self.recheck_interval,
        );
        let (conn, revoked, peer) = (self.conn.clone(), self.revoked.clone(), self.peer);
        tokio::spawn(async move {
            tokio::select! {
                denied = crate::ssh::authz::refused_later(authorizer, cert, node, login, every) => {
                    tracing::warn!(?peer, reason = %denied, "open SSH session closed: access revoked");
                    let _ = revoked.set(denied);
                    conn.cancel();
                }
                _ = conn.cancelled() => {}
            }
        });
    }

    /// Why a port forwarding request (`what`) is refused, if it is; a refusal is logged with
    /// the user, roles and login.
    fn forwarding_refused(&self, what: &str) -> Option<String> {
        if let Some(denied) = &self.denied {
            return Some(denied.clone());
        }
        let Some((user, account)) = &self.user else {
            return Some("not authenticated".into());
        };
        if !self.permits.port_forwarding {
            tracing::warn!(peer = ?self.peer, user = %user.username, roles = ?user.roles, login = %account.name, request = what, "port forwarding refused: a role sets port_forwarding: false");
            return Some(format!(
                "port forwarding is not allowed for {} (role option port_forwarding)",
                user.username
            ));
        }
        None
    }

    /// Starts the `sftp` subsystem on channel `id`: the launcher's program with the login's
    /// rights (it drops to them itself before serving), its stdin and stdout on the channel.
    fn start_sftp(&mut self, id: ChannelId) -> Result<(), String> {
        if let Some(denied) = &self.denied {
            return Err(denied.clone());
        }
        let Some((user, account)) = &self.user else {
            return Err("not authenticated".into());
        };
        let launcher = self
            .sftp
            .clone()
            .ok_or("this SSH Service does not serve the sftp subsystem")?;
        let state = self.channels.get_mut(&id).ok_or("unknown channel")?;
        let channel = state.channel.take().ok_or("the channel already runs a program")?;
        let mut cmd = tokio::process::Command::new(&launcher.program);
        cmd.args(&launcher.args);
        if must_switch(account)? || passwd::current_uid() == Some(0) {
            let groups: Vec<String> = passwd::groups(&account.name, account.gid)
                .iter()
                .map(u32::to_string)
                .collect();
            cmd.arg("--uid")
                .arg(account.uid.to_string())
                .arg("--gid")
                .arg(account.gid.to_string())
                .arg("--groups")
                .arg(groups.join(","));
        }
        cmd.env_clear()
            .env("HOME", &account.home)
            .env("USER", &account.name)
            .env("LOGNAME", &account.name)
            .env("SVC_USER", &user.username)
            // Relative paths start at the home directory; an account without one (`nobody`)
            // starts at the root.
            .current_dir(if account.home.is_dir() {
                account.home.as_path()
            } else {
                std::path::Path::new("/")
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting the sftp server {}: {e}", launcher.program.display()))?;
        tracing::info!(peer = ?self.peer, user = %user.username, login = %account.name, "sftp session");
        tokio::spawn(run_piped(
            channel,
            child,
            state.kill.clone(),
            self.revoked.clone(),
        ));
        Ok(())
    }

    fn start(&mut self, id: ChannelId, command: Option<String>) -> Result<(), String> {
        if let Some(denied) = &self.denied {
            return Err(denied.clone());
        }
        let Some((user, account)) = &self.user else {
            return Err("not authenticated".into());
        };
        let state = self.channels.get_mut(&id).ok_or("unknown channel")?;
        let channel = state.channel.take().ok_or("the channel already runs a program")?;
        let mut env: Vec<(String, String)> = vec![
            ("HOME".into(), account.home.display().to_string()),
            ("USER".into(), account.name.clone()),
            ("LOGNAME".into(), account.name.clone()),
            ("SHELL".into(), account.shell.display().to_string()),
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("SVC_USER".into(), user.username.clone()),
        ];
        if let Some(peer) = self.peer {
            env.push(("SSH_CLIENT".into(), format!("{} {} 0", peer.ip(), peer.port())));
        }
        if let Some((term, _, _)) = &state.pty {
            env.push(("TERM".into(), term.clone()));
        }
        env.extend(state.env.iter().cloned());
        let shell = account.shell.clone();
        let args: Vec<String> = match &command {
            Some(c) => vec!["-c".into(), c.clone()],
            None => vec!["-l".into()],
        };
        // Switch to the login's account only when running as root; otherwise the login must
        // be the account the agent runs as.
        let switch = must_switch(account)?;
        let kill = state.kill.clone();
        if let Some((_, cols, rows)) = state.pty.clone() {
            let (pty, pts) = pty_process::open().map_err(|e| format!("allocating a PTY: {e}"))?;
            pty.resize(pty_process::Size::new(rows, cols))
                .map_err(|e| format!("sizing the PTY: {e}"))?;
            let mut cmd = pty_process::Command::new(&shell)
                .args(&args)
                .env_clear()
                .envs(env)
                .current_dir(&account.home)
                .kill_on_drop(true);
            if switch {
                cmd = cmd.uid(account.uid).gid(account.gid);
            }
            let child = cmd
                .spawn(pts)
                .map_err(|e| format!("starting {}: {e}", shell.display()))?;
            let (resize_tx, resize_rx) = mpsc::unbounded_channel();
            state.resize = Some(resize_tx);
            let (read, write) = pty.into_split();
            tokio::spawn(run_pty(
                channel,
                child,
                read,
                write,
                resize_rx,
                kill,
                self.revoked.clone(),
            ));
        } else {
            let mut cmd = tokio::process::Command::new(&shell);
            cmd.args(&args)
                .env_clear()
                .envs(env)
                .current_dir(&account.home)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            if switch {
                cmd.uid(account.uid).gid(account.gid);
            }
            let child = cmd
                .spawn()
                .map_err(|e| format!("starting {}: {e}", shell.display()))?;
            tokio::spawn(run_piped(channel, child, kill, self.revoked.clone()));
        }
        Ok(())
    }
}

fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> u32 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => s
            .code()
            .map(|c| c as u32)
            .or_else(|| s.signal().map(|sig| 128 + sig as u32))
            .unwrap_or(255),
        Err(_) => 255,
    }
}

async fn pump<R: AsyncRead + Unpin>(mut from: R, to: &mut (impl AsyncWrite + Unpin)) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match from.read(&mut buf).await {
            // The PTY master reports EIO once the last holder of the terminal is gone: the end.
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A command with pipes: stdin from the channel, stdout and stderr to it, then the exit
/// status; a closed channel kills the child.
async fn run_piped(
    channel: Channel<Msg>,
    mut child: tokio::process::Child,
    kill: CancellationToken,
    revoked: Arc<OnceLock<String>>,
) {
    let (mut rd, wr) = channel.split();
    let mut stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut out_w = wr.make_writer();
    let mut err_w = wr.make_writer_ext(Some(1));
    let out = async {
        if let Some(s) = stdout {
            pump(s, &mut out_w).await;
        }
    };
    let err = async {
        if let Some(s) = stderr {
            pump(s, &mut err_w).await;
        }
    };
    let input = async {
        while let Some(msg) = rd.wait().await {
            match msg {
                ChannelMsg::Data { data } => {
                    if let Some(s) = stdin.as_mut()
                        && s.write_all(&data).await.is_err()
                    {
                        stdin = None;
                    }
                }
                ChannelMsg::Eof => stdin = None,
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        // The client closed the channel: end the command.
        kill.cancel();
        std::future::pending::<()>().await;
    };
    let status = tokio::select! {
        (_, _, status) = async { tokio::join!(out, err, child.wait()) } => Some(status),
        _ = input => None,
        _ = kill.cancelled() => None,
    };
    end_session(&wr, &mut child, status, &revoked, &mut err_w, "\n").await;
}

/// A command on a PTY: input and resizes from the channel, output to it, then the exit status.
async fn run_pty(
    channel: Channel<Msg>,
    mut child: tokio::process::Child,
    read: pty_process::OwnedReadPty,
    mut write: pty_process::OwnedWritePty,
    mut resize: mpsc::UnboundedReceiver<(u16, u16)>,
    kill: CancellationToken,
    revoked: Arc<OnceLock<String>>,
) {
    let (mut rd, wr) = channel.split();
    let mut out_w = wr.make_writer();
    let output = pump(read, &mut out_w);
    let input = async {
        loop {
            tokio::select! {
                msg = rd.wait() => match msg {
                    Some(ChannelMsg::Data { data }) => {
                        if write.write_all(&data).await.is_err() {
                            break;
                        }
                    }
                    Some(ChannelMsg::Close) | None => break,
                    Some(_) => {}
                },
                Some((cols, rows)) = resize.recv() => {
                    if let Err(e) = write.resize(pty_process::Size::new(rows, cols)) {
                        tracing::debug!(error = %e, "resizing the PTY failed");
                    }
                }
            }
        }
        kill.cancel();
        std::future::pending::<()>().await;
    };
    let status = tokio::select! {
        (_, status) = async { tokio::join!(output, child.wait()) } => Some(status),
        _ = input => None,
        _ = kill.cancelled() => None,
    };
    // A PTY has no separate stderr: a revocation's reason goes to the terminal.
    end_session(&wr, &mut child, status, &revoked, &mut out_w, "\r\n").await;
}

/// Ends a session's channel: the command's exit status when it finished; otherwise (the client
/// went away, or the session was revoked) the command is killed and, for a revocation, the
/// reason is written to `notice` (lines ended with `eol`) with exit status 1.
async fn end_session(
    wr: &russh::ChannelWriteHalf<Msg>,
    child: &mut tokio::process::Child,
    status: Option<std::io::Result<std::process::ExitStatus>>,
    revoked: &OnceLock<String>,
    notice: &mut (impl AsyncWrite + Unpin),
    eol: &str,
) {
    match status {
        Some(status) => {
            let _ = wr.exit_status(exit_code(status)).await;
            let _ = wr.eof().await;
        }
        None => {
            let _ = child.kill().await;
            if let Some(reason) = revoked.get() {
                let _ = notice
                    .write_all(format!("{eol}svc: session closed: {reason}{eol}").as_bytes())
                    .await;
                let _ = notice.flush().await;
                let _ = wr.exit_status(1).await;
                let _ = wr.eof().await;
            }
        }
    }
    let _ = wr.close().await;
}

/// Ends a session request that starts nothing (refused by node RBAC, or the program could not
/// start): the reason on stderr, exit status 1, end of channel. The request itself is answered
/// with success first, because clients such as OpenSSH exit on a failed `exec` before they
/// print what arrived on stderr; nothing runs either way.
fn end_with_error(session: &mut Session, channel: ChannelId, reason: String) -> Result<(), russh::Error> {
    session.channel_success(channel)?;
    session.extended_data(channel, 1, Bytes::from(reason))?;
    session.exit_status_request(channel, 1)?;
    session.eof(channel)?;
    session.close(channel)
}

impl russh::server::Handler for NodeHandler {
    type Error = russh::Error;

    async fn auth_openssh_certificate(
        &mut self,
        login: &str,
        certificate: &Certificate,
    ) -> Result<Auth, Self::Error> {
        let user = match self.verifier.verify_user_ssh(certificate, SystemTime::now()) {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(peer = ?self.peer, login, error = %e, "SSH login refused: bad user certificate");
                return Ok(Auth::reject());
            }
        };
        if !user.logins.iter().any(|l| l == login) {
            tracing::warn!(peer = ?self.peer, login, user = %user.username, allowed = ?user.logins, "SSH login refused: the login is not among the certificate's principals");
            return Ok(Auth::reject());
        }
        let Some(account) = passwd::lookup(login) else {
            tracing::warn!(peer = ?self.peer, login, "SSH login refused: no such OS account");
            return Ok(Auth::reject());
        };
        let decision = self
            .authorizer
            .clone()
            .authorize(certificate.clone(), self.host_id.to_string(), login.to_owned())
            .await;
        if let Err(denied) = decision {
            tracing::warn!(peer = ?self.peer, login, user = %user.username, reason = %denied, "SSH login refused by node RBAC");
            self.denied = Some(denied);
        } else {
            tracing::info!(peer = ?self.peer, login, user = %user.username, "SSH login");
            self.asked = Some((certificate.clone(), login.to_owned()));
            self.permits = SshPermits::of(certificate);
        }
        self.user = Some((user, account));
        if let Some(tx) = self.authenticated.take() {
            let _ = tx.send(());
        }
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let id = channel.id();
        self.channels.insert(
            id,
            ChanState {
                channel: Some(channel),
                pty: None,
                env: Vec::new(),
                resize: None,
                kill: self.conn.child_token(),
            },
        );
        reply.accept().await;
        Ok(())
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        term: &str,
        col_width: u32,
        row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match self.channels.get_mut(&channel) {
            Some(state) if state.channel.is_some() => {
                state.pty = Some((term.to_owned(), dim(col_width).max(1), dim(row_height).max(1)));
                session.channel_success(channel)
            }
            _ => session.channel_failure(channel),
        }
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        variable_name: &str,
        variable_value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match self.channels.get_mut(&channel) {
            Some(state) if env_allowed(variable_name) => {
                state
                    .env
                    .push((variable_name.to_owned(), variable_value.to_owned()));
                session.channel_success(channel)
            }
            _ => session.channel_failure(channel),
        }
    }

    async fn shell_request(&mut self, channel: ChannelId, session: &mut Session) -> Result<(), Self::Error> {
        match self.start(channel, None) {
            Ok(()) => {
                self.watch();
                session.channel_success(channel)
            }
            Err(e) => {
                tracing::warn!(error = %e, "starting a shell failed");
                end_with_error(session, channel, format!("svc: {e}\r\n"))
            }
        }
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let command = String::from_utf8_lossy(data).into_owned();
        match self.start(channel, Some(command)) {
            Ok(()) => {
                self.watch();
                session.channel_success(channel)
            }
            Err(e) => {
                tracing::warn!(error = %e, "starting a command failed");
                end_with_error(session, channel, format!("svc: {e}\n"))
            }
        }
    }

    async fn window_change_request(
        &mut self,
        channel: ChannelId,
        col_width: u32,
        row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(tx) = self.channels.get(&channel).and_then(|s| s.resize.as_ref()) {
            let _ = tx.send((dim(col_width).max(1), dim(row_height).max(1)));
        }
        Ok(())
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if name != "sftp" {
            tracing::info!(peer = ?self.peer, subsystem = name, "unknown subsystem refused");
            return session.channel_failure(channel);
        }
        match self.start_sftp(channel) {
            Ok(()) => {
                self.watch();
                session.channel_success(channel)
            }
            Err(e) => {
                tracing::warn!(error = %e, "starting the sftp subsystem failed");
                end_with_error(session, channel, format!("svc: {e}\n"))
            }
        }
    }

    async fn agent_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let Some((user, account)) = &self.user else {
            return Ok(false);
        };
        if self.denied.is_some() || !self.permits.agent_forwarding {
            tracing::warn!(peer = ?self.peer, user = %user.username, roles = ?user.roles, login = %account.name, "agent forwarding refused: no role sets forward_agent: true");
            return Ok(false);
        }
        let Some(state) = self.channels.get_mut(&channel).filter(|s| s.channel.is_some()) else {
            return Ok(false);
        };
        let sock = match &self.agent_sock {
            Some(sock) => sock.clone(),
            None => match forward_agent(account, session.handle(), self.conn.child_token()) {
                Ok(sock) => {
                    tracing::info!(peer = ?self.peer, user = %user.username, login = %account.name, "agent forwarding");
                    self.agent_sock = Some(sock.clone());
                    sock
                }
                Err(e) => {
                    tracing::warn!(peer = ?self.peer, error = %e, "agent forwarding: creating the socket failed");
                    return Ok(false);
                }
            },
        };
        state
            .env
            .push(("SSH_AUTH_SOCK".into(), sock.display().to_string()));
        self.watch();
        Ok(true)
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host_to_connect: &str,
        port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let target = format!("{host_to_connect}:{port_to_connect}");
        if let Some(why) = self.forwarding_refused(&format!("direct-tcpip to {target}")) {
            tracing::info!(peer = ?self.peer, %target, reason = %why, "direct-tcpip channel refused");
            reply
                .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        }
        self.watch();
        let (host, kill, peer) = (host_to_connect.to_owned(), self.conn.child_token(), self.peer);
        let Ok(port) = u16::try_from(port_to_connect) else {
            reply.reject(russh::ChannelOpenFailure::ConnectFailed).await;
            return Ok(());
        };
        // Connect off the session's loop; the channel is confirmed once the target answers.
        tokio::spawn(async move {
            let connect = tokio::net::TcpStream::connect((host.as_str(), port));
            match tokio::time::timeout(FORWARD_CONNECT_TIMEOUT, connect).await {
                Ok(Ok(tcp)) => {
                    tracing::debug!(?peer, %target, "direct-tcpip channel connected");
                    reply.accept().await;
                    splice(channel, tcp, kill).await;
                }
                Ok(Err(e)) => {
                    tracing::info!(?peer, %target, error = %e, "direct-tcpip: connecting failed");
                    reply.reject(russh::ChannelOpenFailure::ConnectFailed).await;
                }
                Err(_) => {
                    tracing::info!(?peer, %target, "direct-tcpip: connecting timed out");
                    reply.reject(russh::ChannelOpenFailure::ConnectFailed).await;
                }
            }
        });
        Ok(())
    }

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        if let Some(why) = self.forwarding_refused(&format!("tcpip-forward {address}:{port}")) {
            tracing::info!(peer = ?self.peer, address, port = *port, reason = %why, "remote forward refused");
            return Ok(false);
        }
        let unprivileged = self.user.as_ref().is_some_and(|(_, a)| a.uid != 0);
        if unprivileged && *port != 0 && *port < 1024 {
            tracing::info!(peer = ?self.peer, address, port = *port, "remote forward refused: a privileged port for a non-root login");
            return Ok(false);
        }
        let bind = match forward_bind_addr(address, *port) {
            Ok(b) => b,
            Err(e) => {
                tracing::info!(peer = ?self.peer, address, error = %e, "remote forward refused");
                return Ok(false);
            }
        };
        let listener = match TcpListener::bind(bind).await {
            Ok(l) => l,
            Err(e) => {
                tracing::info!(peer = ?self.peer, %bind, error = %e, "remote forward: binding failed");
                return Ok(false);
            }
        };
        let asked_port = *port;
        if *port == 0 {
            *port = listener.local_addr().map(|a| u32::from(a.port())).unwrap_or(0);
        }
        self.watch();
        let stop = self.conn.child_token();
        // A cancel names the port asked for or, for port 0, the one allocated: either finds it.
        self.forwards
            .insert((address.to_owned(), asked_port), stop.clone());
        self.forwards.insert((address.to_owned(), *port), stop.clone());
        let (handle, address, bound_port, peer) = (session.handle(), address.to_owned(), *port, self.peer);
        tracing::info!(?peer, %bind, port = bound_port, "remote forward listening");
        tokio::spawn(async move {
            loop {
                let (tcp, from) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::debug!(error = %e, "remote forward: accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                    _ = stop.cancelled() => return,
                };
                let (handle, address, kill) = (handle.clone(), address.clone(), stop.child_token());
                tokio::spawn(async move {
                    let opened = handle
                        .channel_open_forwarded_tcpip(
                            address,
                            bound_port,
                            from.ip().to_string(),
                            u32::from(from.port()),
                        )
                        .await;
                    match opened {
                        Ok(channel) => splice(channel, tcp, kill).await,
                        Err(e) => {
                            tracing::info!(error = %e, "remote forward: the client refused the channel")
                        }
                    }
                });
            }
        });
        Ok(true)
    }

    async fn cancel_tcpip_forward(
        &mut self,
        address: &str,
        port: u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        match self.forwards.remove(&(address.to_owned(), port)) {
            Some(stop) => {
                stop.cancel();
                self.forwards.retain(|_, other| !other.is_cancelled());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn channel_close(&mut self, channel: ChannelId, _session: &mut Session) -> Result<(), Self::Error> {
        if let Some(state) = self.channels.remove(&channel) {
            state.kill.cancel();
        }
        Ok(())
    }
}

impl Drop for NodeHandler {
    fn drop(&mut self) {
        // The connection is gone: end every program it started, and the re-check.
        self.conn.cancel();
    }
}
