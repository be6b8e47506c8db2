//! How fast an ingestion lane applies events, and how it yields to checkout.
//!
//! Checkout and the lanes share one Redis, one PostgreSQL (through the
//! write-behind: every applied event is a ledger row) and, on a small host, the
//! same cores. A lane that applied a 10,000-line payload at full speed and only
//! then slept off its rate would put a burst of work ahead of every checkout
//! call for as long as it lasts. So a lane's [`Pacer`] meters events out in small
//! steps ([`STEP`] events, then a pause) and, for a lane that yields
//! ([`Yield`]), drops to a lower rate while this process's checkout is busy:
//! [`CheckoutActivity`] counts the reservations, payments and releases the
//! engine serves (sold-out answers from memory included), and more than
//! [`Yield::above`] of them a second make the lane apply at most [`Yield::rate`]
//! events a second, until checkout has been quiet for [`QUIET_FOR`].
//!
//! Each process paces by its own checkout: a server behind a load balancer sees
//! its share of the traffic, which is the share competing with its own lanes
//! for its CPU. Nothing is dropped by yielding: payloads wait on their stream
//! (up to the lane's caps, beyond which senders are told to retry).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// When a reader that gathers (the write-behind, a server's live feed) may
/// read again: after a read that brought entries without stopping at its count
/// on any stream, once `gather` has passed since that read began, so what
/// arrives meanwhile is read (and handled) together; after an empty read or a
/// backlog, or with a zero `gather`, at once (`None`). A stream read costs
/// about the same for one entry as for hundreds.
pub fn gathered_until(
    began: Instant,
    gather: Duration,
    brought: bool,
    backlog: bool,
) -> Option<Instant> {
    (brought && !backlog && !gather.is_zero()).then(|| began + gather)
}

/// Events a lane applies between two looks at its pace: small enough that a
/// step is a few milliseconds of Redis work, large enough to batch the step's
/// event-id claims into one round trip.
pub const STEP: usize = 32;

/// How long checkout must stay under [`Yield::above`] before a yielding lane
/// returns to its full rate (so a lull of a few milliseconds between shoppers
/// does not let a burst of feed work in).
pub const QUIET_FOR: Duration = Duration::from_secs(1);

/// The shortest window over which checkout's rate is measured.
const MEASURE_OVER: Duration = Duration::from_millis(100);

/// Pace credit a lane may bank while idle: a lane that waited may then apply
/// this much of its rate at once, no more.
const MAX_BURST: Duration = Duration::from_millis(50);

/// The checkout calls this process has served, counted by the engine.
#[derive(Debug, Default)]
pub struct CheckoutActivity(AtomicU64);

impl CheckoutActivity {
    /// Counts one reservation attempt, payment or release.
    pub fn note(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls counted since the process started.
    pub fn calls(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// When a lane gives way to checkout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Yield {
    /// Checkout calls a second (this process's) above which checkout is busy.
    pub above: u32,
    /// Most events a second the lane applies while checkout is busy (at least 1).
    pub rate: u32,
}

/// Meters a lane's events: at most its rate, or its yield rate while checkout
/// is busy.
#[derive(Debug)]
pub struct Pacer {
    /// Events a second when checkout is quiet (0: no limit).
    rate: u32,
    yields: Option<Yield>,
    /// The time the next event may be applied at.
    next_at: Instant,
    /// Checkout calls and the time they were counted, at the last measure.
    seen: (u64, Instant),
    /// Checkout counts as busy until then.
    busy_until: Option<Instant>,
}

impl Pacer {
    /// A pacer for a lane of `rate` events a second (0: unlimited) that yields
    /// to checkout as `yields` says.
    pub fn new(rate: u32, yields: Option<Yield>, activity: &CheckoutActivity) -> Self {
        let now = Instant::now();
        Self {
            rate,
            yields,
            next_at: now,
            seen: (activity.calls(), now),
            busy_until: None,
        }
    }

    /// Whether checkout is busy now, as far as this lane is concerned.
    pub fn checkout_busy(&mut self, activity: &CheckoutActivity) -> bool {
        let Some(yields) = self.yields else {
            return false;
        };
        let now = Instant::now();
        let (calls, at) = self.seen;
        let over = now.duration_since(at);
        if over >= MEASURE_OVER {
            let count = activity.calls();
            let per_sec = count.saturating_sub(calls) as f64 / over.as_secs_f64();
            if per_sec > f64::from(yields.above) {
                self.busy_until = Some(now + QUIET_FOR);
            }
            self.seen = (count, now);
        }
        self.busy_until.is_some_and(|until| now < until)
    }

    /// The rate the lane may apply at now (0: no limit).
    pub fn rate_now(&mut self, activity: &CheckoutActivity) -> u32 {
        let yields = self.yields;
        match yields {
            Some(y) if self.checkout_busy(activity) => {
                let rate = y.rate.max(1);
                if self.rate == 0 {
                    rate
                } else {
                    rate.min(self.rate)
                }
            }
            _ => self.rate,
        }
    }

    /// Books `events` more events; answers when they may be applied (now or
    /// in the past: at once).
    pub fn book(&mut self, events: usize, activity: &CheckoutActivity) -> Instant {
        let rate = self.rate_now(activity);
        let now = Instant::now();
        if rate == 0 || events == 0 {
            return now;
        }
        // A lane that sat idle banks no more than a short burst of credit.
        if let Some(floor) = now.checked_sub(MAX_BURST)
            && self.next_at < floor
        {
            self.next_at = floor;
        }
        let at = self.next_at;
        self.next_at += Duration::from_secs_f64(events as f64 / f64::from(rate));
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lane_keeps_its_rate_step_by_step() {
        let activity = CheckoutActivity::default();
        let mut pacer = Pacer::new(2_000, None, &activity);
        let started = Instant::now();
        for _ in 0..40 {
            tokio::time::sleep_until(pacer.book(10, &activity)).await;
        }
        // 400 events at 2,000/s: the last step starts 195 ms after the first
        // (a burst of MAX_BURST at most was banked at the start).
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(190), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn busy_checkout_lowers_the_rate_until_it_has_been_quiet() {
        let activity = CheckoutActivity::default();
        let yields = Yield {
            above: 100,
            rate: 50,
        };
        let mut pacer = Pacer::new(0, Some(yields), &activity);
        assert_eq!(pacer.rate_now(&activity), 0, "quiet: no limit");
        // 200 calls over the measuring window: 2,000/s, busy.
        for _ in 0..200 {
            activity.note();
        }
        std::thread::sleep(MEASURE_OVER);
        assert_eq!(pacer.rate_now(&activity), 50);
        // No calls since: still busy until QUIET_FOR has passed.
        std::thread::sleep(MEASURE_OVER);
        assert_eq!(pacer.rate_now(&activity), 50);
        std::thread::sleep(QUIET_FOR);
        assert_eq!(pacer.rate_now(&activity), 0);
        // A lane with a rate of its own keeps the lower of the two.
        let mut capped = Pacer::new(20, Some(yields), &activity);
        for _ in 0..200 {
            activity.note();
        }
        std::thread::sleep(MEASURE_OVER);
        assert_eq!(capped.rate_now(&activity), 20);
    }

    #[test]
    fn a_lane_that_does_not_yield_ignores_checkout() {
        let activity = CheckoutActivity::default();
        let mut pacer = Pacer::new(300, None, &activity);
        for _ in 0..10_000 {
            activity.note();
        }
        std::thread::sleep(MEASURE_OVER);
        assert_eq!(pacer.rate_now(&activity), 300);
    }
}
