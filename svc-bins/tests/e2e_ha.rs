//! High availability end to end, with the real binaries and real third-party parts:
//!
//! - a 3-member `etcd` cluster (Debian `etcd-server`) on loopback;
//! - 2 Auth Services (`svc start` with only `auth_service`) on that etcd
//!   (`auth_service.storage.type: etcd`);
//! - 3 proxies, each a `svc start` with only `proxy_service`, joined with a `proxy` token and
//!   given both Auth Services (`svc.auth_server`), behind a real `haproxy` in TCP mode sending
//!   PROXY v2 (the proxies trust it: `proxy_service.proxy_protocol`); haproxy also has one pinned
//!   frontend per proxy, the "unaffected path" a long session takes;
//! - 2 agents in a network namespace whose only way out is an authenticating `tinyproxy`
//!   (`HTTPS_PROXY` with credentials), told only the load balancer's address, each keeping a
//!   tunnel to every proxy;
//! - `tsh` signed in through the load balancer.
//!
//! Faults, one at a time, each while a `tsh ssh` session stays open on an unaffected path, a
//! loop of new `tsh ssh` sessions runs through the load balancer and a loop of `tctl create`
//! writes (roles) runs against the Auth Services: kill the etcd leader; kill -9 one Auth
//! Service; kill -9 one proxy (then start it again); a rolling SIGTERM restart of all three
//! proxies. Printed figures (never asserted on timings): new sessions that failed, and of those
//! the ones in flight through the killed proxy; agents reconnected to a restarted proxy and how
//! long it took; acknowledged writes lost. Asserted: no failed session outside the killed
//! proxy's own, every open session survives, no acknowledged write is lost.

mod common;
#[path = "../../svc-net/tests/support/netns.rs"]
mod netns;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Run, wait};
use netns::Net;
use svc_testkit::etcd::{EtcdCluster, HEALTH_LIMIT};
use svc_testkit::haproxy::{Haproxy, HaproxyConfig};
use svc_testkit::tinyproxy::{Tinyproxy, TinyproxyConfig};

const PASSWORD: &str = "correct-horse-battery";
const CLUSTER: &str = "ha.test";
/// How long one `tsh ssh` or `tctl create` of the load loops may take before it counts as
/// failed (and is killed).
const ATTEMPT_LIMIT: Duration = Duration::from_secs(30);
/// The agents in the namespace.
const NODES: [&str; 2] = ["node-a", "node-b"];
/// How long the killed etcd member stays down, the load running.
const MEMBER_DOWN: Duration = Duration::from_secs(10);

/// One `svc start` process (restartable on the same configuration); killed on drop.
struct Svc {
    name: String,
    config: PathBuf,
    dir: PathBuf,
    env: Vec<(String, String)>,
    netns: Option<String>,
    child: Option<Child>,
    logs: Vec<PathBuf>,
}

impl Svc {
    fn new(name: &str, config: PathBuf, dir: &Path) -> Svc {
        Svc {
            name: name.to_owned(),
            config,
            dir: dir.to_owned(),
            env: Vec::new(),
            netns: None,
            child: None,
            logs: Vec::new(),
        }
    }

    /// Starts it and reads its banner up to `svc: ready` (within [`wait::STEP`]).
    fn start(&mut self) -> &mut Self {
        let log = self.dir.join(format!("{}-{}.stderr", self.name, self.logs.len()));
        let err = std::fs::File::create(&log).expect("stderr file");
        self.logs.push(log.clone());
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new(svc_testkit::require("ip", "iproute2"));
                c.args(["netns", "exec", ns]).arg(bin("svc"));
                c
            }
            None => Command::new(bin("svc")),
        };
        command
            .args(["start", "--insecure", "--config"])
            .arg(&self.config)
            .env_remove("RUST_LOG")
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err);
        let mut child = command.spawn().expect("spawn svc");
        // Ready once the banner ends (stdout is drained afterwards so svc never blocks).
        let banner = wait::first_line(child.stdout.take().expect("stdout"), wait::STEP, |line| {
            (line.trim() == "svc: ready").then_some(())
        });
        if let Err(e) = banner {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} did not start ({e}):\n{}",
                self.name,
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        self.child = Some(child);
        self
    }

    /// Everything it logged, over all of its starts.
    fn log(&self) -> String {
        self.logs
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("--- restarted ---\n")
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits (within [`wait::STEP`]) for the exit; how long the drain took.
    fn term(&mut self) -> Duration {
        let started = Instant::now();
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let what = format!("{} after SIGTERM", self.name);
            let status = wait::wait_exit(&mut child, wait::STEP, &what);
            assert!(status.success(), "{what} exited with {status}:\n{}", self.log());
        }
        started.elapsed()
    }
}

