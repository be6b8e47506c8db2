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

use std::time::Duration;

use crate::redis_conn::RedisConn;
use tokio::sync::{mpsc, oneshot};

use crate::error::EngineError;
use crate::keys::Keyspace;

/// What a round answers each waiter: the replicas that acknowledged, or why
/// the round failed.
type Answer = Result<i64, String>;

/// The acknowledgement rounds' handle. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ReplicaAcks {
    waiters: mpsc::UnboundedSender<oneshot::Sender<Answer>>,
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
    /// the call; [`EngineError::ReplicasBehind`] when fewer acknowledged within
    /// the timeout (the write stands on the master: a retry waits again).
    pub async fn wait(&self) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        let behind = |acked, reason: Option<String>| EngineError::ReplicasBehind {
            wanted: self.wanted,
            acked,
            timeout_ms: self.timeout.as_millis() as u64,
            reason: reason.map(|r| format!(": {r}")).unwrap_or_default(),
        };
        if self.waiters.send(tx).is_err() {
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
    mut rx: mpsc::UnboundedReceiver<oneshot::Sender<Answer>>,
) {
    while let Some(first) = rx.recv().await {
        let mut waiters = vec![first];
        while let Ok(more) = rx.try_recv() {
            waiters.push(more);
        }
        let reply: redis::RedisResult<(i64, i64)> = redis::pipe()
            .cmd("INCR")
            .arg(Keyspace::ACK_MARK)
            .cmd("WAIT")
            .arg(wanted)
            .arg(timeout.as_millis() as u64)
            .query_async(&mut conn)
            .await;
        let answer: Answer = reply
            .map(|(_, acked)| acked)
            .map_err(|e| crate::postgres::one_line(&e.to_string()));
        if let Ok(acked) = answer
            && acked < i64::from(wanted)
        {
            tracing::warn!(
                acked,
                wanted,
                "payments wait for replicas that did not acknowledge in time; answering 503"
            );
        }
        for waiter in waiters {
            let _ = waiter.send(answer.clone());
        }
    }
}
