//! Proof of the agent's health, from the `agent` file the agent writes after every heartbeat
//! the Auth Service accepted ([`AgentReport`]) and the agent's `/readyz`.
//!
//! Two questions, asked by the [runner](super::runner):
//! - after installing version V and restarting the agent: is it healthy with V? —
//!   [`wait_healthy`]: `agent` shows `version == V` and `heartbeat_at` at or after the restart,
//!   and, when `diag_addr` is set, `GET http://<diag_addr>/readyz` answers 200; polled once a
//!   second until `health-timeout`;
//! - before deciding: has the agent been unhealthy for a sustained time? — [`sustained_unhealth`]:
//!   its last accepted heartbeat is older than `unhealthy-after` and `/readyz` does not answer 200
//!   (or there is no diagnostics address). An agent that never wrote `agent` is not judged.

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use svc_core::Version;

use super::status::unix;
use svc_core::updater::AgentReport;

/// How long one `/readyz` request may take.
pub(crate) const READYZ_TIMEOUT: Duration = Duration::from_secs(3);

/// How often [`wait_healthy`] looks at the `agent` file.
const POLL: Duration = Duration::from_secs(1);

/// Waits until the agent proves healthy with `version` after a restart at `restarted_at` (Unix
/// seconds), for at most `timeout`. `Err` carries why it did not, for a person.
pub(crate) async fn wait_healthy(
    agent_path: &Path,
    version: &Version,
    restarted_at: u64,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let bare = version.without_v();
    let mut finding = format!("no heartbeat with {bare} within {}s", timeout.as_secs());
    loop {
        match AgentReport::load(agent_path) {
            Ok(Some(report))
                if report.parsed_version().as_ref() == Some(version)
                    && report.heartbeat_at >= restarted_at =>
            {
                match &report.diag_addr {
                    Some(addr) if !addr.trim().is_empty() => {
                        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                        // At least a second, so the last look can still be answered.
                        let budget = remaining.max(Duration::from_secs(1)).min(READYZ_TIMEOUT);
                        match readyz(addr.trim(), budget).await {
                            Ok(()) => return Ok(()),
                            Err(why) => {
                                finding = format!(
                                    "{bare} sent a heartbeat, but {why} (still so after {}s)",
                                    timeout.as_secs()
                                );
                            }
                        }
                    }
                    _ => return Ok(()),
                }
            }
            Ok(Some(report)) => {
                finding = format!(
                    "no heartbeat with {bare} within {}s (the agent last reported {} at {})",
                    timeout.as_secs(),
                    report.version,
                    report.heartbeat_at
                );
            }
            Ok(None) => {}
            Err(e) => {
                finding = format!("no heartbeat with {bare} within {}s ({e})", timeout.as_secs());
            }
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(finding);
        }
        // One last look at the deadline itself.
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

/// When the agent has been unhealthy for longer than `after`: why, for a person. `None` when it
/// is healthy, or when there is no `agent` file to judge by.
pub(crate) async fn sustained_unhealth(
    agent_path: &Path,
    now: SystemTime,
    after: Duration,
) -> Option<String> {
    let report = match AgentReport::load(agent_path) {
        Ok(Some(report)) => report,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!("cannot judge the agent's health: {e}");
            return None;
        }
    };
    let age = unix(now).saturating_sub(report.heartbeat_at);
    if age <= after.as_secs() {
        return None;
    }
    let readiness = match report.diag_addr.as_deref().map(str::trim) {
        Some(addr) if !addr.is_empty() => match readyz(addr, READYZ_TIMEOUT).await {
            Ok(()) => return None,
            Err(why) => why,
        },
        _ => "no diagnostics address to ask /readyz".to_owned(),
    };
    Some(format!(
        "the agent's last accepted heartbeat was {age}s ago (more than unhealthy-after, {}s) and {readiness}",
        after.as_secs()
    ))
}

/// One `GET http://<addr>/readyz` within `timeout`: `Ok` on 200, else why not.
pub(crate) async fn readyz(addr: &str, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, readyz_once(addr)).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "/readyz at {addr} did not answer within {}s",
            timeout.as_secs()
        )),
    }
}

