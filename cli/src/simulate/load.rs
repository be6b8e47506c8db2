//! The simulated shoppers: an open-loop arrival schedule (a step to the peak rate,
//! then exponential decay) and one task per shopper that reserves through the
//! HTTP API and then confirms, releases or abandons the hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_domain::HoldState;
use serde::Serialize;

/// How the shoppers behave.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Shoppers (arrivals) in all.
    pub shoppers: u64,
    /// Arrivals per second at the peak.
    pub peak_rps: f64,
    /// Seconds at the peak before the decay.
    pub peak_secs: f64,
    /// Seconds over which the rate decays (to about 5% of the peak).
    pub decay_secs: f64,
    /// Share of holders who pay.
    pub confirm: f64,
    /// Share of holders who walk away (their holds expire).
    pub abandon: f64,
    /// Longest pause before paying or releasing.
    pub think: Duration,
    /// Hold lifetime asked for.
    pub hold_ttl: Duration,
    /// Share of reservations sent twice with the same idempotency key.
    pub retry: f64,
    /// Share of shoppers who try once more after their first attempt.
    pub repeat: f64,
    /// Units per attempt: 1 to this.
    pub max_qty: i64,
    /// Random seed.
    pub seed: u64,
    /// Connections opened to each server before the first arrival.
    pub connections: usize,
}

/// A tiny, seedable random source (xorshift64*); good enough to vary behaviour.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded; a zero seed is replaced.
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// When each arrival is due, in seconds from the start.
pub fn schedule(b: &Behaviour) -> Vec<f64> {
    let tau = (b.decay_secs / 3.0).max(0.001);
    let floor = b.peak_rps * 0.05;
    let mut t = 0.0;
    let mut out = Vec::with_capacity(b.shoppers as usize);
    for _ in 0..b.shoppers {
        out.push(t);
        let rate = if t < b.peak_secs || b.decay_secs <= 0.0 {
            b.peak_rps
        } else {
            (b.peak_rps * (-(t - b.peak_secs) / tau).exp()).max(floor)
        };
        t += 1.0 / rate.max(0.001);
    }
    out
}

/// One second of the run (by scheduled arrival time).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Second {
    /// Seconds from the start.
    pub at: u64,
    /// Reservation attempts due in this second.
    pub attempts: u64,
    /// Attempts answered (held or refused) in this second.
    pub decided: u64,
    /// Median reserve latency of attempts due in this second, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
}

/// A tenth of a second of the first two (by scheduled arrival time): the
/// moment the units sell, seen closer than by the second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Slot {
    /// Milliseconds from the start.
    pub at_ms: u64,
    /// Reservation attempts due in this slot.
    pub attempts: u64,
    /// Of those, the ones granted a hold.
    pub held: u64,
    /// Median reserve latency of attempts due in this slot, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
}

/// How long a [`Slot`] is, and how many the report has.
const SLOT: Duration = Duration::from_millis(100);
const SLOTS: usize = 20;

