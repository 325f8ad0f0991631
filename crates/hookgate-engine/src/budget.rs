//! Call budgets: a connector instance starts at most `calls` calls in any rolling window of
//! `per`, writes and lookups alike, so that the CRM never has to refuse one.
//!
//! A [`CallBudget`] keeps a log of this process's calls (on its monotonic clock) and hands out
//! [`Permit`]s while the log has room. The CRM counts a call when it arrives, some time
//! between its start and its answer, and that time is unbounded on a loaded machine. So a
//! call counts here from when it starts (a permit granted counts already) until a window
//! after it ended: whenever it arrived, every call the CRM can count in one window was in
//! this log when the last of them started, and the log had room for it. The window is kept
//! [`WINDOW_MARGIN`] longer than the CRM's, for a call dropped while its bytes are on the way
//! and for the CRM's coarser clock.
//!
//! Several processes on one store share one budget: each holds a slice of it, leased from the
//! store (see `slices`), and [`CallBudget::set_limit`] sets this process's log to its slice.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hookgate_connector::RateLimit;
use hookgate_store::{SliceRequest, Store};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How much longer than the CRM's window a call counts here after it ended: a call given up
/// (its deadline passed) may still reach the CRM, and the CRM's clock is not ours.
pub const WINDOW_MARGIN: Duration = Duration::from_millis(250);

/// The calls one connector instance of this process may start.
#[derive(Debug)]
pub struct CallBudget {
    connector: String,
    rate: RateLimit,
    log: Mutex<Log>,
    /// Woken when a permit is handed back unused, or the limit grows.
    freed: Notify,
}

#[derive(Debug)]
struct Log {
    /// Calls this process may have in the window now: the whole budget, or its slice.
    limit: u32,
    /// When each call of the window ended, oldest first.
    ended: VecDeque<Instant>,
    /// Calls started that have not ended.
    in_flight: u32,
    /// Permits granted whose calls have not started.
    reserved: u32,
    /// The CRM refused a call for its rate: nothing starts before then.
    held_until: Option<Instant>,
}

impl CallBudget {
    /// A budget of `rate`, of which this process may have `limit` calls in the window until
    /// [`CallBudget::set_limit`] says otherwise: all of it alone, none before its first slice.
    pub fn new(connector: &str, rate: RateLimit, limit: u32) -> Arc<CallBudget> {
        let budget = Arc::new(CallBudget {
            connector: connector.to_owned(),
            rate,
            log: Mutex::new(Log {
                limit,
                ended: VecDeque::new(),
                in_flight: 0,
                reserved: 0,
                held_until: None,
            }),
            freed: Notify::new(),
        });
        budget.publish(limit);
        budget
    }

    pub fn connector(&self) -> &str {
        &self.connector
    }

    pub fn rate(&self) -> RateLimit {
        self.rate
    }

    /// The window a call counts in here: the CRM's, and the margin.
    pub fn window(&self) -> Duration {
        self.rate.per + WINDOW_MARGIN
    }

    /// Waits until a call may start within the budget. Waiting for a permit takes no call
    /// and changes nothing: a caller that gives up drops the future, and nothing is counted.
    pub async fn permit(self: &Arc<CallBudget>) -> Permit {
        let waited = std::time::Instant::now();
        let mut counted_waiting = false;
        let permit = loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the log is read, so that a permit freed meanwhile wakes us.
            freed.as_mut().enable();
            let wake_at = {
                let mut log = self.lock();
                let now = Instant::now();
                log.prune(now, self.window());
                let held = log.held_until.filter(|&until| until > now);
                if held.is_none() && log.in_window() < log.limit {
                    log.reserved += 1;
                    break Permit { budget: Arc::clone(self), started: false };
                }
                // The hold ends, or the oldest call leaves the window, then; with neither
                // (every call in flight or reserved, or a limit of zero) only a call ending,
                // a freed permit or a new limit helps.
                held.or_else(|| log.ended.front().map(|&oldest| oldest + self.window()))
            };
            if !counted_waiting {
                counted_waiting = true;
                metrics::gauge!("hookgate_budget_waiting", "connector" => self.connector.clone())
                    .increment(1.0);
            }
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = &mut freed => {}
                    }
                }
                None => freed.await,
            }
        };
        if counted_waiting {
            metrics::gauge!("hookgate_budget_waiting", "connector" => self.connector.clone())
                .decrement(1.0);
        }
        metrics::histogram!("hookgate_budget_wait_seconds", "connector" => self.connector.clone())
            .record(waited.elapsed().as_secs_f64());
        permit
    }

    /// Sets the calls this process may have in the window (its slice of a shared budget).
    /// A smaller limit takes effect at once: no call starts until the log is under it.
    pub fn set_limit(&self, calls: u32) {
        let grew = {
            let mut log = self.lock();
            let grew = calls > log.limit;
            log.limit = calls;
            grew
        };
        self.publish(calls);
        if grew {
            self.freed.notify_waiters();
        }
    }

    /// The CRM refused a call for its rate (another client shares its window, or its count
    /// differs from ours): no call starts for `wait` (its retry-after), or else a whole
    /// window, by when the CRM's window has moved past the calls it counted.
    pub fn refused(&self, wait: Option<Duration>) {
        let until = Instant::now() + wait.unwrap_or(self.window()).min(self.window());
        let mut log = self.lock();
        log.held_until = Some(log.held_until.map_or(until, |held| held.max(until)));
        drop(log);
        metrics::counter!("hookgate_budget_refused_total", "connector" => self.connector.clone())
            .increment(1);
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.lock().limit
    }

    /// How long until at most `calls` of this process's calls are in the window (started or
    /// about to), by its own clock: when a slice given up is free for another process.
    pub fn until_at_most(&self, calls: u32) -> Duration {
        let mut log = self.lock();
        let now = Instant::now();
        log.prune(now, self.window());
        let excess = log.in_window().saturating_sub(calls);
        if excess == 0 {
            return Duration::ZERO;
        }
        if excess > u32::try_from(log.ended.len()).unwrap_or(u32::MAX) {
            // Calls in flight, or permits out whose calls may start now: a whole window from
            // now at least.
            return self.window();
        }
        let index = usize::try_from(excess - 1).unwrap_or(usize::MAX);
        log.ended
            .get(index)
            .map_or(self.window(), |&ended| (ended + self.window()).saturating_duration_since(now))
    }

    /// How long from now each call of this process's window stays in it, soonest first; a
    /// call in flight or a permit out counts as a whole window (it may end, or start, now).
    pub fn in_window(&self) -> Vec<Duration> {
        let mut log = self.lock();
        let now = Instant::now();
        log.prune(now, self.window());
        let mut left: Vec<Duration> = log
            .ended
            .iter()
            .map(|&ended| (ended + self.window()).saturating_duration_since(now))
            .collect();
        left.extend((0..log.in_flight + log.reserved).map(|_| self.window()));
        left
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        // The log is counters and instants: one poisoned by a panic elsewhere is still sound.
        self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn publish(&self, calls: u32) {
        metrics::gauge!("hookgate_budget_limit_calls", "connector" => self.connector.clone())
            .set(f64::from(calls));
    }
}

