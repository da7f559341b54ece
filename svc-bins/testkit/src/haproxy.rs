//! A real `haproxy` (Debian package `haproxy`) as the load balancer in front of several
//! backends, in TCP mode: the configuration is rendered by [`HaproxyConfig::render`], checked
//! with `haproxy -c` before the start, and the process runs in the foreground with its log
//! (one line per connection) kept for failure messages; killed on drop.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::Proc;
use crate::wait::OutputWithin;

/// What the load balancer does.
#[derive(Clone, Debug)]
pub struct HaproxyConfig {
    /// The address clients connect to (round robin over every backend).
    pub listen: SocketAddr,
    /// The backends, in order (named `b0`, `b1`, …).
    pub backends: Vec<SocketAddr>,
    /// Extra frontends reaching one backend each: `(listen address, backend index)`, for a
    /// path through the load balancer to a chosen backend.
    pub pinned: Vec<(SocketAddr, usize)>,
    /// Send a PROXY protocol v2 header to the backends (`send-proxy-v2`), health checks
    /// included.
    pub send_proxy_v2: bool,
    /// The interval of the TCP health checks; one failed check takes a backend out, one
    /// passing check brings it back.
    pub check_interval: Duration,
}

impl HaproxyConfig {
    /// Round robin over `backends` at `listen`, PROXY v2 on, health checks every 300 ms.
    pub fn new(listen: SocketAddr, backends: Vec<SocketAddr>) -> HaproxyConfig {
        HaproxyConfig {
            listen,
            backends,
            pinned: Vec::new(),
            send_proxy_v2: true,
            check_interval: Duration::from_millis(300),
        }
    }

    /// The configuration file: TCP mode, long client and server timeouts (sessions stay open),
    /// connection failures retried on another backend (`option redispatch`), logs to standard
    /// error.
    pub fn render(&self) -> String {
        let proxy = if self.send_proxy_v2 {
            " send-proxy-v2 check-send-proxy"
        } else {
            ""
        };
        let inter = self.check_interval.as_millis().max(1);
        let server = |i: usize, addr: &SocketAddr| {
            format!("  server b{i} {addr}{proxy} check inter {inter}ms fall 1 rise 1\n")
        };
        let mut cfg = String::from(
            "global\n  maxconn 2000\n  log stderr format raw local0 info\n\
             defaults\n  mode tcp\n  log global\n  option tcplog\n  timeout connect 2s\n  \
             timeout client 1h\n  timeout server 1h\n  retries 3\n  option redispatch\n",
        );
        cfg.push_str(&format!(
            "frontend lb\n  bind {}\n  default_backend all\n",
            self.listen
        ));
        cfg.push_str("backend all\n  balance roundrobin\n");
        for (i, addr) in self.backends.iter().enumerate() {
            cfg.push_str(&server(i, addr));
        }
        for (listen, i) in &self.pinned {
            let addr = self.backends.get(*i).unwrap_or_else(|| {
                panic!(
                    "pinned frontend {listen}: no backend {i} (of {})",
                    self.backends.len()
                )
            });
            cfg.push_str(&format!(
                "frontend pin{i}\n  bind {listen}\n  default_backend only{i}\nbackend only{i}\n"
            ));
            cfg.push_str(&server(*i, addr));
        }
        cfg
    }
}

/// A running haproxy; killed on drop (its log printed if the test is failing).
pub struct Haproxy {
    proc: Proc,
    config: HaproxyConfig,
    dir: PathBuf,
}

