//! Real resources and clients for the end-to-end tests of the resource services: a `socat`
//! echo server (desktop host), nginx over TLS (Kubernetes API server), a test CA, per-user
//! `tsh` sessions and `tsh proxy`, and `curl` on the proxy's Kubernetes route.
#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::wait::{self, STEP};
use super::{Cluster, TSH};

/// The password the tests give every user.
pub const PASSWORD: &str = "correct-horse-battery";

/// Fails naming the Debian package when a tool is missing.
pub use svc_testkit::require;

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    svc_testkit::free_port("127.0.0.1")
}

/// Waits until something accepts on `port` (readiness, bounded).
pub fn wait_listening(port: u16, what: &str) {
    wait::wait_until(
        Duration::from_secs(30),
        &format!("{what} listening on {port}"),
        || TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A test CA and a server certificate for `localhost`/127.0.0.1 (PEM: ca, cert, key).
pub fn test_ca() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "e2e database CA");
    let ca = rcgen::CertifiedIssuer::self_signed(params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// `socat` echoing every connection back: the desktop host.
pub fn echo_server() -> (Proc, u16) {
    let port = free_port();
    let child = Command::new(require("socat", "socat"))
        .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
        .arg("EXEC:cat")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let proc = Proc(child);
    wait_listening(port, "socat");
    (proc, port)
}

/// A `tsh` session of its own (`SVC_HOME`) for one user.
pub struct User {
    /// The user's `SVC_HOME`.
    pub home: PathBuf,
}

impl User {
    pub fn login(cluster: &Cluster, name: &str) -> User {
        let home = cluster.path().join(format!("home-{name}"));
        let out = Command::new(TSH)
            .args([
                "login",
                &format!("--proxy={}", cluster.web_addr),
                &format!("--user={name}"),
                "--insecure",
            ])
            .env("SVC_HOME", &home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                c.stdin
                    .take()
                    .unwrap()
                    .write_all(format!("{PASSWORD}\n").as_bytes())?;
                Ok(wait::output_within(c, STEP, &format!("tsh login {name}")))
            })
            .unwrap();
        assert!(
            out.status.success(),
            "tsh login {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        User { home }
    }

    /// `tsh ARGS`, which must succeed: its standard output.
    pub fn tsh(&self, args: &[&str]) -> String {
        let out = wait::run_within(
            Command::new(TSH)
                .args(args)
                .env("SVC_HOME", &self.home)
                .env_remove("RUST_LOG"),
            STEP,
            &format!("tsh {}", args.join(" ")),
        )
        .unwrap();
        assert!(
            out.status.success(),
            "tsh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `tsh proxy KIND NAME --port 0`: waits for the printed address. `Err` is tsh's stderr
    /// when it exits instead.
    pub fn proxy(&self, kind: &str, name: &str) -> Result<(Proc, u16, PathBuf), String> {
        self.proxy_with(kind, name, &[])
    }

    /// [`proxy`](Self::proxy) with more arguments (`--db-user alice`).
    pub fn proxy_with(&self, kind: &str, name: &str, extra: &[&str]) -> Result<(Proc, u16, PathBuf), String> {
        let stderr_file = self
            .home
            .join(format!("tsh-proxy-{kind}-{name}{}.stderr", extra.join("")));
        let mut child = Command::new(TSH)
            .args(["proxy", kind, name, "--port", "0"])
            .args(extra)
            .env("SVC_HOME", &self.home)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_file).unwrap())
            .spawn()
            .unwrap();
        let first = wait::first_line(child.stdout.take().unwrap(), STEP, |line| Some(line.to_owned()));
        let line = match first {
            Ok(line) => line,
            Err(why) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "tsh proxy {kind} {name} printed no address ({why}): {}",
                    std::fs::read_to_string(&stderr_file).unwrap_or_default()
                ));
            }
        };
        let port = line
            .rsplit_once(':')
            .and_then(|(_, p)| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected tsh output: {line}"));
        Ok((Proc(child), port, stderr_file))
    }
}