/// Counters the shoppers update and the live view reads.
#[derive(Debug, Default)]
pub struct Tally {
    /// Reservation attempts sent (retries not counted).
    pub attempts: AtomicU64,
    /// Answered: held, sold out, limit or invalid.
    pub decided: AtomicU64,
    /// Holds granted.
    pub held: AtomicU64,
    /// Units in granted holds.
    pub held_units: AtomicU64,
    /// Holds paid for.
    pub confirmed: AtomicU64,
    /// Units paid for (the API said confirmed).
    pub sold_units: AtomicU64,
    /// Holds released by the shopper.
    pub released: AtomicU64,
    /// Holds left to expire.
    pub abandoned: AtomicU64,
    /// Payments that came after the hold had expired (410).
    pub late: AtomicU64,
    /// Releases that came after the hold had expired (200, the hold shown expired).
    pub late_releases: AtomicU64,
    /// Refused: sold out.
    pub sold_out: AtomicU64,
    /// Refused: per-buyer limit.
    pub limited: AtomicU64,
    /// Retries with the same key.
    pub retries: AtomicU64,
    /// Retries whose answer differed from the first.
    pub retry_mismatch: AtomicU64,
    /// Transport failures and unexpected statuses.
    pub errors: AtomicU64,
    /// Latencies (µs, from the scheduled time) per second.
    latencies: Mutex<Vec<Vec<u32>>>,
    /// Latencies (µs) and holds granted per [`Slot`] of the first two seconds.
    slots: Mutex<Vec<(Vec<u32>, u64)>>,
    /// Decisions per second (by answer time).
    decided_at: Mutex<Vec<u64>>,
    /// Units each buyer bought (the per-buyer limit counts held and bought
    /// units; released and expired ones return to the buyer's allowance).
    pub per_buyer: Mutex<HashMap<String, i64>>,
    /// Shoppers who have arrived.
    pub arrived: AtomicU64,
    /// When the last attempt was answered, µs from the start.
    pub last_decided_us: AtomicU64,
    /// Every reservation id granted, with the ending the shopper chose.
    pub holds: Mutex<Vec<(String, &'static str)>>,
    /// First few unexpected answers, for the report.
    pub samples: Mutex<Vec<String>>,
}

impl Tally {
    fn latency(&self, second: usize, us: u64) {
        let mut l = self
            .latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if l.len() <= second {
            l.resize(second + 1, Vec::new());
        }
        l[second].push(us.min(u64::from(u32::MAX)) as u32);
    }

    /// Counts an attempt due `due` after the start, answered in `us`, in its
    /// [`Slot`] when it is one of the first.
    fn slot(&self, due: Duration, us: u64, held: bool) {
        let slot = (due.as_millis() / SLOT.as_millis()) as usize;
        if slot >= SLOTS {
            return;
        }
        let mut s = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.len() < SLOTS {
            s.resize(SLOTS, (Vec::new(), 0));
        }
        s[slot].0.push(us.min(u64::from(u32::MAX)) as u32);
        s[slot].1 += u64::from(held);
    }

    /// The first two seconds, slot by slot (those with attempts).
    pub fn slots(&self) -> Vec<Slot> {
        let s = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.iter()
            .enumerate()
            .filter(|(_, (lat, _))| !lat.is_empty())
            .map(|(i, (lat, held))| {
                let mut lat = lat.clone();
                lat.sort_unstable();
                Slot {
                    at_ms: i as u64 * SLOT.as_millis() as u64,
                    attempts: lat.len() as u64,
                    held: *held,
                    p50_ms: percentile(&lat, 0.50),
                    p99_ms: percentile(&lat, 0.99),
                }
            })
            .collect()
    }

    fn decided_in(&self, second: usize) {
        self.decided.fetch_add(1, Ordering::Relaxed);
        let mut d = self
            .decided_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if d.len() <= second {
            d.resize(second + 1, 0);
        }
        d[second] += 1;
    }

    fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut s = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.len() < 5 {
            s.push(what);
        }
    }

    /// All latencies so far, sorted (µs).
    pub fn sorted_latencies(&self) -> Vec<u32> {
        let l = self
            .latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut all: Vec<u32> = l.iter().flatten().copied().collect();
        all.sort_unstable();
        all
    }

    /// Latencies (µs) of arrivals due in the last `seconds` seconds of schedule
    /// that have an answer, sorted; cheap enough for a live view.
    pub fn recent_latencies(&self, seconds: usize) -> Vec<u32> {
        let mut recent: Vec<u32> = {
            let l = self
                .latencies
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            l.iter().rev().take(seconds).flatten().copied().collect()
        };
        recent.sort_unstable();
        recent
    }

    /// The run second by second.
    pub fn seconds(&self) -> Vec<Second> {
        let l = self
            .latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let d = self
            .decided_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (0..l.len().max(d.len()))
            .map(|i| {
                let mut lat = l.get(i).cloned().unwrap_or_default();
                lat.sort_unstable();
                Second {
                    at: i as u64,
                    attempts: lat.len() as u64,
                    decided: d.get(i).copied().unwrap_or(0),
                    p50_ms: percentile(&lat, 0.50),
                    p99_ms: percentile(&lat, 0.99),
                }
            })
            .collect()
    }
}

