//! Operators' pauses as this process sees them. The store holds them (every gateway on the
//! database honours them); intake reads this copy, refreshed from the store every
//! [`PAUSE_REFRESH`] and at once when this process's admin API changes one, so that a paused
//! pipeline costs intake a lock-free-in-practice read, not a query per delivery.
//!
//! A delivery pause needs no copy: the lease query skips a paused target's writes.

use std::collections::BTreeSet;
use std::sync::RwLock;
use std::time::Duration;

use hookgate_store::{Pause, PauseKind};

/// How often each gateway reads the pauses another gateway may have changed: the longest a
/// pause or a resume takes to reach every process.
pub const PAUSE_REFRESH: Duration = Duration::from_secs(1);

/// The pipelines whose intake is paused.
#[derive(Debug, Default)]
pub struct Pauses {
    intake: RwLock<BTreeSet<String>>,
}

impl Pauses {
    pub fn intake_paused(&self, pipeline: &str) -> bool {
        self.intake.read().is_ok_and(|paused| paused.contains(pipeline))
    }

    /// Replaces the copy with what the store holds now.
    pub fn set(&self, pauses: &[Pause]) {
        let intake = pauses
            .iter()
            .filter(|p| p.kind == PauseKind::Intake)
            .map(|p| p.pipeline.clone())
            .collect();
        if let Ok(mut held) = self.intake.write() {
            *held = intake;
        }
    }
}
