//! End to end: the Web UI's server side (issue #20) against the real `svc start` (Auth, Proxy
//! and its own SSH agent), real `tctl`, `curl` for HTTPS and a real WebSocket client.
//!
//! - Web sessions: sign in (cookie `Secure; HttpOnly; SameSite=Strict; Max-Age`, an
//!   unguessable 256-bit id), a wrong password, the lockout, CSRF (missing → 403), logout (the
//!   old cookie refused), `tctl lock` and user deletion ending a live session, a restarted
//!   proxy refusing the previous process's cookie.
//! - APIs as the user: a narrow role sees only its nodes and cannot PUT maintenance (403 with
//!   the Auth Service's reason), an editor can and `tctl get cluster_maintenance_config` shows
//!   the change; inventory and channels answer.
//! - The terminal: `echo` on the local node over a WebSocket, its output back; a foreign
//!   Origin refused.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

use common::resources::PASSWORD;
use common::svc::{Svc, token};
use common::{Cluster, wait};

/// Roles: `narrow` reaches only `env: dev` nodes (the local node has no such label) and reads
/// the maintenance window; `maint-editor` may change it.
const ROLES: &str = "kind: role\nversion: v7\nmetadata:\n  name: narrow\nspec:\n  allow:\n    logins: [root]\n    node_labels:\n      env: dev\n    rules:\n    - resources: [cluster_maintenance_config]\n      verbs: [read]\n---\nkind: role\nversion: v7\nmetadata:\n  name: maint-editor\nspec:\n  allow:\n    rules:\n    - resources: [cluster_maintenance_config]\n      verbs: [create, read, update, delete]\n";

/// The node name `svc start` gives its own agent: this host's name.
fn nodename() -> String {
    svc_core::config::Config::all_in_one_default().svc.nodename
}

