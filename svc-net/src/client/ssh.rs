//! `tsh ssh` and `tsh proxy ssh`: the client end of SSH access through the proxy.
//!
//! Where it sits in the data flow: the signed-in profile gives the user's SSH key and
//! certificate and the cluster CAs → [`connect`] opens the first hop to the proxy's web address
//! ([`connect_via_proxy`]: ALPN `svc-proxy-ssh` inside TLS, or — when the
//! profile was signed in with `--insecure` and no `--cacert`, so there is no trust for the
//! proxy's TLS certificate — plain SSH detected on the same port, the proxy then authenticated
//! by its host certificate alone; without TLS routing, plain SSH on the proxy's SSH port) → [`run`] runs an SSH session to the node over that stream,
//! checking the node's host certificate (role `node`, naming the host asked for) against the
//! cluster's host CA.
//!
//! On that session: port forwarding ([`Forward`]: `-L` and `-D` open `direct-tcpip` channels
//! for each local connection, `-D` speaking SOCKS5 to learn the target; `-R` asks the node to
//! listen and carries its `forwarded-tcpip` channels to the local target) and file copies
//! ([`copy`], `tsh scp`, over the `sftp` subsystem).

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use russh::ChannelMsg;
use russh::keys::PublicKeyOrCertificate;
use svc_core::Addr;
use svc_core::identity::Verifier;
use tokio::io::AsyncWriteExt;

use super::{Error, Profile, ProxiedStream, ProxyEndpoint, SshIdentity, connect_via_proxy};
use crate::ssh::client_config;
use crate::tunnel::Tunables;

/// Where to connect: `login@host[:port]`, `%r@%h:%p` as OpenSSH expands it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The login on the node (`None`: the caller picks a default).
    pub login: Option<String>,
    /// The node name, host ID or host UUID.
    pub host: String,
    /// The SSH Service port, 0 for the default.
    pub port: u16,
}

impl Target {
    /// Parses `[login@]host[:port]`.
    pub fn parse(text: &str) -> Result<Target, Error> {
        let (login, rest) = match text.rsplit_once('@') {
            Some((l, r)) => (Some(l.to_owned()).filter(|l| !l.is_empty()), r),
            None => (None, text),
        };
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>().map_err(|e| Error::Target {
                    text: text.to_owned(),
                    reason: format!("expected a port number after ':', found {p:?}"),
                    source: Some(e),
                })?,
            ),
            None => (rest, 0),
        };
        if host.is_empty() {
            return Err(Error::Target {
                text: text.to_owned(),
                reason: "expected [login@]host[:port], found no host".into(),
                source: None,
            });
        }
        Ok(Target {
            login,
            host: host.to_owned(),
            port,
        })
    }
}

impl Target {
    /// The login to use: `explicit` (`tsh ssh -l`), else the target's `login@`, else the
    /// profile's default ([`Profile::default_login`]).
    pub fn resolve_login(&self, explicit: Option<String>, profile: &Profile) -> Result<String, Error> {
        match explicit.or_else(|| self.login.clone()) {
            Some(l) => Ok(l),
            None => profile.default_login(),
        }
    }
}

/// The SSH identity and proxy endpoint of a profile, for `login`.
pub fn endpoint(
    profile: &Profile,
    login: &str,
) -> Result<(ProxyEndpoint, SshIdentity, Arc<Verifier>), Error> {
    let verifier = Arc::new(profile.identity.verifier()?);
    // With TLS routing: the web port, SSH inside TLS (ALPN `svc-proxy-ssh`) when the proxy's
    // certificate can be checked, else plain SSH detected on the same port. Without: the
    // proxy's SSH port (3023). Either way the proxy is also checked by its host certificate.
    let (addr, tls) = match (&profile.ssh_proxy_addr, profile.tls_routing) {
        (Some(ssh), Some(false)) => (ssh, false),
        _ => (&profile.proxy, !profile.insecure || profile.ca_pem.is_some()),
    };
    let endpoint = ProxyEndpoint {
        addr: Addr::parse(addr).map_err(|source| Error::Addr {
            what: "the profile's proxy SSH address",
            addr: addr.clone(),
            source,
        })?,
        tls,
        verifier: verifier.clone(),
        extra_ca_pem: profile.ca_pem.as_ref().map(|p| p.as_bytes().to_vec()),
        dialer: crate::dial::ProxyDialer::from_env()?,
        timeout: Duration::from_secs(30),
    };
    let identity = SshIdentity {
        key: Arc::new(profile.identity.ssh_private_key()?),
        cert: profile.identity.ssh_certificate()?,
        login: login.to_owned(),
    };
    Ok((endpoint, identity, verifier))
}

