//! The firewall tests' network: a namespace whose only way out is an HTTP proxy (tinyproxy with
//! basic auth), shared by the library test (`svc-net/tests/tunnel_firewall.rs`) and the
//! binary test (`svc-bins/tests/e2e_agent.rs`, which includes this file by path).
//!
//! Addresses are private test addresses created here: a veth pair (host 10.231.N.1, agent
//! 10.231.N.2, nothing else routed in the namespace) and a second veth pair kept in the host
//! namespace (10.232.N.1) where the svc proxy listens, reachable from the namespace only through
//! tinyproxy.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::net::IpAddr;
use std::process::Command;

/// The basic-auth user tinyproxy requires.
pub const PROXY_USER: &str = "agentuser";
/// Its password.
pub const PROXY_PASSWORD: &str = "s3cret-pw";

/// The path of a system tool; fails naming the Debian package when it is missing.
pub use svc_testkit::require as tool;

pub fn ip(args: &[&str]) -> std::process::Output {
    Command::new(tool("ip", "iproute2")).args(args).output().unwrap()
}

pub fn ip_ok(args: &[&str]) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespace, veth pair and the proxy's address; removed on drop.
pub struct Net {
    pub ns: String,
    veth: String,
    dummy: String,
    /// The host's end of the namespace's link: where tinyproxy listens.
    pub host_ip: IpAddr,
    /// Where the svc proxy listens: not routed into the namespace.
    pub proxy_ip: IpAddr,
}

impl Net {
    pub fn create() -> Self {
        let n: u8 = rand::random::<u8>() % 250 + 1;
        let tag = format!("{}{n}", std::process::id() % 10000);
        let net = Net {
            ns: format!("svct{tag}"),
            veth: format!("svh{tag}"),
            dummy: format!("svp{tag}"),
            host_ip: format!("10.231.{n}.1").parse().unwrap(),
            proxy_ip: format!("10.232.{n}.1").parse().unwrap(),
        };
        let out = ip(&["netns", "add", &net.ns]);
        assert!(
            out.status.success(),
            "network namespaces are unavailable (`ip netns add` failed: {}); the firewall test \
             needs root and the Debian package iproute2",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let peer = format!("sva{tag}");
        ip_ok(&["link", "add", &net.veth, "type", "veth", "peer", "name", &peer]);
        ip_ok(&["link", "set", &peer, "netns", &net.ns]);
        ip_ok(&["addr", "add", &format!("{}/30", net.host_ip), "dev", &net.veth]);
        ip_ok(&["link", "set", &net.veth, "up"]);
        ip_ok(&[
            "-n",
            &net.ns,
            "addr",
            "add",
            &format!("10.231.{n}.2/30"),
            "dev",
            &peer,
        ]);
        ip_ok(&["-n", &net.ns, "link", "set", &peer, "up"]);
        ip_ok(&["-n", &net.ns, "link", "set", "lo", "up"]);
        // The proxy's address: on a second veth pair kept in the host namespace (no `dummy`
        // module is needed), so nothing routes it into the agent's namespace.
        let dummy_peer = format!("svq{tag}");
        ip_ok(&[
            "link",
            "add",
            &net.dummy,
            "type",
            "veth",
            "peer",
            "name",
            &dummy_peer,
        ]);
        ip_ok(&["addr", "add", &format!("{}/32", net.proxy_ip), "dev", &net.dummy]);
        ip_ok(&["link", "set", &net.dummy, "up"]);
        ip_ok(&["link", "set", &dummy_peer, "up"]);
        net
    }

    /// A command run inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(tool("ip", "iproute2"));
        c.args(["netns", "exec", &self.ns]).arg(program);
        c
    }

    /// Whether the namespace can open a TCP connection to `ip:port` directly.
    pub fn can_reach(&self, ip: IpAddr, port: u16) -> bool {
        self.command("bash")
            .arg("-c")
            .arg(format!("exec 3<>/dev/tcp/{ip}/{port}"))
            .output()
            .unwrap()
            .status
            .success()
    }

    /// The namespace's listening TCP sockets (`ss -l -t -n`), trimmed.
    pub fn listening(&self) -> String {
        let ss = self
            .command("ss")
            .args(["-H", "-l", "-t", "-n"])
            .output()
            .unwrap();
        assert!(ss.status.success());
        String::from_utf8_lossy(&ss.stdout).trim().to_owned()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.dummy]);
        let _ = ip(&["link", "del", &self.veth]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// A running tinyproxy requiring basic auth; killed on drop.
pub struct Tinyproxy {
    proc: svc_testkit::process::Proc,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    pub fn start(listen: IpAddr) -> Self {
        let bin = tool("tinyproxy", "tinyproxy");
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind((listen, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen {listen}\nTimeout 600\nLogLevel Connect\nMaxClients 100\nBasicAuth {PROXY_USER} {PROXY_PASSWORD}\n"
            ),
        )
        .unwrap();
        let proc = svc_testkit::process::Proc::spawn(
            "tinyproxy",
            Command::new(bin).arg("-d").arg("-c").arg(&conf),
            dir.path().join("tinyproxy.log"),
        );
        let addr = std::net::SocketAddr::new(listen, port);
        svc_testkit::wait_until(
            std::time::Duration::from_secs(30),
            &format!("tinyproxy listening on {addr}"),
            || std::net::TcpStream::connect(addr).is_ok(),
        );
        Tinyproxy {
            proc,
            port,
            _dir: dir,
        }
    }

    /// `HTTPS_PROXY` for an agent in the namespace, with the credentials.
    pub fn url(&self, host: IpAddr) -> String {
        format!("http://{PROXY_USER}:{PROXY_PASSWORD}@{host}:{}", self.port)
    }

    pub fn log(&self) -> String {
        self.proc.log()
    }
}
