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
struct NodeHandler {
    verifier: Arc<Verifier>,
    host: String,
    refused: Arc<std::sync::Mutex<Option<String>>>,
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
}

/// An authenticated SSH session to `target` as `login`, through the profile's proxy.
async fn session(
    profile: &Profile,
    target: &Target,
    login: &str,
) -> Result<russh::client::Handle<NodeHandler>, Error> {
    let (endpoint, identity, verifier) = endpoint(profile, login)?;
    let stream = connect_via_proxy(&endpoint, &identity, &target.host, target.port).await?;
    let refused = Arc::new(std::sync::Mutex::new(None));
    let handler = NodeHandler {
        verifier,
        host: target.host.clone(),
        refused: refused.clone(),
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
    let session = session(profile, target, login).await?;
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
}
