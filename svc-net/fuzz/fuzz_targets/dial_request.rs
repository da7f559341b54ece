//! The tunnel's dial request (`svc_net::tunnel::DialRequest::decode`): the line an agent reads
//! from each transport channel the proxy opens (or a direct dial's first line).
//!
//! Properties: no panic; deterministic; a decoded request re-encodes (serde_json, as the proxy
//! writes it) to a line that decodes to the same request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc_net::tunnel::DialRequest;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return; // read_line refuses non-UTF-8 before decoding
    };
    let first = DialRequest::decode(line);
    assert_eq!(first, DialRequest::decode(line), "decode is not deterministic");
    if let Ok(req) = first {
        let encoded = serde_json::to_string(&req).expect("a decoded request encodes");
        assert!(
            !encoded.contains('\n'),
            "the encoded request spans lines: {encoded:?}"
        );
        assert_eq!(
            DialRequest::decode(&encoded).as_ref(),
            Ok(&req),
            "round trip through {encoded}"
        );
    }
});
