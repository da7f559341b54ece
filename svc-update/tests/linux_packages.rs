//! The Linux packages end to end, on the real system (tests run as root on a throwaway machine):
//! real `svc` binaries stamped with three versions, real `.deb` and `.rpm` packages from
//! `deploy/packaging/build-packages.sh`, a gpg-signed apt repository and a createrepo_c rpm
//! repository on `file://`, and the real apt, dnf and zypper driven through
//! [`svc_update::linux::pkg`] and through `deploy/install.sh`.
//!
//! Each test installs v1, proves it with the installed `svc version`, moves to v2, shows the hold
//! keeps a routine upgrade from taking v3, and shows a wrong version fails with the package
//! manager's error while v2 stays. Tests share the system's package databases, so they take
//! one lock and clean up (packages, holds, repository files) before and after.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};
use svc_core::Version;
use svc_update::linux::{
    PkgError, UpgradeConfig, install_and_hold, package_manager,
    pkg::{Apt, Dnf, DnfHold, PackageManager, Zypper},
};

const V1: &str = "17.0.0-dev";
const V2: &str = "17.0.0";
const V3: &str = "17.0.1";

/// The system's package databases are shared: one test at a time.
static SYSTEM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn v(s: &str) -> Version {
    Version::parse(s).unwrap_or_else(|e| panic!("test version {s}: {e}"))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Fails (never skips) when a tool is missing, naming the Debian package that has it.
fn require(program: &str, debian_package: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()));
    ensure!(
        found,
        "{program} not found: install the Debian package {debian_package} (apt-get install {debian_package})"
    );
    Ok(())
}

