//! The host side: loads a plugin library, checks its table and description, and runs its
//! instances as [`Connector`]s.
//!
//! Libraries are never unloaded: a plugin's runtime threads and thread-local destructors may
//! still run its code after its last instance is gone, and unloading under them would crash
//! the process. A gateway loads each library once, at start.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hookgate_connector::{
    Answer, BoxFuture, Connector, ConnectorError, Credentials, Description, KindDescription,
    LookupOutcome, LookupRequest, UpsertOutcome, UpsertRequest, valid_kind_name,
};
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use crate::{
    ABI_VERSION, Buffer, CallAnswer, CallRequest, CreateRequest, ENTRY_SYMBOL, Instance, Outcome,
    PluginTable,
};

/// Why a plugin could not be loaded or an instance built. Each names the library.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{path}: cannot load the library: {message}")]
    Open { path: PathBuf, message: String },
    #[error(
        "{path}: no `hookgate_connector_plugin` symbol: not a hookgate connector plugin (build it with `hookgate_plugin::export_connector!` as a cdylib)"
    )]
    MissingSymbol { path: PathBuf },
    #[error("{path}: the plugin returned no table")]
    NullTable { path: PathBuf },
    #[error(
        "{path}: the plugin speaks connector ABI {found}, this hookgate speaks ABI {expected}: rebuild it against hookgate-plugin {crate_version} (the crate of this hookgate, which speaks ABI {expected})",
        crate_version = env!("CARGO_PKG_VERSION")
    )]
    AbiMismatch { path: PathBuf, found: u32, expected: u32 },
    #[error("{path}: the plugin's table has {found} bytes, ABI {ABI_VERSION} needs {expected}")]
    TableTooSmall { path: PathBuf, found: u32, expected: usize },
    #[error(
        "{path}: the plugin was built with `panic = \"abort\"`: its first panic would stop the gateway; build it with `panic = \"unwind\"` (the default)"
    )]
    AbortsOnPanic { path: PathBuf },
    #[error("{path}: describe: {message}")]
    Describe { path: PathBuf, message: String },
    #[error("connector plugin `{kind}` ({path}): create: {message}")]
    Create { kind: String, path: PathBuf, message: String },
}

/// Bounds on calls into a plugin instance.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Passed to the plugin with each call; the plugin stops the call's future after it.
    pub call_timeout: Duration,
    /// How much longer the host waits for a plugin that does not stop in time.
    pub grace: Duration,
    /// Bytes of one answer read at most; a longer answer is not read.
    pub max_answer_bytes: usize,
    /// Calls of one instance in flight at most, counting calls the host stopped waiting for.
    pub max_calls_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            call_timeout: Duration::from_secs(30),
            grace: Duration::from_secs(5),
            max_answer_bytes: 1 << 20,
            max_calls_in_flight: 16,
        }
    }
}

/// A loaded plugin library and the kind it describes.
#[derive(Debug, Clone)]
pub struct Plugin {
    path: PathBuf,
    table: &'static PluginTable,
    description: KindDescription,
}

/// What tells one library file from another: its path, and the file's device, inode, size
/// and modification time (a new build copied in place changes the last two).
type FileIdentity = (PathBuf, u64, u64, u64, i64, i64);

fn file_identity(path: &Path) -> Option<FileIdentity> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    Some((path.to_path_buf(), meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec()))
}

/// The plugins this process has loaded, by the file each came from.
fn loaded() -> std::sync::MutexGuard<'static, std::collections::HashMap<FileIdentity, Plugin>> {
    static LOADED: std::sync::LazyLock<
        std::sync::Mutex<std::collections::HashMap<FileIdentity, Plugin>>,
    > = std::sync::LazyLock::new(Default::default);
    // A map of loaded plugins: one poisoned by a panic elsewhere is still sound.
    LOADED.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A copy of the library at `path` in a new file only this process knows, deleted when dropped.
fn private_copy(path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let suffix = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    let mut copy =
        tempfile::Builder::new().prefix("hookgate-plugin-").suffix(&suffix).tempfile()?;
    std::io::copy(&mut std::fs::File::open(path)?, copy.as_file_mut())?;
    copy.as_file().sync_all()?;
    Ok(copy)
}

/// Bytes of a description or create answer read at most.
const DESCRIBE_BYTES_MAX: usize = 1 << 20;

