//! The conformance suite, run in process on the connector type. (hookgate's own tests also
//! run it through the C ABI, on the built library.)

use std::sync::Arc;

use hookgate_plugin::hookgate_connector::conformance::{self, Fault, Harness};
use hookgate_plugin::hookgate_connector::{BoxFuture, Connector, Credentials, Kind, Secret};

use super::*;

struct Crm {
    dir: tempfile::TempDir,
}

impl Harness for Crm {
    fn connector(&self, fault: Option<Fault>) -> BoxFuture<'_, Arc<dyn Connector>> {
        let fault = fault.map(|fault| match fault {
            Fault::Unavailable => "unavailable",
            Fault::RateLimited => "rate_limited",
            Fault::Invalid => "invalid",
            Fault::LostResponse => "lost_response",
            Fault::BadCredentials => "bad_credentials",
        });
        let settings =
            serde_json::json!({"path": self.dir.path().join("crm.json"), "fault": fault});
        let settings = serde_json::from_value(settings).expect("settings");
        let credentials = Credentials::from([("token".to_owned(), Secret::new("t0ken"))]);
        Box::pin(async move {
            let connector = JsonFile::create(&settings, &credentials).await.expect("created");
            Arc::new(connector) as Arc<dyn Connector>
        })
    }

    fn object(&self) -> (&str, &str) {
        ("contacts", "email")
    }

    fn field(&self) -> &str {
        "name"
    }
}

#[tokio::test]
async fn passes_the_conformance_suite() {
    let crm = Crm { dir: tempfile::tempdir().expect("a temporary directory") };
    conformance::run(&crm).await;
}
