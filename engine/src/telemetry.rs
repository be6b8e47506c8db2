//! What the engine measures on its hot path, for `/metrics`: the duration of
//! every Redis round trip the engine makes (a script by its name, a pipeline
//! by the script it carries) and the outcome of every reservation attempt.
//!
//! The measures are plain in-memory counters and histograms (from the
//! `prometheus-client` library); whoever serves `/metrics` registers them
//! ([`Telemetry::register`]). Each engine has its own, so two servers in one
//! process (tests) never mix their figures. Label sets are fixed and small:
//! about twenty command names and eight outcomes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Latency buckets, in seconds: 0.25 ms doubling up to about 1 s (13 bounds),
/// so the 1–2 ms budget and a stall of hundreds of milliseconds both resolve.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_25, 2.0, 13)
}

/// A latency histogram with [`latency_buckets`].
pub fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// A histogram family whose members are [`latency_histogram`]s.
pub type Latencies<L> = Family<L, Histogram, fn() -> Histogram>;

/// The label of a Redis round trip.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabel {
    /// The command in lower case, or the script's name for `EVALSHA`/`EVAL`.
    pub command: &'static str,
}

/// The label of a reservation outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// [`holdfast_domain::ReserveOutcome::kind`].
    pub outcome: &'static str,
}

/// The engine's measures.
#[derive(Debug)]
pub struct Telemetry {
    /// Redis round trips by command, in seconds.
    pub redis_seconds: Latencies<CommandLabel>,
    /// Reservation attempts by outcome.
    pub reservations: Family<OutcomeLabel, Counter>,
    /// Script names by SHA1.
    scripts: HashMap<String, &'static str>,
}

impl Telemetry {
    /// Measures that know the scripts in `names` (name, SHA1) by name.
    pub fn new<'a>(names: impl IntoIterator<Item = (&'static str, &'a str)>) -> Self {
        let reservations = Family::<OutcomeLabel, Counter>::default();
        // Every outcome is exported from the start (at 0), so a rate over
        // one that has not happened yet reads 0, not "no data".
        for outcome in holdfast_domain::ReserveOutcome::KINDS {
            drop(reservations.get_or_create(&OutcomeLabel { outcome }));
        }
        Self {
            redis_seconds: Family::new_with_constructor(latency_histogram),
            reservations,
            scripts: names
                .into_iter()
                .map(|(name, sha)| (sha.to_owned(), name))
                .collect(),
        }
    }

    /// Adds these measures to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "holdfast_redis_command_duration_seconds",
            "Redis round trips the engine made, by command (a script by its name; a pipeline by the script it carries, or `pipeline`)",
            self.redis_seconds.clone(),
        );
        registry.register(
            "holdfast_reservations",
            "Reservation attempts by outcome (attempts the sold-out memory answered are counted in holdfast_sold_out_cache_hits instead)",
            self.reservations.clone(),
        );
    }

    /// Counts one reservation outcome.
    pub fn count_outcome(&self, outcome: &'static str) {
        self.reservations
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// The label of `cmd`: its script's name for `EVALSHA`, else its own.
    fn label_of(&self, cmd: &Cmd) -> &'static str {
        match self.script_of(cmd) {
            Some(script) => script,
            None => command_name(simple_args(cmd).next().unwrap_or_default()),
        }
    }

    /// The label of `pipeline`: the script it carries, else `pipeline`.
    fn label_of_pipeline(&self, pipeline: &Pipeline) -> &'static str {
        pipeline
            .cmd_iter()
            .find_map(|c| self.script_of(c).filter(|s| *s != "evalsha"))
            .unwrap_or("pipeline")
    }

    /// For an `EVALSHA`: the script's name (`evalsha` when unknown).
    fn script_of(&self, cmd: &Cmd) -> Option<&'static str> {
        let mut args = simple_args(cmd);
        if !args.next()?.eq_ignore_ascii_case(b"EVALSHA") {
            return None;
        }
        Some(
            args.next()
                .and_then(|sha| std::str::from_utf8(sha).ok())
                .and_then(|sha| self.scripts.get(sha).copied())
                .unwrap_or("evalsha"),
        )
    }

    fn observe(&self, command: &'static str, started: Instant) {
        self.redis_seconds
            .get_or_create(&CommandLabel { command })
            .observe(started.elapsed().as_secs_f64());
    }
}

/// `cmd`'s plain arguments, its name first.
fn simple_args(cmd: &Cmd) -> impl Iterator<Item = &[u8]> {
    cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    })
}

/// The commands the engine sends, by name: a fixed set, so the label cannot
/// grow with input.
fn command_name(name: &[u8]) -> &'static str {
    const KNOWN: [&str; 35] = [
        "get",
        "set",
        "del",
        "exists",
        "expire",
        "pexpire",
        "incr",
        "incrby",
        "hget",
        "hgetall",
        "hmget",
        "hset",
        "hincrby",
        "zrange",
        "zrangebyscore",
        "zcard",
        "zadd",
        "zrem",
        "xadd",
        "xlen",
        "xrange",
        "xrevrange",
        "xreadgroup",
        "xread",
        "xack",
        "xpending",
        "xautoclaim",
        "xtrim",
        "xinfo",
        "xgroup",
        "script",
        "eval",
        "ping",
        "info",
        "time",
    ];
    KNOWN
        .iter()
        .find(|k| k.as_bytes().eq_ignore_ascii_case(name))
        .copied()
        .unwrap_or("other")
}

/// A Redis connection whose every round trip is timed into [`Telemetry`].
#[derive(Clone)]
pub struct Measured<C> {
    inner: C,
    telemetry: Arc<Telemetry>,
}

impl<C> Measured<C> {
    /// Times `inner`'s round trips into `telemetry`.
    pub fn new(inner: C, telemetry: Arc<Telemetry>) -> Self {
        Self { inner, telemetry }
    }

    /// The connection without measurement.
    pub fn inner(&self) -> &C {
        &self.inner
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Measured<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let started = Instant::now();
            let reply = self.inner.req_packed_command(cmd).await;
            self.telemetry
                .observe(self.telemetry.label_of(cmd), started);
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let started = Instant::now();
            let reply = self
                .inner
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.telemetry
                .observe(self.telemetry.label_of_pipeline(pipeline), started);
            reply
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_resolve_a_quarter_millisecond_to_a_second() {
        let b: Vec<f64> = latency_buckets().collect();
        assert_eq!(b.first().copied(), Some(0.000_25));
        assert!(b.contains(&0.001) && b.contains(&0.002));
        assert!(*b.last().unwrap() >= 1.0);
    }

    #[test]
    fn commands_are_labelled_from_a_fixed_set() {
        let t = Telemetry::new([("reserve", "abc123")]);
        assert_eq!(
            t.label_of(redis::cmd("EVALSHA").arg("abc123").arg(0)),
            "reserve"
        );
        assert_eq!(t.label_of(redis::cmd("EVALSHA").arg("zzz")), "evalsha");
        assert_eq!(t.label_of(redis::cmd("hgetall").arg("k")), "hgetall");
        assert_eq!(t.label_of(&redis::cmd("INVENTED-COMMAND")), "other");
        let mut p = redis::pipe();
        p.cmd("EXISTS").arg("k");
        p.cmd("EVALSHA").arg("abc123").arg(0);
        assert_eq!(t.label_of_pipeline(&p), "reserve");
        let mut p = redis::pipe();
        p.cmd("HGET").arg("k").arg("f");
        assert_eq!(t.label_of_pipeline(&p), "pipeline");
    }
}