impl Plugin {
    /// Loads the library at `path` and asks it to describe itself.
    ///
    /// Loading runs the library's initialisers: callers load only from directories the
    /// operator named.
    pub fn load(path: &Path) -> Result<Plugin, PluginError> {
        let path = path.to_path_buf();
        let open = |message: String| PluginError::Open { path: path.clone(), message };
        if let Ok(target) = std::fs::read_link(&path)
            && std::fs::metadata(&path).is_err()
        {
            return Err(open(format!(
                "a symbolic link to {}, which does not exist",
                target.display()
            )));
        }
        // A library already loaded from this very file (a reload that left it alone) is the
        // same plugin: libraries are never unloaded, so loading it again would only add
        // another copy of its code and statics.
        let identity = file_identity(&path);
        if let Some(identity) = &identity
            && let Some(loaded) = loaded().get(identity)
        {
            return Ok(loaded.clone());
        }
        // The library is loaded from a private copy: the file is mapped, not read, so one
        // copied over the installed library in place (an upgrade by `cp`) would change the
        // code under the running process and crash it. The copy is unlinked once loaded; the
        // mapping keeps it alive, and nothing can write to it. Where the copy cannot be made
        // or loaded (a temporary directory mounted `noexec`, a library that finds its own
        // dependencies through `$ORIGIN`), the installed file is loaded in place, and must then
        // be replaced by a rename, not overwritten.
        // A bare name is not a file but the system loader's search (`libc.so.6`), loaded as is.
        let bare = path.parent().is_none_or(|dir| dir.as_os_str().is_empty());
        let copy = if bare { None } else { private_copy(&path).ok() };
        // SAFETY: loading a library runs its initialisers, which is what loading a plugin
        // means; the operator chose the directory it comes from, and the copy is its bytes.
        let from_copy =
            copy.as_ref().and_then(|copy| unsafe { libloading::Library::new(copy.path()) }.ok());
        drop(copy);
        let library = match from_copy {
            Some(library) => library,
            // SAFETY: as above.
            None => unsafe { libloading::Library::new(&path) }.map_err(|e| open(e.to_string()))?,
        };
        // Never unloaded (see the module docs): the table and the functions stay valid for
        // the life of the process.
        let library: &'static libloading::Library = Box::leak(Box::new(library));
        // SAFETY: the symbol's type is the ABI's entry type; a library exporting this name
        // with another type is not a hookgate plugin, and the name is specific enough.
        let entry = unsafe { library.get::<extern "C" fn() -> *const PluginTable>(ENTRY_SYMBOL) }
            .map_err(|_| PluginError::MissingSymbol { path: path.clone() })?;
        let table = entry();
        if table.is_null() {
            return Err(PluginError::NullTable { path });
        }
        // SAFETY: `abi_version` and `table_size` lead the table in every ABI version, so they
        // can be read before the version is known.
        let (found, size) = unsafe { ((*table).abi_version, (*table).table_size) };
        check_table(&path, found, size)?;
        // SAFETY: the version and size match this ABI's table, which the library keeps in a
        // static for as long as it is loaded: forever.
        let table: &'static PluginTable = unsafe { &*table };
        if table.unwinds != 1 {
            return Err(PluginError::AbortsOnPanic { path });
        }
        let bytes = take(table, (table.describe)(), DESCRIBE_BYTES_MAX).map_err(|len| {
            PluginError::Describe {
                path: path.clone(),
                message: format!("an answer of {len} bytes"),
            }
        })?;
        let description = read_description(&path, &bytes)?;
        let plugin = Plugin { path, table, description };
        if let Some(identity) = identity {
            loaded().insert(identity, plugin.clone());
        }
        Ok(plugin)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn description(&self) -> &KindDescription {
        &self.description
    }

    /// Builds an instance and destroys it at once, on this thread: what `check` does to tell
    /// whether the plugin accepts an instance's settings and credentials. (A plugin's
    /// `create` should not contact its CRM; a connector connects on its first call.)
    pub fn try_create(
        &self,
        settings: &std::collections::BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> Result<(), PluginError> {
        let body = self.create_request(settings, credentials)?;
        let (bytes, instance) = call_create(self.table, &body);
        // Destroyed whatever the answer says: nothing else will use it.
        drop((!instance.is_null()).then_some(Handle { table: self.table, instance }));
        self.read_created(bytes).map(drop)
    }

    /// Builds an instance. Creation may block (a plugin may connect to its CRM), so it runs
    /// on the blocking pool, bounded by the call timeout.
    pub async fn create(
        &self,
        settings: &std::collections::BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
        limits: Limits,
    ) -> Result<PluginConnector, PluginError> {
        let body = self.create_request(settings, credentials)?;
        let table = self.table;
        let created = tokio::task::spawn_blocking(move || {
            let (bytes, instance) = call_create(table, &body);
            (bytes, SendPointer(instance))
        });
        let (bytes, instance) = tokio::time::timeout(limits.call_timeout + limits.grace, created)
            .await
            .map_err(|_| self.create_failed(format!("no answer within {:?}", limits.call_timeout)))?
            .map_err(|e| self.create_failed(format!("the call failed: {e}")))?;
        let instance = instance.0;
        let handle = (!instance.is_null()).then(|| Handle { table, instance });
        let description = self.read_created(bytes)?;
        let handle =
            handle.ok_or_else(|| self.create_failed("the plugin made no instance".to_owned()))?;
        Ok(PluginConnector {
            kind: self.description.kind.clone(),
            handle: Arc::new(handle),
            description,
            limits,
            slots: Arc::new(Semaphore::new(limits.max_calls_in_flight.max(1))),
            writes: Writes::default(),
        })
    }

    fn create_failed(&self, message: String) -> PluginError {
        PluginError::Create {
            kind: self.description.kind.clone(),
            path: self.path.clone(),
            message,
        }
    }

    /// `create`'s request: the settings and the credentials' values.
    fn create_request(
        &self,
        settings: &std::collections::BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> Result<Vec<u8>, PluginError> {
        let request = CreateRequest {
            settings: settings.clone(),
            credentials: credentials
                .iter()
                .map(|(name, secret)| (name.clone(), secret.expose().to_owned()))
                .collect(),
        };
        serde_json::to_vec(&request).map_err(|e| self.create_failed(e.to_string()))
    }

    /// The instance's description from `create`'s answer, or the plugin's refusal.
    fn read_created(&self, bytes: Result<Vec<u8>, usize>) -> Result<Description, PluginError> {
        let bytes = bytes.map_err(|len| self.create_failed(format!("an answer of {len} bytes")))?;
        match serde_json::from_slice::<Outcome<Description>>(&bytes) {
            Ok(Outcome::Ok(description)) => Ok(description),
            Ok(Outcome::Err(message)) => Err(self.create_failed(message)),
            Err(e) => Err(self.create_failed(format!("not an instance description: {e}"))),
        }
    }
}

/// Calls the plugin's `create`: its answer (or the length of one too long to read) and the
/// instance it made, if any.
fn call_create(table: &PluginTable, body: &[u8]) -> (Result<Vec<u8>, usize>, *mut Instance) {
    let mut instance: *mut Instance = std::ptr::null_mut();
    let answer = (table.create)(body.as_ptr(), body.len(), &mut instance);
    (take(table, answer, DESCRIBE_BYTES_MAX), instance)
}

/// Refuses a table of another ABI version, or one shorter than this version's.
fn check_table(path: &Path, found: u32, size: u32) -> Result<(), PluginError> {
    let path = path.to_path_buf();
    if found != ABI_VERSION {
        return Err(PluginError::AbiMismatch { path, found, expected: ABI_VERSION });
    }
    if (size as usize) < size_of::<PluginTable>() {
        return Err(PluginError::TableTooSmall {
            path,
            found: size,
            expected: size_of::<PluginTable>(),
        });
    }
    Ok(())
}

/// A plugin's description, refused unless it names a valid kind and a settings schema.
fn read_description(path: &Path, bytes: &[u8]) -> Result<KindDescription, PluginError> {
    let failed = |message: String| PluginError::Describe { path: path.to_path_buf(), message };
    let description = match serde_json::from_slice::<Outcome<KindDescription>>(bytes) {
        Ok(Outcome::Ok(description)) => description,
        Ok(Outcome::Err(message)) => return Err(failed(message)),
        Err(e) => return Err(failed(format!("not a kind description: {e}"))),
    };
    if !valid_kind_name(&description.kind) {
        return Err(failed(format!(
            "`{}` cannot be a kind: use lowercase ASCII letters, digits, `_` and `-`",
            description.kind
        )));
    }
    if !description.settings_schema.is_object() {
        return Err(failed("the settings schema is not a JSON object".to_owned()));
    }
    Ok(description)
}

/// Copies a buffer the plugin returned and gives it back to the plugin's allocator. An answer
/// longer than `limit` is not read: `Err(its length)`.
fn take(table: &PluginTable, buffer: Buffer, limit: usize) -> Result<Vec<u8>, usize> {
    let copied = if buffer.len > limit {
        Err(buffer.len)
    } else if buffer.ptr.is_null() || buffer.len == 0 {
        Ok(Vec::new())
    } else {
        // SAFETY: a plugin's buffer holds `len` initialised bytes until it is freed, below.
        Ok(unsafe { std::slice::from_raw_parts(buffer.ptr, buffer.len) }.to_vec())
    };
    (table.free_buffer)(buffer);
    copied
}

/// An instance pointer moved to the blocking pool and back.
struct SendPointer(*mut Instance);

// SAFETY: the pointer is only handed to the plugin's own functions, which accept it from any
// thread (a plugin's connector is `Send + Sync`).
unsafe impl Send for SendPointer {}

/// A live instance; destroyed when the last call holding it ends.
#[derive(Debug)]
struct Handle {
    table: &'static PluginTable,
    instance: *mut Instance,
}

// SAFETY: a plugin's connector is `Send + Sync` (the `Kind` bound), and its exports take the
// instance from any thread; the pointer is never dereferenced on this side.
unsafe impl Send for Handle {}
// SAFETY: as above; concurrent calls on one instance are what the connector trait allows.
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        (self.table.destroy)(self.instance);
    }
}

#[derive(Debug, Clone, Copy)]
enum Export {
    Upsert,
    Lookup,
    Healthcheck,
}

impl Handle {
    fn invoke(&self, export: Export, body: &[u8], limit: usize) -> Result<Vec<u8>, usize> {
        let function = match export {
            Export::Upsert => self.table.upsert,
            Export::Lookup => self.table.lookup,
            Export::Healthcheck => self.table.healthcheck,
        };
        let answer = function(self.instance, body.as_ptr(), body.len());
        take(self.table, answer, limit)
    }
}

/// Plugin calls of the whole process in flight at most: they run on the blocking pool, which
/// the rest of the gateway shares (tokio's default is 512 threads).
pub const PROCESS_CALLS_MAX: usize = 128;

fn process_slots() -> &'static Arc<Semaphore> {
    static SLOTS: std::sync::OnceLock<Arc<Semaphore>> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| Arc::new(Semaphore::new(PROCESS_CALLS_MAX)))
}