/// Where a client dials an address the proxy advertised: an unspecified host (`0.0.0.0`, `::`,
/// a proxy listening on every interface) is the host the client already reaches the proxy at.
pub fn reachable(advertised: &str, proxy: &str) -> String {
    match (Addr::parse(advertised), Addr::parse(proxy)) {
        (Ok(a), Ok(p)) if a.host().ip().is_some_and(|ip| ip.is_unspecified()) => {
            p.with_port(a.port()).to_string()
        }
        _ => advertised.to_owned(),
    }
}

/// Opens a stream to `target`'s SSH Service through the profile's proxy.
pub async fn connect(profile: &Profile, target: &Target, login: &str) -> Result<ProxiedStream, Error> {
    let (endpoint, identity, _) = endpoint(profile, login)?;
    Ok(connect_via_proxy(&endpoint, &identity, &target.host, target.port).await?)
}

/// Checks the node's host certificate against the cluster's host CA: role `node`, and it must
/// name the host asked for ([`Verifier::verify_node_host_ssh`]). Keeps the refusal for the
/// error message.
pub struct NodeHandler {
    verifier: Arc<Verifier>,
    host: String,
    refused: Arc<std::sync::Mutex<Option<String>>>,
    /// Remote forwards (`-R`): the port the node listens on → the local target.
    remote: RemoteTargets,
}

/// The local targets of remote forwards, by the port the node listens on.
type RemoteTargets = Arc<std::sync::Mutex<std::collections::HashMap<u32, (String, u16)>>>;

/// Copies between a forwarding channel and a TCP connection until either ends.
async fn splice(channel: russh::Channel<russh::client::Msg>, mut tcp: tokio::net::TcpStream) {
    let mut stream = channel.into_stream();
    let _ = tokio::io::copy_bidirectional(&mut stream, &mut tcp).await;
    let _ = stream.shutdown().await;
}

impl russh::client::Handler for NodeHandler {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::Certificate(cert) = key else {
            return Ok(false);
        };
        match self
            .verifier
            .verify_node_host_ssh(cert, SystemTime::now(), &self.host)
        {
            Ok(_) => Ok(true),
            Err(e) => {
                if let Ok(mut refused) = self.refused.lock() {
                    *refused = Some(e.to_string());
                }
                Ok(false)
            }
        }
    }

    async fn server_channel_open_forwarded_tcpip(
        &mut self,
        channel: russh::Channel<russh::client::Msg>,
        _connected_address: &str,
        connected_port: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        let target = self
            .remote
            .lock()
            .ok()
            .and_then(|m| m.get(&connected_port).cloned());
        let Some((host, port)) = target else {
            reply
                .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        tokio::spawn(async move {
            match tokio::net::TcpStream::connect((host.as_str(), port)).await {
                Ok(tcp) => {
                    reply.accept().await;
                    splice(channel, tcp).await;
                }
                Err(e) => {
                    tracing::info!(%host, port, error = %e, "remote forward: connecting the local target failed");
                    reply.reject(russh::ChannelOpenFailure::ConnectFailed).await;
                }
            }
        });
        Ok(())
    }
}

