//! Test support for the tunnel tests: a cluster's CAs and credentials straight from
//! `CertAuthority`, an in-process proxy (tunnel server + SSH entry) on `127.0.0.1:0`, in-process
//! agents running the SSH Service, and an SSH client that runs commands through the proxy.
#![allow(dead_code, clippy::unwrap_used, unreachable_pub)]

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use base64::Engine;
use rcgen::PublicKeyData;
use russh::{
    ChannelMsg,
    keys::{Certificate, PrivateKey, PublicKeyOrCertificate, ssh_key::private::Ed25519Keypair},
};
use svc_core::{
    Addr, Version,
    config::ListenerMode,
    identity::{CertAuthority, HostCertRequest, IdentityKind, SystemRole, UserCertRequest, Verifier},
    proxy_env::ProxyEnv,
};
use svc_net::{
    agent::ssh::{SshServer, SshServerConfig},
    client::{ProxyEndpoint, SshIdentity, connect_via_proxy},
    dial::ProxyDialer,
    proxy::{
        ProxyBuilder, ProxySettings, RunningProxy,
        ssh::{ProxySsh, ProxySshConfig},
    },
    route::alpn,
    tls::{ServerIdentity, TlsSource},
    tunnel::{AgentConfig, Backoff, RunningAgent, Tunables, TunnelAgent, TunnelServer, TunnelServerConfig},
};

pub const CLUSTER: &str = "tunnel.test";

/// How long one step of a test (a tunnel coming up, a command's answer, a shutdown) may take:
/// generous for a debug build on a loaded two-core machine, short enough that a hang is reported
/// long before CI's limit.
pub const STEP: Duration = Duration::from_secs(60);

/// A deadline for anything a test awaits: `fut.within("what should happen").await` fails the
/// test naming it when it has not happened after [`STEP`].
pub trait Within: std::future::Future + Sized {
    fn within(self, what: &str) -> impl std::future::Future<Output = Self::Output> {
        let what = what.to_owned();
        async move {
            tokio::time::timeout(STEP, self)
                .await
                .unwrap_or_else(|_| panic!("{what} did not happen within {STEP:?}"))
        }
    }
}

impl<F: std::future::Future> Within for F {}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

pub fn ssh_key() -> PrivateKey {
    PrivateKey::from(Ed25519Keypair::from_seed(&rand::random::<[u8; 32]>()))
}

/// A host's SSH credentials.
#[derive(Clone)]
pub struct HostCreds {
    pub host_id: String,
    pub node_name: String,
    pub key: PrivateKey,
    pub cert: Certificate,
}

pub struct Cluster {
    pub host_ca: CertAuthority,
    pub user_ca: CertAuthority,
    pub verifier: Arc<Verifier>,
    pub dir: tempfile::TempDir,
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new()
    }
}

