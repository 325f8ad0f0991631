//! The hookgate binary's library: everything that touches files and the process environment.
//!
//! # Layout
//! - [`files`]: reading configuration files with a size bound, turning failures into
//!   diagnostics.
//! - [`secrets`]: resolving secret references from the environment or from files.
//! - [`check`]: `hookgate check` (and `cargo xtask check`): pipelines, connector instances,
//!   secrets and fixtures, reported like a compiler.

pub mod check;
pub mod files;
pub mod secrets;
pub mod serve;
