//! End to end: the real `svc`, `tctl` and `tsh` binaries perform the specification's
//! procedures (§5: sign in, `tctl status`, a role for `cluster_maintenance_config`, role changes
//! that take effect only after signing in again, a GitHub connector edited with
//! `--with-secrets` and applied with `tctl create -f`), join + heartbeat + `tctl inventory ls`,
//! durability across `kill -9`, and secrets kept out of debug logs.

mod common;

use std::time::Duration;

use common::Cluster;
use svc_core::Secret;
use svc_core::auth::Heartbeat;
use svc_core::identity::SystemRole;
use svc_core::resource::Kind;
use svc_net::auth::{AuthClient, JoinParams};

const PASSWORD: &str = "correct-horse-battery";

const SPEC_ROLE: &str = "\
kind: role
version: v7
metadata:
  name: maintenance-admin
spec:
  allow:
    rules:
    - resources: [cluster_maintenance_config]
      verbs: [create, read, update, delete]
";

const MAINTENANCE: &str = "\
kind: cluster_maintenance_config
version: v1
metadata:
  name: cluster-maintenance-config
spec:
  agent_upgrades:
    utc_start_hour: 2
    weekdays: [Mon, Wed]
";

const GITHUB_PRIVATE_KEY: &str =
    "-----BEGIN PRIVATE KEY-----\nGITHUBSIGNINGKEYMATERIAL0123456789\n-----END PRIVATE KEY-----";

fn github(roles: &str) -> String {
    format!(
        "kind: github\nversion: v3\nmetadata:\n  name: github\nspec:\n  client_id: client-id\n  client_secret: github-client-secret-value\n  redirect_url: https://proxy.example.com/v1/webapi/github/callback\n  teams_to_roles:\n  - organization: example\n    team: admins\n    roles: [{roles}]\n  - organization: example\n    team: everyone\n    roles: [access]\n  signing_key_pair:\n    private_key: |\n      {}\n    cert: CERT\n",
        GITHUB_PRIVATE_KEY.replace('\n', "\n      ")
    )
}

fn roles_of(cluster: &Cluster) -> Vec<String> {
    let status = cluster.tsh(&["status", "-f", "json"], None).ok();
    let json: serde_json::Value = serde_json::from_str(&status.stdout).expect("tsh status json");
    assert_eq!(json["active"]["username"], "admin");
    json["active"]["roles"]
        .as_array()
        .expect(".active.roles")
        .iter()
        .map(|r| r.as_str().expect("role name").to_owned())
        .collect()
}