impl Drop for Svc {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "--- {} log ---\n{}--- end of {} log ---",
                self.name,
                self.log(),
                self.name
            );
        }
    }
}

/// A bounded run of a command that never panics: what the load loops record.
#[derive(Clone, Debug)]
struct Attempt {
    ok: bool,
    stdout: String,
    stderr: String,
    start: Instant,
    end: Instant,
}

fn attempt(command: &mut Command, limit: Duration) -> Attempt {
    let start = Instant::now();
    let failed = |stderr: String| Attempt {
        ok: false,
        stdout: String::new(),
        stderr,
        start,
        end: Instant::now(),
    };
    let child = match command
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start: {e}")),
    };
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(out)) => Attempt {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            start,
            end: Instant::now(),
        },
        Ok(Err(e)) => failed(format!("waiting: {e}")),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let _ = rx.recv_timeout(Duration::from_secs(10));
            failed(format!("no answer within {limit:?} (killed)"))
        }
    }
}

fn run(bin: &str, home: &Path, args: &[&str], stdin: Option<&str>) -> Run {
    common::run_client(bin, home, args, stdin)
}

/// The test's own copies of the binaries (hard links, else copies, made once): a rebuild of
/// the target directory while the test runs (another build sharing it) must not change the
/// program a restarted process runs.
fn bin(name: &str) -> String {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = svc_testkit::temp_dir("e2e-ha-bin");
        for (name, path) in [("svc", common::SVC), ("tsh", common::TSH), ("tctl", common::TCTL)] {
            let to = dir.join(name);
            if std::fs::hard_link(path, &to).is_err() {
                std::fs::copy(path, &to)
                    .unwrap_or_else(|e| panic!("copying {path} to {}: {e}", to.display()));
            }
        }
        dir
    });
    dir.join(name).to_string_lossy().into_owned()
}

/// Removes a directory when dropped, whatever the test's outcome.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `127.0.0.1:port`.
fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A join token of `kind` and the CA pin, from the first Auth Service's host.
fn token(auth_data: &Path, home: &Path, kind: &str) -> (String, String) {
    common::svc::token_with(&bin("tctl"), auth_data, home, kind)
}

/// The host ID a proxy saved with its identity.
fn proxy_host_id(data: &Path) -> String {
    svc_net::auth::ClientIdentity::load(&data.join("proxy-identity.json"))
        .expect("the proxy's saved identity")
        .name
}

/// `text` without ANSI colour sequences (`ESC [ ... m`), which svc's log may carry.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// How many tunnels `agent` has established to the proxy `proxy_id` so far (its log).
fn tunnels_to(agent: &Svc, proxy_id: &str) -> usize {
    let needle = format!("proxy_id={proxy_id}");
    plain(&agent.log())
        .lines()
        .filter(|l| l.contains("reverse tunnel established") && l.contains(&needle))
        .count()
}