/// The CRM record a request is about, if any.
trait Record {
    fn record(&self) -> Option<String>;
}

fn record_key(object: &str, field: &str, value: &str) -> String {
    format!("{object}\u{0}{field}\u{0}{value}")
}

impl Record for UpsertRequest {
    fn record(&self) -> Option<String> {
        Some(record_key(&self.object, &self.external_id_field, &self.external_id_value))
    }
}

impl Record for LookupRequest {
    fn record(&self) -> Option<String> {
        Some(record_key(&self.object, &self.external_id_field, &self.external_id_value))
    }
}

impl Record for () {
    fn record(&self) -> Option<String> {
        None
    }
}

fn record_of<T: Record>(export: Export, request: &T) -> Option<String> {
    match export {
        Export::Upsert | Export::Lookup => request.record(),
        Export::Healthcheck => None,
    }
}

/// Writes inside the plugin, by record, counted until the plugin returns.
type Writes = Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>;

/// One write inside the plugin; leaves the count when dropped (when the plugin returned).
struct InFlight {
    writes: Writes,
    record: String,
}

impl InFlight {
    fn enter(writes: &Writes, record: String) -> InFlight {
        *writes.lock().unwrap_or_else(|p| p.into_inner()).entry(record.clone()).or_insert(0) += 1;
        InFlight { writes: Arc::clone(writes), record }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = writes.get_mut(&self.record) {
            *count -= 1;
            if *count == 0 {
                writes.remove(&self.record);
            }
        }
    }
}