/// The `p` quantile of sorted µs values, in ms (0 when empty).
pub fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    f64::from(sorted[((sorted.len() - 1) as f64 * p).round() as usize]) / 1_000.0
}

/// Where to send requests.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://host:port` of each server (at least one). Shoppers are spread
    /// over them, and each shopper's retry and payment go to another server
    /// than its reservation, as a load balancer may send them.
    bases: Vec<String>,
    /// Each server's `/api/v1/reservations`, parsed once: parsing a URL per
    /// request was a noticeable share of the generator's CPU, which it takes
    /// from the server it measures on a small machine.
    reserve_urls: Vec<reqwest::Url>,
    /// `Bearer <token>` with checkout scope, built once for the same reason.
    auth: reqwest::header::HeaderValue,
    /// The SKU on sale.
    sku: String,
    /// Prefix making this run's idempotency keys and buyers unique.
    run: String,
    /// With `--connections`: places for requests in flight, as many as the
    /// connections held open (a load balancer's pool of backend connections:
    /// a request waits for a free one, and its latency counts the wait).
    gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl Target {
    /// Shoppers of run `run` buying `sku` from `bases` (`http://host:port`,
    /// at least one) with bearer `token`; `gate` as [`Target`] says.
    pub fn new(
        bases: Vec<String>,
        token: &str,
        sku: String,
        run: String,
        gate: Option<Arc<tokio::sync::Semaphore>>,
    ) -> anyhow::Result<Self> {
        let reserve_urls = bases
            .iter()
            .map(|b| reqwest::Url::parse(&format!("{b}/api/v1/reservations")))
            .collect::<Result<_, _>>()?;
        let mut auth = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?;
        auth.set_sensitive(true);
        Ok(Self {
            bases,
            reserve_urls,
            auth,
            sku,
            run,
            gate,
        })
    }

    /// The server for a shopper's `turn`-th request.
    fn base(&self, turn: u64) -> &str {
        &self.bases[self.server(turn)]
    }

    /// The index of the server for a shopper's `turn`-th request.
    fn server(&self, turn: u64) -> usize {
        turn as usize % self.bases.len()
    }

    /// A place for one request in flight, when connections are pooled.
    async fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &self.gate {
            Some(gate) => gate.clone().acquire_owned().await.ok(),
            None => None,
        }
    }
}

enum Answer {
    Held(String),
    Refused,
    Failed,
}

/// The body of a shopper's reservation, serialised as it stands (no JSON tree
/// built first).
#[derive(Serialize)]
struct ReserveBody<'a> {
    sku: &'a str,
    qty: i64,
    buyer: &'a str,
    ttl_ms: u64,
}

#[allow(clippy::too_many_arguments)]
async fn reserve(
    http: &reqwest::Client,
    t: &Target,
    turn: u64,
    key: &str,
    buyer: &str,
    qty: i64,
    ttl: Duration,
    tally: &Tally,
) -> (Answer, Option<(u16, String)>) {
    let _place = t.admit().await;
    let body = ReserveBody {
        sku: &t.sku,
        qty,
        buyer,
        ttl_ms: ttl.as_millis() as u64,
    };
    let res = http
        .post(t.reserve_urls[t.server(turn)].clone())
        .header(reqwest::header::AUTHORIZATION, t.auth.clone())
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await;
    let res = match res {
        Ok(r) => r,
        Err(e) => {
            tally.error(format!("reserve: {e}"));
            return (Answer::Failed, None);
        }
    };
    let status = res.status().as_u16();
    let body = res.text().await.unwrap_or_default();
    let answer = match status {
        201 => match serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["id"].as_str().map(str::to_owned))
        {
            Some(id) => Answer::Held(id),
            None => Answer::Failed,
        },
        409 | 422 => Answer::Refused,
        _ => Answer::Failed,
    };
    (answer, Some((status, body)))
}

