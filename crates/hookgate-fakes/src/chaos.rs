//! Random faults for fault-injection runs (`cargo xtask chaos`): every request to a fake draws
//! its fate from a seeded generator, so a run can be repeated. Each fake turns a fate into its
//! own API's documented answer (HubSpot's 429 with its headers, Salesforce's 403
//! `REQUEST_LIMIT_EXCEEDED`, each one's 5xx body).

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How often each fault happens. Rates are probabilities per request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chaos {
    pub seed: u64,
    /// Writes answered with a 5xx, not applied.
    pub write_failure_rate: f64,
    /// Writes applied, then answered only after `lost_answer_delay`, which should be longer
    /// than the client waits: the write happened and the client cannot know.
    pub lost_answer_rate: f64,
    pub lost_answer_delay: Duration,
    /// Lookups answered with a 5xx.
    pub lookup_failure_rate: f64,
    /// Lookups answered only after `lost_answer_delay`: the client gives up.
    pub lookup_timeout_rate: f64,
    /// The chance that a request starts a burst of `rate_limit_burst_length` rate-limit
    /// answers, to reads and writes alike. Every other burst carries `Retry-After` where the
    /// API may send one.
    pub rate_limit_burst_rate: f64,
    pub rate_limit_burst_length: u32,
    /// Every answer is delayed by a random time up to this.
    pub latency_max: Duration,
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// What happens to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Answered normally.
    Pass,
    /// A 5xx; nothing applied.
    Fail,
    /// Applied (writes), then answered after this delay.
    Delay(Duration),
    /// The rate limit's answer; with `retry_after`, the API's retry-after header too.
    RateLimited { retry_after: bool },
}

/// A fake's generator and burst state.
#[derive(Debug)]
pub struct Dice {
    chaos: Chaos,
    rng: StdRng,
    burst_left: u32,
    bursts: u64,
    /// How many requests met each fault, for reports.
    injected: BTreeMap<&'static str, u64>,
}

impl Dice {
    pub fn new(chaos: Chaos) -> Dice {
        Dice {
            rng: StdRng::seed_from_u64(chaos.seed),
            chaos,
            burst_left: 0,
            bursts: 0,
            injected: BTreeMap::new(),
        }
    }

    /// How many requests met each fault so far.
    pub fn injected(&self) -> BTreeMap<String, u64> {
        self.injected.iter().map(|(name, n)| ((*name).to_owned(), *n)).collect()
    }

    /// The fate of one request, and the latency to add before its answer; counted.
    pub fn draw(&mut self, access: Access) -> (Fate, Duration) {
        let (fate, latency) = self.roll(access);
        let name = match (fate, access) {
            (Fate::Pass, _) => None,
            (Fate::Fail, Access::Write) => Some("write_failed"),
            (Fate::Fail, Access::Read) => Some("lookup_failed"),
            (Fate::Delay(_), Access::Write) => Some("write_answer_lost"),
            (Fate::Delay(_), Access::Read) => Some("lookup_timed_out"),
            (Fate::RateLimited { retry_after: true }, _) => Some("rate_limited_with_retry_after"),
            (Fate::RateLimited { retry_after: false }, _) => Some("rate_limited"),
        };
        if let Some(name) = name {
            *self.injected.entry(name).or_default() += 1;
        }
        (fate, latency)
    }

    fn roll(&mut self, access: Access) -> (Fate, Duration) {
        let latency = self.chaos.latency_max.mul_f64(self.rng.random::<f64>());
        if self.burst_left == 0 && self.rng.random_bool(self.chaos.rate_limit_burst_rate) {
            self.burst_left = self.chaos.rate_limit_burst_length;
            self.bursts += 1;
        }
        if self.burst_left > 0 {
            self.burst_left -= 1;
            return (Fate::RateLimited { retry_after: self.bursts.is_multiple_of(2) }, latency);
        }
        let roll = self.rng.random::<f64>();
        let fate = match access {
            Access::Write if roll < self.chaos.write_failure_rate => Fate::Fail,
            Access::Write if roll < self.chaos.write_failure_rate + self.chaos.lost_answer_rate => {
                Fate::Delay(self.chaos.lost_answer_delay)
            }
            Access::Read if roll < self.chaos.lookup_failure_rate => Fate::Fail,
            Access::Read
                if roll < self.chaos.lookup_failure_rate + self.chaos.lookup_timeout_rate =>
            {
                Fate::Delay(self.chaos.lost_answer_delay)
            }
            _ => Fate::Pass,
        };
        (fate, latency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_follow_their_rates_and_repeat_with_the_seed() {
        let chaos = Chaos {
            seed: 7,
            write_failure_rate: 0.2,
            lost_answer_rate: 0.1,
            lost_answer_delay: Duration::from_secs(5),
            lookup_failure_rate: 0.3,
            rate_limit_burst_rate: 0.01,
            rate_limit_burst_length: 4,
            ..Chaos::default()
        };
        let draws = |access| {
            let mut dice = Dice::new(chaos.clone());
            (0..10_000).map(|_| dice.draw(access).0).collect::<Vec<_>>()
        };
        let writes = draws(Access::Write);
        assert_eq!(writes, draws(Access::Write), "the same seed, the same run");
        let count =
            |fates: &[Fate], wanted: fn(&Fate) -> bool| fates.iter().filter(|f| wanted(f)).count();
        let failed = count(&writes, |f| *f == Fate::Fail);
        let lost = count(&writes, |f| matches!(f, Fate::Delay(_)));
        let limited = count(&writes, |f| matches!(f, Fate::RateLimited { .. }));
        assert!((1_700..2_300).contains(&failed), "{failed}");
        assert!((800..1_200).contains(&lost), "{lost}");
        assert!((200..600).contains(&limited), "{limited} in bursts of 4 at 1%");
        let with_retry_after = count(&writes, |f| *f == Fate::RateLimited { retry_after: true });
        assert!(with_retry_after > 0 && with_retry_after < limited, "both kinds of 429");
        let mut dice = Dice::new(chaos.clone());
        for _ in 0..10_000 {
            dice.draw(Access::Write);
        }
        assert_eq!(dice.injected()["write_failed"], failed as u64, "faults are counted");
        let reads = draws(Access::Read);
        assert!((2_500..3_500).contains(&count(&reads, |f| *f == Fate::Fail)));
        assert_eq!(count(&reads, |f| matches!(f, Fate::Delay(_))), 0, "no lookup timeouts asked");
    }
}
