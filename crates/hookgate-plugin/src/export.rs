//! The plugin side: [`export_connector!`](crate::export_connector) builds a [`PluginTable`]
//! of these functions for one connector kind. Every function catches panics, so that no
//! unwind ever crosses `extern "C"` (which would abort the host).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use hookgate_connector::{
    Answer, ConnectorError, Credentials, Kind, LookupOutcome, LookupRequest, Secret, UpsertOutcome,
    UpsertRequest, describe_kind,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{
    ABI_VERSION, Buffer, CallAnswer, CallRequest, CreateRequest, Instance, Outcome, PluginTable,
};

/// Exports `$kind` (a type implementing `hookgate_connector::Kind`) as a connector plugin:
/// one line in a crate built as a `cdylib`.
#[macro_export]
macro_rules! export_connector {
    ($kind:ty) => {
        /// The entry point of this connector plugin (hookgate-plugin's C ABI).
        #[unsafe(no_mangle)]
        pub extern "C" fn hookgate_connector_plugin() -> *const $crate::PluginTable {
            static TABLE: $crate::PluginTable = $crate::export::table::<$kind>();
            $crate::export::quiet_panics();
            &TABLE
        }
    };
}

/// The table for kind `K`.
pub const fn table<K: Kind>() -> PluginTable {
    PluginTable {
        abi_version: ABI_VERSION,
        table_size: size_of::<PluginTable>() as u32,
        unwinds: cfg!(panic = "unwind") as u32,
        describe: describe::<K>,
        create: create::<K>,
        upsert: upsert::<K>,
        lookup: lookup::<K>,
        healthcheck: healthcheck::<K>,
        destroy: destroy::<K>,
        free_buffer,
    }
}

/// An instance and the runtime its futures run on.
struct Hosted<K> {
    connector: K,
    runtime: tokio::runtime::Runtime,
}

/// Hands bytes to the host; it gives them back through [`free_buffer`].
fn buffer(bytes: Vec<u8>) -> Buffer {
    let mut bytes = std::mem::ManuallyDrop::new(bytes);
    Buffer { ptr: bytes.as_mut_ptr(), len: bytes.len(), cap: bytes.capacity() }
}

fn json<T: Serialize>(value: &T) -> Buffer {
    // Serializing our own plain-data types cannot fail; if it ever did, the host reads an
    // empty answer and classifies it as one it cannot parse.
    buffer(serde_json::to_vec(value).unwrap_or_default())
}

extern "C" fn free_buffer(buffer: Buffer) {
    if buffer.ptr.is_null() {
        return;
    }
    // SAFETY: every non-null buffer this plugin hands out comes from `buffer()`, i.e. from a
    // `Vec<u8>` of this allocator with exactly this pointer, length and capacity, and the host
    // returns each one once.
    drop(unsafe { Vec::from_raw_parts(buffer.ptr, buffer.len, buffer.cap) });
}

/// The bytes the host passed for the duration of a call.
///
/// # Safety
/// `ptr` must point at `len` readable bytes (or `len` be 0) for the lifetime `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 || ptr.is_null() {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

thread_local! {
    /// Where this thread's last panic happened, for the message of the call that caught it.
    static PANICKED_AT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Makes the plugin's panics print nothing. A cdylib has its own copy of std, whose default
/// hook writes a panic (and, with `RUST_BACKTRACE`, its backtrace) to stderr as text lines,
/// in the middle of the host's log, which may be JSON. Instead the place is kept, and the call
/// that caught the panic returns it with its message to the host, which logs it in its own
/// format. Called by the entry point, so once per library; a plugin's own hook replaces it.
pub fn quiet_panics() {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let at = info.location().map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
            PANICKED_AT.with(|cell| *cell.borrow_mut() = at);
        }));
    });
}

/// The panic's message and, where the hook saw it, its place. The payload is forgotten, not
/// dropped: its `Drop` could panic again, outside any `catch_unwind`.
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    let message = if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    };
    std::mem::forget(payload);
    match PANICKED_AT.with(|cell| cell.borrow_mut().take()) {
        Some(at) => format!("{message} (at {at})"),
        None => message,
    }
}

extern "C" fn describe<K: Kind>() -> Buffer {
    match catch_unwind(describe_kind::<K>) {
        Ok(description) => json(&Outcome::Ok(description)),
        Err(panic) => {
            json(&Outcome::<()>::Err(format!("describe panicked: {}", panic_message(panic))))
        }
    }
}

