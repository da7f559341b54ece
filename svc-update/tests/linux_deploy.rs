//! The Linux deployment files checked with the real tools: the systemd units with
//! `systemd-analyze`, the shell scripts with `shellcheck`, the packaging script's version mapping
//! against [`svc_update::linux::version`], and the install script's refusals. Nothing here
//! installs anything; `linux_packages.rs` does.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context, Result, bail, ensure};
use svc_core::Version;
use svc_update::linux::{from_package_version, to_package_version};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn deploy(path: &str) -> PathBuf {
    repo_root().join("deploy").join(path)
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

fn run(command: &mut Command) -> Result<Output> {
    command.output().with_context(|| format!("running {command:?}"))
}

const UNITS: [&str; 3] = ["svc.service", "svc-upgrade.service", "svc-upgrade.timer"];

/// A root for `systemd-analyze verify --root`: the system's own units (for the targets the
/// units refer to) and stand-ins for the programs the units run, which `verify` insists exist.
fn verify_root(programs: &[&str]) -> Result<tempfile::TempDir> {
    let root = tempfile::tempdir()?;
    let lib = root.path().join("usr/lib/systemd");
    std::fs::create_dir_all(&lib)?;
    std::fs::create_dir_all(root.path().join("usr/bin"))?;
    std::fs::create_dir_all(root.path().join("etc/systemd/system"))?;
    std::os::unix::fs::symlink("usr/bin", root.path().join("bin"))?;
    let copied = run(Command::new("cp")
        .args(["-a", "/usr/lib/systemd/system"])
        .arg(&lib))?;
    ensure!(
        copied.status.success(),
        "copying the system's units: {}",
        String::from_utf8_lossy(&copied.stderr)
    );
    for program in programs {
        let path = root.path().join("usr/bin").join(program);
        std::fs::write(&path, "#!/bin/sh\n")?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    for unit in UNITS {
        std::fs::copy(
            deploy("systemd").join(unit),
            root.path().join("etc/systemd/system").join(unit),
        )?;
    }
    Ok(root)
}

fn verify(root: &Path, unit: &str) -> Result<Output> {
    run(Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        .arg(root.join("etc/systemd/system").join(unit)))
}

#[test]
fn systemd_units_verify_cleanly() -> Result<()> {
    require("systemd-analyze", "systemd")?;
    let root = verify_root(&["svc", "svc-upgrade", "kill"])?;
    for unit in UNITS {
        let out = verify(root.path(), unit)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.success() && stderr.trim().is_empty(),
            "systemd-analyze verify {unit}:\n{stderr}"
        );
    }
    Ok(())
}

#[test]
fn systemd_verify_catches_a_missing_program() -> Result<()> {
    // Proves the check above checks something: without /usr/bin/svc-upgrade the service fails.
    require("systemd-analyze", "systemd")?;
    let root = verify_root(&["svc", "kill"])?;
    let out = verify(root.path(), "svc-upgrade.service")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "verify passed without /usr/bin/svc-upgrade"
    );
    ensure!(
        stderr.contains("/usr/bin/svc-upgrade is not executable"),
        "{stderr}"
    );
    Ok(())
}

fn unit_values(unit: &str, key: &str) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(deploy("systemd").join(unit))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_owned())
        .collect())
}

#[test]
fn units_carry_the_specified_settings() -> Result<()> {
    let one = |unit: &str, key: &str| -> Result<String> {
        let values = unit_values(unit, key)?;
        ensure!(values.len() == 1, "{unit}: expected one {key}=, found {values:?}");
        Ok(values[0].clone())
    };
    assert_eq!(one("svc.service", "Restart")?, "always");
    assert_eq!(one("svc.service", "RestartSec")?, "5");
    assert_eq!(one("svc.service", "LimitNOFILE")?, "524288");
    assert_eq!(one("svc.service", "UMask")?, "0077");
    assert_eq!(one("svc.service", "EnvironmentFile")?, "-/etc/default/svc");
    assert_eq!(
        one("svc.service", "ExecStart")?,
        "/usr/bin/svc start --config /etc/svc.yaml"
    );
    assert_eq!(one("svc.service", "ExecReload")?, "/bin/kill -HUP $MAINPID");
    assert_eq!(one("svc-upgrade.service", "Type")?, "oneshot");
    assert_eq!(
        one("svc-upgrade.service", "ExecStart")?,
        "/usr/bin/svc-upgrade run"
    );
    assert_eq!(one("svc-upgrade.timer", "RandomizedDelaySec")?, "5min");
    assert_eq!(one("svc-upgrade.timer", "WantedBy")?, "timers.target");
    Ok(())
}

#[test]
fn timer_fires_every_thirty_minutes() -> Result<()> {
    require("systemd-analyze", "systemd")?;
    let calendars = unit_values("svc-upgrade.timer", "OnCalendar")?;
    ensure!(
        calendars.len() == 1,
        "expected one OnCalendar=, found {calendars:?}"
    );
    let out = run(Command::new("systemd-analyze").args([
        "calendar",
        "--iterations=3",
        "--base-time=2026-01-01 10:07:00 UTC",
        &calendars[0],
    ]))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "systemd-analyze calendar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for elapse in ["10:30:00", "11:00:00", "11:30:00"] {
        ensure!(
            stdout.contains(&format!("2026-01-01 {elapse}")),
            "expected an elapse at {elapse}:\n{stdout}"
        );
    }
    Ok(())
}

