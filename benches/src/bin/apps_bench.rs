//! The user path through svc against the same clients direct and through other reverse
//! tunnels, side by side in one run (issue #18's measurement):
//!
//! - `pgbench` (one `SELECT 1` per transaction) to a real PostgreSQL with TLS, through
//!   `tsh proxy db`'s local listener;
//! - `wrk` to nginx `return 200` and a lone HTTP request per new connection, through
//!   `tsh proxy app`'s local listener to a `tcp://` app;
//! - `iperf3`, one stream over a fixed transfer, through `tsh proxy app` to a `tcp://` app, with
//!   the CPU time (utime + stime from `/proc`) each tunnel's processes spent per GB moved.
//!
//! For the new-connection rows it also prints the CPU time of svc's threads per new connection
//! (the cluster's and the local proxies'); `--only` runs a subset of the measurements.
//!
//! Paths, each measured in turn (`--reps` times, medians): direct; rathole 0.5 with its plain TCP
//! transport and with its TLS transport (a throwaway CA and PKCS#12 identity made here);
//! OpenSSH `ssh -N -R` with `-c aes128-gcm@openssh.com` to an `sshd` started here on loopback
//! (throwaway host and user keys); svc with the agent's tunnel on the proxy's single TLS port
//! (multiplex mode) and svc with the tunnel on a separate tunnel port (3024 in production;
//! `proxy_listener_mode: separate`). The two svc clusters (Auth, Proxy, an agent with the
//! Application and Database services behind a reverse tunnel) run in this process on a runtime
//! whose threads are named `svc-cluster`; the local proxies (`tsh proxy app|db` as the CLI wires
//! them) on a runtime whose threads are named `tsh-proxy`, so their CPU time is read apart. A
//! further `tsh proxy app` listener makes a full TLS handshake to the proxy for every connection
//! (resumption off), and another offers ring's default order of cipher suites (AES-256-GCM with
//! SHA-384 first, where svc offers AES-128-GCM with SHA-256 first), for the new-connection rows.
//!
//! Run (release build):
//!
//! ```text
//! cargo run --release -p svc-benches --bin apps_bench -- --secs 5 --reps 3 --conns 300 --mib 2048
//! ```
//!
//! Needs the Debian packages `postgresql` (server and pgbench), `nginx`, `wrk`, `iperf3`,
//! `openssh-server` and `openssh-client`, `openssl`, and rathole (`cargo install rathole`
//! without `--locked`; the binary from `SVC_BENCH_RATHOLE`, `PATH` or `~/.cargo/bin`). As root,
//! PostgreSQL runs as the `postgres` user via `runuser`. A missing tool stops the run with the
//! package to install.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use svc_core::auth::ServedKind;
use svc_core::config::{Config, DbProtocol};
use svc_net::client::{LocalProxy, Multiplexer, ResourceClient, TlsConfigs, bind_local};

struct Args {
    secs: u64,
    reps: usize,
    conns: usize,
    mib: u64,
    /// The measurements to run ([`MEASUREMENTS`]); all when `--only` is not given.
    only: Vec<String>,
}

/// The measurements `--only` selects, in the order they run.
const MEASUREMENTS: [&str; 5] = ["stream", "pgbench", "pgbench-new", "keep-alive", "new-conn"];

impl Args {
    fn runs(&self, measurement: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|m| m == measurement)
    }
}

const USAGE: &str =
    "apps_bench: the svc user path against direct, rathole (plain, TLS) and OpenSSH -R in one run

usage: cargo run --release -p svc-benches --bin apps_bench -- [--secs 5] [--reps 3] [--conns 300] [--mib 2048] [--only LIST]

  --secs   seconds per pgbench/wrk measurement
  --reps   measurements per path (medians are printed)
  --conns  lone HTTP requests on new connections per path (p50/p99)
  --mib    MiB per iperf3 transfer (single stream; CPU per GB is over this transfer)
  --only   comma-separated measurements to run (default: all): stream (iperf3 and CPU per
           GB), pgbench, pgbench-new (-C), keep-alive (wrk), new-conn (wrk with a new
           connection per request, and one connection at a time)

needs: postgresql, nginx, wrk, iperf3, openssh-server, openssh-client, openssl (Debian) and
rathole (cargo install rathole, or SVC_BENCH_RATHOLE=<path>)";

fn args() -> Result<Args> {
    let mut a = Args {
        secs: 5,
        reps: 3,
        conns: 300,
        mib: 2048,
        only: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--secs" => a.secs = value.parse()?,
            "--reps" => a.reps = value.parse()?,
            "--conns" => a.conns = value.parse()?,
            "--mib" => a.mib = value.parse()?,
            "--only" => {
                for m in value.split(',').filter(|m| !m.is_empty()) {
                    if !MEASUREMENTS.contains(&m) {
                        bail!(
                            "--only: unknown measurement {m} (known: {})",
                            MEASUREMENTS.join(", ")
                        );
                    }
                    a.only.push(m.to_owned());
                }
            }
            other => bail!("unknown flag {other}\n\n{USAGE}"),
        }
    }
    Ok(a)
}

