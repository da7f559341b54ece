//! How `tctl` prints what the Auth API returns: YAML, JSON or text tables.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use svc_core::Version;
use svc_core::auth::{InventoryRow, NextWindow, UpdateResult, UpdateStatus};
use svc_core::identity::SystemRole;
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

/// What `tctl inventory ls` keeps: every given condition must hold.
#[derive(Debug, Clone, Default)]
pub struct InventoryFilter {
    /// `--upgrader`: `kube`, `unit` or `none` (not enrolled).
    pub upgrader: Option<&'static str>,
    /// `--older-than`: running a version below this one.
    pub older_than: Option<Version>,
    /// `--newer-than`: running a version above this one.
    pub newer_than: Option<Version>,
    /// `--exact-version`: running this version.
    pub exact_version: Option<Version>,
    /// `--services`: running any of these services (empty: any agent).
    pub services: Vec<SystemRole>,
}

impl InventoryFilter {
    /// Whether `row` is kept. A row whose version does not parse is dropped by the version
    /// conditions (it cannot be compared).
    pub fn keeps(&self, row: &InventoryRow) -> bool {
        if self.upgrader.is_some_and(|u| none(&row.upgrader) != u) {
            return false;
        }
        if !self.services.is_empty()
            && !self
                .services
                .iter()
                .any(|s| row.services.iter().any(|r| r == s.as_str()))
        {
            return false;
        }
        let versioned =
            self.older_than.is_some() || self.newer_than.is_some() || self.exact_version.is_some();
        if !versioned {
            return true;
        }
        let Ok(version) = Version::parse(&row.version) else {
            return false;
        };
        self.older_than.as_ref().is_none_or(|v| version < *v)
            && self.newer_than.as_ref().is_none_or(|v| version > *v)
            && self.exact_version.as_ref().is_none_or(|v| version == *v)
    }
}

/// The rows `filter` keeps.
pub fn filter_inventory(rows: Vec<InventoryRow>, filter: &InventoryFilter) -> Vec<InventoryRow> {
    rows.into_iter().filter(|r| filter.keeps(r)).collect()
}

/// How long ago `at` was, at `now`, in the largest whole unit: `45s`, `12m`, `2h`, `3d`.
fn ago(at: u64, now: u64) -> String {
    let secs = now.saturating_sub(at);
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86_400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}

/// The Update column: the updater's last decision, at `now` (seconds since the Unix epoch).
/// `none` when the agent reported none (no updater, or an older agent).
pub fn update_summary(status: Option<&UpdateStatus>, now: u64) -> String {
    let Some(s) = status else {
        return "none".to_owned();
    };
    let reason = if s.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", s.reason)
    };
    let when = ago(s.at, now);
    match s.result {
        UpdateResult::None => format!("none{reason}"),
        UpdateResult::Updated => format!("updated {}→{} {when}", s.from, s.to),
        UpdateResult::RolledBack => format!("rolled back {}→{} {when}{reason}", s.from, s.to),
        UpdateResult::Failed => format!("failed {}→{} {when}{reason}", s.from, s.to),
    }
}

/// The Next Window column: `2026-11-24 10:00-11:00 UTC`, or `none`.
pub fn window_summary(window: Option<&NextWindow>) -> String {
    let Some(w) = window else {
        return "none".to_owned();
    };
    let stamp =
        |secs: u64| humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string();
    let (start, end) = (stamp(w.start), stamp(w.end));
    // `YYYY-MM-DDTHH:MM:SSZ`.
    match (start.get(..10), start.get(11..16), end.get(..10), end.get(11..16)) {
        (Some(day), Some(from), Some(end_day), Some(to)) if day == end_day => {
            format!("{day} {from}-{to} UTC")
        }
        _ => format!("{start} to {end}"),
    }
}

