//! The TLS ClientHello peek (`svc_net::route::client_hello::parse`): the first bytes of every
//! connection on the proxy's TLS port, sent by anyone.
//!
//! Properties: no panic; the outcome is deterministic; `NeedMore` is only ever asked for below
//! the buffering cap; a complete hello parses the same from the same bytes split nowhere else
//! (the parser is stateless, so any prefix of a complete input is `NeedMore` or an error, never
//! a different hello).
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc_net::route::client_hello::{MAX_BUFFERED, Parsed, parse};

fuzz_target!(|data: &[u8]| {
    let first = parse(data);
    assert_eq!(first, parse(data), "parse is not deterministic");
    match &first {
        Ok(Parsed::NeedMore) => assert!(data.len() < MAX_BUFFERED, "asked for more past the cap"),
        Ok(Parsed::Complete(hello)) => {
            if let Some(name) = &hello.server_name {
                assert!(!name.is_empty(), "empty server name accepted");
            }
            // Extra bytes after a complete hello (the rest of the handshake flight) change
            // nothing.
            let mut longer = data.to_vec();
            longer.extend_from_slice(&[0x16, 0x03, 0x03, 0x00, 0x01, 0x00]);
            assert_eq!(parse(&longer), first, "trailing bytes changed the hello");
            // A strict prefix is never a (different) complete hello.
            let prefix = &data[..data.len() - 1];
            if let Ok(Parsed::Complete(other)) = parse(prefix) {
                assert_eq!(&other, hello, "a prefix parsed as another hello");
            }
        }
        Err(_) => {}
    }
});