/// Joins an agent with a token from `tctl tokens add` and sends one heartbeat.
async fn join_and_heartbeat(cluster: &Cluster) -> String {
    let out = cluster
        .tctl(&["tokens", "add", "--type=node", "--format", "json"])
        .ok();
    let token: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    let params = JoinParams {
        token: Secret::new(token["token"].as_str().expect("token").to_owned()),
        ca_pin: Some(token["ca_pin"].as_str().expect("ca_pin").to_owned()),
        trust_on_first_use: false,
        node_name: "node-1".into(),
        roles: vec![SystemRole::Node],
        additional_names: vec![],
    };
    let identity = svc_net::auth::join(&cluster.auth_addr, params.clone())
        .await
        .expect("join");
    // The token admits once.
    let again = svc_net::auth::join(&cluster.auth_addr, params).await.unwrap_err();
    assert!(again.to_string().contains("already used"), "{again}");
    let mut agent = AuthClient::connect_with(&identity).await.expect("agent connects");
    agent
        .heartbeat(&Heartbeat {
            hostname: "node-1".into(),
            version: "17.0.0-dev".into(),
            ..Default::default()
        })
        .await
        .expect("heartbeat");
    identity.name.trim_end_matches(".e2e.test").to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_specification_procedures_word_for_word() {
    let cluster = Cluster::start("info");

    // On the Auth host, with full permissions: the first administrator, with `editor`.
    let out = cluster
        .tctl_admin(
            &["users", "add", "admin", "--roles=editor", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    assert!(
        out.stdout.contains("User \"admin\" has been created"),
        "{}",
        out.stdout
    );

    // §5.1: sign in; `tctl status` proves the credentials work.
    let wrong = cluster.login("admin", "not-the-password");
    assert!(!wrong.status.success());
    assert!(
        wrong.stderr.contains("invalid username or password"),
        "{}",
        wrong.stderr
    );
    cluster.login("admin", PASSWORD).ok();
    // The profile: private (0600), and tctl reaches the Auth API through the proxy's web port
    // (TLS routing), not the Auth Service's own address.
    let profile_path = cluster.home.join("profile.json");
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&profile_path).expect("profile")).expect("profile json");
    assert_eq!(profile["identity"]["auth_addr"], cluster.web_addr.as_str());
    assert_ne!(cluster.web_addr, cluster.auth_addr);
    {
        use std::os::unix::fs::PermissionsExt;
        for file in [profile_path.clone(), cluster.data_dir.join("admin-identity.json")] {
            let mode = std::fs::metadata(&file).expect("metadata").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", file.display());
        }
    }
    let status = cluster.tctl(&["status"]).ok();
    assert!(status.stdout.contains("Cluster:  e2e.test"), "{}", status.stdout);
    assert!(
        status.stdout.contains("Version:  v17.0.0-dev"),
        "{}",
        status.stdout
    );
    let pin_line = status
        .stdout
        .lines()
        .find(|l| l.starts_with("CA pin:"))
        .expect("CA pin line");
    let pin = pin_line.trim_start_matches("CA pin:").trim();
    assert!(pin.starts_with("sha256:") && pin.len() == 7 + 64, "{pin}");

    // §2.4 + §5.2: the role; no preset role grants it, so creating the config is denied.
    let role = cluster.write("maintenance-role.yaml", SPEC_ROLE);
    let out = cluster.tctl(&["create", role.to_str().expect("path")]).ok();
    assert!(
        out.stdout.contains("role/maintenance-admin has been created"),
        "{}",
        out.stdout
    );
    let config = cluster.write("maintenance.yaml", MAINTENANCE);
    let config = config.to_str().expect("path");
    let denied = cluster.tctl(&["create", config]);
    assert!(!denied.status.success());
    assert!(
        denied
            .stderr
            .contains("access denied to perform action \"create\" on \"cluster_maintenance_config\""),
        "{}",
        denied.stderr
    );

    // §5.3: read the user's roles, set them to the old list plus the new role.
    let mut roles = roles_of(&cluster);
    assert_eq!(roles, ["editor"]);
    roles.push("maintenance-admin".into());
    cluster
        .tctl(&["users", "update", "admin", "--set-roles", &roles.join(",")])
        .ok();

    // Roles live in the certificate: still denied until signing in again.
    let denied = cluster.tctl(&["create", config]);
    assert!(!denied.status.success());
    assert!(
        denied
            .stderr
            .contains("\"create\" on \"cluster_maintenance_config\""),
        "{}",
        denied.stderr
    );
    cluster.tsh(&["logout"], None).ok();
    // Signing in again, this time verifying the proxy against its CA instead of --insecure.
    let proxy = format!("--proxy={}", cluster.web_addr);
    let cacert = format!("--cacert={}", cluster.data_dir.join("proxy-ca.pem").display());
    cluster
        .tsh(
            &["login", &proxy, "--user=admin", &cacert],
            Some(&format!("{PASSWORD}\n")),
        )
        .ok();
    assert_eq!(roles_of(&cluster), ["editor", "maintenance-admin"]);
    let out = cluster.tctl(&["create", config]).ok();
    assert!(
        out.stdout.contains("maintenance window has been updated"),
        "{}",
        out.stdout
    );
    let got = cluster
        .tctl(&["get", "cluster_maintenance_config", "--format", "json"])
        .ok();
    assert!(got.stdout.contains("\"utc_start_hour\": 2"), "{}", got.stdout);

    // §5.4 with a github connector: the admin's team gets the new role via `tctl create -f`.
    let connector = cluster.write("github-initial.yaml", &github("editor"));
    cluster.tctl(&["create", connector.to_str().expect("path")]).ok();
    let plain = cluster.tctl(&["get", "github/github"]).ok();
    assert!(
        !plain.stdout.contains("GITHUBSIGNINGKEYMATERIAL"),
        "secrets shown without --with-secrets"
    );
    let fetched = cluster.tctl(&["get", "github/github", "--with-secrets"]).ok();
    assert!(
        fetched.stdout.contains("GITHUBSIGNINGKEYMATERIAL"),
        "{}",
        fetched.stdout
    );
    let edited = fetched
        .stdout
        .replacen("- editor", "- editor\n    - maintenance-admin", 1);
    assert_ne!(
        edited, fetched.stdout,
        "teams_to_roles edited: {}",
        fetched.stdout
    );
    let file = cluster.write("github.yaml", &edited);
    let out = cluster.tctl(&["create", "-f", file.to_str().expect("path")]).ok();
    assert!(
        out.stdout.contains("github/github has been updated"),
        "{}",
        out.stdout
    );
    std::fs::remove_file(&file).expect("delete the retrieved file right after the update");
    cluster.login("admin", PASSWORD).ok();
    let after = cluster.tctl(&["get", "github/github", "--format", "yaml"]).ok();
    assert!(after.stdout.contains("maintenance-admin"), "{}", after.stdout);
    assert!(!after.stdout.contains("GITHUBSIGNINGKEYMATERIAL"));

    // §2.7: an agent that heartbeats shows up, not enrolled: Upgrader `none`.
    let server_id = join_and_heartbeat(&cluster).await;
    let inv = cluster.tctl(&["inventory", "ls", "--upgrader=none"]).ok();
    let header = inv.stdout.lines().next().expect("header");
    for column in ["Server ID", "Hostname", "Services", "Version", "Upgrader"] {
        assert!(header.contains(column), "{header}");
    }
    let row = inv
        .stdout
        .lines()
        .find(|l| l.contains(&server_id))
        .expect("the agent's row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[..5],
        [server_id.as_str(), "node-1", "node", "17.0.0-dev", "none"],
        "{row}"
    );
    assert!(uuid::Uuid::parse_str(&server_id).is_ok(), "{server_id}");
    let unit = cluster.tctl(&["inventory", "ls", "--upgrader=unit"]).ok();
    assert!(!unit.stdout.contains(&server_id));

    // Users: ls and rm; a removed user cannot sign in.
    cluster
        .tctl_stdin(
            &[
                "users",
                "add",
                "bob",
                "--roles=access",
                "--logins=bob",
                "--password-stdin",
            ],
            "bob-password",
        )
        .ok();
    cluster.login("bob", "bob-password").ok();
    let bob: serde_json::Value =
        serde_json::from_str(&cluster.tsh(&["status", "-f", "json"], None).ok().stdout).expect("json");
    assert_eq!(bob["active"]["logins"], serde_json::json!(["bob"]));
    // bob (access only) may not manage users: the denial names the verb and the kind.
    let denied = cluster.tctl(&["users", "ls"]);
    assert!(
        denied.stderr.contains("\"list\" on \"user\""),
        "{}",
        denied.stderr
    );
    cluster.login("admin", PASSWORD).ok();
    let ls = cluster.tctl(&["users", "ls"]).ok();
    assert!(
        ls.stdout.contains("bob") && ls.stdout.contains("admin"),
        "{}",
        ls.stdout
    );
    cluster.tctl(&["users", "rm", "bob"]).ok();
    assert!(!cluster.login("bob", "bob-password").status.success());

    // tsh logout removes the session; tctl then has nothing to act with but the admin identity
    // of the default data directory, which is not this one.
    cluster.tsh(&["logout"], None).ok();
    assert!(!profile_path.exists());
    assert!(!cluster.tsh(&["status"], None).status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn join_refuses_invalid_and_reused_tokens_and_issues_nothing() {
    let cluster = Cluster::start("info");
    let admin = cluster.admin_identity();
    let mut client = AuthClient::connect_with(&admin).await.expect("admin connects");
    let pin = client.status().await.expect("status").ca_pin;
    let params = |token: &str, pin: Option<String>| JoinParams {
        token: Secret::new(token.to_owned()),
        ca_pin: pin,
        trust_on_first_use: false,
        node_name: "node".into(),
        roles: vec![SystemRole::Node],
        additional_names: vec![],
    };
    let mut refused = 0;
    let e = svc_net::auth::join(&cluster.auth_addr, params("no-such-token", Some(pin.clone())))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("join refused: the join token is invalid"),
        "{e}"
    );
    refused += 1;
    let (token, _) = client.create_token(&["app".into()], None).await.expect("token");
    let e = svc_net::auth::join(&cluster.auth_addr, params(token.expose(), Some(pin.clone())))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("does not allow"), "{e}");
    refused += 1;
    // A wrong pin: the agent refuses the Auth Service before sending the token.
    let wrong_pin = format!("sha256:{}", "0".repeat(64));
    let e = svc_net::auth::join(&cluster.auth_addr, params(token.expose(), Some(wrong_pin)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("CA pin"), "{e}");
    refused += 1;
    // A token that expired (created by an administrator with an expiry in the past).
    let a_minute_ago = (time::OffsetDateTime::now_utc() - time::Duration::minutes(1))
        .format(&time::format_description::well_known::Rfc3339)
        .expect("rfc3339");
    let expired = format!(
        "kind: token\nversion: v2\nmetadata:\n  name: 0123456789abcdef0123456789abcdef\n  expires: {a_minute_ago}\nspec:\n  roles: [node]\n"
    );
    client
        .put_resources(&expired, false)
        .await
        .expect("expired token");
    let e = svc_net::auth::join(
        &cluster.auth_addr,
        params("0123456789abcdef0123456789abcdef", Some(pin.clone())),
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("join refused: the join token has expired"),
        "{e}"
    );
    refused += 1;
    // Nothing was issued: no joined agent is in the inventory (only the SSH agent `svc start`
    // runs in its own process), and the app token was left intact.
    let own_node = svc_core::config::Config::all_in_one_default().svc.nodename;
    let inventory = client.inventory().await.expect("inventory");
    assert!(
        inventory.iter().all(|row| row.hostname == own_node),
        "{inventory:?}"
    );
    let tokens = client
        .get_resources(Kind::Token, None, false)
        .await
        .expect("tokens");
    assert_eq!(tokens.len(), 1, "the app token is still there, unused");
    println!("join refusals: {refused}/4 refused");
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_writes_survive_kill_9() {
    let mut cluster = Cluster::start("warn");
    let admin = cluster.admin_identity();
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut writers = Vec::new();
    for w in 0..4 {
        let admin = admin.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            let Ok(mut client) = AuthClient::connect_with(&admin).await else { return };
            for i in 0.. {
                let name = format!("burst-{w}-{i}");
                let role = format!("kind: role\nversion: v7\nmetadata:\n  name: {name}\nspec:\n  allow:\n    logins: [{name}]\n");
                match client.put_resources(&role, false).await {
                    Ok(_) => acked.lock().expect("lock").push(name),
                    Err(_) => return,
                }
            }
        }));
    }
    // Kill while the burst runs: once enough writes were acknowledged (readiness, not timing).
    common::wait::within(
        common::wait::STEP,
        "200 acknowledged writes before the kill (did every writer fail?)",
        async {
            while acked.lock().expect("lock").len() < 200 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
    )
    .await;
    cluster.kill9();
    for w in writers {
        w.await.expect("writer");
    }
    let acked = acked.lock().expect("lock").clone();
    let dir = cluster.take_dir();
    drop(cluster);

    let cluster = Cluster::start_in(dir, "warn");
    let mut client = AuthClient::connect_with(&cluster.admin_identity())
        .await
        .expect("reconnect");
    let stored: std::collections::HashSet<String> = client
        .get_resources(Kind::Role, None, false)
        .await
        .expect("roles")
        .iter()
        .map(|r| r.name().to_owned())
        .collect();
    let missing: Vec<&String> = acked.iter().filter(|n| !stored.contains(*n)).collect();
    println!(
        "kill -9: {} writes acknowledged, {} missing after restart",
        acked.len(),
        missing.len()
    );
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_never_reach_the_debug_log() {
    let mut cluster = Cluster::start("debug");
    cluster
        .tctl_admin(
            &["users", "add", "admin", "--roles=editor", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    assert!(!cluster.login("admin", "wrong-password-value").status.success());
    cluster.login("admin", PASSWORD).ok();
    let connector = cluster.write("github.yaml", &github("editor"));
    cluster.tctl(&["create", connector.to_str().expect("path")]).ok();
    cluster.tctl(&["get", "github/github", "--with-secrets"]).ok();
    let out = cluster
        .tctl(&["tokens", "add", "--type=node", "--format", "json"])
        .ok();
    let token: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    let token = token["token"].as_str().expect("token").to_owned();
    let joined = svc_net::auth::join(
        &cluster.auth_addr,
        JoinParams {
            token: Secret::new(token.clone()),
            ca_pin: None,
            trust_on_first_use: true,
            node_name: "n".into(),
            roles: vec![SystemRole::Node],
            additional_names: vec![],
        },
    )
    .await
    .expect("join");
    let admin = cluster.admin_identity();
    cluster.stop();

    let log = cluster.stderr();
    assert!(log.contains("DEBUG"), "debug logging was on");
    assert!(
        log.contains("signed in") && log.contains("joined"),
        "the log covers the calls"
    );
    let key_body = |pem: &str| -> String {
        pem.lines()
            .filter(|l| !l.starts_with("-----"))
            .collect::<Vec<_>>()
            .join("")
    };
    let secrets: Vec<(&str, String)> = vec![
        ("password", PASSWORD.to_owned()),
        ("wrong password", "wrong-password-value".to_owned()),
        ("join token", token),
        ("connector private key", "GITHUBSIGNINGKEYMATERIAL".to_owned()),
        ("connector client secret", "github-client-secret-value".to_owned()),
        (
            "admin TLS key",
            key_body(admin.tls_key_pem.expose())[..40].to_owned(),
        ),
        (
            "agent TLS key",
            key_body(joined.tls_key_pem.expose())[..40].to_owned(),
        ),
        (
            "agent SSH key",
            key_body(joined.ssh_key.expose())[..40].to_owned(),
        ),
        ("PEM private key header", "PRIVATE KEY".to_owned()),
    ];
    for (what, secret) in &secrets {
        assert!(!log.contains(secret.as_str()), "the {what} appears in the log");
    }
    println!(
        "log capture: {} secrets checked against {} bytes of debug log",
        secrets.len(),
        log.len()
    );
}