extern "C" fn create<K: Kind>(
    request: *const u8,
    len: usize,
    instance: *mut *mut Instance,
) -> Buffer {
    let built = catch_unwind(AssertUnwindSafe(|| -> Result<_, String> {
        // SAFETY: the host passes `len` readable bytes that live for this call.
        let request: CreateRequest = serde_json::from_slice(unsafe { bytes(request, len) })
            .map_err(|e| format!("the create request is not what this plugin expects: {e}"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("hookgate-plugin")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the plugin's runtime: {e}"))?;
        let credentials: Credentials = request
            .credentials
            .into_iter()
            .map(|(name, value)| (name, Secret::new(value)))
            .collect();
        let connector = runtime
            .block_on(K::create(&request.settings, &credentials))
            .map_err(|error| error.0)?;
        let description = connector.describe();
        let hosted = Box::new(Hosted { connector, runtime });
        Ok((description, Box::into_raw(hosted).cast::<Instance>()))
    }));
    match built {
        Ok(Ok((description, pointer))) => {
            // SAFETY: the host passes a valid place for the instance pointer.
            unsafe { instance.write(pointer) };
            json(&Outcome::Ok(description))
        }
        Ok(Err(message)) => json(&Outcome::<()>::Err(message)),
        Err(panic) => {
            json(&Outcome::<()>::Err(format!("create panicked: {}", panic_message(panic))))
        }
    }
}

/// Decodes a call and finds its instance.
///
/// # Safety
/// `instance` must come from this kind's `create` and not yet be destroyed; `request` must
/// point at `len` readable bytes for the call.
unsafe fn decode<'a, K: Kind, T: DeserializeOwned>(
    instance: *const Instance,
    request: *const u8,
    len: usize,
) -> Result<(&'a Hosted<K>, T, Duration), ConnectorError> {
    // SAFETY: the caller's contract.
    let call: CallRequest<T> =
        serde_json::from_slice(unsafe { bytes(request, len) }).map_err(|e| {
            ConnectorError::Misconfigured {
                message: format!(
                    "the plugin cannot read the host's request (an SDK mismatch?): {e}"
                ),
                answer: Answer::default(),
            }
        })?;
    // SAFETY: the caller's contract: a live `Hosted<K>` made by `create::<K>`.
    let hosted = unsafe { &*instance.cast::<Hosted<K>>() };
    Ok((hosted, call.request, Duration::from_millis(call.timeout_ms)))
}

/// Answers a call: its result, or the error a panic stands for.
fn answer<T: Serialize>(
    result: std::thread::Result<Result<T, ConnectorError>>,
    on_panic: fn(String) -> ConnectorError,
) -> Buffer {
    match result {
        Ok(Ok(value)) => json(&CallAnswer::Ok(value)),
        Ok(Err(error)) => json(&CallAnswer::<()>::Err(error)),
        Err(panic) => json(&CallAnswer::<()>::Err(on_panic(panic_message(panic)))),
    }
}

extern "C" fn upsert<K: Kind>(instance: *const Instance, request: *const u8, len: usize) -> Buffer {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host's contract for `upsert`.
        let (hosted, request, timeout) =
            unsafe { decode::<K, UpsertRequest>(instance, request, len) }?;
        hosted.runtime.block_on(async {
            tokio::time::timeout(timeout, hosted.connector.upsert(&request)).await.unwrap_or_else(
                |_| {
                    Err(ConnectorError::Ambiguous {
                        message: format!("the plugin's write took longer than {timeout:?}"),
                        answer: Answer::default(),
                    })
                },
            )
        })
    }));
    // A write that panicked may have been sent: only a lookup can tell.
    answer::<UpsertOutcome>(result, |message| ConnectorError::Ambiguous {
        message: format!("the plugin panicked during a write: {message}"),
        answer: Answer::default(),
    })
}

extern "C" fn lookup<K: Kind>(instance: *const Instance, request: *const u8, len: usize) -> Buffer {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host's contract for `lookup`.
        let (hosted, request, timeout) =
            unsafe { decode::<K, LookupRequest>(instance, request, len) }?;
        hosted.runtime.block_on(async {
            tokio::time::timeout(timeout, hosted.connector.lookup(&request)).await.unwrap_or_else(
                |_| {
                    Err(ConnectorError::Retryable {
                        message: format!("the plugin's lookup took longer than {timeout:?}"),
                        retry_after: None,
                        answer: Answer::default(),
                    })
                },
            )
        })
    }));
    answer::<LookupOutcome>(result, |message| ConnectorError::Misconfigured {
        message: format!("the plugin panicked during a lookup: {message}"),
        answer: Answer::default(),
    })
}

extern "C" fn healthcheck<K: Kind>(
    instance: *const Instance,
    request: *const u8,
    len: usize,
) -> Buffer {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host's contract for `healthcheck`.
        let (hosted, (), timeout) = unsafe { decode::<K, ()>(instance, request, len) }?;
        hosted.runtime.block_on(async {
            tokio::time::timeout(timeout, hosted.connector.healthcheck()).await.unwrap_or_else(
                |_| {
                    Err(ConnectorError::Retryable {
                        message: format!("the plugin's healthcheck took longer than {timeout:?}"),
                        retry_after: None,
                        answer: Answer::default(),
                    })
                },
            )
        })
    }));
    answer::<()>(result, |message| ConnectorError::Misconfigured {
        message: format!("the plugin panicked during a healthcheck: {message}"),
        answer: Answer::default(),
    })
}

extern "C" fn destroy<K: Kind>(instance: *mut Instance) {
    if instance.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host destroys each instance from `create::<K>` once, with no call in
        // flight.
        let hosted = unsafe { Box::from_raw(instance.cast::<Hosted<K>>()) };
        let Hosted { connector, runtime } = *hosted;
        drop(connector);
        // Not a blocking shutdown: the host may call this from any thread.
        runtime.shutdown_background();
    }));
}
