//! How `tctl` prints what the Auth API returns: YAML, JSON or text tables.

use svc_core::auth::InventoryRow;
use svc_core::resource::{Kind, Resource, resources_to_json, resources_to_yaml};

/// An output format (`--format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// YAML documents separated by `---`.
    Yaml,
    /// Pretty-printed JSON.
    Json,
    /// A text table.
    Text,
}

/// Prints rows as a text table: a header, a dashed rule, left-aligned columns.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    print!("{}", table(header, rows));
}

/// Makes text that came from elsewhere (an agent's hostname, labels or version, a resource
/// name) safe to print on a terminal: control characters (escape sequences, carriage
/// returns, new lines, C1 controls) and the Unicode bidirectional overrides are shown as
/// escapes (`\x1b`, `\u{202e}`) instead of acting on the terminal.
pub fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            if (c as u32) < 0x100 {
                out.push_str(&format!("\\x{:02x}", c as u32));
            } else {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Renders a text table. Every cell is [`sanitize`]d: cells often hold what agents announced.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| sanitize(cell)).collect())
        .collect();
    let rows = &rows;
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[&str]| -> String {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", text.join(" ").trim_end())
    };
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    let mut out = line(header);
    out.push_str(&line(&rule.iter().map(String::as_str).collect::<Vec<_>>()));
    for row in rows {
        out.push_str(&line(&row.iter().map(String::as_str).collect::<Vec<_>>()));
    }
    out
}

/// `tctl get`.
pub fn print_resources(resources: &[Resource], format: Format) -> anyhow::Result<()> {
    match format {
        Format::Yaml => print!("{}", resources_to_yaml(resources)?),
        Format::Json => println!("{}", resources_to_json(resources)?),
        Format::Text => {
            let rows: Vec<Vec<String>> = resources
                .iter()
                .map(|r| {
                    // A token's name is its secret value.
                    let name = if r.kind() == Kind::Token { "***" } else { r.name() };
                    vec![r.kind().to_string(), name.to_owned()]
                })
                .collect();
            print_table(&["Kind", "Name"], &rows);
        }
    }
    Ok(())
}

/// `tctl users ls`.
pub fn print_users(users: &[Resource], format: Format) -> anyhow::Result<()> {
    if format != Format::Text {
        return print_resources(users, format);
    }
    let rows: Vec<Vec<String>> = users
        .iter()
        .filter_map(|r| match r {
            Resource::User(u) => Some(vec![u.metadata.name.clone(), u.spec.roles.join(",")]),
            _ => None,
        })
        .collect();
    print_table(&["User", "Roles"], &rows);
    Ok(())
}

/// `tctl tokens ls`: the operator asked for the tokens, so their values are shown.
pub fn print_tokens(tokens: &[Resource]) {
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .filter_map(|r| match r {
            Resource::Token(t) => Some(vec![
                t.value().expose().clone(),
                t.spec
                    .roles
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                t.metadata
                    .expires
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "never".into()),
            ]),
            _ => None,
        })
        .collect();
    print_table(&["Token", "Type", "Expiry Time (UTC)"], &rows);
}

fn none(s: &str) -> String {
    if s.is_empty() {
        "none".to_owned()
    } else {
        s.to_owned()
    }
}

/// The rows `tctl inventory ls --upgrader=…` keeps (`none`: not enrolled).
pub fn filter_inventory(rows: Vec<InventoryRow>, upgrader: Option<&str>) -> Vec<InventoryRow> {
    rows.into_iter()
        .filter(|r| upgrader.is_none_or(|u| none(&r.upgrader) == u))
        .collect()
}

/// `tctl inventory ls`: Server ID, Hostname, Services, Version, Upgrader, Upgrader Version;
/// empty values print `none`.
pub fn print_inventory(
    rows: Vec<InventoryRow>,
    upgrader: Option<&str>,
    format: Format,
) -> anyhow::Result<()> {
    let rows = filter_inventory(rows, upgrader);
    if format != Format::Text {
        let json: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "server_id": r.server_id, "hostname": r.hostname, "services": r.services,
                    "version": r.version, "upgrader": none(&r.upgrader),
                    "upgrader_version": none(&r.upgrader_version),
                })
            })
            .collect();
        match format {
            Format::Yaml => print!("{}", serde_yaml_ng::to_string(&json)?),
            _ => println!("{}", serde_json::to_string_pretty(&json)?),
        }
        return Ok(());
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.server_id.clone(),
                none(&r.hostname),
                none(&r.services.join(",")),
                none(&r.version),
                none(&r.upgrader),
                none(&r.upgrader_version),
            ]
        })
        .collect();
    print_table(
        &[
            "Server ID",
            "Hostname",
            "Services",
            "Version",
            "Upgrader",
            "Upgrader Version",
        ],
        &table,
    );
    Ok(())
}

/// Prints a new join token (`tctl tokens add`): JSON, or sentences saying what it admits.
pub fn print_invite(invite: &svc_net::auth::Invite, roles: &[String], format: Format) {
    match format {
        Format::Json => println!(
            "{}",
            serde_json::json!({
                "token": invite.token.expose(),
                "roles": roles,
                "extra_names": invite.extra_names,
                "expires_unix": invite.expires_unix,
                "ca_pin": invite.ca_pin,
            })
        ),
        _ => {
            println!("The invite token: {}", invite.token.expose());
            println!(
                "It admits: {}. It expires at Unix time {} and works once.",
                roles.join(","),
                invite.expires_unix
            );
            println!(
                "The agent joins with this token and checks the CA pin {}.",
                invite.ca_pin
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, upgrader: &str) -> InventoryRow {
        InventoryRow {
            server_id: id.into(),
            hostname: format!("host-{id}"),
            services: vec!["node".into()],
            version: "17.0.0".into(),
            upgrader: upgrader.into(),
            upgrader_version: String::new(),
            last_seen: 0,
        }
    }

    #[test]
    fn upgrader_none_means_not_enrolled() {
        let rows = vec![row("a", ""), row("b", "unit"), row("c", "kube")];
        let ids = |u| {
            filter_inventory(rows.clone(), u)
                .into_iter()
                .map(|r| r.server_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(Some("none")), ["a"]);
        assert_eq!(ids(Some("unit")), ["b"]);
        assert_eq!(ids(None), ["a", "b", "c"]);
    }

    #[test]
    fn tables_align_columns() {
        let t = table(&["Server ID", "Upgrader"], &[vec!["x".into(), "none".into()]]);
        assert_eq!(t, "Server ID Upgrader\n--------- --------\nx         none\n");
    }

    #[test]
    fn agent_supplied_text_cannot_drive_the_terminal() {
        // A rogue agent's hostname clears the screen, forges a row and reverses the text.
        let evil = "db\x1b[2J\r\nfake-node  ok\u{202e}gnp.exe\u{9b}";
        let t = table(&["Hostname"], &[vec![evil.into()]]);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert_eq!(t.lines().count(), 3, "{t}");
        assert!(
            t.contains("db\\x1b[2J\\x0d\\x0afake-node  ok\\u{202e}gnp.exe\\x9b"),
            "{t}"
        );
        assert_eq!(sanitize("plain host-1 ünïcode"), "plain host-1 ünïcode");
    }
}