impl Cluster {
    pub fn new() -> Self {
        let now = SystemTime::now();
        let ttl = Duration::from_secs(86400);
        let host_ca = CertAuthority::generate(IdentityKind::Host, CLUSTER, now, ttl).unwrap();
        let user_ca = CertAuthority::generate(IdentityKind::User, CLUSTER, now, ttl).unwrap();
        let verifier = Arc::new(Verifier::new(CLUSTER, [host_ca.trusted(), user_ca.trusted()]).unwrap());
        Self {
            host_ca,
            user_ca,
            verifier,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn host_at(&self, roles: &[SystemRole], node: &str, now: SystemTime, ttl: Duration) -> HostCreds {
        let uuid = uuid::Uuid::new_v4();
        let key = ssh_key();
        let req = HostCertRequest {
            host_uuid: uuid,
            node_name: node.into(),
            roles: roles.to_vec(),
            additional_names: vec![],
            ttl,
        };
        let cert = self.host_ca.sign_host_ssh(&req, key.public_key(), now).unwrap();
        HostCreds {
            host_id: svc_core::identity::host_id(&uuid, CLUSTER),
            node_name: node.into(),
            key,
            cert,
        }
    }

    pub fn host(&self, roles: &[SystemRole], node: &str) -> HostCreds {
        self.host_at(roles, node, SystemTime::now(), Duration::from_secs(3600))
    }

    pub fn user(&self, username: &str, logins: &[&str]) -> SshIdentity {
        let key = ssh_key();
        let req = UserCertRequest {
            username: username.into(),
            roles: vec!["access".into()],
            logins: logins.iter().map(|s| s.to_string()).collect(),
            ttl: Duration::from_secs(3600),
            db_route: None,
            ssh_permits: Default::default(),
        };
        let cert = self
            .user_ca
            .sign_user_ssh(&req, key.public_key(), SystemTime::now())
            .unwrap();
        SshIdentity {
            key: Arc::new(key),
            cert,
            login: logins.first().copied().unwrap_or("root").into(),
        }
    }

    /// The proxy's web certificate, signed by the host CA (so agents trust it through the CA),
    /// naming `ips`; written as files for `TlsSource::Files`.
    pub fn proxy_tls(&self, ips: &[IpAddr]) -> TlsSource {
        let key = rcgen::KeyPair::generate().unwrap();
        let req = HostCertRequest {
            host_uuid: uuid::Uuid::new_v4(),
            node_name: "proxy".into(),
            roles: vec![SystemRole::Proxy],
            additional_names: ips
                .iter()
                .map(|ip| ip.to_string())
                .chain(["localhost".into()])
                .collect(),
            ttl: Duration::from_secs(3600),
        };
        let der = self
            .host_ca
            .sign_host_x509(&req, &key.subject_public_key_info(), SystemTime::now())
            .unwrap();
        let name = uuid::Uuid::new_v4();
        let cert = self.dir.path().join(format!("{name}-cert.pem"));
        let keyf = self.dir.path().join(format!("{name}-key.pem"));
        std::fs::write(&cert, pem("CERTIFICATE", der.as_ref())).unwrap();
        std::fs::write(&keyf, key.serialize_pem()).unwrap();
        TlsSource::Files { cert, key: keyf }
    }
}

pub fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Heartbeats every second, offline after four missed: fast enough for the tests, and a stall
/// of the whole machine of 2 s or more does not mark a live agent offline.
pub fn fast_tunables() -> Tunables {
    Tunables::default().with_keepalive(Duration::from_secs(1), 4)
}

pub struct ProxyOpts {
    pub separate: bool,
    pub ip: IpAddr,
    pub web_port: u16,
    pub tunnel_port: u16,
    pub ssh_port: u16,
    pub tunables: Tunables,
    pub version: Version,
    /// The SSH entry's node authorizer; `None`: [`RouteByName`].
    pub authorizer: Option<Arc<dyn svc_net::ssh::NodeAuthorizer>>,
    /// The accept loop's limits on every listener.
    pub listen: svc_net::listen::ListenOptions,
    /// The public web address the ping advertises (a load balancer in front of several proxies).
    pub public_addr: Option<Addr>,
    /// Sources whose PROXY protocol headers are honoured.
    pub trusted: Vec<ipnet::IpNet>,
    /// The tunnel server's places for handshakes (`None`: its default).
    pub max_handshakes: Option<usize>,
    /// Whether the tunnel server answers agents' pings (off: as proxies that predate them).
    pub answer_pings: bool,
}

impl Default for ProxyOpts {
    fn default() -> Self {
        Self {
            separate: false,
            ip: "127.0.0.1".parse().unwrap(),
            web_port: 0,
            tunnel_port: 0,
            ssh_port: 0,
            tunables: fast_tunables(),
            version: "17.0.0".parse().unwrap(),
            authorizer: None,
            listen: svc_net::listen::ListenOptions::default().with_drain_timeout(Duration::from_secs(2)),
            public_addr: None,
            trusted: Vec::new(),
            max_handshakes: None,
            answer_pings: true,
        }
    }
}

pub struct TestProxy {
    pub running: RunningProxy,
    pub tunnel: TunnelServer,
    pub creds: HostCreds,
    pub web: SocketAddr,
    pub ssh: Option<SocketAddr>,
    pub tunnel_addr: Option<SocketAddr>,
    pub tls: TlsSource,
}

impl TestProxy {
    /// Where clients connect for SSH: the SSH port (separate mode) or the web port (TLS).
    pub fn ssh_endpoint(&self, cluster: &Cluster) -> ProxyEndpoint {
        let (addr, tls) = match self.ssh {
            Some(a) => (a, false),
            None => (self.web, true),
        };
        ProxyEndpoint {
            addr: Addr::from(addr),
            tls,
            verifier: cluster.verifier.clone(),
            extra_ca_pem: None,
            dialer: direct_dialer(),
            timeout: Duration::from_secs(30),
        }
    }

    pub async fn shutdown(self) {
        self.running.shutdown().await;
    }
}

pub fn direct_dialer() -> ProxyDialer {
    ProxyDialer::builder(ProxyEnv::default()).build().unwrap()
}

/// Starts a proxy with the tunnel server and the SSH entry registered on every path.
pub async fn start_proxy(cluster: &Cluster, opts: ProxyOpts) -> TestProxy {
    start_proxy_with(cluster, opts, None, None).await
}

pub async fn start_proxy_with(
    cluster: &Cluster,
    opts: ProxyOpts,
    creds: Option<HostCreds>,
    tls: Option<TlsSource>,
) -> TestProxy {
    let creds = creds.unwrap_or_else(|| cluster.host(&[SystemRole::Proxy], "proxy"));
    let tls = tls.unwrap_or_else(|| cluster.proxy_tls(&[opts.ip, "127.0.0.1".parse().unwrap()]));
    let identity = ServerIdentity::load(&tls, &[]).unwrap();
    let mut tunnel_config = TunnelServerConfig::new(
        opts.version.clone(),
        creds.key.clone(),
        creds.cert.clone(),
        cluster.verifier.clone(),
    )
    .with_tls(identity.server_config(&[alpn::REVERSE_TUNNEL]).unwrap())
    .with_tunables(opts.tunables.clone())
    .with_drain_timeout(opts.listen.drain_timeout)
    .with_answer_pings(opts.answer_pings);
    if let Some(max) = opts.max_handshakes {
        tunnel_config = tunnel_config.with_max_handshakes(max);
    }
    let tunnel = TunnelServer::new(tunnel_config);
    let mut ssh_config = ProxySshConfig::new(
        creds.key.clone(),
        creds.cert.clone(),
        cluster.verifier.clone(),
        tunnel.dialer(),
        opts.authorizer.clone().unwrap_or_else(|| Arc::new(RouteByName)),
    )
    .with_tls(identity.server_config(&[alpn::PROXY_SSH]).unwrap());
    ssh_config.tunables = opts.tunables.clone();
    let ssh = ProxySsh::new(ssh_config);
    let mut settings = ProxySettings::default();
    settings.ping.cluster_name = CLUSTER.into();
    settings.ping.listener_mode = if opts.separate {
        ListenerMode::Separate
    } else {
        ListenerMode::Multiplex
    };
    let addr = |port| Addr::from(SocketAddr::new(opts.ip, port));
    settings.ping.web_listen_addr = addr(opts.web_port);
    settings.ping.tunnel_listen_addr = addr(opts.tunnel_port);
    settings.ping.ssh_listen_addr = addr(opts.ssh_port);
    settings.tls = tls.clone();
    settings.listen = opts.listen.clone();
    settings.ping.web_public_addr = opts.public_addr.clone();
    settings.trusted_proxy_networks = opts.trusted.clone();
    let running = ProxyBuilder::new(settings)
        .with_version(opts.version.clone())
        .tunnel(tunnel.plain_service())
        .route(alpn::REVERSE_TUNNEL, tunnel.tls_service())
        .ssh(ssh.plain_service())
        .route(alpn::PROXY_SSH, ssh.tls_service())
        .bind()
        .await
        .unwrap();
    let web = running.addrs().web;
    let ssh_addr = running.addrs().get("ssh_listen_addr");
    let tunnel_addr = running.addrs().get("tunnel_listen_addr");
    TestProxy {
        running,
        tunnel,
        creds,
        web,
        ssh: ssh_addr,
        tunnel_addr,
        tls,
    }
}

pub fn agent_config(
    cluster: &Cluster,
    proxy_web: SocketAddr,
    creds: &HostCreds,
    version: &str,
) -> AgentConfig {
    AgentConfig::new(
        Addr::from(proxy_web),
        creds.host_id.clone(),
        creds.key.clone(),
        creds.cert.clone(),
        cluster.verifier.clone(),
        direct_dialer(),
    )
    .with_version(version.parse().unwrap())
    .with_tunables(fast_tunables())
    .with_backoff(Backoff::new(
        Duration::from_millis(100),
        Duration::from_millis(800),
    ))
}

/// An in-process agent running the SSH Service behind its tunnel.
pub fn start_agent(cluster: &Cluster, proxy_web: SocketAddr, creds: &HostCreds) -> RunningAgent {
    start_agent_with(agent_config(cluster, proxy_web, creds, "17.0.0"), cluster, creds)
}

pub fn start_agent_with(config: AgentConfig, cluster: &Cluster, creds: &HostCreds) -> RunningAgent {
    let ssh = SshServer::new(SshServerConfig::new(
        creds.key.clone(),
        creds.cert.clone(),
        cluster.verifier.clone(),
        creds.host_id.clone(),
        Arc::new(RouteByName),
    ));
    TunnelAgent::new(config, ssh.dial_service()).unwrap().spawn()
}

/// A russh client that checks the node's host certificate with the host CA as `tsh ssh` does:
/// role `node`, naming the host asked for (`Verifier::verify_node_host_ssh`).
pub struct NodeClient {
    pub verifier: Arc<Verifier>,
    /// The host the client asked for.
    pub host: String,
    /// The host ID of the certificate accepted.
    pub seen_host: Arc<Mutex<Option<String>>>,
    /// Why a certificate was refused.
    pub refused: Arc<Mutex<Option<String>>>,
}

impl NodeClient {
    pub fn new(verifier: Arc<Verifier>, host: &str) -> Self {
        Self {
            verifier,
            host: host.to_owned(),
            seen_host: Arc::default(),
            refused: Arc::default(),
        }
    }
}

impl russh::client::Handler for NodeClient {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::Certificate(cert) = key else {
            return Ok(false);
        };
        match self
            .verifier
            .verify_node_host_ssh(cert, SystemTime::now(), &self.host)
        {
            Ok(host) => {
                *self.seen_host.lock().unwrap() = Some(host.host_id);
                Ok(true)
            }
            Err(e) => {
                *self.refused.lock().unwrap() = Some(e.to_string());
                Ok(false)
            }
        }
    }
}

pub type NodeSession = russh::client::Handle<NodeClient>;

/// An SSH session to `node` through the proxy, authenticated as `user`.
pub async fn node_session(
    proxy: &TestProxy,
    cluster: &Cluster,
    user: &SshIdentity,
    node: &str,
) -> NodeSession {
    let stream = connect_via_proxy(&proxy.ssh_endpoint(cluster), user, node, 0)
        .within(&format!("a connection to {node} through the proxy"))
        .await
        .unwrap();
    let handler = NodeClient::new(cluster.verifier.clone(), node);
    let mut session = russh::client::connect_stream(
        Arc::new(svc_net::ssh::client_config(&Tunables::default())),
        stream,
        handler,
    )
    .within(&format!("the SSH handshake with {node}"))
    .await
    .unwrap();
    let auth = session
        .authenticate_openssh_cert(user.login.clone(), user.key.clone(), user.cert.clone())
        .within(&format!("{node} answering the certificate authentication"))
        .await
        .unwrap();
    assert!(auth.success(), "the node refused the user certificate");
    session
}

/// Output of a command.
#[derive(Debug, Default)]
pub struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: Option<u32>,
}