/// Everything the test runs.
struct World {
    dir: PathBuf,
    etcd: EtcdCluster,
    auths: Vec<Svc>,
    proxies: Vec<Svc>,
    proxy_ids: Vec<String>,
    lb: Haproxy,
    tiny: Tinyproxy,
    agents: Vec<Svc>,
    /// `SVC_HOME` signed in through the load balancer.
    home_lb: PathBuf,
    /// `SVC_HOME` signed in through each proxy's pinned frontend.
    home_pinned: Vec<PathBuf>,
    /// `tctl --config` naming both Auth Services.
    tctl_yaml: PathBuf,
    /// Every write the loops made: the role's name and whether it was acknowledged.
    writes: Arc<Mutex<Vec<(String, bool)>>>,
    next_write: Arc<AtomicUsize>,
    /// Kept until the end: the agents' namespace.
    _net: Net,
}

/// A load running during a fault: new sessions through the load balancer and writes.
struct Load {
    stop: Arc<AtomicBool>,
    sessions: Arc<Mutex<Vec<Attempt>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    first_write: usize,
}

impl Load {
    fn start(w: &World) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let sessions = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        {
            let (stop, sessions, home) = (stop.clone(), sessions.clone(), w.home_lb.clone());
            threads.push(std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let node = NODES[i % NODES.len()];
                    let mut a = attempt(
                        Command::new(bin("tsh"))
                            .args(["ssh", &format!("root@{node}"), &format!("echo s{i}")])
                            .env("SVC_HOME", &home),
                        ATTEMPT_LIMIT,
                    );
                    if a.ok && a.stdout != format!("s{i}\n") {
                        a.ok = false;
                        a.stderr = format!("unexpected output {:?}; {}", a.stdout, a.stderr);
                    }
                    sessions.lock().expect("sessions").push(a);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }));
        }
        let first_write = w.next_write.load(Ordering::Relaxed);
        {
            let (stop, writes, next) = (stop.clone(), w.writes.clone(), w.next_write.clone());
            let (dir, home, tctl_yaml) = (w.dir.clone(), w.home_lb.clone(), w.tctl_yaml.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let name = format!("ha-w-{n:05}");
                    let file = dir.join("writes").join(format!("{name}.yaml"));
                    std::fs::write(
                        &file,
                        format!(
                            "kind: role\nversion: v7\nmetadata:\n  name: {name}\nspec:\n  allow:\n    app_labels: {{write: \"{n}\"}}\n"
                        ),
                    )
                    .expect("write the role file");
                    let a = attempt(
                        Command::new(bin("tctl"))
                            .arg("--config")
                            .arg(&tctl_yaml)
                            .arg("create")
                            .arg(&file)
                            .env("SVC_HOME", &home),
                        ATTEMPT_LIMIT,
                    );
                    writes.lock().expect("writes").push((name, a.ok));
                    std::thread::sleep(Duration::from_millis(100));
                }
            }));
        }
        Load {
            stop,
            sessions,
            threads,
            first_write,
        }
    }

    fn ok_sessions_after(&self, t: Instant) -> usize {
        self.sessions
            .lock()
            .expect("sessions")
            .iter()
            .filter(|a| a.ok && a.start >= t)
            .count()
    }

    fn first_ok_after(&self, t: Instant) -> Option<Duration> {
        self.sessions
            .lock()
            .expect("sessions")
            .iter()
            .filter(|a| a.ok && a.start >= t)
            .map(|a| a.end.duration_since(t))
            .min()
    }

    fn stop(self) -> (Vec<Attempt>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let sessions = self.sessions.lock().expect("sessions").clone();
        (sessions, self.first_write)
    }
}

/// A `tsh ssh` session held open (it waits for a line) through `home`'s proxy.
struct OpenSession {
    child: Child,
    answer: PathBuf,
    what: String,
}

impl OpenSession {
    fn open(home: &Path, node: &str, dir: &Path, what: &str) -> OpenSession {
        let answer = dir.join(format!(
            "answer-{}",
            what.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        ));
        let script = format!("echo ready; read line; echo got $line > {}", answer.display());
        let mut child = Command::new(bin("tsh"))
            .args(["ssh", &format!("root@{node}"), &script])
            .env("SVC_HOME", home)
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tsh ssh");
        wait::first_line(child.stdout.take().expect("stdout"), wait::STEP, |l| {
            (l == "ready").then_some(())
        })
        .unwrap_or_else(|e| panic!("the open session ({what}) did not start: {e}"));
        OpenSession {
            child,
            answer,
            what: what.to_owned(),
        }
    }

