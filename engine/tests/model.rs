//! Property test: random sequences of reserve, confirm, release, expiry,
//! restock, damage (a feed's decrease while no hold is open) and rebalancing
//! against a plain in-memory model of one counter, on an
//! unsplit SKU and on one split into parts. Outcomes must equal the model's,
//! counters never go negative, and available + reserved + sold_pending - owed
//! always equals what was supplied.

use std::collections::HashMap;

use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::{
    ConfirmOutcome, Engine, HoldState, ReleaseOutcome, ReserveOutcome, ReserveRequest, SplitOutcome,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const SKU: &str = "PROP-1";

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        id: u8,
        qty: i64,
    },
    Confirm {
        id: u8,
    },
    Release {
        id: u8,
    },
    Expire {
        id: u8,
    },
    Restock {
        qty: i64,
    },
    /// Units a feed removes (damaged): applied only while no hold is open,
    /// where a split SKU's debt (which the parts' own holds pay back) cannot
    /// differ from one counter's (docs/stock-rules.md, "Split SKUs").
    Damage {
        qty: i64,
    },
    Rebalance,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..8, 1i64..4).prop_map(|(id, qty)| Op::Reserve { id, qty }),
        2 => (0u8..8).prop_map(|id| Op::Confirm { id }),
        2 => (0u8..8).prop_map(|id| Op::Release { id }),
        1 => (0u8..8).prop_map(|id| Op::Expire { id }),
        1 => (1i64..5).prop_map(|qty| Op::Restock { qty }),
        1 => (1i64..4).prop_map(|qty| Op::Damage { qty }),
        1 => Just(Op::Rebalance),
    ]
}

#[derive(Debug, Default)]
struct Model {
    supplied: i64,
    available: i64,
    /// Units a feed removed beyond what was available (no hold was open).
    owed: i64,
    reserved: i64,
    sold: i64,
    holds: HashMap<u8, (i64, HoldState)>,
    /// Ids refused for stock: qty asked and the `available` answered (a retry
    /// gets the same answer, whatever stock did since).
    refused: HashMap<u8, (i64, i64)>,
}

impl Model {
    fn end(&mut self, id: u8, state: HoldState) {
        let (qty, s) = self.holds.get_mut(&id).expect("held");
        *s = state;
        self.reserved -= *qty;
        if state == HoldState::Confirmed {
            self.sold += *qty;
        } else {
            self.available += *qty;
        }
    }
}

fn rid(id: u8) -> String {
    format!("p-{id}")
}

/// Makes hold `id` overdue (as if its time had passed) and runs the reaper.
async fn expire(engine: &Engine, redis: &mut holdfast_engine::RedisConn, id: u8) -> u64 {
    let ks = engine.keyspace();
    // The shard of the hold's part (the SKU's own when it is not split).
    let mut found = None;
    for shard in 0..ks.shards() {
        let lines: Option<String> = redis::cmd("HGET")
            .arg(ks.hold(shard, &rid(id)))
            .arg("lines")
            .query_async(redis)
            .await
            .unwrap();
        if let Some(lines) = lines {
            found = Some((shard, lines.split('=').next().unwrap_or(SKU).to_owned()));
        }
    }
    if let Some((shard, part)) = found {
        let state: String = redis::cmd("HGET")
            .arg(ks.hold(shard, &rid(id)))
            .arg("state")
            .query_async(redis)
            .await
            .unwrap();
        if state == "held" {
            redis::pipe()
                .cmd("HSET")
                .arg(ks.hold(shard, &rid(id)))
                .arg("deadline")
                .arg(0)
                .cmd("ZADD")
                .arg(ks.due(shard))
                .arg("XX")
                .arg(0)
                .arg(rid(id))
                .cmd("ZADD")
                .arg(ks.sku_holds(&part))
                .arg("XX")
                .arg(0)
                .arg(rid(id))
                .query_async::<()>(redis)
                .await
                .unwrap();
        }
    }
    engine.reap_once(100).await.unwrap().released
}

