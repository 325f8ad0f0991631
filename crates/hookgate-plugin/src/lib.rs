//! Connector plugins over a versioned C ABI.
//!
//! A plugin is a `cdylib` that exports one symbol, [`ENTRY_SYMBOL`], returning a
//! [`PluginTable`]: the ABI version, then plain `extern "C"` functions. Only bytes and
//! integers cross the boundary. Requests, answers, settings and descriptions are JSON (the
//! connector SDK's serde types), in [`Buffer`]s that the side which allocated them frees: the
//! plugin's buffers go back through its own `free_buffer`, so two allocators never meet.
//!
//! **Writing one.** Any type implementing [`hookgate_connector::Kind`] becomes a plugin with
//! one line, built as a `cdylib` (with the default `panic = "unwind"`):
//!
//! ```text
//! hookgate_plugin::export_connector!(my_crate::MyConnector);
//! ```
//!
//! The export uses `#[unsafe(no_mangle)]`, so the plugin crate cannot `forbid(unsafe_code)`.
//!
//! **Async, timeouts, cancellation.** Nothing async crosses the boundary and no runtime is
//! shared. Each plugin instance owns a small tokio runtime (one worker thread) on which its
//! connector's futures run; every exported call blocks its caller until that future ends.
//! The host makes calls from its blocking thread pool, never from an async worker, and bounds
//! them three ways: each call carries a timeout that the plugin applies to the future (a write
//! that runs out of time is dropped there and answers `ambiguous`, a read `retryable`); the
//! host stops waiting a grace period later in any case (the thread is left to finish, holding
//! its slot); and a semaphore caps an instance's calls in flight, so a plugin that blocks
//! forever exhausts its own slots, not the process. A panic is caught at every export
//! (`catch_unwind`) and answered as an error of its class; the gateway keeps serving.

// Exports and the loader are `extern "C"`; a panic must never unwind across them.
#![deny(clippy::panic_in_result_fn)]

use serde::{Deserialize, Serialize};

pub mod export;
#[cfg(feature = "host")]
pub mod host;

pub use hookgate_connector;

/// The ABI this crate speaks. A plugin built for another version is refused at load.
pub const ABI_VERSION: u32 = 1;

/// The one symbol a plugin exports (NUL-terminated for `dlsym`).
pub const ENTRY_SYMBOL: &[u8] = b"hookgate_connector_plugin\0";

/// Bytes allocated by one side of the boundary. The receiver copies them and hands the
/// buffer back to the allocator's `free_buffer`.
#[repr(C)]
#[derive(Debug)]
pub struct Buffer {
    pub ptr: *mut u8,
    pub len: usize,
    pub cap: usize,
}

/// What the entry symbol returns. `abi_version` and `table_size` come first and keep their
/// places in every version, so that a host can refuse a table it does not understand before
/// reading anything else.
#[repr(C)]
#[derive(Debug)]
pub struct PluginTable {
    pub abi_version: u32,
    /// `size_of::<PluginTable>()` as the plugin was built.
    pub table_size: u32,
    /// 1 if the plugin was built with `panic = "unwind"`: a plugin built to abort on a panic
    /// would take the gateway down with it, so the host refuses it.
    pub unwinds: u32,
    /// The kind's description: an [`Outcome`] of a [`hookgate_connector::KindDescription`].
    pub describe: extern "C" fn() -> Buffer,
    /// Builds an instance from a [`CreateRequest`]; on success writes the instance pointer
    /// and answers an [`Outcome`] of its `Description`; otherwise writes nothing.
    pub create:
        extern "C" fn(request: *const u8, len: usize, instance: *mut *mut Instance) -> Buffer,
    /// A [`CallRequest`] of an `UpsertRequest`; answers a [`CallAnswer`] of an `UpsertOutcome`.
    pub upsert: extern "C" fn(instance: *const Instance, request: *const u8, len: usize) -> Buffer,
    /// A [`CallRequest`] of a `LookupRequest`; answers a [`CallAnswer`] of a `LookupOutcome`.
    pub lookup: extern "C" fn(instance: *const Instance, request: *const u8, len: usize) -> Buffer,
    /// A [`CallRequest`] of `null`; answers a [`CallAnswer`] of `null`.
    pub healthcheck:
        extern "C" fn(instance: *const Instance, request: *const u8, len: usize) -> Buffer,
    /// Drops an instance. Called once, when no call is in flight.
    pub destroy: extern "C" fn(instance: *mut Instance),
    /// Frees a buffer this plugin returned.
    pub free_buffer: extern "C" fn(buffer: Buffer),
}

/// An instance behind the boundary: opaque to the host.
#[repr(C)]
#[derive(Debug)]
pub struct Instance {
    _private: [u8; 0],
}

/// What `create` receives.
#[derive(Debug, Serialize, Deserialize)]
pub struct CreateRequest {
    pub settings: std::collections::BTreeMap<String, serde_json::Value>,
    /// Credential values by name, resolved by the host from secret references.
    pub credentials: std::collections::BTreeMap<String, String>,
}

/// A call's envelope: the request, and how long the plugin may take.
#[derive(Debug, Serialize, Deserialize)]
pub struct CallRequest<T> {
    pub request: T,
    pub timeout_ms: u64,
}

/// A call's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallAnswer<T> {
    Ok(T),
    Err(hookgate_connector::ConnectorError),
}

/// The answer of `describe` (a `KindDescription`) and of `create` (the instance's
/// `Description`): the value, or why there is none.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome<T> {
    Ok(T),
    Err(String),
}