impl Log {
    fn prune(&mut self, now: Instant, window: Duration) {
        while self.ended.front().is_some_and(|&ended| ended + window <= now) {
            self.ended.pop_front();
        }
    }

    fn in_window(&self) -> u32 {
        u32::try_from(self.ended.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.in_flight)
            .saturating_add(self.reserved)
    }
}

/// The right to start one call. [`Permit::start`] turns it into the [`InFlight`] call; a permit dropped
/// unstarted is handed back.
#[derive(Debug)]
pub struct Permit {
    budget: Arc<CallBudget>,
    started: bool,
}

impl Permit {
    /// The call starts now. It is in flight until the [`InFlight`] is dropped, and counts in the
    /// window until a window after that.
    pub fn start(mut self) -> InFlight {
        self.started = true;
        let mut log = self.budget.lock();
        log.reserved = log.reserved.saturating_sub(1);
        log.in_flight += 1;
        drop(log);
        metrics::counter!("hookgate_budget_calls_total", "connector" => self.budget.connector.clone())
            .increment(1);
        InFlight { budget: Arc::clone(&self.budget) }
    }
}

/// A call in flight: dropped when the CRM has answered, or the call was given up.
#[derive(Debug)]
pub struct InFlight {
    budget: Arc<CallBudget>,
}

impl InFlight {
    /// The CRM refused this call for its rate (see [`CallBudget::refused`]).
    pub fn refused(&self, wait: Option<Duration>) {
        self.budget.refused(wait);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut log = self.budget.lock();
        log.in_flight = log.in_flight.saturating_sub(1);
        log.ended.push_back(Instant::now());
        drop(log);
        // A waiter with nothing ended to time its wait by learns when this call leaves.
        self.budget.freed.notify_waiters();
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.started {
            let mut log = self.budget.lock();
            log.reserved = log.reserved.saturating_sub(1);
            drop(log);
            self.budget.freed.notify_one();
        }
    }
}

/// How often a process renews its slice of each shared budget: a process that joins waits
/// for its share about two renewals (the others shrink at their next one, it grows at its
/// own), so this is short; a renewal is one small transaction.
pub const SLICE_RENEW: Duration = Duration::from_millis(250);

/// How long a slice lasts unless renewed: a process that cannot reach the store stops calling
/// once this has passed since its last renewal, by its own clock (see [`keep_slices`]).
pub const SLICE_LEASE: Duration = Duration::from_secs(5);

