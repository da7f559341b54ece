//! End to end: the Web UI in real Chromium against the real `svc`.
//!
//! `svc start` runs Auth, Proxy, its own SSH Service (node `web-local`) and the Application
//! Service (app `echo`, which answers with the request's headers); a second `svc` process joins
//! with a token as agent `web-agent`. `tctl` creates a maintenance window (04:00 UTC, every day),
//! a user who may only read it and one who may change it. The browser scenario
//! (`svc-net/web/tests/web-ui.mjs`, Debian's `chromium` driven by `playwright-core` from
//! `svc-net/web/node_modules`) signs in, finds both nodes in Resources and the agent in
//! Inventory, is refused saving the window as the reader (the page shows the Auth Service's
//! reason), runs `echo` in the web terminal and resizes it, signs out (the old cookie is refused),
//! changes the window as the editor, and opens the app, which shows the identity header; `tctl`
//! then shows the changed window. Last, `octocat` signs in with the sign-in page's "Sign in with
//! GitHub" button through e2e_sso's GitHub stand-in. Screenshots of each page:
//! `target/web-ui-artefacts/`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::agent::Agent;
use common::resources::{PASSWORD, Proc, free_port, require};
use common::{Cluster, SVC};
use svc_testkit::wait::OutputWithin;

/// The proxy's public host name; apps are its subdomains.
const PUBLIC_HOST: &str = "localhost";

/// The app that echoes its request's headers (`tests/apps/echo_headers.py`): its port.
fn echo_headers_app() -> (Proc, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/echo_headers.py");
    let mut child = Command::new(require("python3", "python3"))
        .arg(&script)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the echo app");
    let out = child.stdout.take().expect("stdout");
    let proc = Proc(child);
    let port = common::wait::first_line(out, common::wait::STEP, |l| l.trim().parse::<u16>().ok())
        .unwrap_or_else(|e| panic!("{} printed no port: {e}", script.display()));
    (proc, port)
}

/// The client secret of the GitHub stand-in's OAuth application.
const GITHUB_SECRET: &str = "github-client-secret-Wb6tQ2";

/// e2e_sso's stand-in for GitHub's OAuth and teams API (`tests/sso/github_standin.py`, Python's
/// standard library only) on a free port, approving `octocat` (team `acme/sre`) and sending the
/// browser to `callback`: the process and its port.
fn github_standin(callback: &str) -> (Proc, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sso/github_standin.py");
    let port = free_port();
    let mut child = Command::new(require("python3", "python3"))
        .arg(&script)
        .arg(port.to_string())
        .args(["gh-client-id", GITHUB_SECRET, callback, "octocat", "acme", "sre"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the GitHub stand-in");
    let out = child.stdout.take().expect("stdout");
    let proc = Proc(child);
    common::wait::first_line(out, common::wait::STEP, |l| l.starts_with("ready").then_some(()))
        .unwrap_or_else(|e| panic!("{} did not start: {e}", script.display()));
    (proc, port)
}

/// `svc-net/web`: the Web UI's package, with `node_modules` installed by `npm ci`.
fn web_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../svc-net/web");
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "{}/node_modules is missing: run `(cd svc-net/web && npm ci)` (the browser test drives \
         Chromium with playwright-core from there)",
        dir.display()
    );
    dir
}

/// Where the screenshots go: `<target>/web-ui-artefacts`.
fn artefacts() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("web-ui-artefacts")
}

