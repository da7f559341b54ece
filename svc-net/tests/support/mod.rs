//! Test support for the dial tests: real proxies (tinyproxy, squid, stunnel) started per test on
//! their own free port and temp dir, killed on drop; a loopback echo target.
#![allow(dead_code, clippy::unwrap_used, unreachable_pub)]

use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

/// Where the test proxies listen. The specification forbids `127.0.0.1` and `localhost` as a
/// proxy host, so proxies use another loopback address.
pub const PROXY_IP: &str = "127.0.0.2";
pub const USER: &str = "alice";
pub const PASSWORD: &str = "Zq8-vL2_pw";
/// The password percent-encoded for a URL (tinyproxy accepts few special characters, so an
/// escaped unreserved one shows the decoding).
pub const PASSWORD_URL: &str = "Zq8%2DvL2_pw";

#[allow(unused_imports)]
pub use svc_testkit::{free_port, require, within};
use svc_testkit::{process::Proc, wait::OutputWithin};

/// How long one step of a test (a connection, a read, an answer) may take: generous for a debug
/// build on a loaded two-core machine, short enough that a hang is reported long before CI's limit.
pub const STEP: Duration = Duration::from_secs(60);

/// Waits (bounded) until `addr` accepts connections.
pub async fn wait_for_port(addr: SocketAddr, what: &str, child: &mut Child, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited before listening on {addr}: {status}; its output:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on {addr} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A tool in its own process group, killed with its group on drop (squid starts helpers, its
/// authenticator); its log is printed if the test fails.
pub struct ProcGuard {
    pub proc: Proc,
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub name: &'static str,
}

impl ProcGuard {
    pub fn addr(&self) -> SocketAddr {
        format!("{PROXY_IP}:{}", self.port).parse().unwrap()
    }

    pub fn log(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(file)).unwrap_or_default()
    }
}

/// Starts `cmd` as `name` in its own process group, output to `log` in `dir`, and waits (bounded)
/// until it listens on `port`.
async fn start(
    name: &'static str,
    cmd: &mut Command,
    dir: tempfile::TempDir,
    log: &str,
    port: u16,
) -> ProcGuard {
    let mut proc = Proc::spawn_group(name, cmd, dir.path().join(log));
    let addr = format!("{PROXY_IP}:{port}").parse().unwrap();
    wait_for_port(addr, name, &mut proc.child, &proc.log.clone()).await;
    ProcGuard {
        proc,
        dir,
        port,
        name,
    }
}

fn tempdir_open() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    // squid drops to the `proxy` user and must read its files and write its logs.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// tinyproxy with `BasicAuth` and the given `ConnectPort`s (none: every port allowed).
pub async fn tinyproxy(connect_ports: &[u16]) -> ProcGuard {
    let bin = require("tinyproxy", "tinyproxy");
    let dir = tempdir_open();
    let port = free_port(PROXY_IP);
    let mut conf = format!(
        "Port {port}\nListen {PROXY_IP}\nTimeout 600\nLogLevel Connect\nMaxClients 200\n\
         BasicAuth {USER} {PASSWORD}\n"
    );
    for p in connect_ports {
        conf.push_str(&format!("ConnectPort {p}\n"));
    }
    let conf_path = dir.path().join("tinyproxy.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-d").arg("-c").arg(&conf_path);
    start("tinyproxy", &mut cmd, dir, "tinyproxy.log", port).await
}

/// squid with basic auth (basic_ncsa_auth, apr1 password file), CONNECT allowed to `443` and
/// `connect_ports`, and names from `hosts` (`name → 127.0.0.1`) resolved from its own hosts file.
pub async fn squid(connect_ports: &[u16], hosts: &[&str]) -> ProcGuard {
    let bin = require("squid", "squid");
    let helper = Path::new("/usr/lib/squid/basic_ncsa_auth");
    assert!(
        helper.exists(),
        "{} is missing: install the Debian package `squid`",
        helper.display()
    );
    let openssl = require("openssl", "openssl");
    let dir = tempdir_open();
    let d = dir.path().display().to_string();
    let hash = Command::new(openssl)
        .args(["passwd", "-apr1", PASSWORD])
        .output_within(STEP, "openssl passwd")
        .unwrap();
    assert!(hash.status.success());
    let hash = String::from_utf8(hash.stdout).unwrap();
    std::fs::write(dir.path().join("passwd"), format!("{USER}:{}\n", hash.trim())).unwrap();
    let hosts_file: String = hosts.iter().map(|h| format!("127.0.0.1 {h}\n")).collect();
    std::fs::write(dir.path().join("hosts"), hosts_file).unwrap();
    let port = free_port(PROXY_IP);
    let ports: Vec<String> = connect_ports.iter().map(u16::to_string).collect();
    let conf = format!(
        "http_port {PROXY_IP}:{port}\n\
         pid_filename none\n\
         cache_log stdio:{d}/cache.log\n\
         access_log stdio:{d}/access.log\n\
         cache deny all\n\
         cache_mem 8 MB\n\
         coredump_dir {d}\n\
         hosts_file {d}/hosts\n\
         dns_nameservers 127.0.0.1\n\
         pinger_enable off\n\
         shutdown_lifetime 0 seconds\n\
         auth_param basic program {} {d}/passwd\n\
         auth_param basic realm svc-test\n\
         acl authed proxy_auth REQUIRED\n\
         acl tunnel_ports port 443 {}\n\
         acl CONNECT method CONNECT\n\
         http_access deny CONNECT !tunnel_ports\n\
         http_access allow authed\n\
         http_access deny all\n",
        helper.display(),
        ports.join(" ")
    );
    let conf_path = dir.path().join("squid.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-N").arg("-f").arg(&conf_path);
    start("squid", &mut cmd, dir, "squid.out", port).await
}

/// A test CA and a server certificate for `PROXY_IP`, as PEM: (ca_cert, server_cert, server_key).
pub fn test_pki() -> (String, String, String) {
    let ca = svc_testkit::pki::TestCa::new("svc test proxy CA");
    let server = ca.server("svc test proxy", &[PROXY_IP]);
    (ca.cert_pem, server.cert_pem, server.key_pem)
}

/// stunnel terminating TLS on its own port and forwarding to `backend` (plain).
pub async fn stunnel(backend: SocketAddr, cert_pem: &str, key_pem: &str) -> ProcGuard {
    let bin = require("stunnel4", "stunnel4");
    let dir = tempdir_open();
    std::fs::write(dir.path().join("cert.pem"), cert_pem).unwrap();
    std::fs::write(dir.path().join("key.pem"), key_pem).unwrap();
    let port = free_port(PROXY_IP);
    let d = dir.path().display();
    let conf = format!(
        "foreground = yes\npid =\ndebug = 5\n[proxy]\naccept = {PROXY_IP}:{port}\n\
         connect = {backend}\ncert = {d}/cert.pem\nkey = {d}/key.pem\n"
    );
    let conf_path = dir.path().join("stunnel.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg(&conf_path);
    start("stunnel", &mut cmd, dir, "stunnel.log", port).await
}

/// A loopback echo server; returns its address.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// Writes `msg`, reads the same number of bytes back.
pub async fn round_trip<S>(stream: &mut S, msg: &[u8]) -> Vec<u8>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    within(STEP, "writing the round-trip message", stream.write_all(msg))
        .await
        .unwrap();
    let mut back = vec![0; msg.len()];
    within(
        STEP,
        &format!("reading {} echoed bytes back", msg.len()),
        stream.read_exact(&mut back),
    )
    .await
    .unwrap();
    back
}

/// A proxy URL for the test proxy with the test credentials.
pub fn proxy_url(scheme: &str, port: u16, user: &str, password_url: Option<&str>) -> String {
    match password_url {
        Some(p) => format!("{scheme}://{user}:{p}@{PROXY_IP}:{port}"),
        None => format!("{scheme}://{PROXY_IP}:{port}"),
    }
}
