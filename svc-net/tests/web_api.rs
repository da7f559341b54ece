//! The web API over real TLS with real clients: curl (HTTP/1.1, `--http2`, `--cacert` with the
//! generated CA) and a hyper HTTP/2 client offering only `h2`.

use std::{path::Path, process::Output};

use anyhow::{Context, Result, bail};
use svc_core::{Version, config::ListenerMode};
use svc_net::proxy::{ProxyBuilder, ProxySettings, RunningProxy};

async fn start(dir: &Path, mode: ListenerMode) -> Result<RunningProxy> {
    let mut settings = ProxySettings::default();
    settings.ping.listener_mode = mode;
    settings.ping.cluster_name = "test.example.com".into();
    settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
    settings.ping.ssh_listen_addr = "127.0.0.1:0".parse()?;
    settings.ping.tunnel_listen_addr = "127.0.0.1:0".parse()?;
    settings.ping.web_public_addr = Some("proxy.example.com:443".parse()?);
    settings.tls = svc_net::tls::TlsSource::Generated {
        data_dir: dir.to_owned(),
    };
    Ok(ProxyBuilder::new(settings)
        .with_version(Version::new(17, 2, 1))
        .bind()
        .await?)
}

/// Runs curl against the proxy; fails naming the package when curl is missing.
async fn curl(proxy: &RunningProxy, args: &[&str], path: &str) -> Result<(u16, String, String)> {
    let port = proxy.addrs().web.port();
    let ca = proxy.ca_file().context("generated CA")?;
    let out: Output = tokio::process::Command::new(svc_testkit::require("curl", "curl"))
        .args(["-sS", "--max-time", "20", "--cacert"])
        .arg(ca)
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .args(args)
        .args(["-w", "\n%{http_code} %{http_version}"])
        .arg(format!("https://localhost:{port}{path}"))
        .output()
        .await
        .context("running curl: install the Debian package `curl`")?;
    if !out.status.success() {
        bail!("curl failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout)?;
    let (body, tail) = text.rsplit_once('\n').context("curl output")?;
    let (code, version) = tail.split_once(' ').context("curl -w")?;
    Ok((code.parse()?, version.to_owned(), body.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_find_over_curl_http1_and_http2() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let proxy = start(dir.path(), ListenerMode::Multiplex).await?;
    let web = proxy.addrs().web.to_string();

    let (code, version, body) = curl(&proxy, &[], "/webapi/ping").await?;
    assert_eq!((code, version.as_str()), (200, "1.1"));
    let ping: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(ping["server_version"], "17.2.1");
    assert_eq!(ping["min_client_version"], "17.0.0-dev");
    assert_eq!(ping["cluster_name"], "test.example.com");
    assert_eq!(ping["automatic_upgrades"], false);
    assert_eq!(ping["auth"]["type"], "local");
    assert_eq!(ping["auth"]["second_factor"], "off");
    assert_eq!(ping["auth"]["local"]["name"], "");
    let p = &ping["proxy"];
    assert_eq!(p["tls_routing_enabled"], true);
    assert_eq!(p["ssh"]["public_addr"], "proxy.example.com:443");
    assert_eq!(p["ssh"]["ssh_tunnel_public_addr"], "proxy.example.com:443");
    assert_eq!(p["ssh"]["web_listen_addr"], web);
    assert_eq!(p["ssh"]["listen_addr"], web);
    assert_eq!(p["ssh"]["tunnel_listen_addr"], web);
    assert_eq!(p["db"]["postgres_public_addr"], "proxy.example.com:443");
    assert_eq!(p["db"]["mysql_public_addr"], "proxy.example.com:443");
    assert_eq!(p["kube"]["enabled"], false);

    // curl --http2 offers h2 and http/1.1; the server prefers http/1.1 (REFERENCE.md).
    let (code, version, body2) = curl(&proxy, &["--http2"], "/webapi/ping").await?;
    assert_eq!((code, version.as_str()), (200, "1.1"));
    assert_eq!(
        body2, body,
        "the ping is served from memory, identical every time"
    );

    let (code, _, find) = curl(&proxy, &[], "/webapi/find").await?;
    assert_eq!(code, 200);
    let find: serde_json::Value = serde_json::from_str(&find)?;
    assert!(find.get("auth").is_none());
    assert_eq!(find["proxy"], ping["proxy"]);
    assert_eq!(find["server_version"], "17.2.1");

    let (code, _, body) = curl(&proxy, &[], "/webapi/nope").await?;
    assert_eq!(code, 404);
    let err: serde_json::Value = serde_json::from_str(&body)?;
    assert!(err["error"]["message"].as_str().unwrap().contains("/webapi/nope"));

    let (code, _, body) = curl(&proxy, &["-X", "POST"], "/webapi/ping").await?;
    assert_eq!(code, 405);
    assert!(body.contains("\"error\""), "{body}");

    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_when_the_client_offers_only_h2() -> Result<()> {
    use http_body_util::{BodyExt, Empty};
    let dir = tempfile::tempdir()?;
    let proxy = start(dir.path(), ListenerMode::Multiplex).await?;
    let ca = std::fs::read(proxy.ca_file().context("ca")?)?;
    let mut config = (*svc_net::tls::client_config(Some(&ca))?).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(proxy.addrs().web).await?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect("localhost".try_into()?, tcp)
        .await?;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await?;
    tokio::spawn(conn);
    let req = http::Request::get("https://localhost/webapi/ping").body(Empty::<bytes::Bytes>::new())?;
    let resp = send.send_request(req).await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await?.to_bytes();
    let ping: serde_json::Value = serde_json::from_slice(&body)?;
    assert_eq!(ping["server_version"], "17.2.1");
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_mode_ping_reports_the_separate_ports() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let proxy = start(dir.path(), ListenerMode::Separate).await?;
    let ssh = proxy.addrs().get("ssh_listen_addr").context("ssh listener")?;
    let tunnel = proxy
        .addrs()
        .get("tunnel_listen_addr")
        .context("tunnel listener")?;
    let (code, _, body) = curl(&proxy, &[], "/webapi/ping").await?;
    assert_eq!(code, 200);
    let ping: serde_json::Value = serde_json::from_str(&body)?;
    let p = &ping["proxy"];
    assert_eq!(p["tls_routing_enabled"], false);
    assert_eq!(p["ssh"]["listen_addr"], ssh.to_string());
    assert_eq!(p["ssh"]["tunnel_listen_addr"], tunnel.to_string());
    assert_eq!(p["ssh"]["ssh_tunnel_public_addr"], tunnel.to_string());
    assert_eq!(p["ssh"]["public_addr"], "proxy.example.com:443");
    // The SSH and tunnel listeners exist; without registered handlers they close connections.
    for addr in [ssh, tunnel] {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let mut buf = [0u8; 8];
        let n = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "closed without a handler");
    }
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_gets_a_hint_and_the_certificate_is_reused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let proxy = start(dir.path(), ListenerMode::Multiplex).await?;
    let port = proxy.addrs().web.port();
    let out = tokio::process::Command::new(svc_testkit::require("curl", "curl"))
        .args(["-sS", "--max-time", "20", "-w", "\n%{http_code}"])
        .arg(format!("http://127.0.0.1:{port}/webapi/ping"))
        .output()
        .await
        .context("running curl: install the Debian package `curl`")?;
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    assert!(text.ends_with("\n400"), "{text}");
    assert!(text.contains("use https://"), "{text}");
    let ca = std::fs::read(proxy.ca_file().context("ca")?)?;
    proxy.shutdown().await;

    let again = start(dir.path(), ListenerMode::Multiplex).await?;
    assert_eq!(
        std::fs::read(again.ca_file().context("ca")?)?,
        ca,
        "restart reuses the CA"
    );
    let (code, _, _) = curl(&again, &[], "/webapi/ping").await?;
    assert_eq!(code, 200);
    again.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_peers_are_closed_and_the_loop_keeps_serving() -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir()?;
    let proxy = start(dir.path(), ListenerMode::Multiplex).await?;
    let garbage: [&[u8]; 6] = [
        b"\x00\x01\x02garbage\r\n",
        b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00",
        b"\x16\x03\x01\x00\x00",
        b"PROXY TCP4 192.0.2.1 127.0.0.1 1000 443\r\n",
        b"\x00\x00\x00\x08\x04\xD2\x16\x2F",
        b"SSH-2.0-OpenSSH_9.2\r\n",
    ];
    for bytes in garbage {
        let mut s = tokio::net::TcpStream::connect(proxy.addrs().web).await?;
        s.write_all(bytes).await?;
        let mut buf = Vec::new();
        // Closed by the server (EOF or reset), with nothing sent back.
        let n = tokio::time::timeout(std::time::Duration::from_secs(60), s.read_to_end(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!("the proxy did not close a connection that sent {bytes:?} within 60 s")
            })
            .unwrap_or(0);
        assert_eq!(n, 0, "{bytes:?} got {buf:?}");
    }
    let (code, _, _) = curl(&proxy, &[], "/webapi/ping").await?;
    assert_eq!(code, 200);
    proxy.shutdown().await;
    Ok(())
}