/// A port forwarding, as OpenSSH's `-L`, `-R` and `-D` write them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward {
    /// `-L [bind:]port:host:hostport`: a local listener whose connections the node makes.
    Local {
        /// The local address to listen on.
        bind: String,
        /// The local port.
        port: u16,
        /// The target, as the node resolves it.
        host: String,
        /// The target's port.
        host_port: u16,
    },
    /// `-R [bind:]port:host:hostport`: the node listens, the connections come to a local target.
    Remote {
        /// The address the node listens on (its loopback interface either way).
        bind: String,
        /// The node's port (0: any, printed).
        port: u16,
        /// The local target.
        host: String,
        /// The local target's port.
        host_port: u16,
    },
    /// `-D [bind:]port`: a local SOCKS5 proxy whose connections the node makes.
    Dynamic {
        /// The local address to listen on.
        bind: String,
        /// The local port.
        port: u16,
    },
}

impl Forward {
    /// Parses the argument of `-L` (`kind` `'L'`), `-R` (`'R'`) or `-D` (`'D'`).
    pub fn parse(kind: char, spec: &str) -> Result<Forward, Error> {
        let bad = |reason: &str| Error::Forward {
            spec: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let port = |p: &str| p.parse::<u16>().map_err(|_| bad(&format!("{p:?} is not a port")));
        // A bracketed IPv6 address is one field.
        let mut fields = Vec::new();
        let mut rest = spec;
        while !rest.is_empty() {
            if let Some(inner) = rest.strip_prefix('[') {
                let (addr, after) = inner.split_once(']').ok_or_else(|| bad("an unclosed '['"))?;
                fields.push(addr);
                rest = after.strip_prefix(':').unwrap_or(after);
            } else {
                let (field, after) = rest.split_once(':').unwrap_or((rest, ""));
                fields.push(field);
                rest = after;
            }
        }
        let local = "127.0.0.1".to_owned();
        match (kind, fields.as_slice()) {
            ('D', [p]) => Ok(Forward::Dynamic {
                bind: local,
                port: port(p)?,
            }),
            ('D', [b, p]) => Ok(Forward::Dynamic {
                bind: (*b).to_owned(),
                port: port(p)?,
            }),
            ('L' | 'R', [p, h, hp]) | ('L' | 'R', [_, p, h, hp]) => {
                let bind = if fields.len() == 4 {
                    fields[0].to_owned()
                } else {
                    local
                };
                let (port, host, host_port) = (port(p)?, (*h).to_owned(), port(hp)?);
                Ok(if kind == 'L' {
                    Forward::Local {
                        bind,
                        port,
                        host,
                        host_port,
                    }
                } else {
                    Forward::Remote {
                        bind,
                        port,
                        host,
                        host_port,
                    }
                })
            }
            ('D', _) => Err(bad("expected [bind_address:]port")),
            _ => Err(bad("expected [bind_address:]port:host:hostport")),
        }
    }
}

/// A SOCKS5 `CONNECT` handshake on `conn` (no authentication): the target host and port.
async fn socks5_target(conn: &mut tokio::net::TcpStream) -> std::io::Result<(String, u16)> {
    use tokio::io::AsyncReadExt;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("SOCKS: {what}"));
    let mut head = [0u8; 2];
    conn.read_exact(&mut head).await?;
    if head[0] != 5 {
        return Err(bad("only SOCKS5 is spoken"));
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    conn.read_exact(&mut methods).await?;
    if !methods.contains(&0) {
        conn.write_all(&[5, 0xff]).await?;
        return Err(bad("the client offers no unauthenticated method"));
    }
    conn.write_all(&[5, 0]).await?;
    let mut req = [0u8; 4];
    conn.read_exact(&mut req).await?;
    if req[1] != 1 {
        conn.write_all(&[5, 7, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
        return Err(bad("only CONNECT is supported"));
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            conn.read_exact(&mut a).await?;
            std::net::Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            conn.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            conn.read_exact(&mut name).await?;
            String::from_utf8(name).map_err(|_| bad("a host name that is not UTF-8"))?
        }
        4 => {
            let mut a = [0u8; 16];
            conn.read_exact(&mut a).await?;
            std::net::Ipv6Addr::from(a).to_string()
        }
        _ => return Err(bad("an unknown address type")),
    };
    let mut port = [0u8; 2];
    conn.read_exact(&mut port).await?;
    Ok((host, u16::from_be_bytes(port)))
}

/// Starts the forwardings on `session`: local listeners (`-L`, `-D`) run until the process
/// ends; remote ones (`-R`) are asked of the node now and refused ones fail the call.
async fn start_forwards(
    session: &Arc<russh::client::Handle<NodeHandler>>,
    remote: &RemoteTargets,
    host: &str,
    forwards: &[Forward],
) -> Result<(), Error> {
    for forward in forwards {
        match forward {
            Forward::Local { bind, port, .. } | Forward::Dynamic { bind, port } => {
                let listener = tokio::net::TcpListener::bind((bind.as_str(), *port))
                    .await
                    .map_err(|source| Error::Listen { port: *port, source })?;
                let (session, forward) = (session.clone(), forward.clone());
                tokio::spawn(async move {
                    while let Ok((mut conn, from)) = listener.accept().await {
                        let (session, forward) = (session.clone(), forward.clone());
                        tokio::spawn(async move {
                            let target = match &forward {
                                Forward::Local { host, host_port, .. } => Ok((host.clone(), *host_port)),
                                _ => socks5_target(&mut conn).await,
                            };
                            let (host, port) = match target {
                                Ok(t) => t,
                                Err(e) => {
                                    tracing::info!(error = %e, "local forward: bad SOCKS request");
                                    return;
                                }
                            };
                            let opened = session
                                .channel_open_direct_tcpip(
                                    host.clone(),
                                    u32::from(port),
                                    from.ip().to_string(),
                                    u32::from(from.port()),
                                )
                                .await;
                            let socks = matches!(forward, Forward::Dynamic { .. });
                            match opened {
                                Ok(channel) => {
                                    if socks && conn.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await.is_err()
                                    {
                                        return;
                                    }
                                    splice(channel, conn).await;
                                }
                                Err(e) => {
                                    eprintln!("tsh: forwarding to {host}:{port} failed: {e}");
                                    if socks {
                                        let _ = conn.write_all(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]).await;
                                    }
                                }
                            }
                        });
                    }
                });
            }
            Forward::Remote {
                bind,
                port,
                host: to_host,
                host_port,
            } => {
                let spec = format!("{bind}:{port}:{to_host}:{host_port}");
                let bound = session
                    .tcpip_forward(bind.clone(), u32::from(*port))
                    .await
                    .map_err(|_| Error::ForwardRefused {
                        host: host.to_owned(),
                        spec: spec.clone(),
                    })?;
                let bound = if *port == 0 { bound } else { u32::from(*port) };
                if *port == 0 {
                    eprintln!("tsh: the node listens on port {bound} for {spec}");
                }
                if let Ok(mut m) = remote.lock() {
                    m.insert(bound, (to_host.clone(), *host_port));
                }
            }
        }
    }
    Ok(())
}

/// How `tsh ssh` runs: a command or shell, or (`no_command`, `-N`) only the forwardings.
#[derive(Debug, Clone, Default)]
pub struct SshOptions {
    /// Port forwardings to set up first.
    pub forwards: Vec<Forward>,
    /// Run nothing: keep the forwardings until interrupted or the connection ends (`-N`).
    pub no_command: bool,
}

/// An authenticated SSH session to `target` as `login`, through the profile's proxy.
async fn session(
    profile: &Profile,
    target: &Target,
    login: &str,
    remote: RemoteTargets,
) -> Result<russh::client::Handle<NodeHandler>, Error> {
    let (endpoint, identity, verifier) = endpoint(profile, login)?;
    session_via(&endpoint, &identity, verifier, target, remote).await
}

/// An authenticated SSH session to `target` as `identity.login` through the proxy at
/// `endpoint`, checking the node's host certificate with `verifier`: what `tsh ssh` opens, for
/// callers holding a user's identity without a profile (the proxy's web terminal).
pub async fn open_session(
    endpoint: &ProxyEndpoint,
    identity: &SshIdentity,
    verifier: Arc<Verifier>,
    target: &Target,
) -> Result<russh::client::Handle<NodeHandler>, Error> {
    session_via(endpoint, identity, verifier, target, RemoteTargets::default()).await
}

async fn session_via(
    endpoint: &ProxyEndpoint,
    identity: &SshIdentity,
    verifier: Arc<Verifier>,
    target: &Target,
    remote: RemoteTargets,
) -> Result<russh::client::Handle<NodeHandler>, Error> {
    let login = identity.login.as_str();
    let stream = connect_via_proxy(endpoint, identity, &target.host, target.port).await?;
    let refused = Arc::new(std::sync::Mutex::new(None));
    let handler = NodeHandler {
        verifier,
        host: target.host.clone(),
        refused: refused.clone(),
        remote,
    };
    let connected =
        russh::client::connect_stream(Arc::new(client_config(&Tunables::default())), stream, handler).await;
    if let Some(reason) = refused.lock().ok().and_then(|mut r| r.take()) {
        return Err(Error::HostRefused {
            host: target.host.clone(),
            reason,
        });
    }
    let mut session = connected.map_err(|source| Error::SshConnect {
        host: target.host.clone(),
        source,
    })?;
    let auth = session
        .authenticate_openssh_cert(login.to_owned(), identity.key.clone(), identity.cert.clone())
        .await?;
    if !auth.success() {
        return Err(Error::LoginRefused {
            host: target.host.clone(),
            login: login.to_owned(),
        });
    }
    Ok(session)
}

/// Runs `command` on `target` as `login` — or, without a command, a shell (with a PTY and the
/// local terminal in raw mode when standard input is a terminal) — copying standard input to
/// it and its output to ours; returns its exit status.
pub async fn run(
    profile: &Profile,
    target: &Target,
    login: &str,
    command: Option<&str>,
) -> Result<u32, Error> {
    run_with(profile, target, login, command, &SshOptions::default()).await
}

/// Like [`run`], with port forwardings first (`tsh ssh -L/-R/-D`) and, with
/// [`SshOptions::no_command`], nothing else: the forwardings last until interrupted or the
/// connection ends (status 0).
pub async fn run_with(
    profile: &Profile,
    target: &Target,
    login: &str,
    command: Option<&str>,
    options: &SshOptions,
) -> Result<u32, Error> {
    let remote = RemoteTargets::default();
    let session = Arc::new(session(profile, target, login, remote.clone()).await?);
    start_forwards(&session, &remote, &target.host, &options.forwards).await?;
    if options.no_command {
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = async {
                while !session.is_closed() {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            } => {}
        }
        return Ok(0);
    }
    let mut channel = session.channel_open_session().await?;
    let tty = command.is_none() && std::io::stdin().is_terminal();
    let _raw = if tty {
        let (cols, rows) = terminal_size();
        let term = std::env::var("TERM").unwrap_or_else(|_| "xterm".into());
        channel.request_pty(true, &term, cols, rows, 0, 0, &[]).await?;
        Some(RawMode::enable()?)
    } else {
        None
    };
    match command {
        Some(c) => channel.exec(true, c).await?,
        None => channel.request_shell(true).await?,
    }
    // Standard input goes to the remote side until it ends (then EOF is sent); the task stops
    // with the process once the remote side has closed.
    let mut writer = channel.make_writer();
    let input = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        if tokio::io::copy(&mut stdin, &mut writer).await.is_ok() {
            let _ = writer.shutdown().await;
        }
    });
    let (mut stdout, mut stderr) = (tokio::io::stdout(), tokio::io::stderr());
    let mut status = None;
    // The remote PTY follows the local terminal's size (SIGWINCH).
    let mut winch = if tty {
        Some(tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::window_change(),
        )?)
    } else {
        None
    };
    loop {
        let msg = tokio::select! {
            msg = channel.wait() => msg,
            Some(()) = async {
                match winch.as_mut() {
                    Some(w) => w.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let (cols, rows) = terminal_size();
                channel.window_change(cols, rows, 0, 0).await?;
                continue;
            }
        };
        let Some(msg) = msg else { break };
        match msg {
            ChannelMsg::Data { data } => {
                stdout.write_all(&data).await?;
                stdout.flush().await?;
            }
            ChannelMsg::ExtendedData { data, .. } => {
                stderr.write_all(&data).await?;
                stderr.flush().await?;
            }
            ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    input.abort();
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
    status.ok_or_else(|| Error::NoExitStatus(target.host.clone()))
}

/// One side of `tsh scp`: a local path, or `[login@]host:path` on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScpPath {
    /// A local file or directory.
    Local(std::path::PathBuf),
    /// A file or directory on a node (an empty path: the login's home directory).
    Remote {
        /// The node and login.
        target: Target,
        /// The path there.
        path: String,
    },
}

impl ScpPath {
    /// Parses an argument as OpenSSH's `scp` does: a colon before any slash makes it remote.
    pub fn parse(text: &str) -> Result<ScpPath, Error> {
        match text.split_once(':') {
            Some((host, path)) if !host.contains('/') && !host.is_empty() => {
                let (login, host) = match host.rsplit_once('@') {
                    Some((l, h)) => (Some(l.to_owned()).filter(|l| !l.is_empty()), h),
                    None => (None, host),
                };
                if host.is_empty() {
                    return Err(Error::Scp(format!("{text:?}: no host before ':'")));
                }
                Ok(ScpPath::Remote {
                    target: Target {
                        login,
                        host: host.to_owned(),
                        port: 0,
                    },
                    path: path.to_owned(),
                })
            }
            _ => Ok(ScpPath::Local(text.into())),
        }
    }
}

/// The last component of a path (what a copy into a directory is named).
fn file_name(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or(path)
}

/// The buffer of `tsh scp`'s copies: about one sftp packet's worth of data.
const SCP_BUFFER: usize = 255 * 1024;

/// `tsh scp`: copies one file between here and `target` (logged in as `login`) over the
/// node's `sftp` subsystem; `upload` copies `local` to `remote`, else `remote` to `local`. A
/// directory as the destination receives the file under its own name. Returns the bytes
/// copied.
pub async fn copy(
    profile: &Profile,
    target: &Target,
    login: &str,
    local: &std::path::Path,
    remote: &str,
    upload: bool,
) -> Result<u64, Error> {
    let session = session(profile, target, login, RemoteTargets::default()).await?;
    let channel = session.channel_open_session().await?;
    channel.request_subsystem(true, "sftp").await?;
    let sftp = russh_sftp::client::SftpSession::new(channel.into_stream())
        .await
        .map_err(|source| Error::Sftp {
            what: "starting",
            path: remote.to_owned(),
            source,
        })?;
    let remote = if remote.is_empty() { "." } else { remote };
    let copied = if upload {
        let mut path = remote.to_owned();
        if let Ok(meta) = sftp.metadata(path.clone()).await
            && meta.is_dir()
        {
            let name = local
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| Error::Scp(format!("{}: not a file name", local.display())))?;
            path = format!("{}/{name}", path.trim_end_matches('/'));
        }
        // Large reads, so each sftp write carries as much as a packet holds.
        let mut from = tokio::io::BufReader::with_capacity(SCP_BUFFER, tokio::fs::File::open(local).await?);
        let mut to = sftp.create(path.clone()).await.map_err(|source| Error::Sftp {
            what: "creating",
            path: path.clone(),
            source,
        })?;
        let n = tokio::io::copy_buf(&mut from, &mut to).await?;
        to.shutdown().await?;
        n
    } else {
        let from = sftp.open(remote.to_owned()).await.map_err(|source| Error::Sftp {
            what: "opening",
            path: remote.to_owned(),
            source,
        })?;
        // Large buffers, so each sftp read asks for as much as a packet holds.
        let mut from = tokio::io::BufReader::with_capacity(SCP_BUFFER, from);
        let local = if local.is_dir() {
            local.join(file_name(remote))
        } else {
            local.to_owned()
        };
        let mut to = tokio::fs::File::create(&local).await?;
        let n = tokio::io::copy_buf(&mut from, &mut to).await?;
        to.flush().await?;
        n
    };
    let _ = sftp.close().await;
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
    Ok(copied)
}

