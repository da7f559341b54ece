//! Runs `examples/serve_ping_and_version.rs`: the product's own hyper server with svc's ping
//! and version server mounted. The product keeps its own routes, svc's routes answer theirs,
//! and what svc refuses (wrong method, unknown or path-traversing channel, unknown path) is
//! refused with svc's JSON errors.

mod support;

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use support::{Running, http};
use svc_testkit::process::example_bin;

#[tokio::test]
async fn the_product_server_serves_svc_ping_and_versions_next_to_its_own_routes() -> Result<()> {
    let running = Running::spawn(Command::new(example_bin("serve_ping_and_version")))?;
    let first = running.line(Duration::from_secs(30), "it should print `listening on <addr>`")?;
    let addr = first
        .strip_prefix("listening on ")
        .with_context(|| format!("expected `listening on <addr>`, got {first:?}"))?
        .to_owned();

    // The product's own route is the product's.
    let (status, body) = http(&addr, "GET", "/").await?;
    assert_eq!(
        (status, body.as_str()),
        (200, "hello from the product's own server\n")
    );

    // svc's ping: the cluster and the version, as JSON.
    // `Version` displays as `v17.0.0`; the ping carries the bare semver.
    let own = svc_core::version::current().to_string();
    let bare = own.trim_start_matches('v');
    for path in ["/webapi/ping", "/webapi/find"] {
        let (status, body) = http(&addr, "GET", path).await?;
        assert_eq!(status, 200, "{path}: {body}");
        let doc: serde_json::Value = serde_json::from_str(&body)?;
        assert_eq!(doc["server_version"], bare, "{path}: {body}");
    }
    let (_, ping) = http(&addr, "GET", "/webapi/ping").await?;
    let ping: serde_json::Value = serde_json::from_str(&ping)?;
    assert_eq!(ping["cluster_name"], "example.test");

    // The version server, under both prefixes.
    let major = svc_core::version::current().major();
    let channel = "/v1/webapi/automaticupgrades/channel";
    assert_eq!(
        http(&addr, "GET", &format!("{channel}/stable/rolling/version")).await?,
        (200, format!("v{major}.0.1"))
    );
    assert_eq!(
        http(
            &addr,
            "GET",
            "/webapi/automaticupgrades/channel/stable/rolling/critical"
        )
        .await?,
        (200, "no".to_owned())
    );
    assert_eq!(
        http(&addr, "GET", &format!("{channel}/default/version")).await?,
        (200, own.clone())
    );
    Ok(())
}

#[tokio::test]
async fn what_svc_refuses_on_the_product_server_is_refused_with_its_reason() -> Result<()> {
    let running = Running::spawn(Command::new(example_bin("serve_ping_and_version")))?;
    let first = running.line(Duration::from_secs(30), "it should print `listening on <addr>`")?;
    let addr = first
        .strip_prefix("listening on ")
        .with_context(|| format!("expected `listening on <addr>`, got {first:?}"))?
        .to_owned();
    let error = |body: &str| -> Result<String> {
        let doc: serde_json::Value =
            serde_json::from_str(body).with_context(|| format!("not JSON: {body:?}"))?;
        Ok(doc["error"]["message"].as_str().unwrap_or_default().to_owned())
    };

    let (status, body) = http(&addr, "POST", "/webapi/ping").await?;
    assert_eq!(status, 405);
    assert_eq!(error(&body)?, "method POST not allowed on /webapi/ping; use GET");

    // A channel nobody configured, and one that tries to climb out of the channel namespace.
    let channel = "/v1/webapi/automaticupgrades/channel";
    let (status, body) = http(&addr, "GET", &format!("{channel}/nope/version")).await?;
    assert_eq!(status, 404);
    assert_eq!(error(&body)?, "channel \"nope\" is not configured");
    let (status, body) = http(&addr, "GET", &format!("{channel}/../../etc/version")).await?;
    assert_eq!(status, 404);
    assert_eq!(error(&body)?, "channel \"../../etc\" is not configured");

    let (status, body) = http(&addr, "GET", "/admin").await?;
    assert_eq!(status, 404);
    assert_eq!(error(&body)?, "not found: /admin");
    Ok(())
}
