//! Glue shared by the `svc`, `tctl` and `tsh` binaries: starting a cluster from `svc.yaml`
//! ([`cluster`]), and finding the identity a client acts with ([`profile`]). Everything with
//! behaviour lives in the libraries; this crate wires them together.
#![deny(missing_docs)]

pub mod cluster;
pub mod profile;

/// Sends `tracing` output to stderr, filtered by `RUST_LOG` (default `default_level`).
pub fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Prints rows as a text table: a header, a dashed rule, left-aligned columns.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", text.join(" ").trim_end());
    };
    line(header.to_vec());
    line(
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
    );
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Runs a binary's fallible main: errors go to stderr as `ERROR: <message>` with exit code 1.
pub fn exit_on_error(result: anyhow::Result<()>) {
    if let Err(e) = result {
        eprintln!("ERROR: {e:#}");
        std::process::exit(1);
    }
}
