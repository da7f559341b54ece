//! The module graph of svc-net has no cycles and keeps its layering.
//!
//! Reads `src/`, maps every file to its top-level module (`proxy/web/ping.rs` → `proxy`), collects
//! the `crate::<module>` and `super::` paths in the code (comments are left out) that reach
//! another top-level module, and checks the graph: no cycle, and the dependency rules
//! docs/architecture.md states (for instance `io` depends on nothing inside the crate, `dial`
//! never on `proxy` or `agent`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → the top-level modules it refers to.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Modules that may not depend on each other: `(from, to)`, `to` being forbidden for `from`.
/// The crate is layered: foundations (`io`, `tls`, `dial`, `route`, `listen`, `diag`), then the
/// wire protocols (`auth`, `ssh`, `tunnel`, `services`), then who runs them (`proxy`, `agent`,
/// `client`), and `cluster` composing the processes.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "tls",
        &[
            "listen",
            "route",
            "dial",
            "auth",
            "ssh",
            "tunnel",
            "proxy",
            "agent",
            "services",
            "client",
            "http",
            "cluster",
            "conn_upgrade",
        ],
    ),
    (
        "dial",
        &[
            "listen",
            "route",
            "auth",
            "ssh",
            "tunnel",
            "proxy",
            "agent",
            "services",
            "client",
            "http",
            "cluster",
            "conn_upgrade",
        ],
    ),
    (
        "route",
        &[
            "listen",
            "auth",
            "ssh",
            "tunnel",
            "proxy",
            "agent",
            "services",
            "client",
            "http",
            "cluster",
            "conn_upgrade",
        ],
    ),
    (
        "listen",
        &[
            "route",
            "auth",
            "ssh",
            "tunnel",
            "proxy",
            "agent",
            "services",
            "client",
            "http",
            "cluster",
            "conn_upgrade",
        ],
    ),
    (
        "diag",
        &[
            "listen",
            "route",
            "auth",
            "ssh",
            "tunnel",
            "proxy",
            "agent",
            "services",
            "client",
            "http",
            "cluster",
            "conn_upgrade",
        ],
    ),
    (
        "auth",
        &["ssh", "tunnel", "proxy", "agent", "services", "client", "cluster"],
    ),
    ("ssh", &["tunnel", "proxy", "agent", "client", "cluster"]),
    ("tunnel", &["proxy", "agent", "services", "client", "cluster"]),
    ("proxy", &["agent", "client", "cluster"]),
    ("agent", &["proxy", "client", "cluster"]),
    ("services", &["proxy", "agent", "client", "cluster"]),
    (
        "http",
        &[
            "listen",
            "route",
            "auth",
            "ssh",
            "tunnel",
            "proxy",
            "agent",
            "services",
            "client",
            "cluster",
            "conn_upgrade",
        ],
    ),
    ("client", &["proxy", "agent", "cluster"]),
    (
        "conn_upgrade",
        &[
            "listen", "dial", "auth", "ssh", "tunnel", "proxy", "agent", "services", "client", "http",
            "cluster",
        ],
    ),
];

/// Modules that depend on nothing inside the crate.
const LEAVES: &[&str] = &["io", "idle"];

#[test]
fn svc_net_modules_have_no_cycle_and_keep_their_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = read_tree(&src);
    assert!(
        files.len() > 20,
        "expected the svc-net sources under {}, found {} files",
        src.display(),
        files.len()
    );
    let graph = module_graph(&files);
    for module in ["io", "listen", "route", "tls", "dial", "tunnel", "proxy", "agent"] {
        assert!(
            graph.contains_key(module),
            "module `{module}` not found in {}: {graph:?}",
            src.display()
        );
    }
    let edges: Vec<String> = graph
        .iter()
        .map(|(m, deps)| format!("  {m} → {deps:?}"))
        .collect();
    let edges = edges.join("\n");
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "svc-net's top-level modules depend on each other in a cycle: {}\nthe graph:\n{edges}",
            cycle.join(" → ")
        );
    }
    let broken = layer_violations(&graph);
    assert!(
        broken.is_empty(),
        "svc-net's layering is broken:\n{}\nthe graph:\n{edges}",
        broken.join("\n")
    );
}

#[test]
fn the_checker_finds_a_cycle_it_is_given() {
    let files = synthetic(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("a/mod.rs", "use crate::b::Thing;\n"),
        ("b/inner.rs", "use crate::{c::Other, io};\n"),
        ("c.rs", "fn f() { super::a::g() }\n"),
        ("io/mod.rs", "mod tests { use super::helper; }\n"),
    ]);
    let graph = module_graph(&files);
    assert_eq!(graph["a"], set(&["b"]));
    assert_eq!(graph["b"], set(&["c", "io"]));
    assert_eq!(graph["c"], set(&["a"]));
    assert_eq!(graph["io"], set(&[]));
    let cycle = find_cycle(&graph).expect("the cycle a → b → c → a is found");
    assert_eq!(cycle, ["a", "b", "c", "a"]);
}

