//! Resource YAML/JSON (`svc_core::resource::parse_resources`): what `tctl create -f` reads and
//! the Auth Service accepts from API callers.
//!
//! Properties: no panic; deterministic; every parsed resource written back out as YAML
//! (`Resource::to_yaml`, what `tctl get` prints) and as JSON parses to the same resource.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc_core::resource::{parse_resources, resources_to_json, resources_to_yaml};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = parse_resources(text);
    assert_eq!(first, parse_resources(text), "parse is not deterministic");
    if let Ok(resources) = first {
        let yaml = resources_to_yaml(&resources).expect("parsed resources serialize to YAML");
        assert_eq!(
            parse_resources(&yaml).as_ref(),
            Ok(&resources),
            "YAML round trip through\n{yaml}"
        );
        let json = resources_to_json(&resources).expect("parsed resources serialize to JSON");
        assert_eq!(
            parse_resources(&json).as_ref(),
            Ok(&resources),
            "JSON round trip through\n{json}"
        );
    }
});
