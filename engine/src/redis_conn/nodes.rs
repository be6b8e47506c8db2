//! Direct connections to a Redis Cluster's nodes, one per address, outside the
//! cluster client, for the failover watch ([`crate::failover`]).
//!
//! The cluster client routes by its own slot map: right after a failover that
//! map can still name the old master, and a client was seen to time out on it
//! for seconds (a graceful `CLUSTER FAILOVER`: one server of three noticed the
//! move 7.6 s late, selling on the moved shards meanwhile). The watch asks the
//! nodes themselves instead: every known node at once, each with a short
//! timeout, the first answer in the order the nodes are known taken. The
//! known nodes are the seed URLs at first, then every master and replica the
//! last `CLUSTER SLOTS` named. Each node's URL is the first seed's with its
//! host and port (the same user, password and TLS settings).

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue, Value};

/// Longest wait for one node to connect or answer.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// A node's address as the cluster announces it.
pub type Address = (String, u16);

/// Direct connections to a cluster's nodes.
pub struct Nodes {
    /// The first seed URL, whose host and port are replaced per node.
    template: String,
    /// Every node known, seeds first.
    known: Vec<Address>,
    /// Open connections by address (dropped when they fail).
    conns: std::sync::Mutex<HashMap<Address, MultiplexedConnection>>,
}

impl Nodes {
    /// The nodes of the cluster that `url` (comma-separated seed URLs) names.
    pub fn new(url: &str) -> Self {
        let seeds: Vec<&str> = url.split(',').map(str::trim).collect();
        let known = seeds
            .iter()
            .filter_map(|s| url::Url::parse(s).ok())
            .filter_map(|u| Some((u.host_str()?.to_owned(), u.port().unwrap_or(6379))))
            .collect();
        Self {
            template: seeds.first().copied().unwrap_or_default().to_owned(),
            known,
            conns: std::sync::Mutex::default(),
        }
    }

    /// Runs `cmd` on the node at `address`, or `None` when it cannot be
    /// reached or does not answer within [`NODE_TIMEOUT`].
    pub async fn query<T: FromRedisValue>(&self, address: &Address, cmd: &Cmd) -> Option<T> {
        let open = self.conns().get(address).cloned();
        let mut conn = match open {
            Some(conn) => conn,
            None => {
                let conn = self.connect(address).await?;
                self.conns().insert(address.clone(), conn.clone());
                conn
            }
        };
        match tokio::time::timeout(NODE_TIMEOUT, cmd.query_async::<T>(&mut conn)).await {
            Ok(Ok(value)) => Some(value),
            _ => {
                self.conns().remove(address);
                None
            }
        }
    }

    /// `CLUSTER SLOTS` as the first node that answers sees it (every known
    /// node asked at once; the first answer in the order they are known
    /// taken); the nodes it names are known from then on.
    pub async fn cluster_slots(&mut self) -> Option<Vec<Value>> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let replies: Vec<Option<Vec<Value>>> = futures_util::future::join_all(
            self.known.iter().map(|address| self.query(address, &cmd)),
        )
        .await;
        let reply = replies.into_iter().flatten().next()?;
        let mut known: Vec<Address> = reply.iter().flat_map(node_addresses).collect();
        known.sort();
        known.dedup();
        if !known.is_empty() {
            self.known = known;
        }
        Some(reply)
    }

    /// The open connections, locked for a moment (never across an await).
    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<Address, MultiplexedConnection>> {
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A connection to the node at `address`, with the first seed's settings.
    async fn connect(&self, address: &Address) -> Option<MultiplexedConnection> {
        let mut url = url::Url::parse(&self.template).ok()?;
        url.set_host(Some(&address.0)).ok()?;
        url.set_port(Some(address.1)).ok()?;
        let client = super::client(url.as_str()).ok()?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(NODE_TIMEOUT))
            .set_response_timeout(Some(NODE_TIMEOUT));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .ok()
    }
}

/// The addresses of the master and replicas in one `CLUSTER SLOTS` range.
fn node_addresses(range: &Value) -> Vec<Address> {
    let Value::Array(parts) = range else {
        return Vec::new();
    };
    parts
        .iter()
        .skip(2)
        .filter_map(|node| {
            let Value::Array(node) = node else {
                return None;
            };
            let host: String = redis::from_redis_value_ref(node.first()?).ok()?;
            let port: u16 = redis::from_redis_value_ref(node.get(1)?).ok()?;
            Some((host, port))
        })
        .collect()
}
