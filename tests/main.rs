//! hookgate end to end: one test binary (linked once) with a module per area. Each area runs
//! the `hookgate` binary as a child process, over real HTTP on loopback, a SQLite file or
//! PostgreSQL, and the fakes. `cargo test -p hookgate --test e2e AREA::` runs one area.

// Shared by every area; each uses only a part of it.
#[allow(dead_code)]
mod support;

#[path = "admin/main.rs"]
mod admin;
mod check;
#[path = "console/main.rs"]
mod console;
#[path = "crms/main.rs"]
mod crms;
#[path = "delivery/main.rs"]
mod delivery;
#[path = "edge/main.rs"]
mod edge;
#[path = "intake/main.rs"]
mod intake;
#[cfg(feature = "otlp")]
#[path = "otlp/main.rs"]
mod otlp;
#[path = "payloads/main.rs"]
mod payloads;
#[path = "plugins/main.rs"]
mod plugins;
#[path = "reload/main.rs"]
mod reload;
#[path = "sources/main.rs"]
mod sources;