/// An HTTP answer.
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("expected JSON ({e}): {}", self.body))
    }

    fn message(&self) -> String {
        self.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// Whose web port a request goes to: an all-in-one cluster's, or a proxy's address.
trait WebPort {
    fn web(&self) -> &str;
}

impl WebPort for Cluster {
    fn web(&self) -> &str {
        &self.web_addr
    }
}

impl WebPort for str {
    fn web(&self) -> &str {
        self
    }
}

/// `curl` over HTTP/1.1 to the proxy's web port (its certificate is self-signed).
fn http(
    cluster: &(impl WebPort + ?Sized),
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Resp {
    let url = format!("https://{}{path}", cluster.web());
    let mut cmd = Command::new(svc_testkit::require("curl", "curl"));
    cmd.args(["-sS", "-k", "--http1.1", "-i", "-X", method]);
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    cmd.arg(&url);
    let out = wait::run_within(&mut cmd, wait::STEP, &format!("curl -X {method} {url}")).expect("run curl");
    assert!(
        out.status.success(),
        "curl {method} {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status line in: {text}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Resp {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A signed-in web session.
struct Web {
    cookie: String,
    csrf: String,
    answer: serde_json::Value,
    set_cookie: String,
}

fn sign_in(cluster: &(impl WebPort + ?Sized), user: &str, pass: &str) -> Resp {
    let body = serde_json::json!({ "user": user, "pass": pass }).to_string();
    http(cluster, "POST", "/webapi/sessions/web", &[], Some(&body))
}

fn web_login(cluster: &(impl WebPort + ?Sized), user: &str) -> Web {
    let r = sign_in(cluster, user, PASSWORD);
    assert_eq!(r.status, 200, "sign-in of {user}: {}", r.body);
    let set_cookie = r.header("set-cookie").expect("Set-Cookie").to_owned();
    let cookie = set_cookie
        .split(';')
        .next()
        .expect("cookie pair")
        .trim()
        .to_owned();
    let answer = r.json();
    Web {
        cookie,
        csrf: answer["csrf_token"].as_str().expect("csrf_token").to_owned(),
        answer,
        set_cookie,
    }
}

impl Web {
    fn get(&self, cluster: &(impl WebPort + ?Sized), path: &str) -> Resp {
        http(cluster, "GET", path, &[("Cookie", &self.cookie)], None)
    }

    fn send(&self, cluster: &(impl WebPort + ?Sized), method: &str, path: &str, body: Option<&str>) -> Resp {
        http(
            cluster,
            method,
            path,
            &[("Cookie", &self.cookie), ("X-CSRF-Token", &self.csrf)],
            body,
        )
    }
}

fn add_user(cluster: &Cluster, user: &str, roles: &str) {
    cluster
        .tctl_admin(
            &[
                "users",
                "add",
                user,
                &format!("--roles={roles}"),
                "--logins=root",
                "--password-stdin",
            ],
            Some(PASSWORD),
        )
        .ok();
}

#[test]
fn web_sessions_sign_in_csrf_logout_lock_deletion_lockout_and_restart() {
    let cluster = Cluster::start("info");
    for user in ["alice", "bob", "carol", "lucy"] {
        add_user(&cluster, user, "access");
    }

    // Sign in: the answer and the cookie's flags.
    let alice = web_login(&cluster, "alice");
    assert_eq!(alice.answer["user"], "alice");
    assert_eq!(alice.answer["roles"], serde_json::json!(["access"]));
    let expires = alice.answer["expires"].as_str().expect("expires");
    assert!(
        expires.ends_with('Z') && expires.contains('T'),
        "RFC 3339: {expires}"
    );
    for flag in ["Path=/", "Secure", "HttpOnly", "SameSite=Strict", "Max-Age="] {
        assert!(
            alice.set_cookie.contains(flag),
            "cookie lacks {flag}: {}",
            alice.set_cookie
        );
    }
    let max_age: u64 = alice
        .set_cookie
        .split("Max-Age=")
        .nth(1)
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.trim().parse().ok())
        .expect("Max-Age value");
    assert!(max_age > 60 && max_age <= 24 * 3600 * 31, "Max-Age {max_age}");
    // The id: 256 bits (URL-safe base64 of 32 bytes), different at every sign-in.
    let id = alice
        .cookie
        .strip_prefix("svc_session=")
        .expect("svc_session cookie");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(id)
        .expect("the session id is URL-safe base64");
    assert!(raw.len() * 8 >= 128, "session id of {} bits", raw.len() * 8);
    let again = web_login(&cluster, "alice");
    assert_ne!(again.cookie, alice.cookie, "two sign-ins got the same session id");
    assert_ne!(again.csrf, alice.csrf, "two sign-ins got the same CSRF token");

    // The current session; the password never reaches the log.
    let current = alice.get(&cluster, "/webapi/sessions/web");
    assert_eq!(current.status, 200, "{}", current.body);
    assert_eq!(current.json()["csrf_token"], alice.csrf.as_str());
    assert!(current.header("set-cookie").is_none());
    assert!(!cluster.stderr().contains(PASSWORD), "the password was logged");

    // No cookie, a made-up cookie.
    let none = http(&cluster, "GET", "/webapi/sessions/web", &[], None);
    assert_eq!(none.status, 401, "{}", none.body);
    let forged = http(
        &cluster,
        "GET",
        "/webapi/resources",
        &[(
            "Cookie",
            "svc_session=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        )],
        None,
    );
    assert_eq!(forged.status, 401, "{}", forged.body);

    // A wrong password.
    let wrong = sign_in(&cluster, "bob", "not-the-password");
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert!(
        wrong.message().contains("invalid username or password"),
        "{}",
        wrong.body
    );
    assert!(wrong.header("set-cookie").is_none());

    // CSRF: a state-changing request without the token (or with another session's) is refused.
    let bare = http(
        &cluster,
        "DELETE",
        "/webapi/sessions/web",
        &[("Cookie", &alice.cookie)],
        None,
    );
    assert_eq!(bare.status, 403, "{}", bare.body);
    assert_eq!(bare.message(), "missing or invalid CSRF token");
    let crossed = http(
        &cluster,
        "PUT",
        "/webapi/maintenance",
        &[("Cookie", &alice.cookie), ("X-CSRF-Token", &again.csrf)],
        Some("{}"),
    );
    assert_eq!(crossed.status, 403, "{}", crossed.body);
    assert_eq!(crossed.message(), "missing or invalid CSRF token");

    // Logout: the cookie is cleared and the old one refused.
    let out = alice.send(&cluster, "DELETE", "/webapi/sessions/web", None);
    assert_eq!(out.status, 200, "{}", out.body);
    assert!(out.header("set-cookie").is_some_and(|c| c.contains("Max-Age=0")));
    let after = alice.get(&cluster, "/webapi/resources");
    assert_eq!(after.status, 401, "{}", after.body);
    // The other session of the same user lives on.
    assert_eq!(again.get(&cluster, "/webapi/sessions/web").status, 200);

    // `tctl lock` ends bob's live session on his next request.
    let bob = web_login(&cluster, "bob");
    assert_eq!(bob.get(&cluster, "/webapi/resources?kind=node").status, 200);
    cluster
        .tctl_admin(&["lock", "--user=bob", "--message=incident 9"], None)
        .ok();
    let locked = bob.get(&cluster, "/webapi/resources?kind=node");
    assert_eq!(locked.status, 401, "{}", locked.body);
    assert!(locked.message().contains("incident 9"), "{}", locked.body);
    assert_eq!(
        sign_in(&cluster, "bob", PASSWORD).status / 100,
        4,
        "a locked user signed in"
    );

    // Deleting carol ends hers.
    let carol = web_login(&cluster, "carol");
    assert_eq!(carol.get(&cluster, "/webapi/sessions/web").status, 200);
    cluster.tctl_admin(&["users", "rm", "carol"], None).ok();
    let deleted = carol.get(&cluster, "/webapi/sessions/web");
    assert_eq!(deleted.status, 401, "{}", deleted.body);
    assert!(deleted.message().contains("no longer exists"), "{}", deleted.body);

    // The lockout of the security work applies: 5 failures, then even the right password is
    // refused with 429.
    for _ in 0..5 {
        let guess = sign_in(&cluster, "lucy", "guessed-password");
        assert!(
            matches!(guess.status, 401 | 429),
            "{} {}",
            guess.status,
            guess.body
        );
    }
    let lockout = sign_in(&cluster, "lucy", PASSWORD);
    assert_eq!(lockout.status, 429, "{}", lockout.body);
    assert!(lockout.message().contains("locked"), "{}", lockout.body);

    // Sessions live in the proxy process's memory: a restarted proxy refuses the cookie.
    let live = again.get(&cluster, "/webapi/sessions/web");
    assert_eq!(live.status, 200, "{}", live.body);
    let mut cluster = cluster;
    let dir = cluster.take_dir();
    let restarted = Cluster::start_in(dir, "info");
    let stale = http(
        &restarted,
        "GET",
        "/webapi/sessions/web",
        &[("Cookie", &again.cookie)],
        None,
    );
    assert_eq!(stale.status, 401, "{}", stale.body);
}

#[test]
fn web_apis_answer_as_the_user_and_the_terminal_runs_a_shell() {
    let cluster = Cluster::start("info");
    cluster
        .tctl_admin(
            &["create", &cluster.write("roles.yaml", ROLES).to_string_lossy()],
            None,
        )
        .ok();
    add_user(&cluster, "nora", "narrow");
    add_user(&cluster, "eddie", "access,maint-editor,editor");
    let node = nodename();
    let nora = web_login(&cluster, "nora");
    let eddie = web_login(&cluster, "eddie");

    // Resources: eddie sees the local node (with its logins); nora's role does not allow it.
    let names = |r: &Resp| -> Vec<String> {
        r.json()["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let mut seen = None;
    wait::wait_until(
        wait::STEP,
        &format!("the local node {node} in eddie's resources"),
        || {
            let r = eddie.get(&cluster, "/webapi/resources?kind=node");
            assert_eq!(r.status, 200, "{}", r.body);
            let found = names(&r).contains(&node);
            if found {
                seen = Some(r);
            } else {
                std::thread::sleep(Duration::from_millis(300));
            }
            found
        },
    );
    let seen = seen.expect("eddie's resources");
    let item = seen.json()["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|i| i["name"] == node.as_str())
        .cloned()
        .expect("node item");
    assert_eq!(item["kind"], "node");
    assert!(
        item["logins"]
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l == "root")),
        "{item}"
    );
    let searched = eddie.get(
        &cluster,
        &format!("/webapi/resources?search={}", node.to_uppercase()),
    );
    assert!(names(&searched).contains(&node), "{}", searched.body);
    let missed = eddie.get(&cluster, "/webapi/resources?kind=node&search=no-such-thing-xyz");
    assert!(names(&missed).is_empty(), "{}", missed.body);
    let narrow = nora.get(&cluster, "/webapi/resources?kind=node");
    assert_eq!(narrow.status, 200, "{}", narrow.body);
    assert!(
        !names(&narrow).contains(&node),
        "nora sees {node}: {}",
        narrow.body
    );
    let bad = eddie.get(&cluster, "/webapi/resources?kind=printer");
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.message().starts_with("kind:"), "{}", bad.body);

    // Maintenance: both read it; nora cannot change it (the Auth Service's reason), eddie can.
    let doc = nora.get(&cluster, "/webapi/maintenance");
    assert_eq!(doc.status, 200, "{}", doc.body);
    assert_eq!(doc.json()["kind"], "cluster_maintenance_config");
    let new_doc = serde_json::json!({
        "kind": "cluster_maintenance_config",
        "version": "v1",
        "metadata": { "name": "cluster-maintenance-config" },
        "spec": { "agent_upgrades": { "utc_start_hour": 3, "weekdays": ["Tue"] } },
    })
    .to_string();
    let refused = nora.send(&cluster, "PUT", "/webapi/maintenance", Some(&new_doc));
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.message().contains("access denied"), "{}", refused.body);
    let saved = eddie.send(&cluster, "PUT", "/webapi/maintenance", Some(&new_doc));
    assert_eq!(saved.status, 200, "{}", saved.body);
    assert_eq!(saved.json()["spec"]["agent_upgrades"]["utc_start_hour"], 3);
    assert!(
        saved.json()["next_window"]
            .as_str()
            .is_some_and(|w| w.contains("T03:00:00")),
        "{}",
        saved.body
    );
    let tctl = cluster
        .tctl_admin(&["get", "cluster_maintenance_config", "--format", "json"], None)
        .ok();
    assert!(tctl.stdout.contains("\"utc_start_hour\": 3"), "{}", tctl.stdout);
    assert!(tctl.stdout.contains("Tue"), "{}", tctl.stdout);
    // nora's view shows eddie's change.
    let after = nora.get(&cluster, "/webapi/maintenance");
    assert_eq!(
        after.json()["spec"]["agent_upgrades"]["utc_start_hour"],
        3,
        "{}",
        after.body
    );

    // Inventory: the local agent with its version; the filters of `tctl inventory ls`.
    let inv = eddie.get(&cluster, "/webapi/inventory");
    assert_eq!(inv.status, 200, "{}", inv.body);
    let inv = inv.json();
    assert!(
        inv["cluster_version"].as_str().is_some_and(|v| !v.is_empty()),
        "{inv}"
    );
    let rows = inv["items"].as_array().expect("items");
    let local = rows
        .iter()
        .find(|r| r["hostname"] == node.as_str())
        .unwrap_or_else(|| panic!("no inventory row for {node}: {inv}"));
    assert_eq!(local["version"], inv["cluster_version"]);
    assert_eq!(local["behind"], false);
    let filtered = eddie.get(&cluster, "/webapi/inventory?older_than=0.0.1");
    assert_eq!(
        filtered.json()["items"],
        serde_json::json!([]),
        "{}",
        filtered.body
    );
    let wrong = eddie.get(&cluster, "/webapi/inventory?upgrader=apt");
    assert_eq!(wrong.status, 400, "{}", wrong.body);
    let channels = eddie.get(&cluster, "/webapi/channels");
    assert_eq!(channels.status, 200, "{}", channels.body);
    assert!(channels.json()["channels"].is_array(), "{}", channels.body);

    // The terminal: a shell on the local node over a WebSocket; the output comes back.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let web = cluster.web_addr.clone();
    let origin = format!("https://{web}");
    let query = format!("/webapi/terminal?node={node}&login=root&cols=100&rows=30");
    let (output, last) = rt.block_on(echo_in_terminal(&web, &query, &eddie.cookie));
    assert!(output.contains("web-term-42 été"), "terminal output: {output}");
    let last: serde_json::Value =
        serde_json::from_str(&last.expect("a closing text frame")).expect("closing frame JSON");
    assert_eq!(last, serde_json::json!({ "type": "exit", "code": 0 }));

    // A foreign Origin is refused before any upgrade; nora cannot reach the node either.
    let foreign = rt.block_on(ws_connect(&web, &query, &eddie.cookie, "https://evil.example"));
    let Err(err) = foreign else {
        panic!("a foreign Origin was accepted");
    };
    assert!(err.contains("403"), "{err}");
    let nora_term = rt.block_on(async {
        let mut ws = ws_connect(&web, &query, &nora.cookie, &origin)
            .await
            .expect("nora's WebSocket");
        tokio::time::timeout(wait::STEP, async {
            while let Some(Ok(frame)) = ws.next().await {
                if let Message::Text(t) = frame {
                    return t.to_string();
                }
            }
            String::new()
        })
        .await
        .expect("an answer for nora within the deadline")
    });
    let nora_term: serde_json::Value = serde_json::from_str(&nora_term).expect("JSON frame");
    assert_eq!(nora_term["type"], "error", "{nora_term}");
    let denied = http(&cluster, "GET", &query, &[("Cookie", &eddie.cookie)], None);
    assert_eq!(denied.status, 403, "no Origin: {}", denied.body);

    // Signing out ends an open terminal too (within the session check's period).
    let short = web_login(&cluster, "eddie");
    let ended = rt.block_on(async {
        let mut ws = ws_connect(&web, &query, &short.cookie, &origin)
            .await
            .expect("eddie's second terminal");
        ws.send(Message::binary(b"echo started-$((1+1)); sleep 600\n".to_vec()))
            .await
            .expect("input");
        let mut seen = Vec::new();
        tokio::time::timeout(wait::STEP, async {
            while let Some(Ok(frame)) = ws.next().await {
                match frame {
                    Message::Binary(b) => {
                        seen.extend_from_slice(&b);
                        if String::from_utf8_lossy(&seen).contains("started-2") {
                            let out = short.send(web.as_str(), "DELETE", "/webapi/sessions/web", None);
                            assert_eq!(out.status, 200, "{}", out.body);
                            seen.clear();
                        }
                    }
                    Message::Text(t) => return t.to_string(),
                    _ => {}
                }
            }
            String::new()
        })
        .await
        .expect("the terminal ends after the sign-out")
    });
    let ended: serde_json::Value = serde_json::from_str(&ended).expect("JSON frame");
    assert_eq!(ended["type"], "error", "{ended}");
    assert!(
        ended["message"]
            .as_str()
            .is_some_and(|m| m.contains("sign in again")),
        "{ended}"
    );
}

/// Runs `echo` (with UTF-8) and `exit` in a web terminal at `query`: the terminal's output and
/// the closing text frame.
async fn echo_in_terminal(web: &str, query: &str, cookie: &str) -> (String, Option<String>) {
    let origin = format!("https://{web}");
    let mut ws = ws_connect(web, query, cookie, &origin)
        .await
        .unwrap_or_else(|e| panic!("terminal WebSocket: {e}"));
    ws.send(Message::text(r#"{"type":"resize","cols":120,"rows":40}"#))
        .await
        .expect("resize");
    ws.send(Message::binary(
        b"echo web-term-$((6*7)) \xc3\xa9t\xc3\xa9; exit\n".to_vec(),
    ))
    .await
    .expect("input");
    let mut output = Vec::new();
    let last = tokio::time::timeout(wait::STEP, async {
        while let Some(frame) = ws.next().await {
            match frame {
                Ok(Message::Binary(b)) => output.extend_from_slice(&b),
                Ok(Message::Text(t)) => return Some(t.to_string()),
                Ok(_) => {}
                Err(e) => panic!("terminal frame: {e}"),
            }
        }
        None
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the terminal did not end within {:?}; output so far: {}",
            wait::STEP,
            String::from_utf8_lossy(&output)
        )
    });
    (String::from_utf8_lossy(&output).into_owned(), last)
}

/// A WebSocket to the proxy's web port (TLS, certificate not checked: a test cluster) with the
/// session cookie and `origin`.
async fn ws_connect(
    web: &str,
    path: &str,
    cookie: &str,
    origin: &str,
) -> Result<tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>, String>
{
    let tcp = tokio::net::TcpStream::connect(web)
        .await
        .map_err(|e| e.to_string())?;
    let mut config = svc_net::tls::insecure_client_config().map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name =
        tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let mut request = format!("wss://{web}{path}")
        .into_client_request()
        .map_err(|e| e.to_string())?;
    let headers = request.headers_mut();
    headers.insert("Cookie", cookie.parse().map_err(|_| "cookie header".to_owned())?);
    headers.insert("Origin", origin.parse().map_err(|_| "origin header".to_owned())?);
    let (ws, _) = tokio::time::timeout(wait::STEP, tokio_tungstenite::client_async(request, tls))
        .await
        .map_err(|_| "the WebSocket handshake timed out".to_owned())?
        .map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(resp) => format!(
                "refused with {}: {}",
                resp.status(),
                String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default())
            ),
            other => other.to_string(),
        })?;
    Ok(ws)
}

/// A free loopback address.
fn free_addr() -> String {
    format!("127.0.0.1:{}", svc_testkit::free_port("127.0.0.1"))
}

#[test]
fn a_proxy_apart_serves_web_sessions_resources_the_terminal_and_ends_locked_sessions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let home = dir.join("home");
    let auth_data = dir.join("auth-data");
    let data = auth_data.to_string_lossy().into_owned();
    let tctl = |args: &[&str], stdin: Option<&str>| {
        let mut all = vec!["--data-dir", data.as_str()];
        all.extend_from_slice(args);
        common::run_client(common::TCTL, &home, &all, stdin).ok()
    };

    // The Auth Service alone, then the Proxy Service alone (joined with a proxy token), then an
    // SSH agent tunnelled through that proxy.
    let auth_yaml = dir.join("auth.yaml");
    std::fs::write(
        &auth_yaml,
        format!(
            "version: v1\nsvc:\n  data_dir: {}\nauth_service:\n  listen_addr: {}\n  cluster_name: apart.test\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n",
            auth_data.display(),
            free_addr()
        ),
    )
    .expect("auth.yaml");
    let auth = Svc::start(&auth_yaml, dir.join("auth.stderr"));
    let auth_addr = auth.line("auth");
    let (proxy_token, pin) = token(&auth_data, &home, "proxy");
    let proxy_yaml = dir.join("proxy.yaml");
    std::fs::write(
        &proxy_yaml,
        format!(
            "version: v1\nsvc:\n  nodename: proxy-1\n  data_dir: {}\n  auth_server: {auth_addr}\n  auth_token: {proxy_token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: true\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\n",
            dir.join("proxy-data").display()
        ),
    )
    .expect("proxy.yaml");
    let proxy = Svc::start(&proxy_yaml, dir.join("proxy.stderr"));
    let web = proxy.line("web").trim_start_matches("https://").to_owned();
    let (node_token, _) = token(&auth_data, &home, "node");
    let agent_yaml = dir.join("agent.yaml");
    std::fs::write(
        &agent_yaml,
        format!(
            "version: v1\nsvc:\n  nodename: node-apart\n  data_dir: {}\n  proxy_server: {web}\n  auth_token: {node_token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            dir.join("agent-data").display()
        ),
    )
    .expect("agent.yaml");
    let mut agent_cmd = Command::new(common::SVC);
    agent_cmd
        .args(["start", "--insecure", "--config"])
        .arg(&agent_yaml);
    let _agent = common::agent::Agent::start(agent_cmd, dir.join("agent.stderr"));
    for user in ["alice", "bob"] {
        tctl(
            &[
                "users",
                "add",
                user,
                "--roles=access",
                "--logins=root",
                "--password-stdin",
            ],
            Some(PASSWORD),
        );
    }

    // Sign in at the proxy apart; the node appears in alice's resources once announced.
    let alice = web_login(web.as_str(), "alice");
    assert_eq!(alice.answer["user"], "alice");
    let wrong = sign_in(web.as_str(), "alice", "not-the-password");
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    wait::wait_until(wait::STEP, "node-apart in alice's web resources", || {
        let r = alice.get(web.as_str(), "/webapi/resources?kind=node");
        assert_eq!(r.status, 200, "{}", r.body);
        let found = r.body.contains("\"node-apart\"");
        if !found {
            std::thread::sleep(Duration::from_millis(300));
        }
        found
    });
    let doc = alice.get(web.as_str(), "/webapi/maintenance");
    assert_eq!(
        doc.status / 100,
        4,
        "access may not read the window: {}",
        doc.body
    );

    // The terminal through the tunnel.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let query = "/webapi/terminal?node=node-apart&login=root";
    let (output, last) = rt.block_on(echo_in_terminal(&web, query, &alice.cookie));
    assert!(output.contains("web-term-42 été"), "terminal output: {output}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&last.expect("a closing text frame")).expect("JSON"),
        serde_json::json!({ "type": "exit", "code": 0 })
    );

    // `tctl lock` reaches the proxy's watched cache: bob's session ends on a later request.
    let bob = web_login(web.as_str(), "bob");
    assert_eq!(bob.get(web.as_str(), "/webapi/sessions/web").status, 200);
    tctl(&["lock", "--user=bob", "--message=apart incident"], None);
    let mut last = String::new();
    wait::wait_until(wait::STEP, "bob's web session ended by the lock", || {
        let r = bob.get(web.as_str(), "/webapi/sessions/web");
        last = r.body.clone();
        let ended = r.status == 401;
        if !ended {
            std::thread::sleep(Duration::from_millis(200));
        }
        ended
    });
    assert!(last.contains("apart incident"), "{last}");
    // alice's session is untouched.
    assert_eq!(alice.get(web.as_str(), "/webapi/sessions/web").status, 200);
}
