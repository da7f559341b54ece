//! Runs the self-contained examples (`router_in_front`, `version_check`) and checks what they
//! print, including the refusals: an agent ahead of its cluster or too old may not join.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use svc_testkit::process::example_bin;

/// Runs example `name` with `args` to completion within 30 s: (success, stdout, stderr).
async fn run(name: &str, args: &[&str]) -> Result<(bool, String, String)> {
    let mut cmd = Command::new(example_bin(name));
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = tokio::process::Command::from(cmd).kill_on_drop(true).spawn()?;
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .with_context(|| format!("{name} did not finish within 30 s"))??;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test]
async fn router_in_front_sends_each_protocol_to_its_server() -> Result<()> {
    let (ok, stdout, stderr) = run("router_in_front", &[]).await?;
    assert!(ok, "router_in_front failed: {stderr}");
    assert!(
        stdout.contains("ALPN my-product/1       -> hello from the product's own server"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ALPN svc-reversetunnel  -> svc reverse tunnel handler"),
        "{stdout}"
    );
    Ok(())
}

#[tokio::test]
async fn version_check_admits_one_major_behind_and_refuses_ahead_or_too_old() -> Result<()> {
    let (ok, stdout, stderr) = run("version_check", &["v16.4.1", "v17.2.0"]).await?;
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("agent v16.4.1 may join cluster v17.2.0"),
        "{stdout}"
    );

    let (ok, stdout, stderr) = run("version_check", &["v18.0.0", "v17.2.0"]).await?;
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("agent v18.0.0 is ahead of cluster v17.2.0: refused"),
        "{stdout}"
    );

    let (ok, stdout, stderr) = run("version_check", &["v15.9.9", "v17.2.0"]).await?;
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("agent v15.9.9 is more than one major behind cluster v17.2.0: refused"),
        "{stdout}"
    );
    Ok(())
}
