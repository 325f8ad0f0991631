//! The verdict of a chaos run, judged from outside hookgate: the senders' answers and each
//! CRM's own effect log (every write it applied, in the order applied).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

/// How many examples of each violation a report lists.
const EXAMPLES_MAX: usize = 20;

/// One event as the senders saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentEvent {
    pub key: String,
    pub entity: String,
    pub version: i64,
    /// Answers `202 accepted`: more than one means the event was accepted twice.
    pub accepted: u32,
    /// Whether any delivery of it was answered 2xx.
    pub acknowledged: bool,
}

/// One write a CRM applied, in the order applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub entity: String,
    /// The event the write came from.
    pub key: String,
    pub version: i64,
}

/// A lower version applied to a record after a higher one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StaleOverwrite {
    pub entity: String,
    pub version: i64,
    pub after: i64,
    /// The position of the stale write in the effect log.
    pub position: usize,
}

/// What one CRM's effect log says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CrmVerdict {
    pub effects: usize,
    pub records: usize,
    /// Acknowledged events whose write never landed and was not superseded by a newer
    /// version of their entity that did.
    pub lost: usize,
    /// Writes applied more than once for one event (each extra one counts).
    pub duplicate_effects: usize,
    pub stale_overwrites: usize,
    /// Effects of events no sender had acknowledged.
    pub unacknowledged_effects: usize,
    pub lost_examples: Vec<String>,
    pub duplicate_examples: Vec<String>,
    pub stale_examples: Vec<StaleOverwrite>,
}

impl CrmVerdict {
    pub fn holds(&self) -> bool {
        self.lost == 0
            && self.duplicate_effects == 0
            && self.stale_overwrites == 0
            && self.unacknowledged_effects == 0
    }
}

/// What the senders' answers say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IntakeVerdict {
    pub events: usize,
    pub acknowledged: usize,
    /// Events answered `202 accepted` more than once.
    pub accepted_twice: usize,
    /// Events no delivery of which was ever answered 2xx.
    pub never_acknowledged: usize,
    pub examples: Vec<String>,
}

impl IntakeVerdict {
    pub fn holds(&self) -> bool {
        self.accepted_twice == 0 && self.never_acknowledged == 0
    }
}

pub fn judge_intake(sent: &[SentEvent]) -> IntakeVerdict {
    let mut verdict = IntakeVerdict { events: sent.len(), ..IntakeVerdict::default() };
    for event in sent {
        if event.acknowledged {
            verdict.acknowledged += 1;
        } else {
            verdict.never_acknowledged += 1;
            example(&mut verdict.examples, format!("{}: never acknowledged", event.key));
        }
        if event.accepted > 1 {
            verdict.accepted_twice += 1;
            example(
                &mut verdict.examples,
                format!("{}: accepted {} times", event.key, event.accepted),
            );
        }
    }
    verdict
}

pub fn judge_crm(sent: &[SentEvent], effects: &[Effect]) -> CrmVerdict {
    let acknowledged: HashMap<&str, &SentEvent> =
        sent.iter().filter(|e| e.acknowledged).map(|e| (e.key.as_str(), e)).collect();
    let mut verdict = CrmVerdict { effects: effects.len(), ..CrmVerdict::default() };

    let mut applied: HashMap<&str, usize> = HashMap::new();
    let mut highest: BTreeMap<&str, i64> = BTreeMap::new();
    for (position, effect) in effects.iter().enumerate() {
        let times = applied.entry(&effect.key).or_default();
        *times += 1;
        if *times > 1 {
            verdict.duplicate_effects += 1;
            example(
                &mut verdict.duplicate_examples,
                format!("{} applied {} times (at {position})", effect.key, times),
            );
        }
        if !acknowledged.contains_key(effect.key.as_str()) {
            verdict.unacknowledged_effects += 1;
        }
        match highest.get(effect.entity.as_str()) {
            Some(&after) if effect.version < after => {
                verdict.stale_overwrites += 1;
                if verdict.stale_examples.len() < EXAMPLES_MAX {
                    verdict.stale_examples.push(StaleOverwrite {
                        entity: effect.entity.clone(),
                        version: effect.version,
                        after,
                        position,
                    });
                }
            }
            Some(&after) if effect.version <= after => {}
            _ => {
                highest.insert(&effect.entity, effect.version);
            }
        }
    }
    verdict.records = highest.len();

    for event in acknowledged.values() {
        let landed = applied.contains_key(event.key.as_str());
        let superseded = highest.get(event.entity.as_str()).is_some_and(|h| *h > event.version);
        if !landed && !superseded {
            verdict.lost += 1;
            example(&mut verdict.lost_examples, event.key.clone());
        }
    }
    verdict.lost_examples.sort();
    verdict
}