fn tool(name: &str, package: &str) -> Result<PathBuf> {
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&dirs)
        .chain(
            std::fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("bin")),
        )
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not installed: apt-get install {package}"))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_listening(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("nothing listens on {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output()?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn as_postgres(bin: &Path) -> Result<Command> {
    let mut c = Command::new(tool("runuser", "util-linux")?);
    c.args(["-u", "postgres", "--"]).arg(bin);
    Ok(c)
}

/// PostgreSQL with TLS on (certificate from a throwaway CA); returns the port and the CA file.
struct Postgres {
    data: PathBuf,
    port: u16,
}

impl Postgres {
    fn start(dir: &Path) -> Result<(Postgres, PathBuf)> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(params, ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])?.signed_by(&key, &ca)?;
        let ca_file = dir.join("db-ca.pem");
        std::fs::write(&ca_file, ca.pem())?;
        let data = dir.join("pg");
        std::fs::create_dir_all(&data)?;
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&data))?;
        run(as_postgres(&tool("initdb", "postgresql")?)?
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data))?;
        std::fs::write(data.join("server.crt"), cert.pem())?;
        std::fs::write(data.join("server.key"), key.serialize_pem())?;
        let port = free_port()?;
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))?;
        write!(
            conf,
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nssl = on\n",
            data.display()
        )?;
        std::fs::write(
            data.join("pg_hba.conf"),
            "hostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\nlocal all all trust\n",
        )?;
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&data))?;
        run(Command::new("chmod").arg("0600").arg(data.join("server.key")))?;
        run(as_postgres(&tool("pg_ctl", "postgresql")?)?
            .args(["-w", "-l"])
            .arg(data.join("log"))
            .arg("-D")
            .arg(&data)
            .arg("start"))?;
        Ok((Postgres { data, port }, ca_file))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Ok(ctl) = tool("pg_ctl", "postgresql")
            && let Ok(mut c) = as_postgres(&ctl)
        {
            let _ = c
                .args(["-m", "immediate", "-D"])
                .arg(&self.data)
                .arg("stop")
                .output();
        }
    }
}

/// nginx answering `ok` on a free port, as one process (`master_process off`): killed on drop,
/// it leaves no worker behind holding the port.
fn nginx(dir: &Path) -> Result<(Killed, u16)> {
    let port = free_port()?;
    let root = dir.join("nginx");
    std::fs::create_dir_all(root.join("tmp"))?;
    let r = root.display();
    let conf = root.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "user root;\nmaster_process off;\ndaemon off;\npid {r}/nginx.pid;\nerror_log {r}/error.log;\nevents {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {r}/tmp/b;\n  proxy_temp_path {r}/tmp/p;\n  fastcgi_temp_path {r}/tmp/f;\n  uwsgi_temp_path {r}/tmp/u;\n  scgi_temp_path {r}/tmp/s;\n  server {{\n    listen 127.0.0.1:{port};\n    location / {{ return 200 'ok'; }}\n  }}\n}}\n"
        ),
    )?;
    let child = Command::new(tool("nginx", "nginx")?)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let k = Killed(child);
    wait_listening(port)?;
    Ok((k, port))
}

/// The rathole binary: `SVC_BENCH_RATHOLE`, else `rathole` on `PATH` or in `~/.cargo/bin`.
fn rathole_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SVC_BENCH_RATHOLE") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("SVC_BENCH_RATHOLE={} is not a file", p.display());
    }
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"));
    std::env::split_paths(&dirs)
        .chain(home)
        .map(|d| d.join("rathole"))
        .find(|p| p.is_file())
        .context("rathole is not installed: `cargo install rathole` (without --locked), or set SVC_BENCH_RATHOLE to its path")
}

/// A tunnel's processes: the public side (rathole's server, `sshd` and its session children)
/// and the far side next to the targets (rathole's client, `ssh`); the public side first.
struct Tunnel {
    procs: Vec<Killed>,
    /// Per target, the port the tunnel serves it on.
    ports: Vec<u16>,
}

