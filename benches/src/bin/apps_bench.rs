//! Database and application access through the proxy against the same clients direct, in one
//! run: `pgbench` (one `SELECT 1` per transaction) to a real PostgreSQL with TLS, direct
//! (`sslmode=require`) and through `tsh proxy db`'s local listener; `wrk` to nginx
//! `return 200`, direct and through `tsh proxy app`'s local listener.
//!
//! The cluster (Auth, Proxy, an agent with the Application and Database services behind a
//! reverse tunnel) and the two local proxies run in this process, as `svc start` and
//! `tsh proxy` wire them. Targets alternate; each is measured `--reps` times; medians and the
//! proxied/direct ratio are printed as a Markdown table.
//!
//! The same clients also run through rathole 0.5 (plain TCP transport: its server and client
//! forward the two targets' ports) in the same run, as a baseline for a reverse tunnel, and
//! through a second `tsh proxy app` listener that makes a full TLS handshake to the proxy for
//! every connection (TLS session resumption off, as local proxies did before), so the
//! resumption's effect shows in the same run. One connection at a time (an HTTP request on a
//! new connection) gives the user path's set-up latency, p50 and p99. The local proxies'
//! TLS handshakes to the proxy (full and resumed) are counted and printed.
//!
//! Run: `cargo run --release -p svc-benches --bin apps_bench -- [--secs 5] [--reps 3]
//! [--conns 300]`. Needs the Debian packages `postgresql` (server and pgbench), `nginx` and
//! `wrk`, and rathole (`cargo install rathole`; the binary from `PATH`, `~/.cargo/bin` or the
//! `SVC_BENCH_RATHOLE` environment variable); as root, PostgreSQL runs as the `postgres` user
//! via `runuser`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use svc_core::auth::ServedKind;
use svc_core::config::{Config, DbProtocol};
use svc_net::client::{LocalProxy, ResourceClient, TlsConfigs, bind_local};

struct Args {
    secs: u64,
    reps: usize,
    conns: usize,
}

