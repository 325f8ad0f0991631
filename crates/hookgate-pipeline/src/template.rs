//! The template environment: minijinja with strict undefined, no auto-escaping, bounded work and
//! bounded output, and only deterministic helpers (no clock, no randomness, no I/O).

use minijinja::value::ValueKind;
use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use sha2::{Digest, Sha256};

/// Work one render may do, in minijinja fuel units (roughly instructions). A mapping template
/// uses a few hundred; a runaway loop is stopped here.
pub const FUEL_MAX: u64 = 100_000;
/// Bytes one rendered value may have.
pub const RENDERED_BYTES_MAX: usize = 64 * 1024;
/// Nested calls and blocks.
const RECURSION_MAX: usize = 32;

/// Variables a template sees before the event is identified (key, scope, type).
pub const REQUEST_VARIABLES: &[&str] = &["payload", "headers", "body"];
/// Variables a template sees once the event is identified (ordering, conditions, targets).
pub const EVENT_VARIABLES: &[&str] = &["payload", "headers", "body", "event"];
/// Functions minijinja provides that are deterministic; templates may call them.
pub const BUILTIN_FUNCTIONS: &[&str] = &["range", "dict", "namespace"];

pub fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_fuel(Some(FUEL_MAX));
    env.set_recursion_limit(RECURSION_MAX);
    env.add_filter("sha256", |value: String| hex::encode(Sha256::digest(value.as_bytes())));
    // Form-encoding rules: `+` is a space, `%XX` a byte; invalid UTF-8 becomes U+FFFD.
    env.add_filter("urldecode", |value: String| {
        let decoded: String =
            form_urlencoded::parse(format!("v={}", value.replace('&', "%26")).as_bytes())
                .map(|(_, v)| v.into_owned())
                .collect();
        decoded
    });
    // CRM fields receive JSON's spelling: `true`/`false`, and an empty value for null (minijinja
    // would write Python's `True` and `none`).
    env.set_formatter(|out, state, value| match value.kind() {
        ValueKind::Bool => {
            out.write_str(if value.is_true() { "true" } else { "false" }).map_err(Into::into)
        }
        ValueKind::None => Ok(()),
        _ => minijinja::escape_formatter(out, state, value),
    });
    env
}

/// Whether a filter or a test: what [`unknown_filters_and_tests`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Applied {
    Filter,
    Test,
}

/// The filters and tests `template` applies that `env` does not have, by name. minijinja
/// looks them up only when a template runs, so without this a misspelt filter passes `check`
/// and fails every write at render.
pub fn unknown_filters_and_tests(
    env: &Environment<'_>,
    template: &minijinja::Template<'_, '_>,
) -> Vec<(Applied, String)> {
    use minijinja::machinery::{Instruction, get_compiled_template};
    let compiled = get_compiled_template(template);
    let mut used = std::collections::BTreeSet::new();
    for instructions in std::iter::once(&compiled.instructions).chain(compiled.blocks.values()) {
        let mut index = 0;
        while let Some(instruction) = instructions.get(index) {
            match instruction {
                Instruction::ApplyFilter(name, ..) => used.insert((Applied::Filter, *name)),
                Instruction::PerformTest(name, ..) => used.insert((Applied::Test, *name)),
                _ => false,
            };
            index += 1;
        }
    }
    used.into_iter()
        .filter(|(applied, name)| !exists(env, *applied, name))
        .map(|(applied, name)| (applied, name.to_owned()))
        .collect()
}

/// Whether `env` has this filter or test: applying it to `none` fails as "unknown" only if
/// it does not (any other outcome, an error included, means it exists).
fn exists(env: &Environment<'_>, applied: Applied, name: &str) -> bool {
    let (source, unknown) = match applied {
        Applied::Filter => (format!("none | {name}"), minijinja::ErrorKind::UnknownFilter),
        Applied::Test => (format!("none is {name}"), minijinja::ErrorKind::UnknownTest),
    };
    match env.compile_expression(&source) {
        Ok(expression) => !matches!(expression.eval(()), Err(e) if e.kind() == unknown),
        Err(error) => error.kind() != unknown,
    }
}

/// A `when` condition is an expression; it is compiled as a template that renders `true` when
/// the expression holds, so it shares the environment, the limits and the error reporting.
pub fn condition_template(expression: &str) -> String {
    format!("{CONDITION_PREFIX}{expression}{CONDITION_SUFFIX}")
}

/// Characters added before the user's expression: error offsets are shifted back by this.
pub const CONDITION_PREFIX: &str = "{% if (";
const CONDITION_SUFFIX: &str = ") %}true{% endif %}";