/// rathole's server and client forwarding `targets` (name, port), with its plain TCP transport
/// or (`tls`) its TLS transport: a throwaway CA, the server's PKCS#12 identity made with
/// `openssl pkcs12 -export`, the client trusting the CA for `localhost`.
fn rathole(dir: &Path, tag: &str, targets: &[(&str, u16)], tls: bool) -> Result<Tunnel> {
    let bin = rathole_bin()?;
    let control = free_port()?;
    let mut server = format!("[server]\nbind_addr = \"127.0.0.1:{control}\"\n");
    let mut client = format!("[client]\nremote_addr = \"127.0.0.1:{control}\"\n");
    if tls {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        // Distinct subjects: OpenSSL (rathole's native-tls) takes a leaf whose subject equals
        // its issuer's for self-signed and refuses it.
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "svc bench rathole CA");
        let ca = rcgen::CertifiedIssuer::self_signed(params, ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let mut leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])?;
        leaf.distinguished_name
            .push(rcgen::DnType::CommonName, "localhost");
        let cert = leaf.signed_by(&key, &ca)?;
        let (ca_file, cert_file, key_file, pfx) = (
            dir.join(format!("{tag}-ca.pem")),
            dir.join(format!("{tag}-cert.pem")),
            dir.join(format!("{tag}-key.pem")),
            dir.join(format!("{tag}-identity.pfx")),
        );
        std::fs::write(&ca_file, ca.pem())?;
        std::fs::write(&cert_file, cert.pem())?;
        std::fs::write(&key_file, key.serialize_pem())?;
        run(Command::new(tool("openssl", "openssl")?)
            .args(["pkcs12", "-export", "-passout", "pass:bench", "-out"])
            .arg(&pfx)
            .arg("-inkey")
            .arg(&key_file)
            .arg("-in")
            .arg(&cert_file)
            .arg("-certfile")
            .arg(&ca_file))?;
        server.push_str(&format!(
            "[server.transport]\ntype = \"tls\"\n[server.transport.tls]\npkcs12 = \"{}\"\npkcs12_password = \"bench\"\n",
            pfx.display()
        ));
        client.push_str(&format!(
            "[client.transport]\ntype = \"tls\"\n[client.transport.tls]\ntrusted_root = \"{}\"\nhostname = \"localhost\"\n",
            ca_file.display()
        ));
    }
    let mut ports = Vec::new();
    for (name, target) in targets {
        let port = free_port()?;
        ports.push(port);
        server.push_str(&format!(
            "[server.services.{name}]\ntoken = \"bench\"\nbind_addr = \"127.0.0.1:{port}\"\n"
        ));
        client.push_str(&format!(
            "[client.services.{name}]\ntoken = \"bench\"\nlocal_addr = \"127.0.0.1:{target}\"\n"
        ));
    }
    let (server_conf, client_conf) = (
        dir.join(format!("{tag}-server.toml")),
        dir.join(format!("{tag}-client.toml")),
    );
    std::fs::write(&server_conf, server)?;
    std::fs::write(&client_conf, client)?;
    let log = |side: &str| -> Result<Stdio> {
        Ok(std::fs::File::create(dir.join(format!("{tag}-{side}.log")))?.into())
    };
    let spawn = |flag: &str, conf: &Path, side: &str| -> Result<Killed> {
        Ok(Killed(
            Command::new(&bin)
                .arg(flag)
                .arg(conf)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(log(side)?)
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?,
        ))
    };
    let procs = vec![
        spawn("-s", &server_conf, "server")?,
        spawn("-c", &client_conf, "client")?,
    ];
    for port in &ports {
        wait_listening(*port).with_context(|| {
            let read = |side: &str| {
                std::fs::read_to_string(dir.join(format!("{tag}-{side}.log"))).unwrap_or_default()
            };
            format!(
                "rathole ({tag}) did not come up; server log:\n{}\nclient log:\n{}",
                read("server"),
                read("client")
            )
        })?;
    }
    Ok(Tunnel { procs, ports })
}

/// OpenSSH's reverse tunnel: an `sshd` on loopback (throwaway host key, one authorized user
/// key) and `ssh -N -c aes128-gcm@openssh.com -R` forwarding `targets` (ports).
fn openssh(dir: &Path, targets: &[u16]) -> Result<Tunnel> {
    let sshd_bin = tool("sshd", "openssh-server").or_else(|_| {
        let p = PathBuf::from("/usr/sbin/sshd");
        if p.is_file() {
            Ok(p)
        } else {
            bail!("sshd is not installed: apt-get install openssh-server")
        }
    })?;
    let ssh_bin = tool("ssh", "openssh-client")?;
    let keygen = tool("ssh-keygen", "openssh-client")?;
    let ssh_dir = dir.join("ssh");
    std::fs::create_dir_all(&ssh_dir)?;
    let (host_key, user_key) = (ssh_dir.join("host_key"), ssh_dir.join("user_key"));
    for k in [&host_key, &user_key] {
        run(Command::new(&keygen)
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(k))?;
    }
    std::fs::copy(ssh_dir.join("user_key.pub"), ssh_dir.join("authorized_keys"))?;
    let sshd_port = free_port()?;
    let conf = ssh_dir.join("sshd_config");
    std::fs::write(
        &conf,
        format!(
            "ListenAddress 127.0.0.1:{sshd_port}\nHostKey {}\nAuthorizedKeysFile {}\nUsePAM no\nStrictModes no\n\
             PermitRootLogin yes\nPasswordAuthentication no\nPidFile none\nAllowTcpForwarding yes\nGatewayPorts no\n\
             Ciphers aes128-gcm@openssh.com\n",
            host_key.display(),
            ssh_dir.join("authorized_keys").display()
        ),
    )?;
    // sshd's privilege separation directory.
    std::fs::create_dir_all("/run/sshd")?;
    let sshd = Killed(
        Command::new(&sshd_bin)
            .args(["-D", "-e", "-f"])
            .arg(&conf)
            .stderr(std::fs::File::create(ssh_dir.join("sshd.log"))?)
            .spawn()
            .context("starting sshd")?,
    );
    wait_listening(sshd_port)?;
    let mut ports = Vec::new();
    let mut cmd = Command::new(&ssh_bin);
    cmd.args(["-F", "/dev/null", "-N", "-c", "aes128-gcm@openssh.com"])
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ])
        .args(["-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes"])
        .arg("-i")
        .arg(&user_key)
        .args(["-p", &sshd_port.to_string()]);
    for target in targets {
        let port = free_port()?;
        ports.push(port);
        cmd.arg("-R").arg(format!("127.0.0.1:{port}:127.0.0.1:{target}"));
    }
    let ssh = Killed(
        cmd.arg("root@127.0.0.1")
            .stderr(std::fs::File::create(ssh_dir.join("ssh.log"))?)
            .spawn()
            .context("starting ssh")?,
    );
    for port in &ports {
        wait_listening(*port)
            .with_context(|| format!("OpenSSH -R: see sshd.log and ssh.log in {}", ssh_dir.display()))?;
    }
    Ok(Tunnel {
        procs: vec![sshd, ssh],
        ports,
    })
}

