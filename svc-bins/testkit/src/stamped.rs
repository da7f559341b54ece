//! `svc` and `svc-upgrade` built with another version stamped in (`SVC_BUILD_VERSION`), for the
//! tests that install one version over another with real package managers.
//!
//! Every stamp is built into one target directory next to the test's own
//! (`<target>/svc-stamped`), so the dependencies are compiled once for every such test and only
//! svc's own crates are rebuilt per stamp. `.ci/run` builds the stamp the systemd test uses with
//! the same command in the same environment before the tests, so there it is a no-op.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

/// How long one stamped build may take (a cold one builds every dependency).
pub const BUILD_LIMIT: Duration = Duration::from_secs(30 * 60);

/// The stamped target directory: `<target>/svc-stamped`, where `<target>` holds the running test
/// binary (`<target>/debug/deps/<test>-<hash>`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .unwrap_or_else(|| panic!("{} is outside a target directory", exe.display()))
        .join("svc-stamped")
}

/// Builds `svc` and `svc-upgrade` of the workspace at `repo_root` with `version` stamped in, and
/// returns the directory holding them (`<target_dir()>/debug`). Panics naming the version and
/// cargo's output when the build fails or takes longer than [`BUILD_LIMIT`].
pub fn build(repo_root: &Path, version: &str) -> PathBuf {
    let target = target_dir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(&cargo);
    // What cargo and nextest set for this test process must not reach the build: build scripts
    // record some of it (ring's records CARGO_MANIFEST_DIR), and a value other than the one
    // another build of this directory saw would rebuild most dependencies.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let cargo_set = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_",
        ]
        .iter()
        .any(|prefix| key.starts_with(prefix));
        if cargo_set || key == "CARGO_TARGET_TMPDIR" || key == "OUT_DIR" {
            command.env_remove(key.as_ref());
        }
    }
    command
        .current_dir(repo_root)
        .args(["build", "-q", "--locked", "-p", "svc-bins"])
        .args(["--bin", "svc", "--bin", "svc-upgrade", "--target-dir"])
        .arg(&target)
        // Each stamp rebuilds the workspace crates; incremental data would only pile up.
        .env("CARGO_INCREMENTAL", "0")
        .env("SVC_BUILD_VERSION", version);
    let started = Instant::now();
    let output = crate::wait::run_within(&mut command, BUILD_LIMIT, &format!("building svc {version}"))
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    assert!(
        output.status.success(),
        "building svc and svc-upgrade stamped {version} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!(
        "stamped svc and svc-upgrade {version}: cargo build took {:.1?}",
        started.elapsed()
    );
    target.join("debug")
}
