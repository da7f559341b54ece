//! Test support for the Kubernetes updater tests: the fake API server, a real version server
//! (in-process hyper, REFERENCE.md bodies), log capture and condition waits.

#![allow(dead_code, unreachable_pub)]

pub mod fake_apiserver;
pub mod version_server;

use std::{
    future::Future,
    io,
    sync::{Arc, Mutex},
    time::Duration,
};

/// Waits until `check` holds, polling; fails after 30 s with `what`. Waiting on a condition,
/// never on an amount of time.
pub async fn wait_until<F: FnMut() -> bool>(what: &str, mut check: F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `fut` for at most `limit`; fails the test naming `what` (what did not happen) after that.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {limit:?}"))
}

/// Like [`wait_until`] for an async check.
pub async fn wait_until_async<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Captured log output; install with [`Logs::install`] on a current-thread runtime.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Routes this thread's tracing output here until the guard drops.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The updaters' shared version-server client, pointed at `base` over plain HTTP.
pub fn version_client(
    base: String,
) -> svc_update::target::VersionClient<hyper_util::client::legacy::connect::HttpConnector> {
    let tls =
        svc_update::target::tls_config(svc_update::target::Trust::Roots(None)).expect("webpki roots load");
    svc_update::target::VersionClient::new(
        hyper_util::client::legacy::connect::HttpConnector::new(),
        tls,
        base,
    )
}