/// `tctl inventory ls`: Server ID, Hostname, Services, Agent Version, Upgrader, Upgrader
/// Version, Update, Next Window; empty values print `none`. JSON and YAML carry every field.
pub fn print_inventory(
    rows: Vec<InventoryRow>,
    filter: &InventoryFilter,
    format: Format,
) -> anyhow::Result<()> {
    print!("{}", render_inventory(rows, filter, format, unix_now())?);
    Ok(())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What [`print_inventory`] prints, at `now` (seconds since the Unix epoch).
pub fn render_inventory(
    rows: Vec<InventoryRow>,
    filter: &InventoryFilter,
    format: Format,
    now: u64,
) -> anyhow::Result<String> {
    let rows = filter_inventory(rows, filter);
    if format != Format::Text {
        let json: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "server_id": r.server_id, "hostname": r.hostname, "services": r.services,
                    "version": r.version, "upgrader": none(&r.upgrader),
                    "upgrader_version": none(&r.upgrader_version),
                    "last_seen": r.last_seen,
                    "update_status": r.update_status,
                    "next_window": r.next_window,
                })
            })
            .collect();
        return Ok(match format {
            Format::Yaml => serde_yaml_ng::to_string(&json)?,
            _ => format!("{}\n", serde_json::to_string_pretty(&json)?),
        });
    }
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.server_id.clone(),
                none(&r.hostname),
                none(&r.services.join(",")),
                none(&r.version),
                none(&r.upgrader),
                none(&r.upgrader_version),
                update_summary(r.update_status.as_ref(), now),
                window_summary(r.next_window.as_ref()),
            ]
        })
        .collect();
    Ok(table(
        &[
            "Server ID",
            "Hostname",
            "Services",
            "Agent Version",
            "Upgrader",
            "Upgrader Version",
            "Update",
            "Next Window",
        ],
        &table_rows,
    ))
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
            update_status: None,
            next_window: None,
        }
    }

    fn ids(rows: &[InventoryRow], filter: &InventoryFilter) -> Vec<String> {
        filter_inventory(rows.to_vec(), filter)
            .into_iter()
            .map(|r| r.server_id)
            .collect()
    }

    #[test]
    fn upgrader_none_means_not_enrolled() {
        let rows = vec![row("a", ""), row("b", "unit"), row("c", "kube")];
        let by = |u| InventoryFilter {
            upgrader: u,
            ..Default::default()
        };
        assert_eq!(ids(&rows, &by(Some("none"))), ["a"]);
        assert_eq!(ids(&rows, &by(Some("unit"))), ["b"]);
        assert_eq!(ids(&rows, &by(None)), ["a", "b", "c"]);
    }

    #[test]
    fn version_and_service_filters() {
        let mut rows = vec![row("a", ""), row("b", "unit"), row("c", "kube"), row("d", "")];
        rows[0].version = "16.4.0".into();
        rows[1].version = "17.0.0".into();
        rows[2].version = "17.1.0".into();
        rows[3].version = "garbage".into();
        rows[2].services = vec!["kube".into(), "app".into()];
        let v = |s: &str| Some(Version::parse(s).unwrap());
        let older = InventoryFilter {
            older_than: v("17.0.0"),
            ..Default::default()
        };
        assert_eq!(ids(&rows, &older), ["a"]);
        let newer = InventoryFilter {
            newer_than: v("16.4.0"),
            ..Default::default()
        };
        assert_eq!(ids(&rows, &newer), ["b", "c"]);
        let exact = InventoryFilter {
            exact_version: v("v17.0.0"),
            ..Default::default()
        };
        assert_eq!(ids(&rows, &exact), ["b"]);
        let between = InventoryFilter {
            newer_than: v("16.0.0"),
            older_than: v("17.1.0"),
            ..Default::default()
        };
        assert_eq!(ids(&rows, &between), ["a", "b"]);
        let services = |s: &[SystemRole]| InventoryFilter {
            services: s.to_vec(),
            ..Default::default()
        };
        assert_eq!(ids(&rows, &services(&[SystemRole::App])), ["c"]);
        assert_eq!(
            ids(&rows, &services(&[SystemRole::Node, SystemRole::Kube])),
            ["a", "b", "c", "d"]
        );
        assert_eq!(ids(&rows, &services(&[SystemRole::Db])), Vec::<String>::new());
    }

    #[test]
    fn the_update_column_says_what_the_updater_did_and_when() {
        let now = 1_764_000_000;
        let status = |result, reason: &str, at| UpdateStatus {
            result,
            from: "1.3.0".into(),
            to: "1.2.3".into(),
            reason: reason.into(),
            at,
        };
        assert_eq!(update_summary(None, now), "none");
        assert_eq!(
            update_summary(Some(&status(UpdateResult::None, "", now)), now),
            "none"
        );
        assert_eq!(
            update_summary(
                Some(&status(UpdateResult::None, "outside of maintenance window", now)),
                now
            ),
            "none: outside of maintenance window"
        );
        let mut updated = status(UpdateResult::Updated, "", now - 2 * 3600 - 5);
        (updated.from, updated.to) = ("1.2.3".into(), "1.3.0".into());
        assert_eq!(update_summary(Some(&updated), now), "updated 1.2.3→1.3.0 2h ago");
        assert_eq!(
            update_summary(
                Some(&status(
                    UpdateResult::RolledBack,
                    "no heartbeat with 1.3.0 within 120s",
                    now - 90
                )),
                now
            ),
            "rolled back 1.3.0→1.2.3 1m ago: no heartbeat with 1.3.0 within 120s"
        );
        assert_eq!(
            update_summary(
                Some(&status(UpdateResult::Failed, "apt-get failed", now - 3 * 86_400)),
                now
            ),
            "failed 1.3.0→1.2.3 3d ago: apt-get failed"
        );
        // 2026-11-24 10:00 to 11:00 UTC.
        let window = NextWindow {
            start: 1_795_514_400,
            end: 1_795_518_000,
        };
        assert_eq!(window_summary(Some(&window)), "2026-11-24 10:00-11:00 UTC");
        assert_eq!(window_summary(None), "none");
    }

    #[test]
    fn inventory_tables_and_json_carry_the_update_status() {
        let mut r = row("a", "unit");
        r.update_status = Some(UpdateStatus {
            result: UpdateResult::RolledBack,
            from: "1.3.0".into(),
            to: "1.2.3".into(),
            reason: "/readyz answered 503".into(),
            at: 100,
        });
        let text = render_inventory(vec![r.clone()], &InventoryFilter::default(), Format::Text, 160).unwrap();
        let header = text.lines().next().unwrap();
        for column in ["Agent Version", "Upgrader Version", "Update", "Next Window"] {
            assert!(header.contains(column), "{header}");
        }
        assert!(
            text.contains("rolled back 1.3.0→1.2.3 1m ago: /readyz answered 503"),
            "{text}"
        );
        let json = render_inventory(vec![r], &InventoryFilter::default(), Format::Json, 160).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v[0]["update_status"]["result"], "rolled_back");
        assert_eq!(v[0]["update_status"]["at"], 100);
        assert_eq!(v[0]["next_window"], serde_json::Value::Null);
        assert_eq!(v[0]["upgrader"], "unit");
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
