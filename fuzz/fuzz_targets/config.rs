//! Operator files: any text as a pipeline, an instances file and a fixture. Every problem is a
//! diagnostic, never a panic or a hang (the loaders bound size, depth and alias expansion).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (instances, _) = hookgate_pipeline::load_instances("hookgate.yaml", text);
    let _ = hookgate_pipeline::load_pipeline("p.yaml", text, instances.as_ref());
    let _ = hookgate_pipeline::load_fixture("f.yaml", text);
});