/// A plugin instance as a [`Connector`].
#[derive(Debug)]
pub struct PluginConnector {
    kind: String,
    handle: Arc<Handle>,
    description: Description,
    limits: Limits,
    slots: Arc<Semaphore>,
    writes: Writes,
}

impl PluginConnector {
    async fn call<T: serde::Serialize + Record, O: DeserializeOwned>(
        &self,
        export: Export,
        request: &T,
    ) -> Result<O, ConnectorError> {
        let write = matches!(export, Export::Upsert);
        let kind = &self.kind;
        // What an answer that cannot be trusted means: a write may have happened (look it
        // up); a read can simply be made again once the plugin is fixed.
        let unusable = |message: String, answer: Answer| {
            if write {
                ConnectorError::Ambiguous { message, answer }
            } else {
                ConnectorError::Misconfigured { message, answer }
            }
        };
        let timeout = self.limits.call_timeout;
        let envelope = CallRequest {
            request,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let body = serde_json::to_vec(&envelope).map_err(|e| ConnectorError::Misconfigured {
            message: format!("cannot encode the request for plugin `{kind}`: {e}"),
            answer: Answer::default(),
        })?;
        // A write of this record the host stopped waiting for may still land: until it
        // returns, neither a lookup nor another write of the record can be trusted, and the
        // engine keeps the write in doubt.
        let record = record_of(export, request);
        if let Some(record) = &record
            && self.writes.lock().unwrap_or_else(|p| p.into_inner()).contains_key(record)
        {
            return Err(ConnectorError::Retryable {
                message: format!(
                    "an earlier write of this record into plugin `{kind}` has not returned yet"
                ),
                retry_after: None,
                answer: Answer::default(),
            });
        }
        // No slot: nothing is sent, so retrying later is always safe; never wait for one.
        let busy = |what: &str| ConnectorError::Retryable {
            message: format!("plugin `{kind}`: {what}"),
            retry_after: None,
            answer: Answer::default(),
        };
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            return Err(busy(&format!(
                "all {} call slots are held by calls that have not returned",
                self.limits.max_calls_in_flight
            )));
        };
        let Ok(process_slot) = Arc::clone(process_slots()).try_acquire_owned() else {
            return Err(busy(&format!(
                "all {PROCESS_CALLS_MAX} plugin call slots of this process are held"
            )));
        };
        let in_flight = match (write, record) {
            (true, Some(record)) => Some(InFlight::enter(&self.writes, record)),
            _ => None,
        };
        let handle = Arc::clone(&self.handle);
        let limit = self.limits.max_answer_bytes;
        let call = tokio::task::spawn_blocking(move || {
            // Held until the plugin returns, however long the host waits.
            let _held = (slot, process_slot, in_flight);
            handle.invoke(export, &body, limit)
        });
        let bytes = match tokio::time::timeout(timeout + self.limits.grace, call).await {
            Err(_) if write => {
                return Err(ConnectorError::Ambiguous {
                    message: format!("plugin `{kind}` did not return within {timeout:?}"),
                    answer: Answer::default(),
                });
            }
            Err(_) => {
                return Err(ConnectorError::Retryable {
                    message: format!("plugin `{kind}` did not return within {timeout:?}"),
                    retry_after: None,
                    answer: Answer::default(),
                });
            }
            Ok(Err(e)) => {
                let message = format!("the call into plugin `{kind}` failed: {e}");
                return Err(unusable(message, Answer::default()));
            }
            Ok(Ok(Err(len))) => {
                let message =
                    format!("plugin `{kind}` answered {len} bytes, more than the {limit} read");
                return Err(unusable(message, Answer::default()));
            }
            Ok(Ok(Ok(bytes))) => bytes,
        };
        read_answer(kind, write, &bytes)
    }
}

