//! Templates and conditions: any text as a field template and as a `when` condition, compiled
//! by the pipeline checker and rendered against a payload. Rendering is bounded in work and
//! output (fuel, size); nothing may panic or run away.
#![no_main]

use hookgate_pipeline::evaluate::Delivery;
use libfuzzer_sys::fuzz_target;

const BODY: &[u8] = br#"{"id":"e-1","type":"customer.updated","n":7,"list":[1,2,{"a":"b"}],"data":{"object":{"id":"cus_1","email":"a@example.com"}},"flag":true,"none":null}"#;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (field, condition) = text.split_once('\u{1}').unwrap_or((text, "true"));
    // Block scalars take the text as it is, line by line.
    let block = |text: &str| text.lines().map(|l| format!("      {l}\n")).collect::<String>();
    let source = format!(
        "name: t\nsignature:\n  scheme: github\n  secrets: [{{env: S}}]\nkey:\n  pointer: /id\nevent_type:\n  pointer: /type\ntargets:\n  - name: t\n    connector: crm\n    when: |-\n{}    object: o\n    external_id: {{field: id, value: \"{{{{ payload.id }}}}\"}}\n    fields:\n      a: |-\n{}",
        block(condition),
        block(field).replace("\n      ", "\n        ").replacen("      ", "        ", 1),
    );
    let (Some(pipeline), _) = hookgate_pipeline::load_pipeline("t.yaml", &source, None) else {
        return;
    };
    let headers = vec![("x-trace".to_owned(), b"abc".to_vec())];
    let _ = pipeline.evaluate(&Delivery { headers: &headers, body: BODY }, &Default::default());
});