async fn readyz_once(addr: &str) -> Result<(), String> {
    let failed = |e: &dyn std::fmt::Display| format!("/readyz at {addr} failed: {e}");
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| failed(&e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| failed(&e))?;
    let driver = tokio::spawn(conn);
    let request = http::Request::get("/readyz")
        .header(http::header::HOST, addr)
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed(&e))?;
    let result = async {
        let response = sender.send_request(request).await.map_err(|e| failed(&e))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| failed(&e))?
            .to_bytes();
        if status == http::StatusCode::OK {
            return Ok(());
        }
        let text: String = String::from_utf8_lossy(&body).trim().chars().take(200).collect();
        Err(format!("/readyz answered {}: {text}", status.as_u16()))
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU16, Ordering},
    };

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A `/readyz` answering the status in `code` to every request.
    async fn diag(code: Arc<AtomicU16>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let code = code.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = stream.read(&mut buf).await;
                    let body = if code == 200 { "ok" } else { "not joined" };
                    let reply = format!(
                        "HTTP/1.1 {code} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(reply.as_bytes()).await;
                });
            }
        });
        addr
    }

    fn report(dir: &Path, version: &str, at: u64, diag: Option<&str>) {
        let json = serde_json::json!({
            "version": version, "host_id": "h", "pid": 1, "heartbeat_at": at, "diag_addr": diag,
        });
        std::fs::write(dir.join("agent"), json.to_string()).expect("write agent");
    }

    #[tokio::test]
    async fn healthy_needs_the_version_a_fresh_heartbeat_and_readyz() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let agent = tmp.path().join("agent");
        let v = Version::new(17, 0, 2);
        let short = Duration::from_secs(1);

        let err = wait_healthy(&agent, &v, 100, short).await.expect_err("no file");
        assert_eq!(err, "no heartbeat with 17.0.2 within 1s");
        report(tmp.path(), "17.0.1", 200, None);
        let err = wait_healthy(&agent, &v, 100, short)
            .await
            .expect_err("old version");
        assert_eq!(
            err,
            "no heartbeat with 17.0.2 within 1s (the agent last reported 17.0.1 at 200)"
        );
        report(tmp.path(), "v17.0.2", 99, None);
        wait_healthy(&agent, &v, 100, short)
            .await
            .expect_err("before the restart");
        report(tmp.path(), "17.0.2", 100, None);
        wait_healthy(&agent, &v, 100, short)
            .await
            .expect("healthy without diag");

        let code = Arc::new(AtomicU16::new(503));
        let addr = diag(code.clone()).await;
        report(tmp.path(), "17.0.2", 100, Some(&addr));
        let err = wait_healthy(&agent, &v, 100, short).await.expect_err("503");
        assert!(
            err.starts_with("17.0.2 sent a heartbeat, but /readyz answered 503: not joined"),
            "{err}"
        );
        code.store(200, Ordering::SeqCst);
        wait_healthy(&agent, &v, 100, short)
            .await
            .expect("healthy with readyz");
    }

    #[tokio::test]
    async fn sustained_unhealth_needs_a_stale_heartbeat_and_no_readyz() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let agent = tmp.path().join("agent");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let after = Duration::from_secs(900);
        assert_eq!(
            sustained_unhealth(&agent, now, after).await,
            None,
            "no file: no judgement"
        );
        report(tmp.path(), "17.0.1", 10_000 - 900, None);
        assert_eq!(
            sustained_unhealth(&agent, now, after).await,
            None,
            "not older than the limit"
        );
        report(tmp.path(), "17.0.1", 10_000 - 901, None);
        assert_eq!(
            sustained_unhealth(&agent, now, after).await.as_deref(),
            Some(
                "the agent's last accepted heartbeat was 901s ago (more than unhealthy-after, 900s) \
                 and no diagnostics address to ask /readyz"
            )
        );
        let code = Arc::new(AtomicU16::new(200));
        let addr = diag(code.clone()).await;
        report(tmp.path(), "17.0.1", 1, Some(&addr));
        assert_eq!(
            sustained_unhealth(&agent, now, after).await,
            None,
            "/readyz says ready"
        );
        code.store(503, Ordering::SeqCst);
        let why = sustained_unhealth(&agent, now, after).await.expect("unhealthy");
        assert!(why.ends_with("and /readyz answered 503: not joined"), "{why}");
        // Nothing listening.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let closed_addr = closed.local_addr().expect("addr").to_string();
        drop(closed);
        report(tmp.path(), "17.0.1", 1, Some(&closed_addr));
        let why = sustained_unhealth(&agent, now, after).await.expect("unhealthy");
        assert!(
            why.contains(&format!("/readyz at {closed_addr} failed: ")),
            "{why}"
        );
    }
}
