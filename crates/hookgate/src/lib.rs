//! The hookgate binary's library: everything that touches files and the process environment.
//!
//! # Layout
//! - [`admin`]: the admin listener: the HTTP API and the console.
//! - [`files`]: reading configuration files with a size bound, turning failures into
//!   diagnostics.
//! - [`secrets`]: resolving secret references from the environment or from files.
//! - [`serve`]: intake, workers and retention, run together.
//! - [`telemetry`]: the log subscriber, and span export over OTLP (cargo feature `otlp`).
//! - [`connectors`]: connector instances built from `hookgate.yaml`.
//! - [`events`]: the evidence, rendered for operators.
//! - [`payloads`]: stored payloads opened and masked for views; payload keys and rotation.
//! - [`output`]: the form a command prints in, and whether bodies are shown.
//! - [`demo`]: the whole path on embedded defaults, shown.
//! - [`sign`]: signature headers for fixtures.
//! - [`check`]: `hookgate check` (and `cargo xtask check`): pipelines, connector instances,
//!   secrets and fixtures, reported like a compiler.

pub mod admin;
pub mod check;
pub mod connectors;
pub mod demo;
pub mod events;
pub mod files;
pub mod fixture_new;
pub mod output;
pub mod payloads;
pub mod render;
pub mod schemas;
pub mod secrets;
pub mod send;
pub mod serve;
pub mod sign;
pub mod telemetry;
