//! A real `tinyproxy` (Debian package `tinyproxy`) as an HTTP CONNECT proxy requiring basic
//! authentication, the only way out for agents in firewall tests. The configuration is rendered
//! by [`TinyproxyConfig::render`]; the process runs in the foreground (`-d`) with its log (one
//! line per CONNECT) kept for failure messages; killed on drop.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process::Proc;

/// What tinyproxy does.
#[derive(Clone, Debug)]
pub struct TinyproxyConfig {
    /// Where it listens (an IP address: tinyproxy's `Listen` takes no name).
    pub listen: SocketAddr,
    /// The basic-auth user it requires.
    pub user: String,
    /// That user's password (test-only; tinyproxy reads it from its configuration).
    pub password: String,
    /// Ports CONNECT may reach; empty: every port.
    pub connect_ports: Vec<u16>,
}

impl TinyproxyConfig {
    /// Basic auth as `user`/`password` on `listen`, every port allowed.
    pub fn new(listen: SocketAddr, user: &str, password: &str) -> TinyproxyConfig {
        TinyproxyConfig {
            listen,
            user: user.to_owned(),
            password: password.to_owned(),
            connect_ports: Vec::new(),
        }
    }

    /// The configuration file: CONNECTs logged, ten-minute idle timeout (tunnels stay up).
    pub fn render(&self) -> String {
        let mut cfg = format!(
            "Port {}\nListen {}\nTimeout 600\nLogLevel Connect\nMaxClients 200\nBasicAuth {} {}\n",
            self.listen.port(),
            self.listen.ip(),
            self.user,
            self.password
        );
        for port in &self.connect_ports {
            cfg.push_str(&format!("ConnectPort {port}\n"));
        }
        cfg
    }
}

/// A running tinyproxy; killed on drop (its log printed if the test is failing).
pub struct Tinyproxy {
    proc: Proc,
    config: TinyproxyConfig,
    dir: PathBuf,
}

impl Tinyproxy {
    /// Writes `config` and starts tinyproxy; waits (30 s at most) until it accepts
    /// connections. A missing `tinyproxy` fails naming the Debian package.
    pub fn start(config: TinyproxyConfig) -> Tinyproxy {
        let bin = crate::require("tinyproxy", "tinyproxy");
        let dir = crate::temp_dir("tinyproxy");
        let path = dir.join("tinyproxy.conf");
        std::fs::write(&path, config.render()).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        let proc = Proc::spawn(
            format!("tinyproxy at {}", config.listen),
            Command::new(bin).arg("-d").arg("-c").arg(&path),
            dir.join("tinyproxy.log"),
        );
        let mut tiny = Tinyproxy { proc, config, dir };
        let addr = tiny.config.listen;
        crate::wait_until(
            Duration::from_secs(30),
            &format!("tinyproxy listening on {addr}"),
            || {
                if let Some(status) = tiny.proc.exited() {
                    panic!("tinyproxy exited ({status}):\n{}", tiny.proc.log());
                }
                TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
            },
        );
        tiny
    }

    /// Basic auth on a free port of `ip`.
    pub fn start_on(ip: IpAddr, user: &str, password: &str) -> Tinyproxy {
        let port = crate::free_port(&ip.to_string());
        Self::start(TinyproxyConfig::new(SocketAddr::new(ip, port), user, password))
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.config.listen
    }

    /// `HTTPS_PROXY` with the credentials: `http://USER:PASSWORD@IP:PORT`.
    pub fn url(&self) -> String {
        format!(
            "http://{}:{}@{}",
            self.config.user, self.config.password, self.config.listen
        )
    }

    /// What tinyproxy logged so far (one line per CONNECT with `LogLevel Connect`).
    pub fn log(&self) -> String {
        self.proc.log()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn the_configuration_requires_basic_auth() {
        let mut c = TinyproxyConfig::new("10.0.0.1:3128".parse().unwrap(), "u", "p");
        let text = c.render();
        assert!(text.contains("Port 3128\nListen 10.0.0.1\n"), "{text}");
        assert!(text.contains("BasicAuth u p\n"), "{text}");
        assert!(!text.contains("ConnectPort"), "{text}");
        c.connect_ports = vec![443, 3080];
        let text = c.render();
        assert!(text.contains("ConnectPort 443\nConnectPort 3080\n"), "{text}");
    }

    fn connect(proxy: SocketAddr, target: SocketAddr, auth: Option<&str>) -> String {
        let mut s = TcpStream::connect(proxy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = auth {
            req.push_str(&format!("Proxy-Authorization: Basic {auth}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn connects_need_the_credentials() {
        let tiny = Tinyproxy::start_on("127.0.0.1".parse().unwrap(), "user", "pw");
        let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = target.local_addr().unwrap();
        assert!(tiny.url().starts_with("http://user:pw@127.0.0.1:"));
        assert!(connect(tiny.addr(), to, None).contains(" 407"));
        // "user:pw" in base64.
        assert!(connect(tiny.addr(), to, Some("dXNlcjpwdw==")).contains(" 200"));
        crate::wait_until(Duration::from_secs(10), "the CONNECT in tinyproxy's log", || {
            tiny.log().contains(&to.to_string())
        });
    }
}