#[test]
fn shell_scripts_pass_shellcheck() -> Result<()> {
    require("shellcheck", "shellcheck")?;
    for script in ["install.sh", "packaging/build-packages.sh", "run-local.sh"] {
        let out = run(Command::new("shellcheck").arg(deploy(script)))?;
        ensure!(
            out.status.success(),
            "shellcheck {script}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(())
}

fn script_version(mode: &str, input: &str) -> Result<Output> {
    run(Command::new("bash")
        .arg(deploy("packaging/build-packages.sh"))
        .args([mode, input]))
}

#[test]
fn packaging_script_maps_versions_like_the_updater() -> Result<()> {
    for input in [
        "17.0.0-dev",
        "v17.0.0-dev",
        "17.0.0",
        "v15.1.3-rc.1",
        "16.2.0-alpha.2+build.5",
        "14.3.7+linux",
    ] {
        let version = Version::parse(input)?;
        let expected = to_package_version(&version)?;
        let out = script_version("package-version", input)?;
        ensure!(
            out.status.success(),
            "package-version {input}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mapped = String::from_utf8(out.stdout)?.trim().to_owned();
        assert_eq!(mapped, expected, "package-version {input}");
        let back = script_version("svc-version", &mapped)?;
        let back = String::from_utf8(back.stdout)?.trim().to_owned();
        assert_eq!(
            from_package_version(&mapped)?,
            Version::parse(&back)?,
            "svc-version {mapped}"
        );
    }
    assert_eq!(to_package_version(&Version::parse("17.0.0-dev")?)?, "17.0.0~dev");
    // Both refuse a hyphen inside the pre-release, which neither dpkg nor rpm accept.
    ensure!(to_package_version(&Version::parse("17.0.0-dev-1")?).is_err());
    let out = script_version("package-version", "17.0.0-dev-1")?;
    ensure!(!out.status.success(), "the script accepted 17.0.0-dev-1");
    for junk in ["17.0", "seventeen", "17.0.0 dev"] {
        ensure!(
            !script_version("package-version", junk)?.status.success(),
            "the script accepted {junk:?}"
        );
    }
    Ok(())
}

fn install_script(args: &[&str], env: &[(&str, &str)]) -> Result<(i32, String)> {
    let out = run(Command::new("/bin/bash")
        .arg(deploy("install.sh"))
        .args(args)
        .envs(env.iter().copied()))?;
    let code = match out.status.code() {
        Some(code) => code,
        None => bail!("install.sh was killed by a signal"),
    };
    Ok((code, String::from_utf8_lossy(&out.stderr).into_owned()))
}

#[test]
fn install_script_refuses_bad_arguments() -> Result<()> {
    let (code, stderr) = install_script(&[], &[])?;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("usage: install.sh <version> <cloud|enterprise>"),
        "{stderr}"
    );
    let (code, stderr) = install_script(&["17.0", "cloud"], &[])?;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("invalid version \"17.0\": expected <major>.<minor>.<patch>"),
        "{stderr}"
    );
    let (code, stderr) = install_script(&["v17.0.0", "community"], &[])?;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("invalid edition \"community\": expected cloud"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn install_script_refuses_an_unsupported_system() -> Result<()> {
    // A PATH with no package manager at all: only what the script needs before it looks.
    let bin = tempfile::tempdir()?;
    for program in ["id", "curl"] {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join(program))
            .find(|p| p.is_file());
        let Some(found) = found else {
            bail!("{program} not found: install the Debian package coreutils / curl")
        };
        std::os::unix::fs::symlink(found, bin.path().join(program))?;
    }
    let path = bin.path().to_str().context("utf-8 temp path")?;
    let (code, stderr) = install_script(&["17.0.0", "enterprise"], &[("PATH", path)])?;
    if !nix_is_root() {
        assert!(stderr.contains("must run as root"), "{stderr}");
        return Ok(());
    }
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("unsupported system: automatic updates need apt, yum/dnf or zypper"),
        "{stderr}"
    );
    let (code, stderr) = install_script(&["17.0.0", "enterprise"], &[("SVC_INSTALLER", "pacman")])?;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("SVC_INSTALLER=\"pacman\": expected apt, yum or zypper"),
        "{stderr}"
    );
    Ok(())
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// Stand-in executables: the package contents, not the programs, are under test here (the real
/// stamped binaries go through linux_packages.rs).
fn bin_dir(programs: &[&str]) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for program in programs {
        let path = dir.path().join(program);
        std::fs::write(&path, "#!/bin/sh\n")?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    Ok(dir)
}

fn build_packages(bin: &Path, out: &Path, format: &str) -> Result<Output> {
    run(Command::new("bash")
        .arg(deploy("packaging/build-packages.sh"))
        .args(["build", "v17.0.0-dev"])
        .arg(bin)
        .arg(out)
        .arg(format))
}

#[test]
fn deb_packages_hold_what_exists_and_map_the_version() -> Result<()> {
    require("dpkg-deb", "dpkg")?;
    let bin = bin_dir(&["svc", "tctl", "svc-upgrade"])?;
    let out = tempfile::tempdir()?;
    let built = build_packages(bin.path(), out.path(), "deb")?;
    ensure!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let arch = String::from_utf8(run(Command::new("dpkg").arg("--print-architecture"))?.stdout)?;
    let deb = |name: &str| out.path().join(format!("{name}_17.0.0~dev_{}.deb", arch.trim()));
    let field = |name: &str, field: &str| -> Result<String> {
        let out = run(Command::new("dpkg-deb").arg("-f").arg(deb(name)).arg(field))?;
        Ok(String::from_utf8(out.stdout)?.trim().to_owned())
    };
    let contents = |name: &str| -> Result<String> {
        Ok(String::from_utf8(
            run(Command::new("dpkg-deb").arg("-c").arg(deb(name)))?.stdout,
        )?)
    };
    assert_eq!(field("svc", "Version")?, "17.0.0~dev");
    assert_eq!(field("svc-ent-updater", "Depends")?, "svc");
    let svc = contents("svc")?;
    for path in [
        "./usr/bin/svc",
        "./usr/bin/tctl",
        "./lib/systemd/system/svc.service",
    ] {
        ensure!(svc.contains(path), "svc lacks {path}:\n{svc}");
    }
    ensure!(
        !svc.contains("./usr/bin/tsh"),
        "svc holds a tsh that was never built:\n{svc}"
    );
    let updater = contents("svc-ent-updater")?;
    for path in [
        "./usr/bin/svc-upgrade",
        "./lib/systemd/system/svc-upgrade.service",
        "./lib/systemd/system/svc-upgrade.timer",
    ] {
        ensure!(updater.contains(path), "svc-ent-updater lacks {path}:\n{updater}");
    }
    let postinst = run(Command::new("dpkg-deb")
        .arg("-I")
        .arg(deb("svc-ent-updater"))
        .arg("postinst"))?;
    let postinst = String::from_utf8(postinst.stdout)?;
    ensure!(
        postinst.contains("mkdir -p /etc/svc-upgrade.d")
            && postinst.contains("[ -d /run/systemd/system ]")
            && postinst.contains(r#""result":"none""#)
            && postinst.contains(r#""reason":"enrolled""#)
            && postinst.contains("UPGRADER_VERSION=17.0.0-dev"),
        "{postinst}"
    );
    Ok(())
}

#[test]
fn rpm_packages_hold_what_exists_and_map_the_version() -> Result<()> {
    require("rpmbuild", "rpm")?;
    let bin = bin_dir(&["svc", "tsh"])?;
    let out = tempfile::tempdir()?;
    let built = build_packages(bin.path(), out.path(), "rpm")?;
    ensure!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let rpm = |name: &str| {
        out.path()
            .join(format!("{name}-17.0.0~dev-1.{}.rpm", std::env::consts::ARCH))
    };
    let query = |name: &str, args: &[&str]| -> Result<String> {
        Ok(String::from_utf8(
            run(Command::new("rpm").arg("-qp").args(args).arg(rpm(name)))?.stdout,
        )?)
    };
    assert_eq!(query("svc", &["--qf", "%{VERSION}-%{RELEASE}"])?, "17.0.0~dev-1");
    assert_eq!(
        query("svc", &["-l"])?,
        "/lib/systemd/system/svc.service\n/usr/bin/svc\n/usr/bin/tsh\n"
    );
    assert_eq!(
        query("svc-ent-updater", &["-l"])?,
        "/lib/systemd/system/svc-upgrade.service\n/lib/systemd/system/svc-upgrade.timer\n"
    );
    ensure!(
        query("svc-ent-updater", &["-R"])?.lines().any(|l| l == "svc"),
        "svc-ent-updater does not require svc"
    );
    let scripts = query("svc-ent-updater", &["--scripts"])?;
    ensure!(
        scripts.contains("mkdir -p /etc/svc-upgrade.d")
            && scripts.contains("[ \"$1\" -eq 1 ]")
            // rpm turned the escaped %% back into the printf formats.
            && scripts.contains(r#""upgrader_version":"%s","result":"none""#)
            && scripts.contains(r#""reason":"enrolled""#),
        "{scripts}"
    );
    Ok(())
}

#[test]
fn packaging_without_svc_fails_clearly() -> Result<()> {
    let bin = bin_dir(&["tctl"])?;
    let out = tempfile::tempdir()?;
    let built = build_packages(bin.path(), out.path(), "deb")?;
    ensure!(!built.status.success(), "packages built without svc");
    let stderr = String::from_utf8_lossy(&built.stderr);
    ensure!(
        stderr.contains("svc: not found or not executable (the svc package needs at least svc)"),
        "{stderr}"
    );
    Ok(())
}