fn example(examples: &mut Vec<String>, text: String) {
    if examples.len() < EXAMPLES_MAX {
        examples.push(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `entity:version` events, each acknowledged and accepted once.
    fn sent(events: &[&str]) -> Vec<SentEvent> {
        events
            .iter()
            .map(|e| {
                let (entity, version) = e.split_once(':').unwrap();
                SentEvent {
                    key: (*e).to_owned(),
                    entity: entity.to_owned(),
                    version: version.parse().unwrap(),
                    accepted: 1,
                    acknowledged: true,
                }
            })
            .collect()
    }

    /// Effects of the `entity:version` events, in this order.
    fn log(effects: &[&str]) -> Vec<Effect> {
        sent(effects)
            .into_iter()
            .map(|e| Effect { entity: e.entity, key: e.key, version: e.version })
            .collect()
    }

    #[track_caller]
    fn check(events: &[&str], effects: &[&str], expect: (usize, usize, usize)) {
        let verdict = judge_crm(&sent(events), &log(effects));
        assert_eq!(
            (verdict.lost, verdict.duplicate_effects, verdict.stale_overwrites),
            expect,
            "{verdict:#?}"
        );
        assert_eq!(verdict.holds(), expect == (0, 0, 0));
    }

    #[test]
    fn each_violation_is_counted_from_the_effect_log() {
        // (lost, duplicate effects, stale overwrites)
        check(&["a:1", "a:2", "b:1"], &["a:1", "b:1", "a:2"], (0, 0, 0));
        // An older version skipped after a newer one landed is superseded, not lost.
        check(&["a:1", "a:2", "a:3"], &["a:3"], (0, 0, 0));
        check(&["a:1", "a:2", "a:3"], &["a:2"], (1, 0, 0));
        check(&["a:1", "b:7"], &["a:1"], (1, 0, 0));
        // The first sequence: v3 applied, then v1 and v2 over it, then v3 again.
        check(&["a:1", "a:2", "a:3"], &["a:3", "a:1", "a:2", "a:3"], (0, 1, 2));
        // And its second: v10, then v7, v8, v9, then v10 rewritten.
        check(&["a:7", "a:8", "a:9", "a:10"], &["a:10", "a:7", "a:8", "a:9", "a:10"], (0, 1, 3));
        // Another entity's versions are no reference.
        check(&["a:5", "b:1"], &["a:5", "b:1"], (0, 0, 0));
    }

    #[test]
    fn effects_nobody_acknowledged_and_intake_answers_are_judged_too() {
        let events = sent(&["a:1"]);
        let verdict = judge_crm(&events, &log(&["a:1", "z:9"]));
        assert_eq!(verdict.unacknowledged_effects, 1);
        assert!(!verdict.holds());

        let mut events = sent(&["a:1", "a:2", "b:1"]);
        events[0].accepted = 2;
        events[2].acknowledged = false;
        let intake = judge_intake(&events);
        assert_eq!(
            (intake.acknowledged, intake.accepted_twice, intake.never_acknowledged),
            (2, 1, 1)
        );
        assert_eq!(intake.examples, ["a:1: accepted 2 times", "b:1: never acknowledged"]);
        assert!(!intake.holds());
    }
}
