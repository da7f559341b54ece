//! Version strings (`svc_core::Version::parse`) and the version server's answers
//! (`svc_net::proxy::web::version::forward::parse_version_body` / `parse_critical_body`): what
//! updaters and the proxy read from an upstream version channel, and what agents announce.
//!
//! Properties: no panic; deterministic; a parsed version prints (`v…`) and prints without `v`
//! to text that parses to the same version, comparing equal to itself; a channel answer is the
//! version parse of the trimmed body (or `none`).
#![no_main]

use std::cmp::Ordering;

use libfuzzer_sys::fuzz_target;
use svc_core::Version;
use svc_net::proxy::web::version::forward::{parse_critical_body, parse_version_body};

const URL: &str = "https://proxy.example.com/v1/webapi/automaticupgrades/channel/stable/cloud/version";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = Version::parse(text);
    assert_eq!(first, Version::parse(text), "parse is not deterministic");
    if let Ok(v) = &first {
        let shown = v.to_string();
        assert!(shown.starts_with('v'), "{shown}");
        assert_eq!(
            Version::parse(&shown).as_ref(),
            Ok(v),
            "round trip through {shown}"
        );
        assert_eq!(
            Version::parse(&v.without_v()).as_ref(),
            Ok(v),
            "round trip through {}",
            v.without_v()
        );
        assert_eq!(v.cmp(v), Ordering::Equal);
        assert_eq!(v.is_pre_release(), !v.pre_release().is_empty());
        let _ = v.agent_compatibility(svc_core::version::current());
    }
    match parse_version_body(URL, text) {
        Ok(None) => assert_eq!(text.trim(), "none"),
        Ok(Some(v)) => assert_eq!(Version::parse(text.trim()).as_ref(), Ok(&v)),
        Err(_) => assert!(text.trim() != "none" && Version::parse(text.trim()).is_err()),
    }
    if let Ok(critical) = parse_critical_body(URL, text) {
        let word = text.trim().to_ascii_lowercase();
        assert_eq!(critical, word == "yes" || word == "true", "{word}");
    }
});
