//! A real etcd cluster for tests: [`EtcdCluster::start`] runs `size` members of the Debian
//! `etcd-server` (3.4) on free ports of one address, each with a data directory of its own under a
//! temporary directory, and waits until every member reports itself healthy. One member can be
//! killed ([`EtcdCluster::kill`], SIGKILL) and started again on its data
//! ([`EtcdCluster::restart`]). Every member's output is kept in a log ([`Proc`]), printed when the
//! test fails; members are killed and the directory removed on drop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::Proc;

/// How long a member (or the cluster) may take to report itself healthy after a start.
pub const HEALTH_LIMIT: Duration = Duration::from_secs(60);

/// One member's fixed settings: its name, where it listens, where its data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSpec {
    /// The member's name (`m0`, `m1`, …).
    pub name: String,
    /// The client address (`http://IP:PORT`).
    pub client: SocketAddr,
    /// The peer address (raft traffic between members).
    pub peer: SocketAddr,
    /// The data directory.
    pub data_dir: PathBuf,
    /// `https` client URLs (the members are given their certificates in `extra_args`).
    pub https: bool,
    /// Arguments appended to the command line (TLS files, `--client-cert-auth`, …).
    pub extra_args: Vec<String>,
}

impl MemberSpec {
    /// The client URL, `http://IP:PORT` (`https` with [`https`](Self::https)).
    pub fn client_url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.client)
    }

    /// The peer URL, `http://IP:PORT`.
    pub fn peer_url(&self) -> String {
        format!("http://{}", self.peer)
    }

    /// The command line of `etcd` for this member of the cluster `members` (all of them,
    /// this one included); `existing` when it restarts on its data rather than bootstrapping.
    pub fn args(&self, members: &[MemberSpec], token: &str, existing: bool) -> Vec<String> {
        let initial = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let state = if existing { "existing" } else { "new" };
        [
            ("--name", self.name.clone()),
            ("--data-dir", self.data_dir.display().to_string()),
            ("--listen-client-urls", self.client_url()),
            ("--advertise-client-urls", self.client_url()),
            ("--listen-peer-urls", self.peer_url()),
            ("--initial-advertise-peer-urls", self.peer_url()),
            ("--initial-cluster", initial),
            ("--initial-cluster-state", state.to_owned()),
            ("--initial-cluster-token", token.to_owned()),
            ("--logger", "zap".to_owned()),
            ("--log-level", "warn".to_owned()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .chain(self.extra_args.iter().cloned())
        .collect()
    }
}

/// Whether an answer of etcd's `/health` endpoint says the member is healthy (it has a leader
/// and serves reads).
pub fn healthy_answer(http: &str) -> bool {
    let compact: String = http.chars().filter(|c| !c.is_whitespace()).collect();
    http.starts_with("HTTP/1.") && compact.contains("\"health\":\"true\"")
}

/// Asks the member at `client` for `/health` (plain HTTP, 2 s at most); true when healthy.
pub fn member_healthy(client: SocketAddr) -> bool {
    let limit = Duration::from_secs(2);
    let Ok(mut s) = TcpStream::connect_timeout(&client, limit) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(limit));
    let _ = s.set_write_timeout(Some(limit));
    let request = format!("GET /health HTTP/1.0\r\nHost: {client}\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    healthy_answer(&answer)
}

/// The `(member_id, leader)` of an answer of etcd's `/v3/maintenance/status` (the JSON
/// gateway writes 64-bit integers as strings).
pub fn status_ids(http: &str) -> Option<(String, String)> {
    let field = |name: &str| {
        let key = format!("\"{name}\":\"");
        let at = http.find(&key)? + key.len();
        let end = http[at..].find('"')?;
        Some(http[at..at + end].to_owned())
    };
    Some((field("member_id")?, field("leader")?))
}

/// Asks the member at `client` for its status (plain HTTP, 2 s at most): `(its member ID, the
/// leader's member ID)`.
pub fn member_status(client: SocketAddr) -> Option<(String, String)> {
    let limit = Duration::from_secs(2);
    let mut s = TcpStream::connect_timeout(&client, limit).ok()?;
    s.set_read_timeout(Some(limit)).ok()?;
    s.set_write_timeout(Some(limit)).ok()?;
    let request = format!(
        "POST /v3/maintenance/status HTTP/1.0\r\nHost: {client}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    s.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    status_ids(&answer)
}

/// How to run the members: TLS on the client URLs and extra flags (the same for every member).
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    /// `https` client URLs; the certificate flags go in [`args`](Self::args). Such members are
    /// not probed at start: the caller waits for them with its own client.
    pub https: bool,
    /// Arguments appended to every member's command line.
    pub args: Vec<String>,
}

/// A running etcd cluster; every member killed and the data removed on drop.
pub struct EtcdCluster {
    bin: PathBuf,
    dir: PathBuf,
    token: String,
    specs: Vec<MemberSpec>,
    procs: Vec<Option<Proc>>,
    starts: Vec<usize>,
}

impl EtcdCluster {
    /// Starts `size` members on free ports of `ip` (say `127.0.0.1`) and waits, within
    /// [`HEALTH_LIMIT`], until each reports itself healthy. A missing `etcd` fails the test
    /// naming the Debian package `etcd-server`.
    pub fn start(size: usize, ip: &str) -> EtcdCluster {
        Self::start_with(size, ip, EtcdOptions::default())
    }

    /// Like [`start`](Self::start), with `options` for every member. Members with `https`
    /// client URLs are not waited for (plain `/health` cannot reach them).
    pub fn start_with(size: usize, ip: &str, options: EtcdOptions) -> EtcdCluster {
        let bin = crate::require("etcd", "etcd-server");
        let dir = crate::temp_dir("etcd");
        let token = format!(
            "svc-test-{}",
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        let parse = |port: u16| -> SocketAddr {
            format!("{ip}:{port}")
                .parse()
                .unwrap_or_else(|e| panic!("etcd address {ip}:{port}: {e}"))
        };
        let specs: Vec<MemberSpec> = (0..size)
            .map(|i| MemberSpec {
                name: format!("m{i}"),
                client: parse(crate::free_port(ip)),
                peer: parse(crate::free_port(ip)),
                data_dir: dir.join(format!("m{i}")),
                https: options.https,
                extra_args: options.args.clone(),
            })
            .collect();
        let mut cluster = EtcdCluster {
            bin,
            dir,
            token,
            procs: (0..size).map(|_| None).collect(),
            starts: vec![0; size],
            specs,
        };
        for i in 0..size {
            cluster.spawn(i, false);
        }
        if !options.https {
            cluster.wait_healthy(HEALTH_LIMIT);
        }
        cluster
    }

    fn spawn(&mut self, i: usize, existing: bool) {
        let spec = &self.specs[i];
        let args = spec.args(&self.specs, &self.token, existing);
        self.starts[i] += 1;
        let log = self.dir.join(format!("{}-{}.log", spec.name, self.starts[i]));
        let proc = Proc::spawn(
            format!("etcd member {} ({})", spec.name, spec.client_url()),
            Command::new(&self.bin).args(&args),
            log,
        );
        self.procs[i] = Some(proc);
    }

    /// The members' settings.
    pub fn members(&self) -> &[MemberSpec] {
        &self.specs
    }

    /// Every member's client URL, in member order.
    pub fn client_urls(&self) -> Vec<String> {
        self.specs.iter().map(MemberSpec::client_url).collect()
    }

    /// Whether member `i` is running (not killed, not exited).
    pub fn running(&mut self, i: usize) -> bool {
        self.procs[i].as_mut().is_some_and(|p| p.exited().is_none())
    }

    /// The index of the member that is the raft leader now, as the running members see it
    /// (`None` while there is none or no member answers).
    pub fn leader(&mut self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for i in 0..self.specs.len() {
            let status = if self.running(i) {
                member_status(self.specs[i].client)
            } else {
                None
            };
            if let Some((id, lead)) = status {
                leader = leader.or(Some(lead));
                ids.push(Some(id));
            } else {
                ids.push(None);
            }
        }
        let leader = leader?;
        ids.iter().position(|id| id.as_deref() == Some(leader.as_str()))
    }

    /// Kills member `i` with SIGKILL (no clean shutdown) and reaps it; its log stays readable
    /// through [`log`](Self::log).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut proc) = self.procs[i].take() {
            let _ = proc.child.kill();
            let _ = proc.child.wait();
            // Dropping the reaped process only reads its log if the test is failing.
        }
    }

    /// Starts member `i` again on its data directory (`--initial-cluster-state existing`) and
    /// waits, within [`HEALTH_LIMIT`], until every running member is healthy (plain HTTP
    /// members only).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i, true);
        if !self.specs[i].https {
            self.wait_healthy(HEALTH_LIMIT);
        }
    }

    /// Waits until every running member reports itself healthy (plain HTTP members: `/health`
    /// is asked without TLS); fails after `limit` naming
    /// the members that are not, with their logs.
    pub fn wait_healthy(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let mut sick = Vec::new();
            for i in 0..self.specs.len() {
                if self.procs[i].is_none() {
                    continue;
                }
                if let Some(status) = self.procs[i].as_mut().and_then(Proc::exited) {
                    panic!(
                        "etcd member {} exited ({status}) before it was healthy:\n{}",
                        self.specs[i].name,
                        self.log(i)
                    );
                }
                if !member_healthy(self.specs[i].client) {
                    sick.push(i);
                }
            }
            if sick.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = sick
                    .iter()
                    .map(|&i| format!("--- {} ---\n{}", self.specs[i].name, self.log(i)))
                    .collect();
                panic!(
                    "etcd members {:?} did not report themselves healthy within {limit:?}:\n{}",
                    sick.iter().map(|&i| &self.specs[i].name).collect::<Vec<_>>(),
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Everything member `i` logged, over all of its starts.
    pub fn log(&self, i: usize) -> String {
        (1..=self.starts[i])
            .map(|n| {
                let path = self.dir.join(format!("{}-{n}.log", self.specs[i].name));
                std::fs::read_to_string(path).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("--- restarted ---\n")
    }

    /// The directory holding the members' data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for proc in &mut self.procs {
            drop(proc.take());
        }
        if std::thread::panicking() {
            eprintln!("(etcd data and logs kept in {})", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(i: u16) -> MemberSpec {
        MemberSpec {
            name: format!("m{i}"),
            client: format!("127.0.0.1:{}", 2379 + i * 10).parse().unwrap(),
            peer: format!("127.0.0.1:{}", 2380 + i * 10).parse().unwrap(),
            data_dir: PathBuf::from(format!("/tmp/d/m{i}")),
            https: false,
            extra_args: Vec::new(),
        }
    }

    #[test]
    fn a_member_is_told_the_whole_cluster_and_its_state() {
        let members = [spec(0), spec(1), spec(2)];
        let args = members[1].args(&members, "tok", false);
        let value = |flag: &str| {
            let at = args.iter().position(|a| a == flag).unwrap();
            args[at + 1].clone()
        };
        assert_eq!(value("--name"), "m1");
        assert_eq!(value("--data-dir"), "/tmp/d/m1");
        assert_eq!(value("--listen-client-urls"), "http://127.0.0.1:2389");
        assert_eq!(value("--advertise-client-urls"), "http://127.0.0.1:2389");
        assert_eq!(value("--listen-peer-urls"), "http://127.0.0.1:2390");
        assert_eq!(
            value("--initial-cluster"),
            "m0=http://127.0.0.1:2380,m1=http://127.0.0.1:2390,m2=http://127.0.0.1:2400"
        );
        assert_eq!(value("--initial-cluster-state"), "new");
        assert_eq!(value("--initial-cluster-token"), "tok");
        let again = members[1].args(&members, "tok", true);
        let at = again.iter().position(|a| a == "--initial-cluster-state").unwrap();
        assert_eq!(again[at + 1], "existing");

        let mut tls = spec(0);
        tls.https = true;
        tls.extra_args = vec!["--client-cert-auth".into()];
        assert_eq!(tls.client_url(), "https://127.0.0.1:2379");
        let args = tls.args(&[tls.clone()], "tok", false);
        assert_eq!(args.last().map(String::as_str), Some("--client-cert-auth"));
        assert!(args.contains(&"https://127.0.0.1:2379".to_owned()));
    }

    #[test]
    fn health_answers_are_read() {
        assert!(healthy_answer(
            "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"health\":\"true\",\"reason\":\"\"}"
        ));
        assert!(!healthy_answer(
            "HTTP/1.0 503 Service Unavailable\r\n\r\n{\"health\":\"false\",\"reason\":\"RAFT NO LEADER\"}"
        ));
        assert!(!healthy_answer(""));
    }

    #[test]
    fn status_answers_name_the_member_and_its_leader() {
        let answer = "HTTP/1.0 200 OK\r\n\r\n{\"header\":{\"cluster_id\":\"1\",\"member_id\":\"1234\",\"revision\":\"5\"},\"version\":\"3.4.23\",\"leader\":\"99\",\"raftIndex\":\"8\"}";
        assert_eq!(status_ids(answer), Some(("1234".to_owned(), "99".to_owned())));
        assert_eq!(status_ids("HTTP/1.0 503\r\n\r\n"), None);
    }

    #[test]
    fn a_three_member_cluster_survives_the_loss_and_return_of_a_member() {
        let mut cluster = EtcdCluster::start(3, "127.0.0.1");
        assert_eq!(cluster.client_urls().len(), 3);
        let mut leader = None;
        crate::wait_until(HEALTH_LIMIT, "an etcd leader", || {
            leader = cluster.leader();
            leader.is_some()
        });
        let leader = leader.unwrap();
        cluster.kill(leader);
        assert!(!cluster.running(leader));
        // The two others keep a quorum and elect a new leader.
        cluster.wait_healthy(HEALTH_LIMIT);
        crate::wait_until(HEALTH_LIMIT, "a new etcd leader", || {
            cluster.leader().is_some_and(|l| l != leader)
        });
        cluster.restart(leader);
        assert!(cluster.running(leader));
        assert!(member_healthy(cluster.members()[leader].client));
        let dir = cluster.dir().to_owned();
        drop(cluster);
        assert!(!dir.exists(), "the data is removed on drop");
    }
}
