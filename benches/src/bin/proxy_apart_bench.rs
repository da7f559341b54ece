//! A Proxy Service apart from the Auth Service (joined with a `proxy` token, deciding from its
//! watched cache) against the all-in-one process's proxy, in the same run and the same process.
//!
//! Two figures, each measured alternately (all-in-one, apart, all-in-one, …) for several
//! repetitions and reported as medians and a ratio (apart ÷ all-in-one):
//! - sign-ins per second: sequential `POST /webapi/login` (the proxy calls the Auth Service's
//!   `Login`; argon2 dominates, the same for both);
//! - route resolutions per second: sequential new connections to an SSH node through the proxy
//!   (TLS + SSH to the proxy, the proxy's node authorization and route, the channel through the
//!   agent's tunnel; the stream is dropped once the node answers).
//!
//! Both proxies use the same Auth Service; each has its own agent tunnelled to it.
//!
//! Run: `cargo run --release -p svc-benches --bin proxy_apart_bench -- [--reps 5] [--logins 20]
//! [--conns 300]`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use svc_core::Secret;
use svc_core::config::Config;
use svc_net::auth::{AuthClient, ClientIdentity};
use svc_net::client::{ProxyEndpoint, SshIdentity, connect_via_proxy, login_via_proxy};

struct Args {
    reps: usize,
    logins: usize,
    conns: usize,
}