/// Runs a command that must succeed; returns its stdout.
fn sh(command: &mut Command) -> Result<String> {
    let out = command.output().with_context(|| format!("running {command:?}"))?;
    ensure!(
        out.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command whose failure does not matter (clean-up of what may not exist).
fn quietly(command: &mut Command) {
    let _ = command.output();
}

/// Stops the gpg-agent that gpg (or dnf, importing a repository key) started for `home`; it
/// would otherwise outlive the test.
fn stop_gpg_agent(home: &Path) {
    quietly(
        Command::new("gpgconf")
            .arg("--homedir")
            .arg(home)
            .args(["--kill", "gpg-agent"]),
    );
}

/// Built once per test run: stamped binaries, packages, signed repositories.
struct Fixture {
    /// `<dir>/repo`, served as `file://`.
    repo: PathBuf,
    /// The armored public key that signed the repositories.
    key: PathBuf,
    /// An rpm that provides `/bin/sh` (see [`build_host_compat_rpm`]).
    host_compat: PathBuf,
}

static FIXTURE: OnceLock<Result<Fixture, String>> = OnceLock::new();

fn fixture() -> Result<&'static Fixture> {
    FIXTURE
        .get_or_init(|| reuse_or_build_fixture().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("building the package fixture failed: {e}"))
}

/// Marks a fixture complete, for the nextest run that built it: `<run id>\n<host-compat rpm>`.
const FIXTURE_MARKER: &str = ".built-for-nextest-run";

/// Under cargo-nextest every test is a process of its own, so the [`FIXTURE`] static alone would
/// build the fixture (three stamped builds) once per test. Within one nextest run
/// (`NEXTEST_RUN_ID`) the first test builds it and the others reuse it; the `system-packages`
/// test group of `.config/nextest.toml` runs them one at a time, so no two build at once. Under
/// `cargo test` (no run id) it is built once per process as before.
fn reuse_or_build_fixture() -> Result<Fixture> {
    let run = std::env::var("NEXTEST_RUN_ID").ok();
    let dir = stamped_target_dir()?.join("fixture");
    let marker = dir.join(FIXTURE_MARKER);
    if let (Some(run), Ok(text)) = (&run, std::fs::read_to_string(&marker))
        && let Some((built_for, host_compat)) = text.split_once('\n')
        && built_for == run
    {
        eprintln!("reusing the package fixture built earlier in nextest run {run}");
        let repo = dir.join("repo");
        return Ok(Fixture {
            key: repo.join("svc-pubkey.asc"),
            repo,
            host_compat: PathBuf::from(host_compat),
        });
    }
    let fixture = build_fixture()?;
    ensure!(
        fixture.repo == dir.join("repo") && fixture.key == fixture.repo.join("svc-pubkey.asc"),
        "the fixture's layout changed: update reuse_or_build_fixture"
    );
    if let Some(run) = run {
        std::fs::write(&marker, format!("{run}\n{}", fixture.host_compat.display()))?;
    }
    Ok(fixture)
}

/// Where stamped builds go ([`svc_testkit::stamped::target_dir`]), kept between runs so only the
/// version stamp (svc-core and what depends on it) is rebuilt; the fixture lives next to them.
fn stamped_target_dir() -> Result<PathBuf> {
    Ok(svc_testkit::stamped::target_dir())
}

fn build_fixture() -> Result<Fixture> {
    let uid = sh(Command::new("id").arg("-u"))?;
    ensure!(
        uid.trim() == "0",
        "these tests install packages into the system: run them as root (on a throwaway machine)"
    );
    for (program, package) in [
        ("dpkg-deb", "dpkg"),
        ("dpkg-scanpackages", "dpkg-dev"),
        ("apt-ftparchive", "apt-utils"),
        ("gpg", "gnupg"),
        ("rpmbuild", "rpm"),
        ("createrepo_c", "createrepo-c"),
        ("strip", "binutils"),
    ] {
        require(program, package)?;
    }
    // Statics are never dropped, so a temporary directory would outlive every run; this one is
    // replaced by the next run instead.
    let target_dir = stamped_target_dir()?;
    let dir = target_dir.join("fixture");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    // apt reads file:// repositories as user _apt.
    for ancestor in dir.ancestors().take(3) {
        std::fs::set_permissions(ancestor, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    let repo = dir.join("repo");
    let pool = dir.join("pool");
    // A signing key of our own, in a keyring of our own.
    let gnupg = dir.join("gnupg");
    // An agent of an earlier run may still serve this path (its socket directory is gone).
    stop_gpg_agent(&gnupg);
    std::fs::create_dir_all(&gnupg)?;
    std::fs::set_permissions(&gnupg, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let gpg = |args: &[&str]| -> Result<String> {
        sh(Command::new("gpg")
            .env("GNUPGHOME", &gnupg)
            .args(["--batch", "--quiet"])
            .args(args))
    };
    gpg(&[
        "--passphrase",
        "",
        "--quick-gen-key",
        "svc test repository <repo@example.invalid>",
        "ed25519",
        "sign",
        "never",
    ])?;
    std::fs::create_dir_all(&repo)?;
    let key = repo.join("svc-pubkey.asc");
    std::fs::write(&key, gpg(&["--armor", "--export"])?)?;

    for version in [V1, V2, V3] {
        let built = svc_testkit::stamped::build(&repo_root(), version);
        let bin = dir.join("bin").join(version);
        std::fs::create_dir_all(&bin)?;
        for program in ["svc", "svc-upgrade"] {
            std::fs::copy(built.join(program), bin.join(program))?;
            // Debug builds carry ~100 MB of debug information each; packing it into six
            // packages per version would dominate the test's time.
            sh(Command::new("strip").arg("--strip-debug").arg(bin.join(program)))?;
            let said = sh(Command::new(bin.join(program)).arg("version"))?;
            ensure!(
                said.trim() == format!("{program} v{version}"),
                "stamped {program} says {said:?}"
            );
        }
        let started = Instant::now();
        sh(Command::new("bash")
            .arg(repo_root().join("deploy/packaging/build-packages.sh"))
            .args(["build", version])
            .arg(&bin)
            .arg(&pool)
            .env("GNUPGHOME", &gnupg)
            .env("SVC_RPM_SIGN_KEY", "repo@example.invalid"))?;
        eprintln!("packages of {version} built in {:.1?}", started.elapsed());
        let signature = sh(Command::new("rpm")
            .args(["-qp", "--qf", "%{DSAHEADER:pgpsig} %{RSAHEADER:pgpsig}"])
            .arg(pool.join(format!(
                "svc-{}-1.{}.rpm",
                version.replacen('-', "~", 1),
                std::env::consts::ARCH
            ))))?;
        ensure!(
            signature.contains("Key ID"),
            "the svc {version} rpm is not signed: {signature}"
        );
    }

    // apt: pool plus dists/stable/{cloud,v17}/binary-<arch>/Packages, Release signed into InRelease.
    let arch = sh(Command::new("dpkg").arg("--print-architecture"))?
        .trim()
        .to_owned();
    let apt = repo.join("apt");
    std::fs::create_dir_all(apt.join("pool"))?;
    for entry in std::fs::read_dir(&pool)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "deb") {
            std::fs::copy(
                &path,
                apt.join("pool").join(path.file_name().context("file name")?),
            )?;
        }
    }
    for component in ["cloud", "v17"] {
        let binary = apt.join(format!("dists/stable/{component}/binary-{arch}"));
        std::fs::create_dir_all(&binary)?;
        let packages = sh(Command::new("apt-ftparchive")
            .current_dir(&apt)
            .args(["packages", "pool"]))?;
        std::fs::write(binary.join("Packages"), packages)?;
    }
    let release = sh(Command::new("apt-ftparchive")
        .current_dir(apt.join("dists/stable"))
        .args([
            "-o",
            "APT::FTPArchive::Release::Suite=stable",
            "-o",
            "APT::FTPArchive::Release::Codename=stable",
        ])
        .args(["-o", "APT::FTPArchive::Release::Components=cloud v17"])
        .arg("-o")
        .arg(format!("APT::FTPArchive::Release::Architectures={arch}"))
        .args(["release", "."]))?;
    std::fs::write(apt.join("dists/stable/Release"), release)?;
    sh(Command::new("gpg")
        .env("GNUPGHOME", &gnupg)
        .args(["--batch", "--yes", "--clearsign", "-o"])
        .arg(apt.join("dists/stable/InRelease"))
        .arg(apt.join("dists/stable/Release")))?;

    // rpm: one createrepo_c tree per channel and architecture, repomd.xml signed.
    let rpm_arch = sh(Command::new("uname").arg("-m"))?.trim().to_owned();
    for component in ["cloud", "v17"] {
        let tree = repo.join(format!("rpm/stable/{component}/{rpm_arch}"));
        std::fs::create_dir_all(&tree)?;
        for entry in std::fs::read_dir(&pool)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "rpm") {
                std::fs::copy(&path, tree.join(path.file_name().context("file name")?))?;
            }
        }
        sh(Command::new("createrepo_c").arg("-q").arg(&tree))?;
        sh(Command::new("gpg")
            .env("GNUPGHOME", &gnupg)
            .args(["--batch", "--yes", "--armor", "--detach-sign"])
            .arg(tree.join("repodata/repomd.xml")))?;
    }
    let host_compat = build_host_compat_rpm(&dir)?;
    stop_gpg_agent(&gnupg);
    Ok(Fixture {
        repo,
        key,
        host_compat,
    })
}