/// Clock ticks per second for `/proc` CPU times.
fn clock_ticks() -> Result<f64> {
    let out = run(Command::new(tool("getconf", "libc-bin")?).arg("CLK_TCK"))?;
    Ok(out.trim().parse()?)
}

/// utime + stime (ticks) from one `/proc/.../stat` file, and the process's parent pid.
fn stat_ticks(path: &Path) -> Option<(u64, u32, String)> {
    let s = std::fs::read_to_string(path).ok()?;
    let (head, rest) = s.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state(0) ppid(1) ... utime(11) stime(12).
    let ppid = f.get(1)?.parse().ok()?;
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some((ticks, ppid, comm))
}

/// CPU ticks of `pid` and all its live descendants (sshd's session processes).
fn tree_ticks(pid: u32) -> u64 {
    let procs: Vec<(u32, u64, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let (t, ppid, _) = stat_ticks(&e.path().join("stat"))?;
            Some((p, t, ppid))
        })
        .collect();
    let mut tree = vec![pid];
    let mut total = 0;
    while let Some(p) = tree.pop() {
        for (child, t, ppid) in &procs {
            if *child == p {
                total += t;
            }
            if *ppid == p {
                tree.push(*child);
            }
        }
    }
    total
}

/// CPU ticks of this process's threads whose name starts with `prefix` (a runtime's workers).
fn thread_ticks(prefix: &str) -> u64 {
    std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| stat_ticks(&e.path().join("stat")))
        .filter(|(_, _, comm)| comm.starts_with(prefix))
        .map(|(t, _, _)| t)
        .sum()
}

/// iperf3, one stream from client to server, `mib` MiB: the receiver's Gbit/s. The server
/// takes one test at a time and may still be closing the previous test's connections (their
/// ends cross a tunnel): a "busy" answer is retried for up to 30 s.
fn iperf(port: u16, mib: u64) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let out = loop {
        let out = Command::new(tool("iperf3", "iperf3")?)
            .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-f", "g", "-n"])
            .arg(format!("{mib}M"))
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            break text;
        }
        if !text.contains("busy") || Instant::now() > deadline {
            bail!("iperf3 -c to port {port}: {text}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    out.lines()
        .find(|l| l.trim_end().ends_with("receiver"))
        .and_then(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|w| *w == "Gbits/sec")?;
            f.get(i.checked_sub(1)?)?.parse().ok()
        })
        .with_context(|| format!("no receiver Gbits/sec in iperf3 output: {out}"))
}

/// One HTTP request per new connection, one connection at a time, `n` times: each one's
/// milliseconds (connect, request, whole answer read, close).
fn one_at_a_time(port: u16, n: usize) -> Result<Vec<f64>> {
    use std::io::Read;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)?;
        if !answer.starts_with(b"HTTP/1.1 200") {
            bail!(
                "port {port} answered {:?}",
                String::from_utf8_lossy(&answer[..answer.len().min(80)])
            );
        }
        lat.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(lat)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// pgbench transactions per second (`new_conn`: a new connection per transaction, `-C`).
fn pgbench(script: &Path, conninfo: &str, secs: u64, new_conn: bool) -> Result<f64> {
    let mut cmd = Command::new(tool("pgbench", "postgresql")?);
    cmd.args(["-n", "-c", "1", "-T", &secs.to_string(), "-f"])
        .arg(script)
        .arg(conninfo);
    if new_conn {
        cmd.arg("-C");
    }
    let out = run(&mut cmd)?;
    out.lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no tps in pgbench output: {out}"))
}

/// wrk requests per second and p99 latency (ms) with `conns` keep-alive connections (or
/// `Connection: close`).
fn wrk(port: u16, secs: u64, conns: usize, close: bool) -> Result<(f64, f64)> {
    let mut cmd = Command::new(tool("wrk", "wrk")?);
    cmd.args([
        "--latency",
        "-t",
        "1",
        "-c",
        &conns.to_string(),
        "-d",
        &format!("{secs}s"),
    ]);
    if close {
        cmd.args(["-H", "Connection: close"]);
    }
    cmd.arg(format!("http://127.0.0.1:{port}/"));
    let out = run(&mut cmd)?;
    let rps = out
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no Requests/sec in wrk output: {out}"))?;
    let p99 = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("99%"))
        .and_then(|v| {
            let v = v.trim();
            let (num, scale) = if let Some(n) = v.strip_suffix("us") {
                (n, 1e-3)
            } else if let Some(n) = v.strip_suffix("ms") {
                (n, 1.0)
            } else if let Some(n) = v.strip_suffix('s') {
                (n, 1e3)
            } else {
                return None;
            };
            num.parse::<f64>().ok().map(|x| x * scale)
        })
        .with_context(|| format!("no 99% latency in wrk output: {out}"))?;
    Ok((rps, p99))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Where a probe's clients connect.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Direct,
    Rathole,
    RatholeTls,
    OpenSsh,
    /// svc, the agent's tunnel on the proxy's single TLS port.
    Svc,
    /// svc, the agent's tunnel on the separate tunnel port (3024 in production).
    Svc3024,
    /// svc on the single TLS port, the local proxy without TLS session resumption.
    SvcCold,
    /// svc on the single TLS port, the local proxy making a TLS connection (resumed) per client
    /// connection instead of a stream of its multiplexed connection.
    SvcOwn,
}