    /// Sends a line and waits for the session to end; `Err` says what went wrong.
    fn finish(mut self) -> Result<(), String> {
        let sent = self.child.stdin.take().map(|mut s| s.write_all(b"through\n"));
        if !matches!(sent, Some(Ok(()))) {
            return Err(format!("{}: could not write to the open session", self.what));
        }
        let status = wait::wait_exit(&mut self.child, wait::STEP, &self.what);
        let got = std::fs::read_to_string(&self.answer).unwrap_or_default();
        if status.success() && got == "got through\n" {
            Ok(())
        } else {
            Err(format!(
                "{}: the session opened before the fault ended with {status}, answer {got:?}",
                self.what
            ))
        }
    }
}

/// What one fault did to the load.
struct PhaseResult {
    name: String,
    sessions: usize,
    failed: usize,
    /// Failed sessions that were in flight when the proxy was killed (its own sessions).
    failed_own: usize,
    writes: usize,
    writes_failed: usize,
    open_session: Result<(), String>,
    failures: Vec<String>,
    figures: Vec<String>,
}

/// What a fault returns: when a proxy was killed (its in-flight sessions are its own) and the
/// figures it measured.
struct FaultOutcome {
    killed_at: Option<Instant>,
    figures: Vec<String>,
}

/// Runs `fault` under the load, with a session held open through `open_via` (a proxy's pinned
/// frontend; `None`: the load balancer).
fn phase(
    w: &mut World,
    name: &str,
    open_via: Option<usize>,
    fault: impl FnOnce(&mut World, &Load) -> FaultOutcome,
) -> PhaseResult {
    println!("=== fault: {name}");
    let (home, via) = match open_via {
        None => (w.home_lb.clone(), "the load balancer".to_owned()),
        Some(i) => (w.home_pinned[i].clone(), format!("proxy {i}'s pinned frontend")),
    };
    let open = OpenSession::open(
        &home,
        NODES[0],
        &w.dir,
        &format!("{name}: open session via {via}"),
    );
    let load = Load::start(w);
    let started = Instant::now();
    wait::wait_until(
        wait::STEP,
        &format!("{name}: 2 new sessions before the fault"),
        || load.ok_sessions_after(started) >= 2,
    );
    let outcome = fault(w, &load);
    let recovered = Instant::now();
    wait::wait_until(
        wait::STEP,
        &format!("{name}: 3 new sessions through the load balancer after the fault"),
        || load.ok_sessions_after(recovered) >= 3,
    );
    let (sessions, first_write) = load.stop();
    let open_session = open.finish();
    let failed: Vec<&Attempt> = sessions.iter().filter(|a| !a.ok).collect();
    let own = |a: &Attempt| outcome.killed_at.is_some_and(|k| a.start <= k && a.end >= k);
    let failed_own = failed.iter().filter(|a| own(a)).count();
    let failures = failed
        .iter()
        .filter(|a| !own(a))
        .map(|a| a.stderr.trim().to_owned())
        .collect();
    let writes = w.writes.lock().expect("writes");
    let mine: Vec<&(String, bool)> = writes
        .iter()
        .filter(|(n, _)| {
            n.trim_start_matches("ha-w-")
                .parse::<usize>()
                .is_ok_and(|n| n >= first_write)
        })
        .collect();
    let result = PhaseResult {
        name: name.to_owned(),
        sessions: sessions.len(),
        failed: failed.len(),
        failed_own,
        writes: mine.len(),
        writes_failed: mine.iter().filter(|(_, ok)| !ok).count(),
        open_session,
        failures,
        figures: outcome.figures,
    };
    println!(
        "FIGURE [{name}]: new sessions {} failed {} (in flight through the killed proxy: {}); writes {} not acknowledged {}; open session: {}",
        result.sessions,
        result.failed,
        result.failed_own,
        result.writes,
        result.writes_failed,
        match &result.open_session {
            Ok(()) => "survived".to_owned(),
            Err(e) => e.clone(),
        }
    );
    for f in &result.figures {
        println!("FIGURE [{name}]: {f}");
    }
    for e in result.failures.iter().take(5) {
        println!("FAILED SESSION [{name}]: {e}");
    }
    result
}

