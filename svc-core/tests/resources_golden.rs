//! Golden resource files: every file under `testdata/resources/valid` parses and survives a
//! YAML and a JSON round trip; every file under `testdata/resources/invalid` fails with exactly
//! the message in its `.err` sibling.
//!
//! After an intended change of wording, run with `SVC_BLESS=1` to rewrite the `.err` files, then
//! review the diff.

use std::{fs, path::PathBuf};

use anyhow::{Context, Result, bail, ensure};
use svc_core::{
    Resource, RoleSet, Verb,
    maintenance::AgentUpgradeWindow,
    parse_resource, parse_resources,
    resource::{Kind, resources_to_json, resources_to_yaml},
};
use time::{Weekday, macros::datetime};

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/resources")
        .join(name)
}

fn inputs(name: &str) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir(name))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml" || e == "json"));
    files.sort();
    ensure!(!files.is_empty(), "no golden files in {name}");
    Ok(files)
}

fn read(path: &PathBuf) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

#[test]
fn valid_files_parse_and_round_trip() -> Result<()> {
    for path in inputs("valid")? {
        let text = read(&path)?;
        let parsed = parse_resources(&text).with_context(|| format!("{}", path.display()))?;
        let yaml = resources_to_yaml(&parsed)?;
        ensure!(
            parse_resources(&yaml)? == parsed,
            "{}: YAML round trip changed it:\n{yaml}",
            path.display()
        );
        let json = resources_to_json(&parsed)?;
        ensure!(
            parse_resources(&json)? == parsed,
            "{}: JSON round trip changed it:\n{json}",
            path.display()
        );
        for r in &parsed {
            ensure!(
                parse_resource(&r.to_yaml()?)? == *r,
                "{}: single YAML round trip",
                path.display()
            );
            ensure!(
                parse_resource(&r.to_json()?)? == *r,
                "{}: single JSON round trip",
                path.display()
            );
        }
    }
    Ok(())
}

#[test]
fn invalid_files_fail_with_the_expected_message() -> Result<()> {
    let bless = std::env::var_os("SVC_BLESS").is_some();
    let mut failures = Vec::new();
    for path in inputs("invalid")? {
        let text = read(&path)?;
        let err_path = path.with_extension("err");
        let actual = match parse_resources(&text) {
            Ok(r) => bail!("{} parsed but must not: {r:?}", path.display()),
            Err(e) => e.to_string(),
        };
        if bless {
            fs::write(&err_path, format!("{actual}\n"))?;
            continue;
        }
        let expected = read(&err_path)?;
        if expected.trim_end() != actual {
            failures.push(format!(
                "{}:\n  expected: {}\n  actual:   {actual}",
                path.display(),
                expected.trim_end()
            ));
        }
        // Secrets in the input never reach the error.
        ensure!(
            !actual.contains("do-not-echo-me") && !actual.contains("secret-token-value"),
            "{actual}"
        );
    }
    ensure!(failures.is_empty(), "mismatched errors:\n{}", failures.join("\n"));
    Ok(())
}

fn load(name: &str) -> Result<Resource> {
    Ok(parse_resource(&read(&dir("valid").join(name))?)?)
}

#[test]
fn connector_secrets_are_held_and_removed() -> Result<()> {
    for (file, secrets) in [
        (
            "github.yaml",
            &["github-private-key-material", "gh-client-secret-value"][..],
        ),
        ("saml.yaml", &["saml-private-key-material"][..]),
        (
            "oidc.yaml",
            &["oidc-private-key-material", "oidc-client-secret-value"][..],
        ),
    ] {
        let r = load(file)?;
        let debug = format!("{r:?}");
        let with = r.to_yaml()?;
        let without = r.without_secrets();
        let stripped = [without.to_yaml()?, without.to_json()?];
        for secret in secrets {
            ensure!(!debug.contains(secret), "{file}: Debug shows {secret}");
            ensure!(
                with.contains(secret),
                "{file}: --with-secrets output lacks {secret}"
            );
            for out in &stripped {
                ensure!(
                    !out.contains(secret),
                    "{file}: stripped output shows {secret}:\n{out}"
                );
            }
        }
        // The public half stays, and the stripped copy is still a valid resource.
        ensure!(stripped[0].contains("cert"), "{file}: cert removed");
        ensure!(
            parse_resource(&stripped[0])? == without,
            "{file}: stripped copy does not parse back"
        );
    }
    Ok(())
}

#[test]
fn token_value_is_secret() -> Result<()> {
    let r = load("token.yaml")?;
    let Resource::Token(token) = &r else {
        bail!("expected a token")
    };
    ensure!(token.value().expose() == "join-token-secret-value");
    ensure!(
        r.name() == "join-token-secret-value",
        "the name is the storage key"
    );
    ensure!(!format!("{r:?} {r}").contains("join-token-secret-value"));
    ensure!(r.to_string() == "token/***");
    ensure!(!token.is_expired(datetime!(2030-06-01 11:59 UTC).into()));
    ensure!(token.is_expired(datetime!(2030-06-01 12:00 UTC).into()));
    Ok(())
}

#[test]
fn maintenance_config_drives_the_windows() -> Result<()> {
    let Resource::ClusterMaintenanceConfig(cfg) = load("cluster_maintenance_config.yaml")? else {
        bail!("expected a cluster_maintenance_config")
    };
    let window = cfg.spec.agent_upgrades.context("agent_upgrades")?;
    ensure!(window == AgentUpgradeWindow::new(2, [Weekday::Monday, Weekday::Wednesday, Weekday::Friday])?);
    // 2024-01-01 is a Monday: the short name `Mon` opens the window.
    ensure!(window.is_open(datetime!(2024-01-01 02:30 UTC).into()));
    ensure!(!window.is_open(datetime!(2024-01-02 02:30 UTC).into()));
    Ok(())
}

#[test]
fn minimal_maintenance_config_gets_version_and_name() -> Result<()> {
    let r = load("cluster_maintenance_config_minimal.yaml")?;
    ensure!(r.name() == "cluster-maintenance-config");
    let yaml = r.to_yaml()?;
    ensure!(
        yaml.starts_with(
            "kind: cluster_maintenance_config\nversion: v1\nmetadata:\n  name: cluster-maintenance-config\n"
        ),
        "{yaml}"
    );
    Ok(())
}

#[test]
fn spec_role_file_grants_maintenance_access() -> Result<()> {
    let Resource::Role(role) = load("role_maintenance.yaml")? else {
        bail!("expected a role")
    };
    let set = RoleSet::new([role]);
    for verb in [Verb::Create, Verb::Read, Verb::Update, Verb::Delete] {
        set.check(verb, Kind::ClusterMaintenanceConfig.as_str())?;
    }
    Ok(())
}