/// The paths measured besides [`VIAS`]: what the multiplexed connection changes (every row),
/// and what TLS resumption changes (the new-connection rows).
const EXTRA_VIAS: [Via; 2] = [Via::SvcCold, Via::SvcOwn];

const VIAS: [Via; 6] = [
    Via::Direct,
    Via::Rathole,
    Via::RatholeTls,
    Via::OpenSsh,
    Via::Svc,
    Via::Svc3024,
];

impl Via {
    fn label(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Rathole => "rathole (plain)",
            Via::RatholeTls => "rathole (TLS)",
            Via::OpenSsh => "OpenSSH -R aes128-gcm",
            Via::Svc => "svc, TLS port",
            Via::Svc3024 => "svc, 3024",
            Via::SvcCold => "svc, TLS port, no TLS resumption",
            Via::SvcOwn => "svc, TLS port, a TLS connection per client connection",
        }
    }

    fn is_svc(self) -> bool {
        matches!(self, Via::Svc | Via::Svc3024 | Via::SvcCold | Via::SvcOwn)
    }
}

/// The ports one path serves the three targets on.
#[derive(Clone, Copy)]
struct Ports {
    pg: u16,
    web: u16,
    iperf: u16,
}

/// The targets the paths lead to.
struct Targets<'a> {
    pg: u16,
    ca_file: &'a Path,
    web: u16,
    iperf: u16,
}

/// One svc cluster and its local proxies.
struct Svc {
    running: svc_net::cluster::RunningCluster,
    ports: Ports,
    /// The `tcp://` app's listener without TLS session resumption.
    cold_web: u16,
    /// The local proxies making a TLS connection per client connection (no multiplexing).
    own: Ports,
    warm: TlsConfigs,
    cold: TlsConfigs,
    mux: Multiplexer,
}

/// Starts a cluster (the tunnel on the single TLS port, or with `separate` on its own port), a
/// user, and its local proxies: `tsh proxy db` for PostgreSQL, `tsh proxy app` for the nginx
/// and iperf3 `tcp://` apps, and a second app listener without TLS session resumption.
fn start_svc(
    rt: &tokio::runtime::Runtime,
    local_rt: &tokio::runtime::Runtime,
    dir: &Path,
    separate: bool,
    t: &Targets<'_>,
) -> Result<Svc> {
    let tag = if separate { "svc-3024" } else { "svc-tls" };
    let (mode, extra) = if separate {
        (
            "  proxy_listener_mode: separate\n",
            "  tunnel_listen_addr: 127.0.0.1:0\n  listen_addr: 127.0.0.1:0\n  kube_listen_addr: 127.0.0.1:0\n  postgres_listen_addr: 127.0.0.1:0\n  mysql_listen_addr: 127.0.0.1:0\n  mongo_listen_addr: 127.0.0.1:0\n  redis_listen_addr: 127.0.0.1:0\n",
        )
    } else {
        ("", "")
    };
    let yaml = format!(
        "version: v1\nsvc:\n  data_dir: {}\n  log:\n    severity: warn\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: {tag}.bench.test\n{mode}proxy_service:\n  web_listen_addr: 127.0.0.1:0\n{extra}ssh_service:\n  enabled: false\napp_service:\n  enabled: true\n  apps:\n  - name: web\n    uri: tcp://127.0.0.1:{}\n  - name: iperf\n    uri: tcp://127.0.0.1:{}\ndb_service:\n  enabled: true\n  databases:\n  - name: pg\n    protocol: postgres\n    uri: 127.0.0.1:{}\n    tls:\n      ca_cert_file: {}\n      server_name: localhost\n",
        dir.join(tag).display(),
        t.web,
        t.iperf,
        t.pg,
        t.ca_file.display()
    );
    let config = Config::from_yaml_str_with_hostname(&yaml, "bench")?;
    let (running, client) = rt.block_on(async {
        let running = svc_net::Cluster::from_config(&config).start().await?;
        let admin = svc_net::auth::ClientIdentity::load(
            &running
                .auth
                .as_ref()
                .context("the Auth Service is not running")?
                .admin_identity,
        )?;
        let mut auth = svc_net::auth::AuthClient::connect_with(&admin).await?;
        let password = svc_core::Secret::new("bench-password-1".into());
        auth.create_user("bench", &["access".to_owned()], &[], &password)
            .await?;
        let proxy = running
            .proxy
            .as_ref()
            .context("the proxy is not running")?
            .addrs()
            .web
            .to_string();
        let identity = svc_net::client::login_via_proxy(&proxy, true, None, "bench", &password, None).await?;
        let client = ResourceClient {
            proxy: svc_core::Addr::parse(&proxy)?,
            identity,
            insecure: true,
            extra_ca_pem: None,
            dialer: svc_net::dial::ProxyDialer::from_env()?,
            tls_configs: Default::default(),
            multiplexer: Multiplexer::new(),
        };
        anyhow::Ok((running, client))
    })?;
    // The same local proxies making a TLS connection (resumed) per client connection: what the
    // multiplexed connection buys.
    let own = ResourceClient {
        multiplexer: Multiplexer::disabled(),
        ..client.clone()
    };
    // And one for the app without TLS session resumption either (a full handshake to the proxy
    // per connection): what resumption buys.
    let cold = ResourceClient {
        tls_configs: TlsConfigs::uncached(),
        ..own.clone()
    };
    let (warm, cold_counts) = (own.tls_configs.clone(), cold.tls_configs.clone());
    let mux = client.multiplexer.clone();
    let ports = local_rt.block_on(async {
        let mut ports = Vec::new();
        for (kind, name, protocol, client) in [
            (ServedKind::Db, "pg", Some(DbProtocol::Postgres), &client),
            (ServedKind::App, "web", None, &client),
            (ServedKind::App, "iperf", None, &client),
            (ServedKind::App, "web", None, &cold),
            (ServedKind::Db, "pg", Some(DbProtocol::Postgres), &own),
            (ServedKind::App, "web", None, &own),
            (ServedKind::App, "iperf", None, &own),
        ] {
            let what = LocalProxy {
                kind,
                name: name.into(),
                protocol,
                db_user: None,
                db_name: None,
            };
            let (listener, addr) = bind_local(0).await?;
            ports.push(addr.port());
            tokio::spawn(
                what.serve(listener, client.clone(), Default::default(), |peer, e| {
                    eprintln!("local proxy: connection from {peer}: {e}");
                }),
            );
        }
        anyhow::Ok(ports)
    })?;
    for p in &ports {
        wait_listening(*p)?;
    }
    Ok(Svc {
        running,
        ports: Ports {
            pg: ports[0],
            web: ports[1],
            iperf: ports[2],
        },
        cold_web: ports[3],
        own: Ports {
            pg: ports[4],
            web: ports[5],
            iperf: ports[6],
        },
        warm,
        cold: cold_counts,
        mux,
    })
}

