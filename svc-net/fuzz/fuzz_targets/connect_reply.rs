//! The HTTP proxy's reply to CONNECT (`svc_net::dial::reply::parse`): read from whatever
//! `HTTPS_PROXY` points at, before any byte of the tunnel.
//!
//! Properties: no panic; deterministic; a complete head's length lies within the input and the
//! head parses the same with any bytes after it (they belong to the tunnel); the status is an HTTP
//! status code, 100 to 599 (`000` from a broken proxy was once reported as a refusal: the
//! `status-000` input in the corpus).
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc_net::dial::{MAX_REPLY_HEAD, reply::parse};

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(MAX_REPLY_HEAD + 64)];
    let first = parse(data);
    assert_eq!(first, parse(data), "parse is not deterministic");
    if let Ok(Some(head)) = &first {
        assert!(head.len <= data.len(), "head length {} past the input", head.len);
        assert!((100..=599).contains(&head.status), "status {}", head.status);
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"SSH-2.0-tunnel bytes\r\n\r\n");
        assert_eq!(&parse(&longer), &first, "tunnel bytes changed the head");
        assert_eq!(
            &parse(&data[..head.len]),
            &first,
            "the head alone parses differently"
        );
    }
});
