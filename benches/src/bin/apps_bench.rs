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
//! Run: `cargo run --release -p svc-benches --bin apps_bench -- [--secs 5] [--reps 3]`.
//! Needs the Debian packages `postgresql` (server and pgbench), `nginx` and `wrk`; as root,
//! PostgreSQL runs as the `postgres` user via `runuser`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use svc_core::auth::ServedKind;
use svc_core::config::{Config, DbProtocol};
use svc_net::client::{LocalProxy, ResourceClient, bind_local};

struct Args {
    secs: u64,
    reps: usize,
}

fn args() -> Result<Args> {
    let mut a = Args { secs: 5, reps: 3 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--secs" => a.secs = value.parse()?,
            "--reps" => a.reps = value.parse()?,
            other => bail!("unknown flag {other}; expected --secs, --reps"),
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
    let (db_port, web_port) = (free_port()?, free_port()?);
    let running = rt.block_on(async {
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
        };
        for (kind, name, protocol, port) in [
            (ServedKind::Db, "pg", Some(DbProtocol::Postgres), db_port),
            (ServedKind::App, "web", None, web_port),
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
        anyhow::Ok(running)
    })?;
    wait_listening(db_port)?;
    wait_listening(web_port)?;

    let script = dir.path().join("select1.sql");
    std::fs::write(&script, "SELECT 1;\n")?;
    let direct_db = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=require",
        pg.port
    );
    let proxied_db = format!("host=127.0.0.1 port={db_port} user=postgres dbname=postgres sslmode=disable");
    // Warm-up: the first connection through the tunnel opens the agent's paths.
    pgbench(&script, &proxied_db, 1, false)?;
    wrk(web_port, 1, 1, false)?;

    type Probe<'a> = Box<dyn Fn(bool) -> Result<f64> + 'a>;
    let cases: Vec<(&str, &str, Probe<'_>)> = vec![
        (
            "pgbench `SELECT 1`, 1 client, one connection",
            "tps",
            Box::new(|proxied| {
                pgbench(
                    &script,
                    if proxied { &proxied_db } else { &direct_db },
                    a.secs,
                    false,
                )
            }),
        ),
        (
            "pgbench `SELECT 1`, 1 client, new connection per transaction (-C)",
            "tps",
            Box::new(|proxied| {
                pgbench(
                    &script,
                    if proxied { &proxied_db } else { &direct_db },
                    a.secs,
                    true,
                )
            }),
        ),
        (
            "wrk to nginx, 10 keep-alive connections",
            "req/s",
            Box::new(|proxied| wrk(if proxied { web_port } else { app_port }, a.secs, 10, false)),
        ),
        (
            "wrk to nginx, new connection per request",
            "req/s",
            Box::new(|proxied| wrk(if proxied { web_port } else { app_port }, a.secs, 10, true)),
        ),
    ];
    println!("| path | direct | through svc | svc / direct |");
    println!("|---|---|---|---|");
    for (name, unit, probe) in &cases {
        let (mut direct, mut proxied) = (Vec::new(), Vec::new());
        for _ in 0..a.reps {
            direct.push(probe(false)?);
            proxied.push(probe(true)?);
        }
        let (d, p) = (median(direct), median(proxied));
        println!("| {name} | {d:.0} {unit} | {p:.0} {unit} | {:.2} |", p / d);
    }
    rt.block_on(running.shutdown());
    Ok(())
}
