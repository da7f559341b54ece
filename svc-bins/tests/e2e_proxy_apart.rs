//! End to end with the real binaries: the Proxy Service apart from the Auth Service.
//!
//! An Auth-only `svc start` (`proxy_service` and `ssh_service` disabled); a proxy-only
//! `svc start` joined with a `proxy` token from `tctl tokens add`, given a dead Auth address
//! before the real one; an agent joined and tunnelled through that proxy; `tsh login` and
//! `tsh ssh` through the proxy. Then the Auth Service is killed: the open session keeps going,
//! a new `tsh ssh` through the proxy still works (the proxy decides from its watched cache),
//! and `tsh login` fails at once with a message naming the Auth Service's addresses. `tctl`
//! given both addresses in its `--config` fails over to the live one.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::agent::Agent;
use common::{Run, SVC, TCTL, TSH, wait};

const PASSWORD: &str = "correct-horse-battery";

/// One `svc start` process; killed on drop.
struct Svc {
    child: Option<Child>,
    stderr: PathBuf,
    lines: Vec<(String, String)>,
}

impl Svc {
    /// Starts `svc start --config CONFIG` and reads its banner up to `svc: ready`.
    fn start(config: &Path, stderr: PathBuf) -> Svc {
        let err = std::fs::File::create(&stderr).expect("stderr file");
        let mut child = Command::new(SVC)
            .args(["start", "--insecure", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("spawn svc");
        let mut lines = Vec::new();
        let banner = wait::first_line(child.stdout.take().expect("stdout"), wait::STEP, move |line| {
            if let Some((k, v)) = line.trim().split_once(": ") {
                lines.push((k.to_owned(), v.to_owned()));
            }
            (line.trim() == "svc: ready").then(|| lines.clone())
        });
        match banner {
            Ok(lines) => Svc {
                child: Some(child),
                stderr,
                lines,
            },
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "svc did not start ({e}):\n{}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                );
            }
        }
    }

    fn line(&self, key: &str) -> String {
        self.lines
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no `{key}:` line in the banner: {:?}", self.lines))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill -9 svc");
            let _ = child.wait();
        }
    }
}

impl Drop for Svc {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.stderr.display(), self.log());
        }
    }
}

fn run(bin: &str, home: &Path, args: &[&str], stdin: Option<&str>) -> Run {
    common::run_client(bin, home, args, stdin)
}

/// A join token of `kind` and the CA pin, from the Auth host.
fn token(auth_data: &Path, home: &Path, kind: &str) -> (String, String) {
    let data = auth_data.to_string_lossy().into_owned();
    let out = run(
        TCTL,
        home,
        &[
            "--data-dir",
            &data,
            "tokens",
            "add",
            &format!("--type={kind}"),
            "--format",
            "json",
        ],
        None,
    )
    .ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    (
        v["token"].as_str().expect("token").to_owned(),
        v["ca_pin"].as_str().expect("ca_pin").to_owned(),
    )
}

fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr").to_string();
    drop(l);
    a
}