/// The local terminal's size (columns, rows), 80x24 when unknown.
fn terminal_size() -> (u32, u32) {
    match rustix::termios::tcgetwinsize(std::io::stdin()) {
        Ok(w) if w.ws_col > 0 && w.ws_row > 0 => (u32::from(w.ws_col), u32::from(w.ws_row)),
        _ => (80, 24),
    }
}

/// The local terminal in raw mode (keys go to the remote shell as typed); restored on drop.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enable() -> Result<RawMode, Error> {
        use rustix::termios::{OptionalActions, tcgetattr, tcsetattr};
        let saved = tcgetattr(std::io::stdin())
            .map_err(|e| Error::Terminal("reading the terminal's settings", e.into()))?;
        let mut raw = saved.clone();
        raw.make_raw();
        tcsetattr(std::io::stdin(), OptionalActions::Now, &raw)
            .map_err(|e| Error::Terminal("setting raw mode", e.into()))?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// `tsh proxy ssh`: copies stdin/stdout to `target`'s SSH Service (OpenSSH `ProxyCommand`).
pub async fn pipe(profile: &Profile, target: &Target, login: &str) -> Result<(), Error> {
    let stream = connect(profile, target, login).await?;
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (mut stdin, mut stdout) = (tokio::io::stdin(), tokio::io::stdout());
    tokio::select! {
        r = tokio::io::copy(&mut stdin, &mut wr) => { r?; }
        r = tokio::io::copy(&mut rd, &mut stdout) => { r?; }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_as_openssh_expands_them() {
        let t = Target::parse("root@node-1:3022").unwrap();
        assert_eq!(
            t,
            Target {
                login: Some("root".into()),
                host: "node-1".into(),
                port: 3022
            }
        );
        let t = Target::parse("node-1").unwrap();
        assert_eq!((t.login, t.host.as_str(), t.port), (None, "node-1", 0));
        assert!(Target::parse("root@").is_err());
        assert!(Target::parse("root@n:x").is_err());
    }

    #[test]
    fn forwards_parse_as_openssh_writes_them() {
        assert_eq!(
            Forward::parse('L', "8080:localhost:80").unwrap(),
            Forward::Local {
                bind: "127.0.0.1".into(),
                port: 8080,
                host: "localhost".into(),
                host_port: 80
            }
        );
        assert_eq!(
            Forward::parse('R', "0.0.0.0:9000:[::1]:22").unwrap(),
            Forward::Remote {
                bind: "0.0.0.0".into(),
                port: 9000,
                host: "::1".into(),
                host_port: 22
            }
        );
        assert_eq!(
            Forward::parse('D', "1080").unwrap(),
            Forward::Dynamic {
                bind: "127.0.0.1".into(),
                port: 1080
            }
        );
        assert!(Forward::parse('L', "8080:localhost").is_err());
        assert!(Forward::parse('D', "x").is_err());
    }

    #[test]
    fn scp_paths_are_remote_with_a_colon_before_any_slash() {
        assert_eq!(
            ScpPath::parse("root@node-1:/tmp/x").unwrap(),
            ScpPath::Remote {
                target: Target {
                    login: Some("root".into()),
                    host: "node-1".into(),
                    port: 0
                },
                path: "/tmp/x".into()
            }
        );
        assert_eq!(ScpPath::parse("./a:b").unwrap(), ScpPath::Local("./a:b".into()));
        assert_eq!(ScpPath::parse("file").unwrap(), ScpPath::Local("file".into()));
        assert_eq!(file_name("/a/b/c.txt"), "c.txt");
    }
}