impl Haproxy {
    /// Writes `config`, checks it with `haproxy -c` (a refusal fails the test with haproxy's
    /// message) and starts haproxy; waits (30 s at most) until every frontend accepts
    /// connections. A missing `haproxy` fails naming the Debian package.
    pub fn start(config: HaproxyConfig) -> Haproxy {
        let bin = crate::require("haproxy", "haproxy");
        let dir = crate::temp_dir("haproxy");
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, config.render()).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        check(&bin, &path);
        let proc = Proc::spawn(
            format!("haproxy at {}", config.listen),
            Command::new(&bin).arg("-db").arg("-f").arg(&path),
            dir.join("haproxy.log"),
        );
        let mut lb = Haproxy { proc, config, dir };
        let mut fronts = vec![lb.config.listen];
        fronts.extend(lb.config.pinned.iter().map(|(a, _)| *a));
        crate::wait_until(
            Duration::from_secs(30),
            &format!("haproxy listening on {fronts:?}"),
            || {
                if let Some(status) = lb.proc.exited() {
                    panic!("haproxy exited ({status}):\n{}", lb.proc.log());
                }
                fronts
                    .iter()
                    .all(|a| TcpStream::connect_timeout(a, Duration::from_secs(1)).is_ok())
            },
        );
        lb
    }

    /// The load-balanced address.
    pub fn addr(&self) -> SocketAddr {
        self.config.listen
    }

    /// The configuration it runs.
    pub fn config(&self) -> &HaproxyConfig {
        &self.config
    }

    /// What haproxy logged so far (one line per connection, health-check changes).
    pub fn log(&self) -> String {
        self.proc.log()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `haproxy -c -f PATH`: fails the test with haproxy's own message when it refuses the file.
pub fn check(bin: &Path, path: &Path) {
    let out = Command::new(bin)
        .arg("-c")
        .arg("-f")
        .arg(path)
        .output_within(Duration::from_secs(30), "haproxy -c")
        .unwrap_or_else(|e| panic!("running {} -c: {e}", bin.display()));
    assert!(
        out.status.success(),
        "haproxy refused its configuration {}:\n{}{}\n--- configuration ---\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(path).unwrap_or_default()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn config() -> HaproxyConfig {
        let mut c = HaproxyConfig::new(addr(4000), vec![addr(4001), addr(4002), addr(4003)]);
        c.pinned = vec![(addr(4100), 2)];
        c
    }

    #[test]
    fn every_backend_gets_proxy_v2_and_health_checks() {
        let text = config().render();
        assert!(text.contains("mode tcp"), "{text}");
        assert!(text.contains("bind 127.0.0.1:4000\n"), "{text}");
        for (i, port) in [4001, 4002, 4003].iter().enumerate() {
            assert!(
                text.contains(&format!(
                    "server b{i} 127.0.0.1:{port} send-proxy-v2 check-send-proxy check inter 300ms fall 1 rise 1\n"
                )),
                "{text}"
            );
        }
        assert!(text.contains("option redispatch"), "{text}");
        // The pinned frontend reaches backend 2 only.
        let pinned = text.split("frontend pin2").nth(1).unwrap();
        assert!(pinned.contains("bind 127.0.0.1:4100"), "{text}");
        assert!(pinned.contains("server b2 127.0.0.1:4003"), "{text}");
        assert!(!pinned.contains("4001") && !pinned.contains("4002"), "{text}");
    }

    #[test]
    fn without_proxy_v2_no_header_is_sent() {
        let mut c = config();
        c.send_proxy_v2 = false;
        assert!(!c.render().contains("send-proxy"));
    }

    #[test]
    fn haproxy_accepts_the_rendered_configuration() {
        let bin = crate::require("haproxy", "haproxy");
        let dir = crate::temp_dir("haproxy-check");
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, config().render()).unwrap();
        check(&bin, &path);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    #[should_panic(expected = "haproxy refused its configuration")]
    fn a_refused_configuration_fails_with_haproxys_message() {
        let bin = crate::require("haproxy", "haproxy");
        let dir = crate::temp_dir("haproxy-bad");
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, "frontend x\n  bind nowhere:notaport\n").unwrap();
        let checked = std::panic::catch_unwind(|| check(&bin, &path));
        let _ = std::fs::remove_dir_all(dir);
        if let Err(panic) = checked {
            std::panic::resume_unwind(panic);
        }
    }

    #[test]
    fn connections_are_spread_over_the_backends() {
        let backends: Vec<std::net::TcpListener> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs = backends.iter().map(|l| l.local_addr().unwrap()).collect();
        let mut config = HaproxyConfig::new(addr(crate::free_port("127.0.0.1")), addrs);
        config.send_proxy_v2 = false;
        let lb = Haproxy::start(config);
        for l in &backends {
            l.set_nonblocking(true).unwrap();
        }
        let mut reached = [false, false];
        crate::wait_until(Duration::from_secs(30), "both backends reached", || {
            let _c = TcpStream::connect(lb.addr());
            std::thread::sleep(Duration::from_millis(50));
            for (i, l) in backends.iter().enumerate() {
                // Health checks connect too; any accepted connection counts.
                while l.accept().is_ok() {
                    reached[i] = true;
                }
            }
            reached.iter().all(|r| *r)
        });
    }
}
