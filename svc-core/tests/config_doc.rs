//! `docs/configuration.md` describes every field the parser accepts.
//!
//! The field list comes from the parser itself: a probe key placed in each mapping makes the
//! strict parser answer with the fields it allows there (`unknown field …, expected one of …`).
//! The walk is driven by the fully populated golden file, so it also proves that file sets every
//! field, and the documentation's full example must be that file.

use std::{collections::BTreeSet, fs, path::Path};

use serde_yaml_ng::{Mapping, Value};
use svc_core::config::{Config, ConfigError};

const PROBE: &str = "zz_probe_field";
/// Fields accepted by the parser only to be rejected with an explanation; documented, but never
/// in a valid file.
const REJECTED: &[&str] = &["app_service.listen_addr", "db_service.listen_addr"];
/// Maps whose keys are chosen by the user, not fields.
const FREE_FORM: &[&str] = &["labels"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One step from the root to a mapping: a field, the first element of a list field, or the
/// value of a user-named key.
#[derive(Clone)]
enum Step {
    Field(String),
    ListOf(String),
    Named(String),
}

fn doc_path(steps: &[Step], field: &str) -> String {
    let mut out = String::new();
    for s in steps {
        match s {
            Step::Field(f) => out.push_str(&format!("{f}.")),
            Step::ListOf(f) => out.push_str(&format!("{f}[].")),
            Step::Named(_) => out.push_str("<name>."),
        }
    }
    out + field
}

/// The fields the parser accepts in the mapping at `steps`.
fn allowed_fields(steps: &[Step]) -> Vec<String> {
    let mut inner = Value::Mapping(Mapping::from_iter([(PROBE.into(), Value::from(1))]));
    for s in steps.iter().rev() {
        inner = match s {
            Step::Field(f) | Step::Named(f) => {
                Value::Mapping(Mapping::from_iter([(f.as_str().into(), inner)]))
            }
            Step::ListOf(f) => Value::Mapping(Mapping::from_iter([(
                f.as_str().into(),
                Value::Sequence(vec![inner]),
            )])),
        };
    }
    if let Value::Mapping(m) = &mut inner
        && !steps.is_empty()
    {
        m.insert("version".into(), "v1".into());
    }
    let text = serde_yaml_ng::to_string(&inner).unwrap();
    let message = match Config::from_yaml_str_with_hostname(&text, "h") {
        Err(ConfigError::Parse { message, .. }) => message,
        other => panic!(
            "probe at {} was not rejected as unknown: {other:?}",
            doc_path(steps, PROBE)
        ),
    };
    let expected = message
        .split_once(", expected")
        .unwrap_or_else(|| panic!("unexpected probe answer: {message}"))
        .1;
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn walk(steps: &mut Vec<Step>, example: &Mapping, fields: &mut BTreeSet<String>, missing: &mut Vec<String>) {
    for field in allowed_fields(steps) {
        let path = doc_path(steps, &field);
        fields.insert(path.clone());
        let Some(value) = example.get(field.as_str()) else {
            if !REJECTED.contains(&path.as_str()) {
                missing.push(path);
            }
            continue;
        };
        if FREE_FORM.contains(&field.as_str()) {
            continue;
        }
        if field == "automatic_upgrades_channels" {
            // Keys are channel names; every channel is probed, so each kind of channel counts.
            for (name, channel) in value.as_mapping().unwrap() {
                let Some(channel) = channel.as_mapping() else {
                    continue;
                };
                steps.push(Step::Field(field.clone()));
                steps.push(Step::Named(name.as_str().unwrap().to_owned()));
                let mut m = Vec::new();
                walk(steps, channel, fields, &mut m);
                steps.truncate(steps.len() - 2);
            }
            continue;
        }
        match value {
            Value::Mapping(m) => {
                steps.push(Step::Field(field.clone()));
                walk(steps, m, fields, missing);
                steps.pop();
            }
            Value::Sequence(items) => {
                if let Some(Value::Mapping(first)) = items.first() {
                    // Fields present in any element count as set.
                    let mut merged = first.clone();
                    for item in items {
                        if let Value::Mapping(m) = item {
                            merged.extend(m.clone());
                        }
                    }
                    steps.push(Step::ListOf(field.clone()));
                    walk(steps, &merged, fields, missing);
                    steps.pop();
                }
            }
            _ => {}
        }
    }
}

fn full_example() -> (String, Mapping) {
    let text = fs::read_to_string(root().join("testdata/config/valid/full.yaml")).unwrap();
    let value: Value = serde_yaml_ng::from_str(&text).unwrap();
    (text, value.as_mapping().unwrap().clone())
}

#[test]
fn every_field_is_documented_and_in_the_full_example() {
    let doc = fs::read_to_string(root().join("../docs/configuration.md")).unwrap();
    let (_, example) = full_example();
    let mut fields = BTreeSet::new();
    let mut missing_in_example = Vec::new();
    walk(&mut Vec::new(), &example, &mut fields, &mut missing_in_example);

    // Sanity: the walk reached nested structs, lists and channels.
    for must in [
        "svc.log.format",
        "app_service.apps[].uri",
        "db_service.databases[].tls.server_name",
        "proxy_service.https_keypairs[].key_file",
        "proxy_service.automatic_upgrades_channels.<name>.forward_url",
        "proxy_service.automatic_upgrades_channels.<name>.critical",
        "app_service.listen_addr",
    ] {
        assert!(fields.contains(must), "the walk missed {must}; found {fields:?}");
    }
    let undocumented: Vec<&String> = fields
        .iter()
        .filter(|f| !doc.contains(&format!("`{f}`")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "docs/configuration.md does not describe: {undocumented:?}"
    );
    assert!(
        missing_in_example.is_empty(),
        "testdata/config/valid/full.yaml does not set: {missing_in_example:?}"
    );
}

#[test]
fn the_documented_full_example_is_the_golden_file() {
    let doc = fs::read_to_string(root().join("../docs/configuration.md")).unwrap();
    let (text, _) = full_example();
    let section = doc.split_once("## Full example").unwrap().1;
    let block = section
        .split_once("```yaml\n")
        .unwrap()
        .1
        .split_once("```")
        .unwrap()
        .0;
    assert_eq!(block.trim_end(), text.trim_end());
    Config::from_yaml_str_with_hostname(block, "h").unwrap();
}