#[test]
fn a_proxy_apart_serves_tsh_and_keeps_routing_while_the_auth_service_is_down() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let home = dir.join("home");
    let auth_data = dir.join("auth-data");

    // The Auth Service alone.
    // On a fixed port, so that it can come back on the same address.
    let auth_port = dead_addr();
    let auth_yaml = dir.join("auth.yaml");
    std::fs::write(
        &auth_yaml,
        format!(
            "version: v1\nsvc:\n  data_dir: {}\nauth_service:\n  listen_addr: {auth_port}\n  cluster_name: apart.test\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n",
            auth_data.display()
        ),
    )
    .expect("auth.yaml");
    let mut auth = Svc::start(&auth_yaml, dir.join("auth.stderr"));
    let auth_addr = auth.line("auth");

    // The proxy alone: a dead Auth address first, the real one second.
    let (proxy_token, pin) = token(&auth_data, &home, "proxy");
    let dead = dead_addr();
    let proxy_yaml = dir.join("proxy.yaml");
    std::fs::write(
        &proxy_yaml,
        format!(
            "version: v1\nsvc:\n  nodename: proxy-1\n  data_dir: {}\n  auth_server:\n    - {dead}\n    - {auth_addr}\n  auth_token: {proxy_token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: true\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\n",
            dir.join("proxy-data").display()
        ),
    )
    .expect("proxy.yaml");
    let proxy = Svc::start(&proxy_yaml, dir.join("proxy.stderr"));
    let web = proxy.line("web").trim_start_matches("https://").to_owned();
    assert!(
        proxy.log().contains(&dead),
        "the proxy says it could not reach the dead address first:\n{}",
        proxy.log()
    );

    // An agent joined through the proxy (the Auth API under TLS routing) and tunnelled to it.
    let (node_token, _) = token(&auth_data, &home, "node");
    let agent_yaml = dir.join("agent.yaml");
    std::fs::write(
        &agent_yaml,
        format!(
            "version: v1\nsvc:\n  nodename: node-apart\n  data_dir: {}\n  proxy_server: {web}\n  auth_token: {node_token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            dir.join("agent-data").display()
        ),
    )
    .expect("agent.yaml");
    let mut agent_cmd = Command::new(SVC);
    agent_cmd
        .args(["start", "--insecure", "--config"])
        .arg(&agent_yaml);
    let agent = Agent::start(agent_cmd, dir.join("agent.stderr"));

    // alice signs in through the proxy and reaches the node.
    let data = auth_data.to_string_lossy().into_owned();
    run(
        TCTL,
        &home,
        &[
            "--data-dir",
            &data,
            "users",
            "add",
            "alice",
            "--roles=access",
            "--logins=root",
            "--password-stdin",
        ],
        Some(PASSWORD),
    )
    .ok();
    let proxy_flag = format!("--proxy={web}");
    let login = || {
        run(
            TSH,
            &home,
            &["login", &proxy_flag, "--user=alice", "--insecure"],
            Some(&format!("{PASSWORD}\n")),
        )
    };
    login().ok();
    // The node is in the proxy's cache once its heartbeat reached the Auth Service.
    wait::wait_until(wait::STEP, "tsh ssh through the proxy apart", || {
        run(TSH, &home, &["ssh", "root@node-apart", "echo hello"], None).stdout == "hello\n"
    });

    // tctl with both Auth addresses in its configuration: the dead one first.
    let tctl_yaml = dir.join("tctl.yaml");
    std::fs::write(
        &tctl_yaml,
        format!(
            "version: v1\nsvc:\n  data_dir: {}\n  auth_server:\n    - {dead}\n    - {auth_addr}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n",
            auth_data.display()
        ),
    )
    .expect("tctl.yaml");
    let status = run(
        TCTL,
        &home,
        &["--config", tctl_yaml.to_str().expect("utf-8"), "status"],
        None,
    )
    .ok();
    assert!(status.stdout.contains("apart.test"), "{}", status.stdout);

    // A session that stays open across the outage: established (it printed `ready`) before
    // the Auth Service goes, it finishes after.
    let answer = dir.join("answer");
    let script = format!("echo ready; read line; echo got $line > {}", answer.display());
    let mut open = Command::new(TSH)
        .args(["ssh", "root@node-apart", &script])
        .env("SVC_HOME", &home)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tsh ssh");
    wait::first_line(open.stdout.take().expect("stdout"), wait::STEP, |l| {
        (l == "ready").then_some(())
    })
    .expect("the open session starts");

    // The Auth Service goes down.
    auth.kill9();
    let ssh = run(TSH, &home, &["ssh", "root@node-apart", "echo still here"], None);
    assert_eq!(
        ssh.stdout,
        "still here\n",
        "a new session while the Auth Service is down: {}\nproxy: {}\nagent: {}",
        ssh.stderr,
        proxy.log(),
        agent.log()
    );
    open.stdin
        .take()
        .expect("stdin")
        .write_all(b"through\n")
        .expect("write to the open session");
    let status = wait::wait_exit(&mut open, wait::STEP, "the session opened before the outage");
    assert!(status.success(), "the open session ended with {status}");
    assert_eq!(
        std::fs::read_to_string(&answer).unwrap_or_default(),
        "got through\n",
        "the session opened before the outage kept going"
    );

    // Signing in needs the Auth Service: a clear refusal naming it, never a hang.
    let refused = login();
    assert!(!refused.status.success(), "{}", refused.stdout);
    assert!(
        refused.stderr.contains(&auth_addr) && refused.stderr.contains("Auth Service"),
        "{}",
        refused.stderr
    );

    // The Auth Service comes back on its address: sign-ins work again, and the proxy's cache
    // follows it again (a lock made now refuses the next session through the proxy).
    let _auth = Svc::start(&auth_yaml, dir.join("auth-again.stderr"));
    wait::wait_until(wait::STEP, "a sign-in once the Auth Service is back", || {
        login().status.success()
    });
    run(
        TCTL,
        &home,
        &[
            "--data-dir",
            &data,
            "lock",
            "--user=alice",
            "--message=apart incident",
        ],
        None,
    )
    .ok();
    wait::wait_until(wait::STEP, "the lock reaching the proxy apart", || {
        let out = run(
            TSH,
            &home,
            &["ssh", "root@node-apart", "echo should-not-run"],
            None,
        );
        !out.status.success() && out.stderr.contains("apart incident")
    });
    drop(agent);
}