/// Keeps this process's slice of every shared budget that `budgets` gives (the current
/// wiring's), renewing each every [`SLICE_RENEW`], until `shutdown`. A slice not renewed
/// within [`SLICE_LEASE`] (less a renewal, for the round trip) is taken as lost: its budget
/// starts nothing until a renewal succeeds, since the store may have given it to others.
pub(crate) async fn keep_slices(
    store: Store,
    owner: String,
    budgets: impl Fn() -> Vec<Arc<CallBudget>>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut renewed: std::collections::HashMap<String, Instant> = Default::default();
    let mut failing = false;
    loop {
        for budget in budgets() {
            let asked = Instant::now();
            let request = SliceRequest {
                connector: budget.connector(),
                owner: &owner,
                budget_calls: budget.rate().calls,
                window_ms: millis(budget.window()),
                lease_ms: millis(SLICE_LEASE),
                in_window_ms: budget.in_window().into_iter().map(millis).collect(),
            };
            match store.lease_budget_slice(&request).await {
                Ok(calls) => {
                    failing = false;
                    renewed.insert(budget.connector().to_owned(), asked);
                    budget.set_limit(calls);
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(connector = budget.connector(), %error, "cannot renew the budget's slice");
                    }
                    failing = true;
                    let held = renewed.get(budget.connector()).copied();
                    if held.is_none_or(|at| at.elapsed() + SLICE_RENEW >= SLICE_LEASE) {
                        budget.set_limit(0);
                    }
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(SLICE_RENEW) => {}
        }
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Takes a permit of `budget`, if there is one, and starts its call.
pub(crate) async fn start_call(budget: Option<&Arc<CallBudget>>) -> Option<InFlight> {
    match budget {
        Some(budget) => Some(budget.permit().await.start()),
        None => None,
    }
}

/// Ends `call`, if any, telling its budget if the CRM refused it for its rate.
pub(crate) fn end_call<T>(
    call: Option<InFlight>,
    result: &Result<T, hookgate_connector::ConnectorError>,
) {
    if let (Some(call), Err(hookgate_connector::ConnectorError::RateLimited { retry_after, .. })) =
        (&call, result)
    {
        call.refused(*retry_after);
    }
    drop(call);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(calls: u32, per_ms: u64) -> RateLimit {
        RateLimit { calls, per: Duration::from_millis(per_ms) }
    }

    /// Calls start in bursts of the limit, one window (and the margin) apart.
    #[tokio::test(start_paused = true)]
    async fn no_window_holds_more_than_the_limit() {
        let budget = CallBudget::new("crm", rate(3, 1_000), 3);
        let begun = Instant::now();
        let mut starts = Vec::new();
        for _ in 0..7 {
            budget.permit().await.start();
            starts.push(begun.elapsed().as_millis());
        }
        assert_eq!(starts, [0, 0, 0, 1_250, 1_250, 1_250, 2_500]);
    }

    /// A call counts until a window after it ended, however long it was in flight: the CRM
    /// may have counted it on arrival at any time before its answer.
    #[tokio::test(start_paused = true)]
    async fn a_slow_call_counts_until_a_window_after_its_answer() {
        let budget = CallBudget::new("crm", rate(1, 1_000), 1);
        let slow = budget.permit().await.start();
        let next = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move { budget.permit().await.start() }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!next.is_finished(), "the slow call is still in flight");
        assert_eq!(budget.in_window(), [budget.window()]);
        let answered = Instant::now();
        drop(slow);
        let _next = next.await.unwrap();
        assert_eq!(answered.elapsed(), budget.window());
    }

    /// A permit handed back unused is another caller's at once; one started is not.
    #[tokio::test(start_paused = true)]
    async fn an_unused_permit_is_handed_back() {
        let budget = CallBudget::new("crm", rate(1, 10_000), 1);
        let first = budget.permit().await;
        let waiting = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move { budget.permit().await.start() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished(), "the one permit is out");
        drop(first);
        tokio::time::timeout(Duration::from_millis(10), waiting).await.unwrap().unwrap();
        let free_in = budget.until_at_most(0);
        assert!(free_in > budget.window() - Duration::from_millis(50), "{free_in:?}");
    }

    /// A call the CRM refused for its rate holds every call for its retry-after, at most a
    /// window.
    #[tokio::test(start_paused = true)]
    async fn a_refused_call_holds_the_budget() {
        let budget = CallBudget::new("crm", rate(10, 1_000), 10);
        budget.permit().await.start();
        budget.refused(Some(Duration::from_millis(300)));
        let begun = Instant::now();
        budget.permit().await.start();
        assert_eq!(begun.elapsed().as_millis(), 300);
        budget.refused(Some(Duration::from_secs(3600)));
        let begun = Instant::now();
        budget.permit().await.start();
        assert_eq!(begun.elapsed(), budget.window(), "never longer than a window");
    }

    /// A smaller slice holds calls until the log is under it; a larger one frees waiters.
    #[tokio::test(start_paused = true)]
    async fn a_new_limit_takes_effect_at_once() {
        let budget = CallBudget::new("crm", rate(4, 1_000), 4);
        for _ in 0..2 {
            budget.permit().await.start();
        }
        budget.set_limit(2);
        assert_eq!(budget.until_at_most(1), budget.window());
        let held = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move { budget.permit().await.start() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!held.is_finished(), "two calls in the window fill a slice of two");
        budget.set_limit(3);
        tokio::time::timeout(Duration::from_millis(10), held).await.unwrap().unwrap();
        budget.set_limit(0);
        assert_eq!(budget.limit(), 0);
        let none = tokio::time::timeout(Duration::from_secs(5), budget.permit()).await;
        assert!(none.is_err(), "a slice of nothing starts nothing");
    }
}
