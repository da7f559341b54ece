//! What svc's tests share, so every suite waits, spawns and fails the same way:
//!
//! - [`require`]: the path of a third-party tool; a missing tool fails the test with the package
//!   to install (tests never skip);
//! - [`free_port`]: a free TCP port for a tool that must be told one;
//! - [`wait`]: deadlines for everything a test waits on ([`wait::wait_until`], [`wait::within`],
//!   a child's output or exit), failing with a message naming what did not happen;
//! - [`process`]: spawned processes whose output is kept in a log file, printed when the test
//!   fails, and killed when dropped; [`process::example_bin`] finds the built example programs;
//! - [`pki`]: a test CA issuing server certificates (rcgen);
//! - [`stamped`]: `svc` and `svc-upgrade` built with another version stamped in;
//! - [`etcd`], [`haproxy`], [`tinyproxy`]: real third-party servers for the high-availability
//!   tests (an etcd cluster, a TCP load balancer sending PROXY v2, an authenticating HTTP
//!   CONNECT proxy), each with its log kept and killed on drop.
#![deny(missing_docs)]
#![allow(clippy::unwrap_used)]

pub mod etcd;
pub mod haproxy;
pub mod pki;
pub mod process;
pub mod stamped;
pub mod tinyproxy;
pub mod wait;

use std::net::TcpListener;
use std::path::PathBuf;

pub use wait::{wait_until, within};

/// The directories searched for third-party tools.
const TOOL_DIRS: [&str; 6] = [
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/bin",
    "/sbin",
];

/// The path of the system tool `binary`, looked for on `PATH` and then in the system's binary
/// directories (Debian keeps some tools in `sbin`, outside a user's `PATH`). A missing tool fails
/// the test (never skips it), naming the Debian `package` that provides it.
pub fn require(binary: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(TOOL_DIRS.iter().map(PathBuf::from));
    for dir in dirs {
        let p = dir.join(binary);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{binary} is not installed: this test needs the Debian package `{package}` \
         (apt-get install -y {package}; CI installs it from .ci/apt-packages.d/)"
    );
}

/// A free TCP port on `ip` (probed and released: the tool that is given it binds it next).
///
/// The port is chosen at random *below* the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port the kernel handed out for `bind(0)` is in that range,
/// and any process's next outgoing connection may take it as its source port in the moment
/// between this probe and the tool's own bind (seen as `AddrInUse` in CI). Ports below the range
/// are only ever taken by an explicit bind.
pub fn free_port(ip: &str) -> u16 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    const FLOOR: u16 = 15_000;
    let ceiling = ephemeral_range_start();
    if ceiling <= FLOOR + 1_000 {
        // A machine whose ephemeral range starts low: the kernel's choice is all there is.
        return TcpListener::bind((ip, 0))
            .and_then(|l| l.local_addr())
            .unwrap_or_else(|e| panic!("finding a free port on {ip}: {e}"))
            .port();
    }
    let span = u64::from(ceiling - FLOOR);
    let state = std::collections::hash_map::RandomState::new();
    for _ in 0..1_000 {
        let mut hasher = state.build_hasher();
        hasher.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
        hasher.write_u32(std::process::id());
        let port = FLOOR + u16::try_from(hasher.finish() % span).unwrap_or(0);
        if TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on {ip} between {FLOOR} and {ceiling} after 1,000 tries")
}

/// The first port of the kernel's ephemeral range (Linux's default, 32768, when unreadable).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A new, empty directory under the system's temporary directory, named after `what`, this
/// process and a counter (the caller removes it).
pub fn temp_dir(what: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("svc-{what}-{}-{n}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_can_be_bound() {
        let port = free_port("127.0.0.1");
        assert_ne!(port, 0);
        assert!(port < ephemeral_range_start(), "{port} is in the ephemeral range");
        TcpListener::bind(("127.0.0.1", port)).expect("the free port binds");
    }

    #[test]
    fn required_tools_are_found() {
        assert!(require("sh", "dash").ends_with("sh"));
    }

    #[test]
    #[should_panic(expected = "Debian package `no-such-package`")]
    fn a_missing_tool_fails_naming_its_package() {
        require("no-such-tool-svc", "no-such-package");
    }
}