impl Output {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

pub async fn exec(session: &NodeSession, cmd: &str) -> Output {
    async {
        let mut ch = session.channel_open_session().await.unwrap();
        ch.exec(true, cmd).await.unwrap();
        let mut out = Output::default();
        while let Some(msg) = ch.wait().await {
            match msg {
                ChannelMsg::Data { data } => out.stdout.extend_from_slice(&data),
                ChannelMsg::ExtendedData { data, .. } => out.stderr.extend_from_slice(&data),
                ChannelMsg::ExitStatus { exit_status } => out.status = Some(exit_status),
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        out
    }
    .within(&format!("`{cmd}` running to its channel's close"))
    .await
}

/// Runs `cmd` on `node` through the proxy in a fresh connection.
pub async fn ssh_exec(proxy: &TestProxy, cluster: &Cluster, node: &str, cmd: &str) -> Output {
    let user = cluster.user("alice", &["root"]);
    let session = node_session(proxy, cluster, &user, node).await;
    let out = exec(&session, cmd).await;
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
    out
}

/// A tracing writer that keeps everything logged, for asserting on log lines.
#[derive(Clone, Default)]
pub struct CapturedLogs(pub Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Waits up to 10 s for a line matching `pred` and returns it. A server logs what it did
    /// after the client saw it happen (a connection is closed, then the reason logged), so a
    /// line is awaited, never read at once. Panics with `what` and everything logged.
    #[allow(dead_code)]
    pub async fn wait_for_line(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.text();
            if let Some(line) = text.lines().find(|l| pred(l)) {
                return line.to_owned();
            }
            if std::time::Instant::now() >= deadline {
                panic!("no log line within 10 s: {what}\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLogs {
    type Writer = CapturedLogs;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

// Not every test including this module uses them.
#[allow(unused_imports)]
pub use svc_testkit::{
    process::{Proc, example_bin},
    require,
};

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

impl Cluster {
    /// A credentials directory for the example programs: the CAs' public halves and the
    /// cluster name.
    pub fn creds_dir(&self) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("cluster"), CLUSTER).unwrap();
        for (name, ca) in [("host_ca", &self.host_ca), ("user_ca", &self.user_ca)] {
            let t = ca.trusted();
            std::fs::write(p.join(format!("{name}.pem")), t.tls_cert_pem()).unwrap();
            std::fs::write(p.join(format!("{name}.pub")), t.ssh_authorized_key().unwrap()).unwrap();
        }
        dir
    }

    /// `creds_dir` plus an agent's host identity (`tunnel_agent`).
    pub fn host_creds_dir(&self, creds: &HostCreds) -> tempfile::TempDir {
        let dir = self.creds_dir();
        let p = dir.path();
        std::fs::write(p.join("host_id"), &creds.host_id).unwrap();
        write_private(
            &p.join("key"),
            &creds.key.to_openssh(ssh_key::LineEnding::LF).unwrap(),
        );
        std::fs::write(p.join("key-cert.pub"), creds.cert.to_openssh().unwrap()).unwrap();
        dir
    }

    /// `creds_dir` plus a user's key, certificate and login (`proxy_command`, OpenSSH).
    pub fn user_creds_dir(&self, user: &SshIdentity) -> tempfile::TempDir {
        let dir = self.creds_dir();
        let p = dir.path();
        std::fs::write(p.join("login"), &user.login).unwrap();
        write_private(
            &p.join("key"),
            &user.key.to_openssh(ssh_key::LineEnding::LF).unwrap(),
        );
        std::fs::write(p.join("key-cert.pub"), user.cert.to_openssh().unwrap()).unwrap();
        dir
    }
}

/// The tunnel tests are about moving bytes, not RBAC (the Auth Service's rule is tested in
/// svc-core and end to end in svc-bins): this authorizer lets every session through and routes
/// by the name the client gave, as the tunnel registry resolves it.
pub struct RouteByName;

impl svc_net::ssh::NodeAuthorizer for RouteByName {
    fn authorize(
        self: Arc<Self>,
        _user_cert: russh::keys::Certificate,
        node: String,
        _login: String,
    ) -> svc_net::ssh::NodeDecisionFuture {
        Box::pin(async move {
            let mut resource =
                svc_core::auth::ServedResource::new(svc_core::auth::ServedKind::Node, node.clone());
            resource.protocol = "ssh".into();
            Ok(svc_core::auth::ResourceRoute {
                server_id: node.clone(),
                hostname: node,
                resource,
            })
        })
    }
}