/// A path's measurements over the repetitions (per repetition, one value per unit), or why it
/// failed (printed in the table's cell).
type Cell = std::result::Result<Vec<Vec<f64>>, String>;

/// Per unit, the median over the repetitions.
fn medians(reps: &[Vec<f64>], units: usize) -> Vec<f64> {
    (0..units)
        .map(|j| median(reps.iter().map(|r| r[j]).collect()))
        .collect()
}

fn main() -> Result<()> {
    let a = args()?;
    for (name, package) in [
        ("pgbench", "postgresql"),
        ("wrk", "wrk"),
        ("iperf3", "iperf3"),
        ("ssh", "openssh-client"),
        ("openssl", "openssl"),
        ("nginx", "nginx"),
    ] {
        tool(name, package)?;
    }
    rathole_bin()?;
    let ticks = clock_ticks()?;
    let dir = tempfile::tempdir()?;
    run(Command::new("chmod").arg("0755").arg(dir.path()))?;
    let (pg, ca_file) = Postgres::start(dir.path())?;
    let (_nginx, app_port) = nginx(dir.path())?;
    let iperf_port = free_port()?;
    let _iperf = Killed(
        Command::new(tool("iperf3", "iperf3")?)
            .args(["-s", "-B", "127.0.0.1", "-p", &iperf_port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 -s")?,
    );
    wait_listening(iperf_port)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("svc-cluster")
        .enable_all()
        .build()?;
    let local_rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("tsh-proxy")
        .enable_all()
        .build()?;

    let targets = [("pg", pg.port), ("web", app_port), ("iperf", iperf_port)];
    let rat = rathole(dir.path(), "rathole-plain", &targets, false)?;
    let rat_tls = rathole(dir.path(), "rathole-tls", &targets, true)?;
    let ssh = openssh(dir.path(), &[pg.port, app_port, iperf_port])?;
    let t = Targets {
        pg: pg.port,
        ca_file: &ca_file,
        web: app_port,
        iperf: iperf_port,
    };
    let svc = start_svc(&rt, &local_rt, dir.path(), false, &t)?;
    let svc3024 = start_svc(&rt, &local_rt, dir.path(), true, &t)?;
    let tunnel_ports = |t: &Tunnel| Ports {
        pg: t.ports[0],
        web: t.ports[1],
        iperf: t.ports[2],
    };
    let ports_for = |via: Via| match via {
        Via::Direct => Ports {
            pg: pg.port,
            web: app_port,
            iperf: iperf_port,
        },
        Via::Rathole => tunnel_ports(&rat),
        Via::RatholeTls => tunnel_ports(&rat_tls),
        Via::OpenSsh => tunnel_ports(&ssh),
        Via::Svc => svc.ports,
        Via::Svc3024 => svc3024.ports,
        Via::SvcCold => Ports {
            web: svc.cold_web,
            ..svc.ports
        },
        Via::SvcOwn => svc.own,
    };
    // CPU ticks of a path's two sides so far: (public side, far side), named by `sides`.
    let cpu = |via: Via| -> (u64, u64) {
        let tree = |t: &Tunnel| (tree_ticks(t.procs[0].0.id()), tree_ticks(t.procs[1].0.id()));
        match via {
            Via::Direct => (0, 0),
            Via::Rathole => tree(&rat),
            Via::RatholeTls => tree(&rat_tls),
            Via::OpenSsh => tree(&ssh),
            Via::Svc | Via::Svc3024 | Via::SvcCold | Via::SvcOwn => {
                (thread_ticks("svc-cluster"), thread_ticks("tsh-proxy"))
            }
        }
    };
    let sides = |via: Via| match via {
        Via::Direct => ("–", "–"),
        Via::Rathole | Via::RatholeTls => ("rathole server", "rathole client"),
        Via::OpenSsh => ("sshd", "ssh -R"),
        Via::Svc | Via::Svc3024 | Via::SvcCold | Via::SvcOwn => {
            ("proxy + agent + Auth (in-process)", "tsh proxy app")
        }
    };

    let script = dir.path().join("select1.sql");
    std::fs::write(&script, "SELECT 1;\n")?;
    let db_for = |via: Via| {
        // Through the local proxy the client speaks plain to `tsh proxy db`; elsewhere TLS
        // end to end to PostgreSQL.
        let ssl = if via.is_svc() { "disable" } else { "require" };
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode={ssl}",
            ports_for(via).pg
        )
    };
    // Warm-up: the first connection through a tunnel opens its paths.
    for via in VIAS.iter().copied().chain(EXTRA_VIAS) {
        let p = ports_for(via);
        pgbench(&script, &db_for(via), 1, false)
            .with_context(|| format!("warm-up pgbench via {}", via.label()))?;
        wrk(p.web, 1, 1, false).with_context(|| format!("warm-up wrk via {}", via.label()))?;
        iperf(p.iperf, 16).with_context(|| format!("warm-up iperf3 via {}", via.label()))?;
    }

    let uptime = run(&mut Command::new("uptime")).unwrap_or_default();
    println!("uptime at start: {}", uptime.trim());
    println!();

    type Probe<'a> = Box<dyn Fn(Via) -> Result<Vec<f64>> + 'a>;
    // (name, units of the probe's values, probe, with the no-resumption listener too).
    let cases: Vec<(&str, &str, Vec<&str>, Probe<'_>, bool)> = vec![
        (
            "stream",
            "single stream (iperf3)",
            vec!["Gbit/s"],
            Box::new(|via| Ok(vec![iperf(ports_for(via).iperf, a.mib)?])),
            false,
        ),
        (
            "pgbench",
            "pgbench `SELECT 1`, 1 client, one connection",
            vec!["tps"],
            Box::new(|via| Ok(vec![pgbench(&script, &db_for(via), a.secs, false)?])),
            false,
        ),
        (
            "pgbench-new",
            "pgbench `SELECT 1`, 1 client, new connection per transaction (-C)",
            vec!["tps"],
            Box::new(|via| Ok(vec![pgbench(&script, &db_for(via), a.secs, true)?])),
            false,
        ),
        (
            "keep-alive",
            "wrk to nginx, 10 keep-alive connections (req/s, p99)",
            vec!["req/s", "ms"],
            Box::new(|via| {
                let (r, p) = wrk(ports_for(via).web, a.secs, 10, false)?;
                Ok(vec![r, p])
            }),
            false,
        ),
        (
            "new-conn",
            "wrk to nginx, new connection per request (req/s, p99)",
            vec!["req/s", "ms"],
            Box::new(|via| {
                let (r, p) = wrk(ports_for(via).web, a.secs, 10, true)?;
                Ok(vec![r, p])
            }),
            true,
        ),
    ];
    let (warm_full, warm_resumed) = (svc.warm.full_handshakes(), svc.warm.resumed_handshakes());
    let mut header: Vec<&str> = VIAS.iter().map(|v| v.label()).collect();
    header.extend([
        "svc TLS port / rathole plain",
        "svc 3024 / rathole plain",
        "svc TLS port, a TLS connection per client connection, no TLS resumption",
        "svc TLS port, a TLS connection per client connection",
    ]);
    println!("| measurement | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(header.len()));
    // CPU ticks spent (public side, far side) during the iperf3 transfers, per path.
    let mut cpu_spent: Vec<(Via, u64, u64)> = Vec::new();
    // CPU ticks spent (cluster, local proxies) and connections made, per svc path, during the
    // new-connection wrk runs.
    let mut conn_cpu: Vec<(Via, u64, u64, f64)> = Vec::new();
    for (key, name, units, probe, cold_too) in &cases {
        if !a.runs(key) {
            continue;
        }
        let mut cells: Vec<Cell> = vec![Ok(Vec::new()); VIAS.len()];
        let mut extra: Vec<Cell> = vec![Ok(Vec::new()); EXTRA_VIAS.len()];
        let targets: Vec<Via> = VIAS
            .iter()
            .copied()
            .chain(
                EXTRA_VIAS
                    .iter()
                    .copied()
                    .filter(|v| *cold_too || *v == Via::SvcOwn),
            )
            .collect();
        for _ in 0..a.reps {
            for via in &targets {
                let cell = match via {
                    v if EXTRA_VIAS.contains(v) => {
                        &mut extra[EXTRA_VIAS.iter().position(|x| x == v).unwrap_or(0)]
                    }
                    v => &mut cells[VIAS.iter().position(|x| x == v).unwrap_or(0)],
                };
                let Ok(done) = cell else {
                    continue;
                };
                let before = cpu(*via);
                match probe(*via) {
                    Ok(v) => {
                        if *key == "stream" {
                            let after = cpu(*via);
                            cpu_spent.push((*via, after.0 - before.0, after.1 - before.1));
                        }
                        if *key == "new-conn" && via.is_svc() {
                            let after = cpu(*via);
                            let conns = v.first().copied().unwrap_or(0.0) * a.secs as f64;
                            conn_cpu.push((*via, after.0 - before.0, after.1 - before.1, conns));
                        }
                        done.push(v);
                    }
                    Err(e) => {
                        eprintln!("{name} via {}: {e:#}", via.label());
                        *cell = Err("failed (see stderr)".to_owned());
                    }
                }
            }
        }
        let fmt = |c: &Cell| -> String {
            match c {
                Ok(reps) if !reps.is_empty() => medians(reps, units.len())
                    .iter()
                    .zip(units)
                    .map(|(x, u)| {
                        if *u == "Gbit/s" || *u == "ms" {
                            format!("{x:.2} {u}")
                        } else {
                            format!("{x:.0} {u}")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                Ok(_) => "–".to_owned(),
                Err(e) => e.clone(),
            }
        };
        let first = |c: &Cell| match c {
            Ok(reps) if !reps.is_empty() => Some(medians(reps, 1)[0]),
            _ => None,
        };
        let ratio = |k: usize| match (first(&cells[k]), first(&cells[1])) {
            (Some(x), Some(r)) => format!("{:.2}", x / r),
            _ => "–".to_owned(),
        };
        let mut row: Vec<String> = cells.iter().map(fmt).collect();
        row.push(ratio(4));
        row.push(ratio(5));
        row.extend(extra.iter().map(fmt));
        println!("| {name} | {} |", row.join(" | "));
    }
    if a.runs("new-conn") {
        // One connection at a time: the set-up latency a user sees, in alternating rounds.
        let all: Vec<Via> = VIAS.iter().copied().chain(EXTRA_VIAS).collect();
        let rounds = a.reps.max(1);
        let mut lat: Vec<Vec<f64>> = vec![Vec::new(); all.len()];
        for round in 0..rounds {
            let n = a.conns / rounds + usize::from(round < a.conns % rounds);
            for (via, l) in all.iter().zip(lat.iter_mut()) {
                l.extend(
                    one_at_a_time(ports_for(*via).web, n)
                        .with_context(|| format!("one at a time via {}", via.label()))?,
                );
            }
        }
        println!();
        println!(
            "HTTP request on a new connection, one at a time ({} connections per path): p50 / p99 ms",
            a.conns
        );
        println!();
        println!(
            "| {} |",
            all.iter().map(|v| v.label()).collect::<Vec<_>>().join(" | ")
        );
        println!("|{}", "---|".repeat(all.len()));
        let cells: Vec<String> = lat
            .iter_mut()
            .map(|l| format!("{:.3} / {:.3}", pct(l, 0.5), pct(l, 0.99)))
            .collect();
        println!("| {} |", cells.join(" | "));
    }
    if !conn_cpu.is_empty() {
        println!();
        println!(
            "CPU per new connection through svc (wrk, a new connection per request; utime + stime of the threads from /proc over all repetitions):"
        );
        println!();
        println!("| path | proxy + agent + Auth (in-process), µs | tsh proxy app, µs | both, µs |");
        println!("|---|---|---|---|");
        for via in VIAS.iter().chain(EXTRA_VIAS.iter()) {
            let spent: Vec<_> = conn_cpu.iter().filter(|c| c.0 == *via).collect();
            let conns: f64 = spent.iter().map(|c| c.3).sum();
            if spent.is_empty() || conns <= 0.0 {
                continue;
            }
            let per = |t: u64| t as f64 / ticks / conns * 1e6;
            let cluster = per(spent.iter().map(|c| c.1).sum());
            let local = per(spent.iter().map(|c| c.2).sum());
            println!(
                "| {} | {cluster:.0} | {local:.0} | {:.0} |",
                via.label(),
                cluster + local
            );
        }
    }
    if !cpu_spent.is_empty() {
        println!();
        println!(
            "CPU seconds per GB moved by iperf3 ({} MiB per transfer, up to {} transfers per path; utime + stime from /proc):",
            a.mib, a.reps
        );
        println!();
        println!("| path | public side | CPU s/GB | far side | CPU s/GB | total CPU s/GB |");
        println!("|---|---|---|---|---|---|");
        for via in VIAS.iter().skip(1) {
            let spent: Vec<&(Via, u64, u64)> = cpu_spent.iter().filter(|c| c.0 == *via).collect();
            if spent.is_empty() {
                continue;
            }
            let gb = (spent.len() as u64 * (a.mib << 20)) as f64 / 1e9;
            let public = spent.iter().map(|c| c.1).sum::<u64>() as f64 / ticks / gb;
            let far = spent.iter().map(|c| c.2).sum::<u64>() as f64 / ticks / gb;
            let (ps, fs) = sides(*via);
            println!(
                "| {} | {ps} | {public:.2} | {fs} | {far:.2} | {:.2} |",
                via.label(),
                public + far
            );
        }
    }
    println!();
    println!(
        "TLS handshakes to the proxy (TLS port cluster, a TLS connection per client connection): with resumption {} full, {} resumed (the measured part: {} full, {} resumed); without resumption {} full, {} resumed",
        svc.warm.full_handshakes(),
        svc.warm.resumed_handshakes(),
        svc.warm.full_handshakes() - warm_full,
        svc.warm.resumed_handshakes() - warm_resumed,
        svc.cold.full_handshakes(),
        svc.cold.resumed_handshakes()
    );
    println!(
        "multiplexed (TLS port cluster): {} streams over {} connections",
        svc.mux.streams_opened(),
        svc.mux.connections_made()
    );
    let uptime = run(&mut Command::new("uptime")).unwrap_or_default();
    println!("uptime at end: {}", uptime.trim());
    rt.block_on(async {
        svc.running.shutdown().await;
        svc3024.running.shutdown().await;
    });
    Ok(())
}
