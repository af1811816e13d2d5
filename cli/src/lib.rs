//! The pieces of the `l3` tool that `cargo xtask bench` shares: the demo's generator of natural-looking
//! images ([`synth`]) and the engine that builds the same images in every format and streams each through
//! the loader ([`compare`]). The subcommands themselves live in the binary (`main.rs` and one module per
//! subcommand group).
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod compare;
pub mod synth;