/// The rpm database of a Debian host knows nothing of the files dpkg installed, so the `/bin/sh`
/// every package with maintainer scripts requires is declared by an empty package, as a real
/// rpm-based system's `bash` package would.
fn build_host_compat_rpm(dir: &Path) -> Result<PathBuf> {
    let top = dir.join("host-compat");
    std::fs::create_dir_all(top.join("SPECS"))?;
    let spec = top.join("SPECS/host-compat.spec");
    std::fs::write(
        &spec,
        "Name: svc-test-host-compat\nVersion: 1\nRelease: 1\nSummary: the Debian host's /bin/sh\n\
         License: Apache-2.0\nBuildArch: noarch\nProvides: /bin/sh\n%description\nTest fixture.\n%files\n",
    )?;
    sh(Command::new("rpmbuild")
        .args(["--quiet", "-bb", "--define"])
        .arg(format!("_topdir {}", top.display()))
        .arg(&spec))?;
    Ok(top.join("RPMS/noarch/svc-test-host-compat-1-1.noarch.rpm"))
}

fn installed_svc_says() -> Result<String> {
    Ok(sh(Command::new("/usr/bin/svc").arg("version"))?.trim().to_owned())
}

/// The steps every package manager goes through, with `routine_upgrade` running the system's
/// ordinary upgrade command (which the hold must resist).
async fn exercise(pm: &dyn PackageManager, routine_upgrade: impl Fn() -> Result<()>) -> Result<()> {
    assert_eq!(
        pm.installed_version("svc").await?,
        None,
        "svc installed before the test"
    );

    install_and_hold(pm, "svc", &v(V1), false).await?;
    assert_eq!(pm.installed_version("svc").await?, Some(v(V1)));
    assert_eq!(installed_svc_says()?, format!("svc v{V1}"));

    // 17.0.0-dev → 17.0.0: the pre-release sorts below its release in the package manager too.
    install_and_hold(pm, "svc", &v(V2), false).await?;
    assert_eq!(pm.installed_version("svc").await?, Some(v(V2)));
    assert_eq!(installed_svc_says()?, format!("svc v{V2}"));

    routine_upgrade()?;
    assert_eq!(
        installed_svc_says()?,
        format!("svc v{V2}"),
        "a routine upgrade moved the held package"
    );

    let err = install_and_hold(pm, "svc", &v("99.0.0"), false)
        .await
        .expect_err("no such version");
    match &err {
        PkgError::Failed { code, stderr, .. } => {
            ensure!(code.is_some_and(|c| c != 0), "exit code {code:?}");
            ensure!(!stderr.is_empty(), "no stderr in {err}");
        }
        other => bail!("expected PkgError::Failed, got {other:?}"),
    }
    eprintln!("{:?} refused 99.0.0: {err}", pm.kind());
    assert_eq!(installed_svc_says()?, format!("svc v{V2}"));
    routine_upgrade()?;
    assert_eq!(
        installed_svc_says()?,
        format!("svc v{V2}"),
        "the failed install left the package unheld"
    );

    // Below the installed version only when forced (a cluster rolled back).
    let err = install_and_hold(pm, "svc", &v(V1), false)
        .await
        .expect_err("unforced downgrade");
    eprintln!("{:?} refused the unforced downgrade: {err}", pm.kind());
    assert_eq!(installed_svc_says()?, format!("svc v{V2}"));
    install_and_hold(pm, "svc", &v(V1), true).await?;
    assert_eq!(installed_svc_says()?, format!("svc v{V1}"));

    // The updater package's install script creates the configuration directory.
    ensure!(
        !Path::new("/etc/svc-upgrade.d").exists(),
        "/etc/svc-upgrade.d left from before"
    );
    pm.install("svc-ent-updater", &v(V1), false).await?;
    let mode = sh(Command::new("stat").args(["-c", "%a"]).arg("/etc/svc-upgrade.d"))?;
    assert_eq!(mode.trim(), "755");
    ensure!(
        Path::new("/lib/systemd/system/svc-upgrade.timer").is_file(),
        "no timer installed"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// apt

fn apt_cleanup() {
    quietly(Command::new("apt-mark").args(["unhold", "svc", "svc-ent-updater"]));
    quietly(Command::new("dpkg").args(["--purge", "svc-ent-updater", "svc"]));
    for path in [
        "/etc/apt/sources.list.d/svc.list",
        "/usr/share/keyrings/svc-archive-keyring.asc",
    ] {
        let _ = std::fs::remove_file(path);
    }
    // The lists `install.sh` fetched from the fixture repository.
    if let Ok(lists) = std::fs::read_dir("/var/lib/apt/lists") {
        for entry in lists.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .contains("_svc-stamped_fixture_repo_apt_")
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir_all("/etc/svc-upgrade.d");
}

#[tokio::test(flavor = "multi_thread")]
async fn apt_installs_pinned_versions_and_holds_them() -> Result<()> {
    let _system = SYSTEM.lock().await;
    require("apt-get", "apt")?;
    let fixture = fixture()?;
    apt_cleanup();
    // The test's own sources list and lists directory: the machine's sources stay out.
    let state = tempfile::tempdir()?;
    let list = state.path().join("svc-test.list");
    std::fs::write(
        &list,
        format!(
            "deb [signed-by={}] file://{}/apt stable v17\n",
            fixture.key.display(),
            fixture.repo.display()
        ),
    )?;
    std::fs::create_dir_all(state.path().join("lists/partial"))?;
    let options: Vec<String> = [
        format!("Dir::Etc::sourcelist={}", list.display()),
        "Dir::Etc::sourceparts=-".to_owned(),
        format!("Dir::State::lists={}/lists", state.path().display()),
    ]
    .into_iter()
    .flat_map(|o| ["-o".to_owned(), o])
    .collect();
    let apt = Apt::with_options(options.clone());
    let result = exercise(&apt, || {
        let upgrade = sh(Command::new("apt-get").args(&options).args(["-y", "upgrade"]))?;
        eprintln!("apt-get upgrade:\n{upgrade}");
        let held = sh(Command::new("apt-mark").arg("showhold"))?;
        ensure!(held.lines().any(|l| l == "svc"), "apt-mark showhold: {held}");
        let policy = sh(Command::new("apt-cache").args(&options).args(["policy", "svc"]))?;
        ensure!(
            policy.contains(&format!("Candidate: {V3}")),
            "v3 not offered, so the hold proved nothing:\n{policy}"
        );
        Ok(())
    })
    .await;
    apt_cleanup();
    result
}

#[tokio::test(flavor = "multi_thread")]
async fn apt_wrong_signing_key_is_refused() -> Result<()> {
    let _system = SYSTEM.lock().await;
    let fixture = fixture()?;
    let state = tempfile::tempdir()?;
    // A key that did not sign the repository.
    let gnupg = state.path().join("gnupg");
    std::fs::create_dir_all(&gnupg)?;
    std::fs::set_permissions(&gnupg, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    sh(Command::new("gpg").env("GNUPGHOME", &gnupg).args([
        "--batch",
        "--quiet",
        "--passphrase",
        "",
        "--quick-gen-key",
        "other <other@example.invalid>",
        "ed25519",
        "sign",
        "never",
    ]))?;
    let other = state.path().join("other.asc");
    std::fs::write(
        &other,
        sh(Command::new("gpg")
            .env("GNUPGHOME", &gnupg)
            .args(["--batch", "--armor", "--export"]))?,
    )?;
    stop_gpg_agent(&gnupg);
    let list = state.path().join("svc-test.list");
    std::fs::write(
        &list,
        format!(
            "deb [signed-by={}] file://{}/apt stable v17\n",
            other.display(),
            fixture.repo.display()
        ),
    )?;
    std::fs::create_dir_all(state.path().join("lists/partial"))?;
    let apt = Apt::with_options(vec![
        "-o".into(),
        format!("Dir::Etc::sourcelist={}", list.display()),
        "-o".into(),
        "Dir::Etc::sourceparts=-".into(),
        "-o".into(),
        format!("Dir::State::lists={}/lists", state.path().display()),
    ]);
    let err = apt
        .install("svc", &v(V1), false)
        .await
        .expect_err("unsigned for this key");
    ensure!(
        err.to_string().contains("NO_PUBKEY") || err.to_string().contains("not signed"),
        "{err}"
    );
    assert_eq!(apt.installed_version("svc").await?, None);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn install_script_with_apt() -> Result<()> {
    let _system = SYSTEM.lock().await;
    let fixture = fixture()?;
    apt_cleanup();
    let result = run_install_script(fixture, "enterprise", "apt", &[], || {
        let held = sh(Command::new("apt-mark").arg("showhold"))?;
        ensure!(
            held.contains("svc\n") && held.contains("svc-ent-updater"),
            "apt-mark showhold: {held}"
        );
        let list = std::fs::read_to_string("/etc/apt/sources.list.d/svc.list")?;
        ensure!(
            list.contains("[signed-by=/usr/share/keyrings/svc-archive-keyring.asc]")
                && list.contains(" stable v17"),
            "{list}"
        );
        Ok(())
    })
    .await;
    apt_cleanup();
    result
}

/// Runs `deploy/install.sh v17.0.0 <edition>` against the fixture repository with `installer`,
/// for a non-root agent user, checks what every installer must leave behind and what
/// `installer_checks` says; then moves the enrolled agent to v3 the way `svc-upgrade` will: the
/// configuration directory the script wrote, the package manager it names with the system's
/// defaults, [`install_and_hold`].
async fn run_install_script(
    fixture: &Fixture,
    edition: &str,
    installer: &str,
    env: &[(&str, &str)],
    installer_checks: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let out = sh(Command::new("/bin/bash")
        .arg(repo_root().join("deploy/install.sh"))
        .args([&format!("v{V2}"), edition])
        .env("SVC_REPO_URL", format!("file://{}", fixture.repo.display()))
        .env("SVC_INSTALLER", installer)
        .env("SVC_AGENT_USER", "nobody")
        .envs(env.iter().copied()))?;
    ensure!(out.contains("svc-upgrade dry-run"), "no next step in:\n{out}");
    assert_eq!(installed_svc_says()?, format!("svc v{V2}"));
    let schedule = Path::new("/etc/svc-upgrade.d/schedule");
    let owner = sh(Command::new("stat").args(["-c", "%U %a"]).arg(schedule))?;
    assert_eq!(owner.trim(), "nobody 644");
    // The agent reports its heartbeats to the updater in `agent`.
    let owner = sh(Command::new("stat")
        .args(["-c", "%U %a"])
        .arg("/etc/svc-upgrade.d/agent"))?;
    assert_eq!(owner.trim(), "nobody 644");
    // The updater package announced the enrolment.
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("/etc/svc-upgrade.d/status")?)?;
    ensure!(
        status["upgrader"] == "unit"
            && status["upgrader_version"] == V2
            && status["result"] == "none"
            && status["reason"] == "enrolled"
            && status["from"] == V2,
        "initial status: {status}"
    );
    let mode = sh(Command::new("stat")
        .args(["-c", "%a"])
        .arg("/etc/svc-upgrade.d/status"))?;
    assert_eq!(mode.trim(), "644");
    let dir_mode = sh(Command::new("stat").args(["-c", "%a"]).arg("/etc/svc-upgrade.d"))?;
    assert_eq!(dir_mode.trim(), "755");
    assert_eq!(
        std::fs::read_to_string("/etc/svc-upgrade.d/installer")?.trim(),
        installer
    );
    ensure!(
        Path::new("/lib/systemd/system/svc-upgrade.timer").is_file(),
        "svc-ent-updater installed no timer"
    );
    installer_checks()?;

    let config = UpgradeConfig::load(|_| None)?;
    assert_eq!(
        config.installer.map(|k| k.to_string()).as_deref(),
        Some(installer)
    );
    let pm = package_manager(config.installer)?;
    install_and_hold(pm.as_ref(), &config.package, &v(V3), false).await?;
    assert_eq!(pm.installed_version("svc").await?, Some(v(V3)));
    assert_eq!(installed_svc_says()?, format!("svc v{V3}"));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// rpm family: rpm, dnf and zypper share /var/lib/rpm (Debian's rpm defaults to ~/.rpmdb).

const RPM_MACROS: &str = "/etc/rpm/macros.svc-test-dbpath";

/// After [`rpm_cleanup`], which writes the `%_dbpath` macro.
fn rpm_setup(fixture: &Fixture) -> Result<()> {
    std::fs::create_dir_all("/var/lib/rpm")?;
    sh(Command::new("rpm").arg("--initdb"))?;
    sh(Command::new("rpm")
        .args(["-i", "--replacepkgs"])
        .arg(&fixture.host_compat))?;
    Ok(())
}

fn rpm_cleanup(dnf_conf: Option<&str>) {
    // The macro first, so rpm sees the database dnf and zypper wrote.
    let _ = std::fs::create_dir_all("/etc/rpm");
    let _ = std::fs::write(RPM_MACROS, "%_dbpath /var/lib/rpm\n");
    quietly(Command::new("zypper").args(["--non-interactive", "removelock", "svc", "svc-ent-updater"]));
    // One at a time: `rpm -e a b` removes nothing when a is not installed.
    for package in ["svc-ent-updater", "svc", "svc-test-host-compat"] {
        quietly(Command::new("rpm").args(["-e", "--nodeps", package]));
    }
    if let Some(conf) = dnf_conf {
        let _ = std::fs::write("/etc/dnf/dnf.conf", conf);
    }
    // Repository keys imported by zypper or install.sh: the tests' keys only.
    if let Ok(out) = Command::new("rpm")
        .args([
            "-q",
            "gpg-pubkey",
            "--qf",
            "%{NAME}-%{VERSION}-%{RELEASE} %{SUMMARY}\\n",
        ])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("example.invalid"))
        {
            if let Some(key) = line.split_whitespace().next() {
                quietly(Command::new("rpm").args(["-e", key]));
                // zypper keeps a copy of every key it saw in the rpm database.
                let _ = std::fs::remove_file(format!("/var/cache/zypp/pubkeys/{key}.key"));
            }
        }
    }
    for path in [
        "/etc/yum.repos.d/svc.repo",
        "/etc/zypp/repos.d/svc.repo",
        "/etc/pki/rpm-gpg/RPM-GPG-KEY-svc",
    ] {
        let _ = std::fs::remove_file(path);
    }
    let _ = std::fs::remove_dir_all("/etc/svc-upgrade.d");
    quietly(Command::new("zypper").args(["--non-interactive", "clean", "--all"]));
    if let Ok(caches) = std::fs::read_dir("/var/cache/dnf") {
        for cache in caches.flatten() {
            if cache.file_name().to_string_lossy().starts_with("svc") {
                stop_gpg_agent(&cache.path().join("pubring"));
                // `dnf clean all` keeps caches of repositories it no longer knows.
                let _ = std::fs::remove_dir_all(cache.path());
            }
        }
    }
    quietly(Command::new("dnf").args(["clean", "all"]));
}

fn rpm_repo_file(fixture: &Fixture, dir: &Path) -> Result<()> {
    std::fs::write(
        dir.join("svc-test.repo"),
        format!(
            "[svc-test]\nname=svc test\nbaseurl=file://{}/rpm/stable/v17/$basearch\nenabled=1\nautorefresh=1\n\
             gpgcheck=1\npkg_gpgcheck=1\nrepo_gpgcheck=1\ngpgkey=file://{}\n",
            fixture.repo.display(),
            fixture.key.display()
        ),
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn dnf_installs_pinned_versions_and_holds_them() -> Result<()> {
    let _system = SYSTEM.lock().await;
    require("dnf", "dnf")?;
    require("rpm", "rpm")?;
    let fixture = fixture()?;
    let dnf_conf = std::fs::read_to_string("/etc/dnf/dnf.conf")?;
    rpm_cleanup(Some(&dnf_conf));
    rpm_setup(fixture)?;
    let repos = tempfile::tempdir()?;
    rpm_repo_file(fixture, repos.path())?;
    let options = vec![
        "--releasever=12".to_owned(),
        format!("--setopt=reposdir={}", repos.path().display()),
    ];
    let dnf = Dnf::new("dnf", options.clone());
    let result = async {
        // This machine's dnf has no versionlock plugin (its package conflicts with zypper's), so
        // the hold is the exclude= line.
        assert_eq!(
            dnf.hold_method().await?,
            &DnfHold::Exclude("/etc/dnf/dnf.conf".into())
        );
        exercise(&dnf, || {
            let upgrade = sh(Command::new("dnf").args(&options).args(["-y", "upgrade"]))?;
            eprintln!("dnf upgrade:\n{upgrade}");
            let conf = std::fs::read_to_string("/etc/dnf/dnf.conf")?;
            ensure!(
                conf.lines().any(|l| l == "exclude=svc"),
                "no hold in dnf.conf:\n{conf}"
            );
            let offered = sh(Command::new("dnf").args(&options).args([
                "-q",
                "--disableexcludes=all",
                "list",
                "--available",
                "svc",
            ]))?;
            ensure!(
                offered.contains("17.0.1"),
                "v3 not offered, so the hold proved nothing:\n{offered}"
            );
            Ok(())
        })
        .await
    }
    .await;
    rpm_cleanup(Some(&dnf_conf));
    let _ = std::fs::remove_file(RPM_MACROS);
    result
}

#[tokio::test(flavor = "multi_thread")]
async fn zypper_installs_pinned_versions_and_locks_them() -> Result<()> {
    let _system = SYSTEM.lock().await;
    require("zypper", "zypper")?;
    require("rpm", "rpm")?;
    let fixture = fixture()?;
    rpm_cleanup(None);
    rpm_setup(fixture)?;
    let repos = tempfile::tempdir()?;
    rpm_repo_file(fixture, repos.path())?;
    let reposd = repos.path().to_str().context("utf-8 temp path")?.to_owned();
    let options = vec![
        "--gpg-auto-import-keys".to_owned(),
        "--reposd-dir".to_owned(),
        reposd.clone(),
    ];
    let zypper = Zypper::with_options(options.clone());
    let result = exercise(&zypper, || {
        let upgrade = sh(Command::new("zypper")
            .arg("--non-interactive")
            .args(&options)
            .arg("update"))?;
        eprintln!("zypper update:\n{upgrade}");
        let locks = sh(Command::new("zypper").args(["--non-interactive", "locks"]))?;
        ensure!(locks.contains("svc"), "zypper locks:\n{locks}");
        let offered = sh(Command::new("zypper")
            .arg("--non-interactive")
            .args(&options)
            .args(["search", "-s", "svc"]))?;
        ensure!(
            offered.contains("17.0.1"),
            "v3 not offered, so the lock proved nothing:\n{offered}"
        );
        Ok(())
    })
    .await;
    rpm_cleanup(None);
    let _ = std::fs::remove_file(RPM_MACROS);
    result
}

#[tokio::test(flavor = "multi_thread")]
async fn install_script_with_dnf() -> Result<()> {
    let _system = SYSTEM.lock().await;
    require("dnf", "dnf")?;
    let fixture = fixture()?;
    let dnf_conf = std::fs::read_to_string("/etc/dnf/dnf.conf")?;
    rpm_cleanup(Some(&dnf_conf));
    rpm_setup(fixture)?;
    let result = run_install_script(fixture, "cloud", "yum", &[], || {
        let conf = std::fs::read_to_string("/etc/dnf/dnf.conf")?;
        ensure!(
            conf.lines().any(|l| l == "exclude=svc svc-ent-updater"),
            "no hold in dnf.conf:\n{conf}"
        );
        let repo = std::fs::read_to_string("/etc/yum.repos.d/svc.repo")?;
        ensure!(
            repo.contains("/rpm/stable/cloud/$basearch")
                && repo.contains("\ngpgcheck=1")
                && repo.contains("repo_gpgcheck=1"),
            "{repo}"
        );
        Ok(())
    })
    .await;
    rpm_cleanup(Some(&dnf_conf));
    let _ = std::fs::remove_file(RPM_MACROS);
    result
}

#[tokio::test(flavor = "multi_thread")]
async fn install_script_with_zypper() -> Result<()> {
    let _system = SYSTEM.lock().await;
    require("zypper", "zypper")?;
    let fixture = fixture()?;
    rpm_cleanup(None);
    rpm_setup(fixture)?;
    // The key as a local file this time (the other installers download it from the repository).
    let key = fixture.key.to_str().context("utf-8 key path")?.to_owned();
    let result = run_install_script(
        fixture,
        "enterprise",
        "zypper",
        &[("SVC_REPO_KEY", key.as_str())],
        || {
            let locks = sh(Command::new("zypper").args(["--non-interactive", "locks"]))?;
            ensure!(locks.contains("svc-ent-updater"), "zypper locks:\n{locks}");
            Ok(())
        },
    )
    .await;
    rpm_cleanup(None);
    let _ = std::fs::remove_file(RPM_MACROS);
    result
}

// ---------------------------------------------------------------------------------------------
// svc-upgrade end to end (tests/linux_packages/upgrade.rs), on the same fixture.

#[path = "linux_packages/upgrade.rs"]
mod upgrade;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn svc_upgrade_with_apt() -> Result<()> {
    let _system = SYSTEM.lock().await;
    require("apt-get", "apt")?;
    let fixture = fixture()?;
    apt_cleanup();
    let result = upgrade::updater_story(fixture, "apt", || {
        let held = sh(Command::new("apt-mark").arg("showhold"))?;
        Ok(held.lines().any(|l| l == "svc"))
    })
    .await;
    apt_cleanup();
    result
}

/// Whether `exclude=` in dnf.conf's main section names `svc`.
fn dnf_holds_svc() -> Result<bool> {
    let conf = std::fs::read_to_string("/etc/dnf/dnf.conf")?;
    Ok(conf.lines().any(|l| {
        l.split_once('=').is_some_and(|(k, v)| {
            matches!(k.trim(), "exclude" | "excludepkgs")
                && v.split(|c: char| c == ',' || c.is_whitespace())
                    .any(|p| p == "svc")
        })
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn svc_upgrade_with_dnf() -> Result<()> {
    let _system = SYSTEM.lock().await;
    require("dnf", "dnf")?;
    let fixture = fixture()?;
    let dnf_conf = std::fs::read_to_string("/etc/dnf/dnf.conf")?;
    rpm_cleanup(Some(&dnf_conf));
    rpm_setup(fixture)?;
    let result = upgrade::updater_story(fixture, "yum", dnf_holds_svc).await;
    rpm_cleanup(Some(&dnf_conf));
    let _ = std::fs::remove_file(RPM_MACROS);
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn svc_upgrade_with_zypper() -> Result<()> {
    let _system = SYSTEM.lock().await;
    require("zypper", "zypper")?;
    let fixture = fixture()?;
    rpm_cleanup(None);
    rpm_setup(fixture)?;
    let result = upgrade::updater_story(fixture, "zypper", || {
        let locks = sh(Command::new("zypper").args(["--non-interactive", "locks"]))?;
        Ok(locks.lines().any(|l| l.split('|').any(|f| f.trim() == "svc")))
    })
    .await;
    rpm_cleanup(None);
    let _ = std::fs::remove_file(RPM_MACROS);
    result
}