#[test]
fn the_checker_accepts_a_layered_graph_and_ignores_comments_and_own_module() {
    let files = synthetic(&[
        ("a/mod.rs", "//! See [`crate::b`].\nmod x;\nuse self::x::Y;\n"),
        (
            "a/x.rs",
            "use super::super::b::T; // crate::c::Z\nuse super::Sibling;\n",
        ),
        (
            "b.rs",
            "/* crate::a::Hidden */ use crate::c::U;\nmod tests { use super::*; }\n",
        ),
        ("c.rs", "pub struct U;\n"),
    ]);
    let graph = module_graph(&files);
    assert_eq!(graph["a"], set(&["b"]));
    assert_eq!(graph["b"], set(&["c"]));
    assert_eq!(find_cycle(&graph), None);
}

#[test]
fn the_checker_reports_a_broken_layer() {
    let files = synthetic(&[
        ("io/mod.rs", "use crate::tls::X;\n"),
        ("dial.rs", "use crate::proxy::P;\n"),
        ("tls.rs", ""),
        ("proxy/mod.rs", "use crate::{dial, io::Connection};\n"),
    ]);
    let broken = layer_violations(&module_graph(&files));
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken.iter().any(|b| b.contains("`io`")), "{broken:?}");
    assert!(
        broken
            .iter()
            .any(|b| b.contains("`dial` must not depend on `proxy`")),
        "{broken:?}"
    );
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn synthetic(files: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
    files
        .iter()
        .map(|(p, s)| (PathBuf::from(p), s.to_string()))
        .collect()
}

/// Every `.rs` file under `root`, as (path relative to `root`, contents).
fn read_tree(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
                .path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                let rel = path.strip_prefix(root).expect("under the root").to_path_buf();
                out.push((rel, text));
            }
        }
    }
    out.sort();
    out
}

/// The module path of a file: `proxy/web/mod.rs` → `[proxy, web]`, `proxy/node.rs` →
/// `[proxy, node]`, `lib.rs` → `[]`.
fn module_path(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The top-level module graph of a crate's files.
fn module_graph(files: &[(PathBuf, String)]) -> Graph {
    let mut graph = Graph::new();
    for (file, text) in files {
        let path = module_path(file);
        let Some(own) = path.first().cloned() else {
            continue;
        };
        let deps = graph.entry(own.clone()).or_default();
        for target in references(&strip_comments(text), &path) {
            if target != own {
                deps.insert(target);
            }
        }
    }
    // Only top-level modules are nodes: a `super::helper` in a top-level file's inline test
    // module names a function, not a module.
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

/// The top-level modules a file's code names, through `crate::` (also `crate::{a, b::c}`) and
/// `super::` paths, given the file's module path.
fn references(code: &str, path: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let boundary = i == 0 || !is_ident(bytes[i - 1]);
        if boundary && rest.starts_with("crate::") {
            let after = &rest["crate::".len()..];
            if let Some(group) = after.strip_prefix('{') {
                for item in top_level_items(group) {
                    if let Some(name) = first_ident(item) {
                        out.insert(name.to_string());
                    }
                }
            } else if let Some(name) = first_ident(after) {
                out.insert(name.to_string());
            }
            i += "crate::".len();
            continue;
        }
        if boundary && rest.starts_with("super::") {
            let mut ups = 0;
            let mut tail = rest;
            while let Some(t) = tail.strip_prefix("super::") {
                ups += 1;
                tail = t;
            }
            // `super` of a top-level module's file (or of an inline module in it) is the crate
            // root or the module itself: only a path that climbs above the top-level module
            // names another one.
            if ups >= path.len()
                && let Some(name) = first_ident(tail)
            {
                out.insert(name.to_string());
            }
            i += ups * "super::".len();
            continue;
        }
        i += rest.chars().next().map_or(1, char::len_utf8);
    }
    out.retain(|m| {
        m != "self"
            && m != "super"
            && m != "crate"
            && m.chars().next().is_some_and(|c| c.is_ascii_lowercase())
    });
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

fn first_ident(s: &str) -> Option<&str> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (end > 0).then(|| &s[..end])
}

/// The comma-separated items of a `{ … }` group (the text after its `{`), at depth 0.
fn top_level_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

/// The code without `//` and `/* */` comments (string literals are kept as they are; a `//`
/// inside one ends the line early, which only ever drops text).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = &rest[l..];
                match rest.find('\n') {
                    Some(n) => rest = &rest[n..],
                    None => return out,
                }
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                match rest[b..].find("*/") {
                    Some(e) => rest = &rest[b + e + 2..],
                    None => return out,
                }
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// A cycle in the graph, as the modules along it with the first repeated at the end.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack
                    .iter()
                    .position(|n| n == node)
                    .expect("an open node is on the stack");
                let mut cycle = stack[from..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        let mut stack = Vec::new();
        if let Some(cycle) = visit(node, graph, &mut marks, &mut stack) {
            return Some(cycle);
        }
    }
    None
}

/// The layering rules the graph breaks, one line each.
fn layer_violations(graph: &Graph) -> Vec<String> {
    let mut broken = Vec::new();
    for leaf in LEAVES {
        if let Some(deps) = graph.get(*leaf)
            && !deps.is_empty()
        {
            broken.push(format!(
                "`{leaf}` must not depend on anything in the crate, but uses {deps:?}"
            ));
        }
    }
    for (from, forbidden) in FORBIDDEN {
        for to in graph.get(*from).into_iter().flatten() {
            if forbidden.contains(&to.as_str()) {
                broken.push(format!("`{from}` must not depend on `{to}`"));
            }
        }
    }
    broken
}