/// Runs `ops` from 5 units; with `split`, the SKU is split into that many
/// parts first (in the catalogue of its PostgreSQL).
async fn run_case(
    engine: &Engine,
    admin: &mut holdfast_engine::RedisConn,
    ops: &[Op],
    split: Option<(&sqlx::PgPool, u16)>,
) -> Result<(), TestCaseError> {
    redis::cmd("FLUSHALL")
        .query_async::<()>(admin)
        .await
        .unwrap();
    let mut m = Model {
        supplied: 5,
        available: 5,
        ..Model::default()
    };
    stock(engine, SKU, 5).await;
    if let Some((pg, parts)) = split {
        prop_assert_eq!(
            engine.set_parts(pg, SKU, parts).await.unwrap(),
            SplitOutcome::Changed { from: 1, to: parts }
        );
    }
    // A split SKU's refusal is kept in the reservation id's claim, without
    // the count it answered with.
    let replayed = |answered: i64| if split.is_some() { 0 } else { answered };
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Reserve { id, qty } => {
                let got = engine
                    .reserve(&ReserveRequest::single(rid(id), SKU, qty))
                    .await
                    .unwrap();
                match m.holds.get(&id).copied() {
                    Some((q, state)) if q == qty => prop_assert!(
                        matches!(got, ReserveOutcome::AlreadyReserved { state: s, .. } if s == state),
                        "step {step}: {got:?}"
                    ),
                    Some(_) => prop_assert!(
                        matches!(got, ReserveOutcome::Conflict { .. }),
                        "step {step}: {got:?}"
                    ),
                    None if m.refused.contains_key(&id) => {
                        let (asked, answered) = m.refused[&id];
                        if asked == qty {
                            prop_assert_eq!(
                                got,
                                ReserveOutcome::SoldOut {
                                    sku: SKU.into(),
                                    available: replayed(answered),
                                    replayed: true,
                                }
                            );
                        } else {
                            prop_assert!(
                                matches!(got, ReserveOutcome::Conflict { .. }),
                                "step {step}: {got:?}"
                            );
                        }
                    }
                    None if m.available < qty => {
                        m.refused.insert(id, (qty, m.available));
                        prop_assert_eq!(
                            got,
                            ReserveOutcome::SoldOut {
                                sku: SKU.into(),
                                available: m.available,
                                replayed: false,
                            }
                        );
                    }
                    None => {
                        m.available -= qty;
                        m.reserved += qty;
                        m.holds.insert(id, (qty, HoldState::Held));
                        // A split SKU answers with its part's count.
                        prop_assert!(
                            matches!(&got, ReserveOutcome::Reserved { available_after, .. }
                                if split.is_some() || available_after[0].1 == m.available),
                            "step {step}: {got:?}"
                        );
                    }
                }
            }
            Op::Confirm { id } => {
                let got = engine.confirm(&rid(id)).await.unwrap();
                let want = match m.holds.get(&id).map(|h| h.1) {
                    None => ConfirmOutcome::Unknown,
                    Some(HoldState::Held) => {
                        m.end(id, HoldState::Confirmed);
                        ConfirmOutcome::Confirmed
                    }
                    Some(HoldState::Confirmed) => ConfirmOutcome::AlreadyConfirmed,
                    Some(state) => ConfirmOutcome::Expired { state },
                };
                prop_assert_eq!(got, want, "step {}", step);
            }
            Op::Release { id } => {
                let got = engine.release(&rid(id)).await.unwrap();
                let want = match m.holds.get(&id).map(|h| h.1) {
                    None => ReleaseOutcome::Unknown,
                    Some(HoldState::Held) => {
                        m.end(id, HoldState::Released);
                        ReleaseOutcome::Released
                    }
                    Some(state) => ReleaseOutcome::AlreadyGone { state },
                };
                prop_assert_eq!(got, want, "step {}", step);
            }
            Op::Expire { id } => {
                let released = expire(engine, admin, id).await;
                let want = if m.holds.get(&id).map(|h| h.1) == Some(HoldState::Held) {
                    m.end(id, HoldState::Expired);
                    1
                } else {
                    0
                };
                prop_assert_eq!(released, want, "step {}", step);
            }
            Op::Restock { qty } => {
                engine
                    .apply_delta(SKU, qty, "prop", &format!("restock-{step}"))
                    .await
                    .unwrap();
                m.supplied += qty;
                let effective = m.available - m.owed + qty;
                (m.available, m.owed) = if effective < 0 {
                    (0, -effective)
                } else {
                    (effective, 0)
                };
            }
            Op::Damage { qty } => {
                if m.reserved == 0 {
                    engine
                        .apply_delta(SKU, -qty, "prop", &format!("damage-{step}"))
                        .await
                        .unwrap();
                    m.supplied -= qty;
                    // Below 0, the rest is owed: a later restock pays it first.
                    let effective = m.available - m.owed - qty;
                    (m.available, m.owed) = if effective < 0 {
                        (0, -effective)
                    } else {
                        (effective, 0)
                    };
                }
            }
            Op::Rebalance => {
                engine.rebalance(SKU).await.unwrap();
            }
        }
        let f = engine.figures(SKU).await.unwrap().unwrap();
        prop_assert!(
            f.available >= 0 && f.reserved >= 0 && f.sold_pending >= 0,
            "step {step}: {f:?}"
        );
        prop_assert_eq!(
            f.available + f.reserved + f.sold_pending - f.owed,
            m.supplied,
            "conservation at step {}",
            step
        );
        prop_assert_eq!(
            (f.available, f.reserved, f.sold_pending, f.moving, f.owed),
            (m.available, m.reserved, m.sold, 0, m.owed)
        );
    }
    Ok(())
}

#[test]
fn random_lifecycles_match_the_model_and_conserve_stock() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = TestRedis::start();
    let (engine, admin) = rt.block_on(async { (redis.engine().await, redis.connection().await) });
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
        // RedisConn clones share one connection; a clone per case is free.
        rt.block_on(run_case(&engine, &mut admin.clone(), &ops, None))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn random_lifecycles_on_a_split_sku_match_the_one_counter_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = TestRedis::start();
    let (engine, admin, pg) = rt.block_on(async {
        let (pg, _) = holdfast_engine::testkit::fresh_database("holdfast_model_split").await;
        holdfast_engine::testkit::add_sku(&pg, SKU, 5).await;
        (redis.engine().await, redis.connection().await, pg)
    });
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let result = runner.run(
        &(prop::collection::vec(op(), 1..40), 2u16..6),
        |(ops, parts)| {
            rt.block_on(run_case(
                &engine,
                &mut admin.clone(),
                &ops,
                Some((&pg, parts)),
            ))
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