/// Waits until every agent has established a new tunnel to proxy `i` (more than `before[a]`);
/// the figures: how long each took from `since`.
fn wait_agents_back(w: &World, i: usize, before: &[usize], since: Instant, what: &str) -> Vec<String> {
    let mut figures = Vec::new();
    for (a, agent) in w.agents.iter().enumerate() {
        wait::wait_until(
            wait::STEP,
            &format!("{what}: agent {} holding a new tunnel to proxy {i}", NODES[a]),
            || tunnels_to(agent, &w.proxy_ids[i]) > before[a],
        );
        figures.push(format!(
            "agent {} reconnected to proxy {i} {:.1?} after it was started again",
            NODES[a],
            since.elapsed()
        ));
    }
    figures
}

fn counts_to(w: &World, i: usize) -> Vec<usize> {
    w.agents.iter().map(|a| tunnels_to(a, &w.proxy_ids[i])).collect()
}

fn write_file(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path.to_owned()
}

#[test]
fn the_cluster_survives_etcd_auth_and_proxy_failures_behind_a_load_balancer() {
    // Kept when the test fails (every process's log is there), removed when it passes.
    let dir = svc_testkit::temp_dir("e2e-ha");
    let _bins = RemoveOnDrop(Path::new(&bin("svc")).parent().map(Path::to_path_buf));
    std::fs::create_dir_all(dir.join("writes")).expect("writes dir");
    let admin_home = dir.join("admin-home");

    // etcd: three members.
    let etcd = EtcdCluster::start(3, "127.0.0.1");
    let peers = etcd.client_urls().join(", ");

    // Two Auth Services on it.
    let auth_addrs: Vec<SocketAddr> = (0..2)
        .map(|_| loopback(svc_testkit::free_port("127.0.0.1")))
        .collect();
    let mut auths = Vec::new();
    for (i, addr) in auth_addrs.iter().enumerate() {
        let config = write_file(
            &dir.join(format!("auth{i}.yaml")),
            &format!(
                "version: v1\nsvc:\n  nodename: auth-{i}\n  data_dir: {}\nauth_service:\n  listen_addr: {addr}\n  cluster_name: {CLUSTER}\n  storage:\n    type: etcd\n    peers: [{peers}]\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n",
                dir.join(format!("auth{i}-data")).display()
            ),
        );
        let mut auth = Svc::new(&format!("auth{i}"), config, &dir);
        auth.start();
        auths.push(auth);
    }
    let auth_list = auth_addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let auth0_data = dir.join("auth0-data");
    let tctl_yaml = write_file(
        &dir.join("tctl.yaml"),
        &format!(
            "version: v1\nsvc:\n  data_dir: {}\n  auth_server: [{auth_list}]\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n",
            auth0_data.display()
        ),
    );

    // The network: the agents' namespace, the load balancer's address outside it.
    let net = Net::create();
    let lb_addr = SocketAddr::new(net.proxy_ip, svc_testkit::free_port(&net.proxy_ip.to_string()));
    let proxy_ports: Vec<u16> = (0..3).map(|_| svc_testkit::free_port("127.0.0.1")).collect();
    let pinned: Vec<SocketAddr> = (0..3)
        .map(|_| loopback(svc_testkit::free_port("127.0.0.1")))
        .collect();
    let mut lb_config = HaproxyConfig::new(lb_addr, proxy_ports.iter().map(|p| loopback(*p)).collect());
    lb_config.pinned = pinned.iter().enumerate().map(|(i, a)| (*a, i)).collect();
    let lb = Haproxy::start(lb_config);

    // Three proxies apart from the Auth Services, behind haproxy, trusting its PROXY headers.
    let mut proxies = Vec::new();
    let mut proxy_ids = Vec::new();
    for (i, port) in proxy_ports.iter().enumerate() {
        let (token, pin) = token(&auth0_data, &admin_home, "proxy");
        let data = dir.join(format!("proxy{i}-data"));
        let config = write_file(
            &dir.join(format!("proxy{i}.yaml")),
            &format!(
                "version: v1\nsvc:\n  nodename: proxy-{i}\n  data_dir: {}\n  auth_server: [{auth_list}]\n  auth_token: {token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: true\n  public_addr: {lb_addr}\n  web_listen_addr: 127.0.0.1:{port}\n  peer_listen_addr: 127.0.0.1:{}\n  proxy_protocol: on\n  proxy_protocol_trusted_networks: [127.0.0.1]\n  shutdown_drain_timeout: 10s\nssh_service:\n  enabled: false\n",
                data.display(),
                svc_testkit::free_port("127.0.0.1")
            ),
        );
        let mut proxy = Svc::new(&format!("proxy{i}"), config, &dir);
        proxy.start();
        proxy_ids.push(proxy_host_id(&data));
        proxies.push(proxy);
    }

    // alice, signed in through the load balancer and through each pinned frontend.
    run(
        &bin("tctl"),
        &admin_home,
        &[
            "--config",
            &tctl_yaml.to_string_lossy(),
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
    let login = |home: &Path, proxy: &SocketAddr| {
        let flag = format!("--proxy={proxy}");
        wait::wait_until(wait::STEP, &format!("tsh login through {proxy}"), || {
            run(
                &bin("tsh"),
                home,
                &["login", &flag, "--user=alice", "--insecure"],
                Some(&format!("{PASSWORD}\n")),
            )
            .status
            .success()
        });
    };
    let home_lb = dir.join("home-lb");
    login(&home_lb, &lb_addr);
    let home_pinned: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("home-pin{i}"))).collect();
    for (home, addr) in home_pinned.iter().zip(&pinned) {
        login(home, addr);
    }

    // Two agents in the namespace, out only through the authenticating tinyproxy.
    let tiny = Tinyproxy::start(TinyproxyConfig::new(
        SocketAddr::new(net.host_ip, svc_testkit::free_port(&net.host_ip.to_string())),
        netns::PROXY_USER,
        netns::PROXY_PASSWORD,
    ));
    assert!(
        !net.can_reach(net.proxy_ip, lb_addr.port()),
        "the agents' namespace must have no route to the load balancer"
    );
    let mut agents = Vec::new();
    let agents_started = Instant::now();
    for node in NODES {
        let (token, pin) = token(&auth0_data, &admin_home, "node");
        let config = write_file(
            &dir.join(format!("{node}.yaml")),
            &format!(
                "version: v1\nsvc:\n  nodename: {node}\n  data_dir: {}\n  proxy_server: {lb_addr}\n  auth_token: {token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
                dir.join(format!("{node}-data")).display()
            ),
        );
        let mut agent = Svc::new(node, config, &dir);
        agent.netns = Some(net.ns.clone());
        agent.env = vec![("HTTPS_PROXY".to_owned(), tiny.url())];
        agent.start();
        agents.push(agent);
    }

    let mut w = World {
        dir: dir.clone(),
        etcd,
        auths,
        proxies,
        proxy_ids,
        lb,
        tiny,
        agents,
        home_lb,
        home_pinned,
        tctl_yaml,
        writes: Arc::new(Mutex::new(Vec::new())),
        next_write: Arc::new(AtomicUsize::new(0)),
        _net: net,
    };

    // Each agent holds a tunnel to each proxy, through the one load-balanced address.
    for (a, agent) in w.agents.iter().enumerate() {
        for (i, id) in w.proxy_ids.iter().enumerate() {
            wait::wait_until(
                wait::STEP,
                &format!("agent {} holding a tunnel to proxy {i} ({id})", NODES[a]),
                || tunnels_to(agent, id) > 0,
            );
        }
    }
    println!(
        "FIGURE [start]: both agents hold a tunnel to each of the 3 proxies {:.1?} after they started",
        agents_started.elapsed()
    );
    // Every path reaches every agent.
    for node in NODES {
        for home in std::iter::once(&w.home_lb).chain(&w.home_pinned) {
            wait::wait_until(
                wait::STEP,
                &format!("tsh ssh root@{node} with {}", home.display()),
                || {
                    run(
                        &bin("tsh"),
                        home,
                        &["ssh", &format!("root@{node}"), "echo up"],
                        None,
                    )
                    .stdout
                        == "up\n"
                },
            );
        }
    }
    // haproxy's PROXY v2 headers are honoured: the proxies log the client's own address (the
    // load balancer's frontend address is the source of tsh's and tinyproxy's connections on
    // this host), not haproxy's 127.0.0.1.
    let client_peer = format!("peer={}:", lb_addr.ip());
    assert!(
        w.proxies.iter().any(|p| plain(&p.log())
            .lines()
            .any(|l| l.contains("SSH client authenticated") && l.contains(&client_peer))),
        "no proxy logged a client at {client_peer} taken from a PROXY header:\n{}",
        w.proxies
            .iter()
            .map(|p| tail(&plain(&p.log()), 20))
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    let tiny_log = w.tiny.log();
    assert!(
        tiny_log.contains(&lb_addr.to_string()),
        "the agents went out through tinyproxy to the load balancer:\n{tiny_log}"
    );

    let mut results = Vec::new();

    // 1. The etcd leader dies; it comes back afterwards.
    results.push(phase(&mut w, "kill the etcd leader", None, |w, load| {
        let mut leader = None;
        wait::wait_until(HEALTH_LIMIT, "an etcd leader", || {
            leader = w.etcd.leader();
            leader.is_some()
        });
        let leader = leader.expect("leader");
        let killed = Instant::now();
        w.etcd.kill(leader);
        wait::wait_until(HEALTH_LIMIT, "a new etcd leader among the two others", || {
            w.etcd.leader().is_some_and(|l| l != leader)
        });
        let elected = killed.elapsed();
        // The member stays down for a while under load: the Auth Services must use the two
        // others.
        std::thread::sleep(MEMBER_DOWN);
        wait::wait_until(wait::STEP, "3 new sessions after the etcd leader died", || {
            load.ok_sessions_after(killed) >= 3
        });
        let first = load.first_ok_after(killed);
        w.etcd.restart(leader);
        FaultOutcome {
            killed_at: None,
            figures: vec![
                format!("etcd member m{leader} (the leader) killed, down for {MEMBER_DOWN:?}; a new leader after {elected:.1?}"),
                format!("first new session after the kill finished {first:.1?} after it"),
            ],
        }
    }));

    // 2. One Auth Service dies (the first every client tries); it comes back afterwards.
    results.push(phase(&mut w, "kill -9 an Auth Service", None, |w, load| {
        let killed = Instant::now();
        w.auths[0].kill9();
        let before = w.writes.lock().expect("writes").len();
        wait::wait_until(
            wait::STEP,
            "3 acknowledged writes through the other Auth Service",
            || {
                w.writes.lock().expect("writes")[before..]
                    .iter()
                    .filter(|(_, ok)| *ok)
                    .count()
                    >= 3
            },
        );
        let write_after = killed.elapsed();
        wait::wait_until(wait::STEP, "3 new sessions after the Auth Service died", || {
            load.ok_sessions_after(killed) >= 3
        });
        let first = load.first_ok_after(killed);
        w.auths[0].start();
        FaultOutcome {
            killed_at: None,
            figures: vec![
                format!("auth0 killed; 3 writes acknowledged by auth1 {write_after:.1?} after"),
                format!("first new session after the kill finished {first:.1?} after it"),
            ],
        }
    }));

    // 3. kill -9 one proxy; the open session goes through another; then it starts again.
    results.push(phase(&mut w, "kill -9 a proxy", Some(1), |w, load| {
        let before = counts_to(w, 0);
        let killed = Instant::now();
        w.proxies[0].kill9();
        wait::wait_until(wait::STEP, "3 new sessions after the proxy died", || {
            load.ok_sessions_after(killed) >= 3
        });
        let first = load.first_ok_after(killed);
        let restarted = Instant::now();
        w.proxies[0].start();
        let mut figures = vec![format!(
            "proxy 0 killed; first new session through the load balancer after it finished {first:.1?} after the kill"
        )];
        figures.extend(wait_agents_back(w, 0, &before, restarted, "after kill -9"));
        FaultOutcome {
            killed_at: Some(killed),
            figures,
        }
    }));

    // 4. Rolling restart: SIGTERM (drain) and start again, one proxy after the other.
    for i in 0..3 {
        let open_via = Some((i + 1) % 3);
        results.push(phase(
            &mut w,
            &format!("rolling restart: SIGTERM proxy {i}"),
            open_via,
            |w, _load| {
                let before = counts_to(w, i);
                let drained = w.proxies[i].term();
                let restarted = Instant::now();
                w.proxies[i].start();
                let mut figures = vec![format!(
                    "proxy {i} drained and exited {drained:.1?} after SIGTERM"
                )];
                figures.extend(wait_agents_back(w, i, &before, restarted, "rolling restart"));
                FaultOutcome {
                    killed_at: None,
                    figures,
                }
            },
        ));
    }

    // Every acknowledged write is there, read through either Auth Service.
    let listed = run(
        &bin("tctl"),
        &w.home_lb,
        &[
            "--config",
            &w.tctl_yaml.to_string_lossy(),
            "get",
            "role",
            "--format",
            "json",
        ],
        None,
    )
    .ok();
    let writes = w.writes.lock().expect("writes").clone();
    let acked: Vec<&String> = writes.iter().filter(|(_, ok)| *ok).map(|(n, _)| n).collect();
    let lost: Vec<&&String> = acked
        .iter()
        .filter(|n| !listed.stdout.contains(&format!("\"{n}\"")))
        .collect();
    println!(
        "FIGURE [writes]: {} writes, {} acknowledged, {} acknowledged and lost",
        writes.len(),
        acked.len(),
        lost.len()
    );

    // The summary, then the assertions.
    println!("=== summary");
    println!(
        "fault | new sessions | failed | failed, in flight through the killed proxy | writes | not acknowledged | open session"
    );
    for r in &results {
        println!(
            "{} | {} | {} | {} | {} | {} | {}",
            r.name,
            r.sessions,
            r.failed,
            r.failed_own,
            r.writes,
            r.writes_failed,
            if r.open_session.is_ok() {
                "survived"
            } else {
                "FAILED"
            }
        );
    }
    let mut problems = Vec::new();
    for r in &results {
        if !r.failures.is_empty() {
            problems.push(format!(
                "{}: {} new sessions failed outside the killed proxy's own; first errors: {:?}",
                r.name,
                r.failures.len(),
                r.failures.iter().take(3).collect::<Vec<_>>()
            ));
        }
        if let Err(e) = &r.open_session {
            problems.push(e.clone());
        }
    }
    if !lost.is_empty() {
        problems.push(format!("acknowledged writes lost: {lost:?}"));
    }
    assert!(
        problems.is_empty(),
        "high availability failed:\n{}\n(the last lines of haproxy's log:\n{})\nevery process's log is kept in {}",
        problems.join("\n"),
        tail(&w.lb.log(), 40),
        dir.display()
    );
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}