#[test]
fn the_web_ui_in_chromium() {
    let node = require("node", "nodejs");
    let chromium = require("chromium", "chromium");
    let web = web_dir();
    let (_app, app_port) = echo_headers_app();
    // Apps are served on subdomains of the proxy's public address (`echo.localhost`, which the
    // browser resolves to 127.0.0.1), on a port chosen up front; the agents tunnel to the
    // loopback address.
    let web_port = free_port();
    let services = format!(
        "  nodename: web-local\n\
         auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\n\
         proxy_service:\n  web_listen_addr: 127.0.0.1:{web_port}\n  public_addr: {PUBLIC_HOST}:{web_port}\n\
         app_service:\n  enabled: true\n  apps:\n  - name: echo\n    uri: http://127.0.0.1:{app_port}\n"
    );
    let tunnel = format!("127.0.0.1:{web_port}");
    let cluster = Cluster::start_with_env(
        tempfile::tempdir().expect("tempdir"),
        "info",
        &services,
        &[("SVC_TUNNEL_PUBLIC_ADDR", tunnel.as_str())],
    );

    // The window everyone sees, a reader and an editor of it (both with login root on nodes and
    // the inventory's `list`, as `tctl inventory ls` needs).
    let maintenance = cluster.write(
        "maintenance.yaml",
        "kind: cluster_maintenance_config\nversion: v1\nmetadata:\n  name: cluster-maintenance-config\nspec:\n  agent_upgrades:\n    utc_start_hour: 4\n    weekdays: [Mon, Tue, Wed, Thu, Fri, Sat, Sun]\n",
    );
    cluster
        .tctl_admin(&["create", &maintenance.to_string_lossy()], None)
        .ok();
    for (role, verbs) in [
        ("maintenance-reader", "[list, read]"),
        ("maintenance-editor", "[list, read, create, update]"),
    ] {
        let file = cluster.write(
            &format!("{role}.yaml"),
            &format!(
                "kind: role\nversion: v7\nmetadata:\n  name: {role}\nspec:\n  allow:\n    rules:\n    - resources: [cluster_maintenance_config]\n      verbs: {verbs}\n    - resources: [inventory]\n      verbs: [list]\n"
            ),
        );
        cluster
            .tctl_admin(&["create", &file.to_string_lossy()], None)
            .ok();
    }
    for (user, role) in [("vera", "maintenance-reader"), ("eddie", "maintenance-editor")] {
        cluster
            .tctl_admin(
                &[
                    "users",
                    "add",
                    user,
                    &format!("--roles=access,{role}"),
                    "--logins=root",
                    "--password-stdin",
                ],
                Some(PASSWORD),
            )
            .ok();
    }

    // A GitHub connector through the stand-in: octocat (team acme/sre) gets `access`; the
    // sign-in page shows its button.
    let callback = format!("https://127.0.0.1:{web_port}/v1/webapi/github/callback");
    let (_github, github_port) = github_standin(&callback);
    let connector = cluster.write(
        "github.yaml",
        &format!(
            "kind: github\nversion: v3\nmetadata:\n  name: gh\nspec:\n  client_id: gh-client-id\n  client_secret: {GITHUB_SECRET}\n  redirect_url: {callback}\n  display: GitHub\n  endpoint_url: http://127.0.0.1:{github_port}\n  api_endpoint_url: http://127.0.0.1:{github_port}/api/v3\n  teams_to_roles:\n  - organization: acme\n    team: sre\n    roles: [access]\n"
        ),
    );
    cluster
        .tctl_admin(&["create", &connector.to_string_lossy()], None)
        .ok();

    // An agent joined with a token, through the proxy's web port.
    let token = cluster
        .tctl_admin(&["tokens", "add", "--type=node", "--format", "json"], None)
        .ok();
    let token: serde_json::Value = serde_json::from_str(&token.stdout).expect("token json");
    let agent_config = cluster.write(
        "agent.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: web-agent\n  data_dir: {}\n  proxy_server: {}\n  auth_token: {}\n  ca_pin: {}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            cluster.path().join("agent-data").display(),
            cluster.web_addr,
            token["token"].as_str().expect("token"),
            token["ca_pin"].as_str().expect("ca_pin"),
        ),
    );
    let mut command = Command::new(SVC);
    command
        .args(["start", "--insecure", "--config"])
        .arg(&agent_config)
        .env("SVC_TUNNEL_PUBLIC_ADDR", &tunnel);
    let agent = Agent::start(command, cluster.path().join("agent.stderr"));
    let host_uuid = agent.host_id.split('.').next().unwrap_or_default().to_owned();

    let artefacts = artefacts();
    let _ = std::fs::remove_dir_all(&artefacts);
    let out = Command::new(&node)
        .arg("tests/web-ui.mjs")
        .current_dir(&web)
        .env("SVC_WEB_URL", format!("https://127.0.0.1:{web_port}"))
        .env("SVC_WEB_ARTEFACTS", &artefacts)
        .env("SVC_VIEWER", "vera")
        .env("SVC_VIEWER_PASS", PASSWORD)
        .env("SVC_EDITOR", "eddie")
        .env("SVC_EDITOR_PASS", PASSWORD)
        .env("SVC_LOCAL_NODE", "web-local")
        .env("SVC_AGENT", "web-agent")
        .env("SVC_AGENT_HOST_ID", &host_uuid)
        .env("SVC_LOGIN", "root")
        .env("SVC_APP", "echo")
        .env("SVC_PUBLIC_HOST", PUBLIC_HOST)
        .env("SVC_CHROMIUM", &chromium)
        .env("SVC_SSO_DISPLAY", "GitHub")
        .env("SVC_SSO_USER", "octocat")
        .output_within(Duration::from_secs(600), "the browser scenario")
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("web UI scenario: ok"),
        "the browser scenario failed ({}); screenshots in {}\nstdout:\n{stdout}\nstderr:\n{stderr}\nagent:\n{}\nsvc:\n{}",
        out.status,
        artefacts.display(),
        agent.log(),
        cluster.stderr()
    );
    // The app received the user's identity in the signed header.
    let app_line = stdout
        .lines()
        .find(|l| l.starts_with("app says: "))
        .unwrap_or_default();
    assert!(
        app_line.to_ascii_lowercase().contains("svc-jwt-assertion"),
        "the app did not receive svc-jwt-assertion: {app_line}"
    );
    // The editor's change is the cluster's window.
    let window = cluster
        .tctl_admin(&["get", "cluster_maintenance_config"], None)
        .ok()
        .stdout;
    assert!(window.contains("utc_start_hour: 7"), "{window}");
    assert!(
        window.contains("Tue") && window.contains("Thu") && !window.contains("Mon"),
        "{window}"
    );
    for page in [
        "01-sign-in",
        "02-resources",
        "03-inventory",
        "04-maintenance-viewer",
        "05-maintenance-refused",
        "06-channels",
        "07-terminal",
        "09-inventory-narrow",
        "10-maintenance-saved",
        "12-app",
        "13-sso-sign-in-page",
        "14-sso-signed-in",
    ] {
        let shot = artefacts.join(format!("{page}.png"));
        assert!(shot.is_file(), "no screenshot {}", shot.display());
    }
}