fn args() -> Result<Args> {
    let mut a = Args {
        reps: 5,
        logins: 20,
        conns: 300,
    };
    let all: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < all.len() {
        let flag = all[i].as_str();
        let value = || -> Result<usize> {
            Ok(all
                .get(i + 1)
                .with_context(|| format!("{flag}: missing value"))?
                .parse()?)
        };
        match flag {
            "--reps" => a.reps = value()?,
            "--logins" => a.logins = value()?,
            "--conns" => a.conns = value()?,
            other => bail!("unknown flag {other}; expected --reps, --logins, --conns"),
        }
        i += 2;
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

const PASSWORD: &str = "bench-password-1";

/// One proxy under test: where it is, how to trust it, the node behind it, a signed-in user.
struct Target {
    name: &'static str,
    web: String,
    endpoint: ProxyEndpoint,
    ssh: SshIdentity,
    node: String,
}

async fn target(name: &'static str, web: String, ca_file: Option<&Path>, node: &str) -> Result<Target> {
    let password = Secret::new(PASSWORD.into());
    let identity: ClientIdentity = login_via_proxy(&web, true, None, "bench", &password, None).await?;
    let endpoint = ProxyEndpoint {
        addr: svc_core::Addr::parse(&web)?,
        tls: true,
        verifier: Arc::new(identity.verifier()?),
        extra_ca_pem: match ca_file {
            Some(f) => Some(std::fs::read(f)?),
            None => None,
        },
        dialer: svc_net::dial::ProxyDialer::from_env()?,
        timeout: Duration::from_secs(30),
    };
    let ssh = SshIdentity {
        key: Arc::new(identity.ssh_private_key()?),
        cert: identity.ssh_certificate()?,
        login: "root".into(),
    };
    Ok(Target {
        name,
        web,
        endpoint,
        ssh,
        node: node.to_owned(),
    })
}

/// Waits until a connection to the target's node goes through (its agent announced itself).
async fn routable(t: &Target) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match connect_via_proxy(&t.endpoint, &t.ssh, &t.node, 0).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => bail!("{}: node {} not routable: {e}", t.name, t.node),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn sign_ins(t: &Target, n: usize) -> Result<f64> {
    let password = Secret::new(PASSWORD.into());
    let start = Instant::now();
    for _ in 0..n {
        login_via_proxy(&t.web, true, None, "bench", &password, None).await?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

async fn routes(t: &Target, n: usize) -> Result<f64> {
    let start = Instant::now();
    for _ in 0..n {
        let stream = connect_via_proxy(&t.endpoint, &t.ssh, &t.node, 0).await?;
        drop(stream);
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn yaml(dir: &Path, body: &str) -> Result<Config> {
    let text = format!(
        "version: v1\nsvc:\n  data_dir: {}\n  log:\n    severity: warn\n{body}",
        dir.display()
    );
    Ok(Config::from_yaml_str_with_hostname(&text, "bench")?)
}

fn main() -> Result<()> {
    let a = args()?;
    let dir = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        // The all-in-one process: Auth Service, proxy, and an agent for node `aio-node`.
        let aio_cfg = yaml(
            &dir.path().join("aio"),
            "  nodename: aio-node\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: bench.test\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: true\n",
        )?;
        let aio = svc_net::Cluster::from_config(&aio_cfg).start().await?;
        let auth = aio.auth.as_ref().context("the Auth Service is not running")?;
        let admin = ClientIdentity::load(&auth.admin_identity)?;
        let mut client = AuthClient::connect_with(&admin).await?;
        client
            .create_user("bench", &["access".into()], &["root".into()], &Secret::new(PASSWORD.into()))
            .await?;
        let (proxy_token, _) = client.create_token(&["proxy".into()], None).await?;
        let (node_token, _) = client.create_token(&["node".into()], None).await?;
        let pin = auth.ca_pin();

        // The proxy apart, joined to the same Auth Service, and an agent tunnelled to it.
        let apart_cfg = yaml(
            &dir.path().join("apart"),
            &format!(
                "  nodename: proxy-apart\n  auth_server: {}\n  auth_token: {}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\n",
                auth.addr,
                proxy_token.expose()
            ),
        )?;
        let apart = svc_net::Cluster::from_config(&apart_cfg).start().await?;
        let apart_proxy = apart.proxy.as_ref().context("the proxy apart is not running")?;
        let agent_cfg = yaml(
            &dir.path().join("agent"),
            &format!(
                "  nodename: apart-node\n  proxy_server: {}\n  auth_token: {}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
                apart_proxy.addrs().web,
                node_token.expose()
            ),
        )?;
        let agent = svc_net::Cluster::from_config(&agent_cfg)
            .insecure(true)
            .start()
            .await?;

        let aio_proxy = aio.proxy.as_ref().context("the all-in-one proxy is not running")?;
        let targets = [
            target(
                "all-in-one",
                aio_proxy.addrs().web.to_string(),
                aio_proxy.ca_file().map(|p| p.as_path()),
                "aio-node",
            )
            .await?,
            target(
                "apart",
                apart_proxy.addrs().web.to_string(),
                apart_proxy.ca_file().map(|p| p.as_path()),
                "apart-node",
            )
            .await?,
        ];
        for t in &targets {
            routable(t).await?;
            // Warm-up.
            routes(t, 10).await?;
        }
        let mut logins = [Vec::new(), Vec::new()];
        let mut conns = [Vec::new(), Vec::new()];
        for _ in 0..a.reps {
            for (i, t) in targets.iter().enumerate() {
                logins[i].push(sign_ins(t, a.logins).await?);
                conns[i].push(routes(t, a.conns).await?);
            }
        }
        println!(
            "{} repetitions alternating, medians; sign-ins: {} sequential per repetition; routes: {} sequential new connections to an SSH node per repetition",
            a.reps, a.logins, a.conns
        );
        println!("| figure | all-in-one | apart (cache) | apart ÷ all-in-one |");
        println!("|---|---|---|---|");
        let [l0, l1] = logins.map(median);
        let [c0, c1] = conns.map(median);
        println!("| sign-ins/s | {l0:.1} | {l1:.1} | {:.2} |", l1 / l0);
        println!("| new connections/s to an SSH node | {c0:.0} | {c1:.0} | {:.2} |", c1 / c0);
        agent.shutdown().await;
        apart.shutdown().await;
        aio.shutdown().await;
        anyhow::Ok(())
    })
}