/// A stand-in Kubernetes API server ([`fake_api_server`] with a fresh test CA) and the files a
/// `kubernetes_service` needs to reach it: its CA bundle and the agent's token file (written
/// with a trailing newline, as Kubernetes mounts it).
pub struct KubeApi {
    _nginx: Proc,
    /// The HTTPS port on 127.0.0.1.
    pub port: u16,
    /// The CA that signed the server's certificate (`kubernetes_service.ca_file`).
    pub ca_file: PathBuf,
    /// The agent's bearer token (`kubernetes_service.token_file`).
    pub token_file: PathBuf,
}

impl KubeApi {
    /// Starts it in `dir`, accepting only `token`.
    pub fn start(dir: &Path, token: &str) -> KubeApi {
        let (ca, cert, key) = test_ca();
        let (ca_file, cert_file, key_file) =
            (dir.join("ca.pem"), dir.join("api.pem"), dir.join("api-key.pem"));
        std::fs::write(&ca_file, ca).unwrap();
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let (nginx, port) = fake_api_server(dir, &cert_file, &key_file, token);
        KubeApi {
            _nginx: nginx,
            port,
            ca_file,
            token_file,
        }
    }
}

/// nginx over TLS standing in for the Kubernetes API server: 401 unless the agent's bearer
/// token arrives; otherwise echoes the impersonation headers and the path as JSON. One process
/// (`master_process off`): killed on drop, it leaves no worker behind holding the port.
pub fn fake_api_server(dir: &Path, cert: &Path, key: &Path, token: &str) -> (Proc, u16) {
    let nginx = require("nginx", "nginx");
    let port = free_port();
    let root = dir.join("nginx");
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    let conf = root.join("nginx.conf");
    let r = root.display();
    std::fs::write(
        &conf,
        format!(
            "user root;\nmaster_process off;\ndaemon off;\npid {r}/nginx.pid;\nerror_log {r}/error.log;\nevents {{}}\n\
http {{\n  access_log off;\n  client_body_temp_path {r}/tmp/body;\n  proxy_temp_path {r}/tmp/proxy;\n  fastcgi_temp_path {r}/tmp/fastcgi;\n  uwsgi_temp_path {r}/tmp/uwsgi;\n  scgi_temp_path {r}/tmp/scgi;\n\
  server {{\n    listen 127.0.0.1:{port} ssl;\n    ssl_certificate {};\n    ssl_certificate_key {};\n    default_type application/json;\n\
    location / {{\n      if ($http_authorization != \"Bearer {token}\") {{ return 401 '{{\"kind\":\"Status\",\"message\":\"bad token\"}}'; }}\n\
      return 200 '{{\"user\":\"$http_impersonate_user\",\"group\":\"$http_impersonate_group\",\"path\":\"$request_uri\"}}';\n    }}\n  }}\n}}\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let child = Command::new(nginx)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let proc = Proc(child);
    wait_listening(port, "nginx");
    (proc, port)
}

/// `curl` to the proxy's Kubernetes route with the user's certificate (from the tsh profile),
/// trying to smuggle its own credentials and impersonation: (HTTP status, body).
pub fn kube_curl(cluster: &Cluster, user: &User, path: &str) -> (String, String) {
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(user.home.join("profile.json")).unwrap()).unwrap();
    let cert = user.home.join("user-cert.pem");
    let key = user.home.join("user-key.pem");
    std::fs::write(&cert, profile["identity"]["tls_cert_pem"].as_str().unwrap()).unwrap();
    std::fs::write(&key, profile["identity"]["tls_key_pem"].as_str().unwrap()).unwrap();
    let port = cluster.web_addr.rsplit_once(':').unwrap().1;
    let host = "kube-svc-proxy-alpn.e2e.test";
    let mut curl = Command::new(require("curl", "curl"));
    curl.args(["-sS", "-k", "--max-time", "30", "-w", "\n%{http_code}"])
        .arg("--resolve")
        .arg(format!("{host}:{port}:127.0.0.1"))
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .args([
            "-H",
            "Authorization: Bearer stolen",
            "-H",
            "Impersonate-User: system:admin",
        ])
        .arg(format!("https://{host}:{port}{path}"));
    let out = wait::run_within(&mut curl, STEP, &format!("curl {path} via the kube proxy")).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.to_owned(), body.to_owned())
}
