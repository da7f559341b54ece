//! Byte streams as every other module sees them.

pub mod rewind;
