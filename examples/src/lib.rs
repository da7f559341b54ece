//! Example programs live next to this file as `*.rs` and run with
//! `cargo run -p svc-examples --example <name>`. This library is empty on purpose.