/// Proxy peering with the real binaries: an Auth-only `svc start` with
/// `tunnel_strategy: {type: proxy_peering, agent_connection_count: 1}`, three proxy-only
/// `svc start`s (each with its own `peer_listen_addr`), one agent told the first proxy's
/// address. The agent ends up tunnelled to one proxy only (the proxies log which), and
/// `tsh ssh`, signed in through each proxy, reaches it through every one of them: the proxies
/// learnt the strategy and each other's peer address and held agents from the registry. Then
/// the holding proxy is killed (`kill -9`, its record still listed): the agent moves and new
/// sessions through both remaining proxies reach it.
#[test]
fn proxy_peering_reaches_an_agent_through_every_proxy() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let admin_home = dir.join("admin-home");
    let auth_data = dir.join("auth-data");
    let auth_yaml = dir.join("auth.yaml");
    std::fs::write(
        &auth_yaml,
        format!(
            "version: v1\nsvc:\n  data_dir: {}\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: peering.test\n  tunnel_strategy:\n    type: proxy_peering\n    agent_connection_count: 1\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n",
            auth_data.display()
        ),
    )
    .expect("auth.yaml");
    let auth = Svc::start(&auth_yaml, dir.join("auth.stderr"));
    let auth_addr = auth.line("auth");

    let mut proxies = Vec::new();
    let mut webs = Vec::new();
    for i in 0..3 {
        let (token, pin) = token(&auth_data, &admin_home, "proxy");
        let yaml = dir.join(format!("proxy{i}.yaml"));
        std::fs::write(
            &yaml,
            format!(
                "version: v1\nsvc:\n  nodename: proxy-{i}\n  data_dir: {}\n  auth_server:\n    - {auth_addr}\n  auth_token: {token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: true\n  web_listen_addr: 127.0.0.1:0\n  peer_listen_addr: {}\nssh_service:\n  enabled: false\n",
                dir.join(format!("proxy{i}-data")).display(),
                dead_addr()
            ),
        )
        .expect("proxy.yaml");
        let proxy = Svc::start(&yaml, dir.join(format!("proxy{i}.stderr")));
        webs.push(proxy.line("web").trim_start_matches("https://").to_owned());
        proxies.push(proxy);
    }

    let (node_token, pin) = token(&auth_data, &admin_home, "node");
    let agent_yaml = dir.join("agent.yaml");
    std::fs::write(
        &agent_yaml,
        format!(
            "version: v1\nsvc:\n  nodename: node-peered\n  data_dir: {}\n  proxy_server: {}\n  auth_token: {node_token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            dir.join("agent-data").display(),
            webs[0]
        ),
    )
    .expect("agent.yaml");
    let mut agent_cmd = Command::new(SVC);
    agent_cmd
        .args(["start", "--insecure", "--config"])
        .arg(&agent_yaml);
    let agent = Agent::start(agent_cmd, dir.join("agent.stderr"));

    let data = auth_data.to_string_lossy().into_owned();
    run(
        TCTL,
        &admin_home,
        &[
            "--data-dir",
            &data,
            "users",
            "add",
            "alice",
            "--roles=access",
            "--logins=root",
            "--password-stdin",
        ],
        Some(PASSWORD),
    )
    .ok();
    // Every proxy serves peering once it heard the strategy from the registry, and tells its
    // agents about all three proxies (a list every 5 seconds).
    for (i, p) in proxies.iter().enumerate() {
        wait::wait_until(
            wait::STEP,
            &format!("proxy-{i} serving proxy peering and listing the three proxies"),
            || {
                let log = p.log();
                log.contains("serving proxy peering")
                    && log
                        .lines()
                        .rfind(|l| l.contains("telling the agents about the cluster's proxies"))
                        .is_some_and(|l| l.matches(".peering.test").count() == 3)
            },
        );
    }
    for (i, web) in webs.iter().enumerate() {
        let home = dir.join(format!("home{i}"));
        let flag = format!("--proxy={web}");
        run(
            TSH,
            &home,
            &["login", &flag, "--user=alice", "--insecure"],
            Some(&format!("{PASSWORD}\n")),
        )
        .ok();
        let started = std::time::Instant::now();
        wait::wait_until(wait::STEP, &format!("tsh ssh through proxy-{i}"), || {
            run(TSH, &home, &["ssh", "root@node-peered", "echo hello"], None).stdout == "hello\n"
        });
        println!(
            "FIGURE: tsh ssh through proxy-{i} reached node-peered {:?} after sign-in",
            started.elapsed()
        );
    }
    // One tunnel only: the agent let go of every proxy but the one chosen for it.
    let holders: Vec<usize> = (0..3)
        .filter(|i| {
            let log = proxies[*i].log();
            log.matches("agent tunnel registered").count() > log.matches("agent tunnel closed").count()
        })
        .collect();
    assert_eq!(
        holders.len(),
        1,
        "exactly one proxy holds the agent's tunnel: {holders:?}\nagent: {}",
        agent.log()
    );

    // kill -9 the holding proxy (its record stays listed until it expires): the agent reaches
    // another proxy — its configured address or one it heard of — and new sessions through
    // both remaining proxies reach it.
    let holder = holders[0];
    proxies[holder].kill9();
    let killed = std::time::Instant::now();
    for i in (0..3).filter(|i| *i != holder) {
        let home = dir.join(format!("home{i}"));
        wait::wait_until(
            wait::STEP,
            &format!("tsh ssh through proxy-{i} after proxy-{holder} died"),
            || run(TSH, &home, &["ssh", "root@node-peered", "echo again"], None).stdout == "again\n",
        );
        println!(
            "FIGURE: tsh ssh through proxy-{i} reached node-peered {:?} after its proxy was killed",
            killed.elapsed()
        );
    }
    drop(agent);
}