/// A call's answer: the plugin's result, or the class an unreadable answer stands for (a
/// write may have happened, so it is ambiguous; a read is misconfigured, retried once the
/// plugin is fixed).
fn read_answer<O: DeserializeOwned>(
    kind: &str,
    write: bool,
    bytes: &[u8],
) -> Result<O, ConnectorError> {
    match serde_json::from_slice::<CallAnswer<O>>(bytes) {
        Ok(CallAnswer::Ok(value)) => Ok(value),
        Ok(CallAnswer::Err(error)) => Err(error),
        // Invalid JSON, or an outcome class this hookgate does not know.
        Err(e) => {
            let message = format!("plugin `{kind}` gave an answer hookgate cannot read: {e}");
            let answer = Answer::with_excerpt(None, &String::from_utf8_lossy(bytes));
            Err(if write {
                ConnectorError::Ambiguous { message, answer }
            } else {
                ConnectorError::Misconfigured { message, answer }
            })
        }
    }
}

impl Connector for PluginConnector {
    fn describe(&self) -> Description {
        self.description.clone()
    }

    fn upsert<'a>(
        &'a self,
        request: &'a UpsertRequest,
    ) -> BoxFuture<'a, Result<UpsertOutcome, ConnectorError>> {
        Box::pin(self.call(Export::Upsert, request))
    }

    fn lookup<'a>(
        &'a self,
        request: &'a LookupRequest,
    ) -> BoxFuture<'a, Result<LookupOutcome, ConnectorError>> {
        Box::pin(self.call(Export::Lookup, request))
    }

    fn healthcheck(&self) -> BoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(self.call(Export::Healthcheck, &()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_answers_are_classified_by_what_they_may_hide() {
        let garbage: &[&[u8]] = &[
            b"",
            b"not json",
            br#"{"err":{"Exploded":{"message":"boom"}}}"#,
            br#"{"maybe":{"record_id":"1","created":true,"answer":{}}}"#,
            br#"{"ok":{"record_id":1}}"#,
        ];
        for bytes in garbage {
            let write = read_answer::<UpsertOutcome>("x", true, bytes).unwrap_err();
            assert_eq!(write.class(), "ambiguous", "{}", String::from_utf8_lossy(bytes));
            assert!(write.to_string().contains("plugin `x`"), "{write}");
            let read = read_answer::<LookupOutcome>("x", false, bytes).unwrap_err();
            assert_eq!(read.class(), "misconfigured", "{}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn tables_of_another_abi_are_refused_before_anything_else_is_read() {
        let path = Path::new("plugins/libx.so");
        let size = u32::try_from(size_of::<PluginTable>()).unwrap();
        check_table(path, ABI_VERSION, size).unwrap();
        let newer = check_table(path, ABI_VERSION + 1, size + 8).unwrap_err().to_string();
        assert_eq!(
            newer,
            "plugins/libx.so: the plugin speaks connector ABI 2, this hookgate speaks ABI 1: rebuild it against hookgate-plugin 0.1.0 (the crate of this hookgate, which speaks ABI 1)"
        );
        let short = check_table(path, ABI_VERSION, size - 8).unwrap_err().to_string();
        assert!(short.contains("the plugin's table has"), "{short}");
    }

    #[test]
    fn descriptions_must_name_a_kind_and_a_settings_schema() {
        let path = Path::new("plugins/libx.so");
        let good =
            br#"{"ok":{"kind":"pipedrive","version":"1.0.0","settings_schema":{"type":"object"}}}"#;
        assert_eq!(read_description(path, good).unwrap().kind, "pipedrive");
        for (bytes, expected) in [
            (&b"garbage"[..], "not a kind description"),
            (br#"{"err":"cannot start"}"#, "describe: cannot start"),
            (
                br#"{"ok":{"kind":"Pipe Drive","version":"1","settings_schema":{}}}"#,
                "cannot be a kind",
            ),
            (
                br#"{"ok":{"kind":"mock","version":"1","settings_schema":true}}"#,
                "not a JSON object",
            ),
            (br#"{"ok":{"kind":"mock"}}"#, "missing field"),
        ] {
            let error = read_description(path, bytes).unwrap_err().to_string();
            assert!(error.starts_with("plugins/libx.so: describe: "), "{error}");
            assert!(error.contains(expected), "{expected}: {error}");
        }
    }

    #[test]
    fn a_plugin_error_keeps_its_class_and_a_result_its_value() {
        let error = ConnectorError::RateLimited {
            message: "slow".into(),
            retry_after: Some(Duration::from_secs(3)),
            answer: Answer::with_excerpt(Some(429), "{}"),
        };
        let bytes = serde_json::to_vec(&CallAnswer::<()>::Err(error.clone())).unwrap();
        assert_eq!(read_answer::<UpsertOutcome>("x", true, &bytes).unwrap_err(), error);
        let outcome =
            UpsertOutcome { record_id: "r1".into(), created: true, answer: Answer::default() };
        let bytes = serde_json::to_vec(&CallAnswer::Ok(outcome.clone())).unwrap();
        assert_eq!(read_answer::<UpsertOutcome>("x", true, &bytes).unwrap(), outcome);
    }
}
