//! Slow and silent peers cannot starve honest clients: 300 connections that send nothing or one
//! byte per second are held open while curl still gets its ping; the accept loop then closes
//! each of them at the (short, configured) peek deadline. Outcomes only, no timing assertions.

use std::time::Duration;

use anyhow::{Context, Result};
use svc_net::{
    listen::ListenOptions,
    proxy::{ProxyBuilder, ProxySettings},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// Waits until the server closes `s`; `trickle` sends one byte of a TLS hello each second.
async fn until_closed(mut s: TcpStream, trickle: bool) {
    // A valid beginning of a TLS record carrying a ClientHello, then filler: the peer gets past
    // protocol detection and sits in the ClientHello peek.
    let hello_start = [0x16u8, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
    let mut sent = 0usize;
    let mut buf = [0u8; 64];
    loop {
        if trickle {
            let byte = hello_start.get(sent).copied().unwrap_or(0x42);
            if s.write_all(&[byte]).await.is_err() {
                return;
            }
            sent += 1;
        }
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            () = tokio::time::sleep(Duration::from_secs(1)), if trickle => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_peers_do_not_block_an_honest_client() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
    settings.tls = svc_net::tls::TlsSource::Generated {
        data_dir: dir.path().to_owned(),
    };
    settings.listen = ListenOptions::default()
        .with_peek_timeout(Duration::from_secs(3))
        .with_max_peeking(1000)
        .with_drain_timeout(Duration::from_secs(5));
    let proxy = ProxyBuilder::new(settings).bind().await?;
    let addr = proxy.addrs().web;

    let mut held = Vec::new();
    for i in 0..300 {
        let s = TcpStream::connect(addr).await?;
        held.push(tokio::spawn(until_closed(s, i % 2 == 1)));
    }

    let port = addr.port();
    let out = tokio::process::Command::new(svc_testkit::require("curl", "curl"))
        .args([
            "-sS",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cacert",
        ])
        .arg(proxy.ca_file().context("ca")?)
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .arg(format!("https://localhost:{port}/webapi/ping"))
        .output()
        .await
        .context("running curl: install the Debian package `curl`")?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Every slow or silent peer is cut off by the server (the outer bound only guards a hang).
    let all = futures_util::future::join_all(held);
    let results = tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .context("slow peers were never closed by the server")?;
    assert_eq!(results.len(), 300);
    for r in results {
        r?;
    }
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_peek_cap_new_connections_are_shed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
    settings.tls = svc_net::tls::TlsSource::Generated {
        data_dir: dir.path().to_owned(),
    };
    settings.listen = ListenOptions::default()
        .with_peek_timeout(Duration::from_secs(2))
        .with_max_peeking(5);
    let proxy = ProxyBuilder::new(settings).bind().await?;
    let addr = proxy.addrs().web;

    // Five silent peers fill the cap (accepted in order, before the sixth).
    let mut silent = Vec::new();
    for _ in 0..5 {
        silent.push(TcpStream::connect(addr).await?);
    }
    let mut sixth = TcpStream::connect(addr).await?;
    let mut buf = [0u8; 8];
    let n = tokio::time::timeout(Duration::from_secs(60), sixth.read(&mut buf))
        .await
        .context("the sixth connection was never closed")?
        .unwrap_or(0);
    assert_eq!(n, 0, "shed without an answer");

    // Once the silent peers hit their deadline and are closed, honest clients get in again.
    for mut s in silent {
        let n = tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf))
            .await
            .context("a silent peer was never closed")?
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
    let port = addr.port();
    let out = tokio::process::Command::new(svc_testkit::require("curl", "curl"))
        .args([
            "-sS",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cacert",
        ])
        .arg(proxy.ca_file().context("ca")?)
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .arg(format!("https://localhost:{port}/webapi/ping"))
        .output()
        .await
        .context("running curl: install the Debian package `curl`")?;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    proxy.shutdown().await;
    Ok(())
}