/// Runs every shopper; returns when all have finished (holds paid, released or
/// left to expire), with the time of the last arrival from the start.
pub async fn run(target: Target, b: Behaviour, tally: Arc<Tally>) -> Duration {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1_024)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client");
    preopen(&http, &target, b.connections).await;
    let arrivals = schedule(&b);
    let started = Instant::now();
    let mut rng = Rng::new(b.seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut last = started;
    for (i, at) in arrivals.iter().enumerate() {
        let due = started + Duration::from_secs_f64(*at);
        tokio::time::sleep_until(due.into()).await;
        last = due;
        let draws: [f64; 6] = std::array::from_fn(|_| rng.unit());
        let (http, target, tally, b) = (http.clone(), target.clone(), tally.clone(), b.clone());
        tasks.spawn(async move {
            shopper(i as u64, due, started, draws, &http, &target, &b, &tally).await;
        });
        // Reap finished tasks as we go, so memory stays flat on long runs.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    last.duration_since(started)
}

/// Opens `n` connections to each server and leaves them idle in `http`'s pool:
/// `n` requests at once each need a connection of their own (a connection
/// started while another came free still joins the pool).
async fn preopen(http: &reqwest::Client, target: &Target, n: usize) {
    if n == 0 {
        return;
    }
    let mut opening = tokio::task::JoinSet::new();
    for base in &target.bases {
        for _ in 0..n {
            let (http, url) = (http.clone(), format!("{base}/healthz"));
            // Read to the end, so the connection goes back to the pool.
            opening.spawn(async move {
                match http.get(url).send().await {
                    Ok(r) => r.bytes().await.is_ok(),
                    Err(_) => false,
                }
            });
        }
    }
    let opened = opening
        .join_all()
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
    eprintln!("{opened} connections opened before the first shopper");
}

#[allow(clippy::too_many_arguments)]
async fn shopper(
    n: u64,
    due: Instant,
    started: Instant,
    draws: [f64; 6],
    http: &reqwest::Client,
    t: &Target,
    b: &Behaviour,
    tally: &Tally,
) {
    tally.arrived.fetch_add(1, Ordering::Relaxed);
    let buyer = format!("{}-buyer-{n}", t.run);
    let attempts = if draws[4] < b.repeat { 2 } else { 1 };
    for attempt in 0..attempts {
        let second = (due - started).as_secs() as usize;
        let key = format!("{}-{n}-{attempt}", t.run);
        let qty = 1 + (draws[0] * b.max_qty as f64) as i64;
        tally.attempts.fetch_add(1, Ordering::Relaxed);
        let turn = n + attempt;
        let ask = |turn| {
            reserve(
                http,
                t,
                turn,
                &key,
                &buyer,
                qty.min(b.max_qty),
                b.hold_ttl,
                tally,
            )
        };
        let (answer, raw) = ask(turn).await;
        let elapsed = due.elapsed();
        tally.latency(second, elapsed.as_micros() as u64);
        tally.slot(
            due - started,
            elapsed.as_micros() as u64,
            matches!(answer, Answer::Held(_)),
        );
        let decided = started.elapsed().as_secs() as usize;
        tally
            .last_decided_us
            .fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        if draws[5] < b.retry {
            // The shopper's network "failed": the same request again must get the same answer.
            tally.retries.fetch_add(1, Ordering::Relaxed);
            let (_, again) = ask(turn + 1).await;
            if again.is_none() || raw.as_ref().map(|r| &r.1) != again.as_ref().map(|r| &r.1) {
                tally.retry_mismatch.fetch_add(1, Ordering::Relaxed);
            }
        }
        let id = match answer {
            Answer::Held(id) => id,
            Answer::Refused => {
                tally.decided_in(decided);
                let body = raw.map(|r| r.1).unwrap_or_default();
                if body.contains("buyer_limit") {
                    tally.limited.fetch_add(1, Ordering::Relaxed);
                } else if body.contains("sold_out") {
                    tally.sold_out.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.error(format!("refused: {body}"));
                }
                continue;
            }
            Answer::Failed => {
                if let Some((status, body)) = raw {
                    tally.error(format!("reserve answered {status}: {body}"));
                }
                continue;
            }
        };
        tally.decided_in(decided);
        tally.held.fetch_add(1, Ordering::Relaxed);
        tally.held_units.fetch_add(qty as u64, Ordering::Relaxed);
        let ending = if draws[1] < b.confirm {
            "confirm"
        } else if draws[1] < b.confirm + b.abandon {
            "abandon"
        } else {
            "release"
        };
        tally
            .holds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((id.clone(), ending));
        if ending == "abandon" {
            tally.abandoned.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        tokio::time::sleep(b.think.mul_f64(draws[2])).await;
        let place = t.admit().await;
        let res = http
            .post(format!(
                "{}/api/v1/reservations/{id}/{ending}",
                t.base(turn + 1)
            ))
            .header(reqwest::header::AUTHORIZATION, t.auth.clone())
            .header("Idempotency-Key", format!("{key}-{ending}"))
            .send()
            .await;
        drop(place);
        let answer = match res {
            Ok(r) => Ok((r.status().as_u16(), r.text().await.unwrap_or_default())),
            Err(e) => Err(e),
        };
        match answer {
            Ok((200, _)) if ending == "confirm" => {
                tally.confirmed.fetch_add(1, Ordering::Relaxed);
                tally.sold_units.fetch_add(qty as u64, Ordering::Relaxed);
                *tally
                    .per_buyer
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(buyer.clone())
                    .or_default() += qty;
            }
            // A release answers 200 whether it ended the hold or found it
            // already ended; the hold it shows says which.
            Ok((200, body)) => match shown_state(&body) {
                Some(HoldState::Released) => {
                    tally.released.fetch_add(1, Ordering::Relaxed);
                }
                Some(HoldState::Expired) => {
                    tally.late_releases.fetch_add(1, Ordering::Relaxed);
                }
                _ => tally.error(format!("release answered 200: {body}")),
            },
            Ok((410, _)) if ending == "confirm" => {
                tally.late.fetch_add(1, Ordering::Relaxed);
            }
            Ok((status, _)) => tally.error(format!("{ending} answered {status}")),
            Err(e) => tally.error(format!("{ending}: {e}")),
        }
    }
}

/// The state of the hold an answer shows.
fn shown_state(body: &str) -> Option<HoldState> {
    let view: serde_json::Value = serde_json::from_str(body).ok()?;
    HoldState::parse(view.get("state")?.as_str()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_steps_to_the_peak_then_decays() {
        let b = Behaviour {
            shoppers: 3_000,
            peak_rps: 1_000.0,
            peak_secs: 2.0,
            decay_secs: 3.0,
            confirm: 1.0,
            abandon: 0.0,
            think: Duration::ZERO,
            hold_ttl: Duration::from_secs(5),
            retry: 0.0,
            repeat: 0.0,
            max_qty: 1,
            seed: 7,
            connections: 0,
        };
        let s = schedule(&b);
        assert_eq!(s.len(), 3_000);
        // 2,000 arrivals in the first two seconds at the peak…
        // (give or take one to floating-point accumulation)
        let peak = s.iter().filter(|t| **t < 2.0).count();
        assert!((1_999..=2_001).contains(&peak), "{peak}");
        // …then fewer per second as the rate decays.
        let second = |k: f64| s.iter().filter(|t| **t >= k && **t < k + 1.0).count();
        assert!(
            second(2.0) > second(3.0) && second(3.0) > second(4.0),
            "{} {} {}",
            second(2.0),
            second(3.0),
            second(4.0)
        );
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_random_source_is_uniform_enough_and_seeded() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let xs: Vec<f64> = (0..10_000).map(|_| a.unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        assert_eq!(xs[..5], (0..5).map(|_| b.unit()).collect::<Vec<_>>()[..]);
        let low = xs.iter().filter(|x| **x < 0.5).count();
        assert!((4_700..5_300).contains(&low), "{low}");
    }
}
