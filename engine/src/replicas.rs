//! Payments acknowledged by replicas (`--confirm-replicas N`): a confirm is
//! answered only once N replicas hold the sale, so an acknowledged sale
//! survives losing the master to a promoted replica (without it, a sale the
//! replica had not yet received is gone after the promotion: units sold come
//! back).
//!
//! `WAIT` covers only the writes of the connection it is sent on, and blocks
//! that connection until it answers. So acknowledgements run on a connection of
//! their own, never the checkout's, and in rounds: a round writes one key of
//! its own (`INCR`), which every replica applies after every write the master
//! made before it, then waits for it (`WAIT N timeout`). Every confirm that
//! finished before a round began is covered by that round, so concurrent
//! payments share one round trip instead of queueing one `WAIT` each.
//!
//! On a Redis Cluster a round runs for each slot the waiting payments wrote
//! to, at once, each `WAIT` sent to that slot's master over the rounds' own
//! cluster client: a payment waits only for the replicas of its own masters.

use std::time::Duration;

use crate::redis_conn::RedisConn;
use tokio::sync::{mpsc, oneshot};

use crate::error::EngineError;
use crate::keys::Keyspace;

/// What a round answers each waiter: the replicas that acknowledged, or why
/// the round failed.
type Answer = Result<i64, String>;

/// A payment waiting: the slots its writes went to (ignored on one node), and
/// where to send the answer.
type Waiter = (Vec<u16>, oneshot::Sender<Answer>);

/// The acknowledgement rounds' handle. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ReplicaAcks {
    waiters: mpsc::UnboundedSender<Waiter>,
    wanted: u32,
    timeout: Duration,
}

impl ReplicaAcks {
    /// Starts the rounds on `conn` (a connection used for nothing else):
    /// `wanted` replicas, each round waiting at most `timeout`.
    pub fn start(conn: RedisConn, wanted: u32, timeout: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(rounds(conn, wanted, timeout, rx));
        Self {
            waiters: tx,
            wanted,
            timeout,
        }
    }

    /// Waits until `wanted` replicas hold every write this process made before
    /// the call (on a cluster: of the masters serving `slots`, the slots the
    /// payment wrote to, so a master that lost its replica holds up only its
    /// own payments); [`EngineError::ReplicasBehind`] when fewer acknowledged
    /// within the timeout (the write stands on the master: a retry waits again).
    pub async fn wait(&self, slots: Vec<u16>) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        let behind = |acked, reason: Option<String>| EngineError::ReplicasBehind {
            wanted: self.wanted,
            acked,
            timeout_ms: self.timeout.as_millis() as u64,
            reason: reason.map(|r| format!(": {r}")).unwrap_or_default(),
        };
        if self.waiters.send((slots, tx)).is_err() {
            return Err(behind(0, Some("the acknowledgement task stopped".into())));
        }
        match rx.await {
            Ok(Ok(acked)) if acked >= i64::from(self.wanted) => Ok(()),
            Ok(Ok(acked)) => Err(behind(acked, None)),
            Ok(Err(reason)) => Err(behind(0, Some(reason))),
            Err(_) => Err(behind(0, Some("the acknowledgement task stopped".into()))),
        }
    }
}

async fn rounds(
    mut conn: RedisConn,
    wanted: u32,
    timeout: Duration,
    mut rx: mpsc::UnboundedReceiver<Waiter>,
) {
    let mut ack_keys = std::collections::HashMap::new();
    while let Some(first) = rx.recv().await {
        let mut waiters = vec![first];
        while let Ok(more) = rx.try_recv() {
            waiters.push(more);
        }
        let answers: Vec<Answer> = match &mut conn {
            RedisConn::Node(_) => {
                let answer = one_round(&mut conn, wanted, timeout).await;
                vec![answer; waiters.len()]
            }
            RedisConn::Cluster(_) => {
                let mut slots: Vec<u16> = waiters.iter().flat_map(|(s, _)| s.clone()).collect();
                slots.sort_unstable();
                slots.dedup();
                let by_slot = slot_rounds(&conn, &mut ack_keys, &slots, wanted, timeout).await;
                waiters
                    .iter()
                    .map(|(mine, _)| {
                        mine.iter()
                            .map(|s| by_slot.get(s).cloned().unwrap_or(Ok(0)))
                            .try_fold(i64::MAX, |least, a| a.map(|n| least.min(n)))
                    })
                    .collect()
            }
        };
        for ((_, waiter), answer) in waiters.into_iter().zip(answers) {
            if let Ok(acked) = answer
                && acked < i64::from(wanted)
            {
                tracing::warn!(
                    acked,
                    wanted,
                    "a payment waits for replicas that did not acknowledge in time; answering 503"
                );
            }
            let _ = waiter.send(answer);
        }
    }
}

/// One round on one master: `INCR` of the round's key, then `WAIT`, pipelined
/// on the round's own connection. The replicas that acknowledged.
async fn one_round(conn: &mut RedisConn, wanted: u32, timeout: Duration) -> Answer {
    redis::pipe()
        .cmd("INCR")
        .arg(Keyspace::ACK_MARK)
        .cmd("WAIT")
        .arg(wanted)
        .arg(timeout.as_millis() as u64)
        .query_async::<(i64, i64)>(conn)
        .await
        .map(|(_, acked)| acked)
        .map_err(|e| crate::postgres::one_line(&e.to_string()))
}

/// One round on a cluster for each of `slots`, at once: an `INCR` of a key in
/// the slot and a `WAIT`, both sent to the slot's master over the rounds' own
/// client (one connection per node, so the `WAIT` covers the `INCR`, which
/// follows every payment that master answered before). The replicas each
/// slot's round saw acknowledge.
async fn slot_rounds(
    conn: &RedisConn,
    ack_keys: &mut std::collections::HashMap<u16, String>,
    slots: &[u16],
    wanted: u32,
    timeout: Duration,
) -> std::collections::HashMap<u16, Answer> {
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
    let RedisConn::Cluster(link) = conn else {
        return std::collections::HashMap::new();
    };
    let cluster = link.current();
    let rounds = slots.iter().map(|&slot| {
        let key = ack_keys
            .entry(slot)
            .or_insert_with(|| key_in_slot(slot))
            .clone();
        let mut cluster = cluster.clone();
        async move {
            let at = || {
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                    slot,
                    SlotAddr::Master,
                )))
            };
            let round = async {
                let mut incr = redis::cmd("INCR");
                incr.arg(&key);
                cluster.route_command(incr, at()).await?;
                let mut wait = redis::cmd("WAIT");
                wait.arg(wanted).arg(timeout.as_millis() as u64);
                let acked = cluster.route_command(wait, at()).await?;
                redis::from_redis_value::<i64>(acked).map_err(redis::RedisError::from)
            };
            let answer = round
                .await
                .map_err(|e| crate::postgres::one_line(&e.to_string()));
            (slot, answer)
        }
    });
    futures_util::future::join_all(rounds)
        .await
        .into_iter()
        .collect()
}

/// A key (`hf:ack:<n>`) that hashes to `slot`: found by trying, about 16,384
/// tries at worst, once per master slot for the life of the process.
fn key_in_slot(slot: u16) -> String {
    (0_u32..)
        .map(|n| format!("hf:ack:{n}"))
        .find(|k| crate::keys::key_slot(k.as_bytes()) == slot)
        .expect("every slot has a key")
}