fn args() -> Result<Args> {
    let mut a = Args {
        secs: 5,
        reps: 3,
        conns: 300,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--secs" => a.secs = value.parse()?,
            "--reps" => a.reps = value.parse()?,
            "--conns" => a.conns = value.parse()?,
            other => bail!("unknown flag {other}; expected --secs, --reps, --conns"),
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

fn nginx(dir: &Path) -> Result<(Killed, u16)> {
    let port = free_port()?;
    let root = dir.join("nginx");
    std::fs::create_dir_all(root.join("tmp"))?;
    let r = root.display();
    let conf = root.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "user root;\nworker_processes 1;\ndaemon off;\npid {r}/nginx.pid;\nerror_log {r}/error.log;\nevents {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {r}/tmp/b;\n  proxy_temp_path {r}/tmp/p;\n  fastcgi_temp_path {r}/tmp/f;\n  uwsgi_temp_path {r}/tmp/u;\n  scgi_temp_path {r}/tmp/s;\n  server {{\n    listen 127.0.0.1:{port};\n    location / {{ return 200 'ok'; }}\n  }}\n}}\n"
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

/// rathole's server and client (plain TCP transport) forwarding `targets` (name, port);
/// returns the processes and, per target, the port rathole's server serves it on.
fn rathole(dir: &Path, targets: &[(&str, u16)]) -> Result<(Vec<Killed>, Vec<u16>)> {
    let bin = rathole_bin()?;
    let control = free_port()?;
    let mut server = format!("[server]\nbind_addr = \"127.0.0.1:{control}\"\n");
    let mut client = format!("[client]\nremote_addr = \"127.0.0.1:{control}\"\n");
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
    let (server_conf, client_conf) = (dir.join("rathole-server.toml"), dir.join("rathole-client.toml"));
    std::fs::write(&server_conf, server)?;
    std::fs::write(&client_conf, client)?;
    let spawn = |flag: &str, conf: &Path| -> Result<Killed> {
        Ok(Killed(
            Command::new(&bin)
                .arg(flag)
                .arg(conf)
                .env("RUST_LOG", "error")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?,
        ))
    };
    let procs = vec![spawn("-s", &server_conf)?, spawn("-c", &client_conf)?];
    for port in &ports {
        wait_listening(*port)?;
    }
    Ok((procs, ports))
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

/// wrk requests per second with `conns` keep-alive connections (or `Connection: close`).
fn wrk(port: u16, secs: u64, conns: usize, close: bool) -> Result<f64> {
    let mut cmd = Command::new(tool("wrk", "wrk")?);
    cmd.args(["-t", "1", "-c", &conns.to_string(), "-d", &format!("{secs}s")]);
    if close {
        cmd.args(["-H", "Connection: close"]);
    }
    cmd.arg(format!("http://127.0.0.1:{port}/"));
    let out = run(&mut cmd)?;
    out.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no Requests/sec in wrk output: {out}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let a = args()?;
    let dir = tempfile::tempdir()?;
    run(Command::new("chmod").arg("0755").arg(dir.path()))?;
    let (pg, ca_file) = Postgres::start(dir.path())?;
    let (_nginx, app_port) = nginx(dir.path())?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;

    let yaml = format!(
        "version: v1\nsvc:\n  data_dir: {}\n  log:\n    severity: warn\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: bench.test\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\napp_service:\n  enabled: true\n  apps:\n  - name: web\n    uri: http://127.0.0.1:{app_port}\ndb_service:\n  enabled: true\n  databases:\n  - name: pg\n    protocol: postgres\n    uri: 127.0.0.1:{}\n    tls:\n      ca_cert_file: {}\n      server_name: localhost\n",
        dir.path().join("data").display(),
        pg.port,
        ca_file.display()
    );
    let config = Config::from_yaml_str_with_hostname(&yaml, "bench")?;
    let (db_port, web_port, cold_port) = (free_port()?, free_port()?, free_port()?);
    let (_rathole, rathole_ports) = rathole(dir.path(), &[("pg", pg.port), ("web", app_port)])?;
    let (rathole_db_port, rathole_web_port) = (rathole_ports[0], rathole_ports[1]);
    let (running, warm, cold) = rt.block_on(async {
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
        };
        // The same local proxy for the app without TLS session resumption (a full handshake
        // to the proxy per connection): the comparison for what resumption buys.
        let cold = ResourceClient {
            tls_configs: TlsConfigs::uncached(),
            ..client.clone()
        };
        let (warm, cold_counts) = (client.tls_configs.clone(), cold.tls_configs.clone());
        for (kind, name, protocol, port, client) in [
            (ServedKind::Db, "pg", Some(DbProtocol::Postgres), db_port, &client),
            (ServedKind::App, "web", None, web_port, &client),
            (ServedKind::App, "web", None, cold_port, &cold),
        ] {
            let what = LocalProxy {
                kind,
                name: name.into(),
                protocol,
                db_user: None,
                db_name: None,
            };
            let (listener, _) = bind_local(port).await?;
            tokio::spawn(
                what.serve(listener, client.clone(), Default::default(), |peer, e| {
                    eprintln!("local proxy: connection from {peer}: {e}");
                }),
            );
        }
        anyhow::Ok((running, warm, cold_counts))
    })?;
    wait_listening(db_port)?;
    wait_listening(web_port)?;
    wait_listening(cold_port)?;

    let script = dir.path().join("select1.sql");
    std::fs::write(&script, "SELECT 1;\n")?;
    let direct_db = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=require",
        pg.port
    );
    let proxied_db = format!("host=127.0.0.1 port={db_port} user=postgres dbname=postgres sslmode=disable");
    let rathole_db =
        format!("host=127.0.0.1 port={rathole_db_port} user=postgres dbname=postgres sslmode=require");
    // Warm-up: the first connection through the tunnel opens the agent's paths.
    pgbench(&script, &proxied_db, 1, false)?;
    pgbench(&script, &rathole_db, 1, false)?;
    wrk(web_port, 1, 1, false)?;
    wrk(cold_port, 1, 1, false)?;
    wrk(rathole_web_port, 1, 1, false)?;

    // Where a probe's clients connect: direct, through rathole, through svc's local proxy, and
    // through the local proxy without TLS session resumption.
    #[derive(Clone, Copy)]
    enum Via {
        Direct,
        Rathole,
        Svc,
        SvcCold,
    }
    let db_for = |via: Via| match via {
        Via::Direct => direct_db.clone(),
        Via::Rathole => rathole_db.clone(),
        Via::Svc | Via::SvcCold => proxied_db.clone(),
    };
    let web_for = |via: Via| match via {
        Via::Direct => app_port,
        Via::Rathole => rathole_web_port,
        Via::Svc => web_port,
        Via::SvcCold => cold_port,
    };
    type Probe<'a> = Box<dyn Fn(Via) -> Result<f64> + 'a>;
    // (name, unit, probe, whether the no-resumption listener applies).
    let cases: Vec<(&str, &str, Probe<'_>, bool)> = vec![
        (
            "pgbench `SELECT 1`, 1 client, one connection",
            "tps",
            Box::new(|via| pgbench(&script, &db_for(via), a.secs, false)),
            false,
        ),
        (
            "pgbench `SELECT 1`, 1 client, new connection per transaction (-C)",
            "tps",
            Box::new(|via| pgbench(&script, &db_for(via), a.secs, true)),
            false,
        ),
        (
            "wrk to nginx, 10 keep-alive connections",
            "req/s",
            Box::new(|via| wrk(web_for(via), a.secs, 10, false)),
            false,
        ),
        (
            "wrk to nginx, new connection per request",
            "req/s",
            Box::new(|via| wrk(web_for(via), a.secs, 10, true)),
            true,
        ),
    ];
    let (warm_full, warm_resumed) = (warm.full_handshakes(), warm.resumed_handshakes());
    println!(
        "| path | direct | rathole (plain) | through svc | svc / direct | svc / rathole | svc without TLS resumption |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, unit, probe, cold_too) in &cases {
        let (mut direct, mut rat, mut svc, mut cold) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.reps {
            direct.push(probe(Via::Direct)?);
            rat.push(probe(Via::Rathole)?);
            svc.push(probe(Via::Svc)?);
            if *cold_too {
                cold.push(probe(Via::SvcCold)?);
            }
        }
        let (d, r, p) = (median(direct), median(rat), median(svc));
        let c = if cold.is_empty() {
            "–".to_owned()
        } else {
            format!("{:.0} {unit}", median(cold))
        };
        println!(
            "| {name} | {d:.0} {unit} | {r:.0} {unit} | {p:.0} {unit} | {:.2} | {:.2} | {c} |",
            p / d,
            p / r
        );
    }
    // One connection at a time: the set-up latency a user sees, in alternating rounds.
    let rounds = a.reps.max(1);
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(); 4];
    let vias = [Via::Direct, Via::Rathole, Via::Svc, Via::SvcCold];
    for round in 0..rounds {
        let n = a.conns / rounds + usize::from(round < a.conns % rounds);
        for (via, l) in vias.iter().zip(lat.iter_mut()) {
            l.extend(one_at_a_time(web_for(*via), n)?);
        }
    }
    println!();
    println!(
        "HTTP request on a new connection, one at a time ({} connections per path): p50 / p99 ms",
        a.conns
    );
    println!();
    println!("| direct | rathole (plain) | through svc | svc without TLS resumption |");
    println!("|---|---|---|---|");
    let cells: Vec<String> = lat
        .iter_mut()
        .map(|l| format!("{:.3} / {:.3}", pct(l, 0.5), pct(l, 0.99)))
        .collect();
    println!("| {} |", cells.join(" | "));
    println!();
    println!(
        "TLS handshakes to the proxy: with resumption {} full, {} resumed (the measured part: {} full, {} resumed); without resumption {} full, {} resumed",
        warm.full_handshakes(),
        warm.resumed_handshakes(),
        warm.full_handshakes() - warm_full,
        warm.resumed_handshakes() - warm_resumed,
        cold.full_handshakes(),
        cold.resumed_handshakes()
    );
    rt.block_on(running.shutdown());
    Ok(())
}
