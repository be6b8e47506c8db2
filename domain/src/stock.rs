//! The rules over a SKU's live counters: the conservation equation and the stock
//! state a shopper or merchandiser sees.

use serde::{Deserialize, Serialize};

/// A SKU's counters as Redis holds them, read together. `available` is `None`
/// when the SKU was never warmed (or Redis lost it); the others read 0 when absent.
///
/// The conservation equation: `available + moving + reserved + sold_pending -
/// owed = on_hand` once every event is written behind. `owed` counts held units
/// a feed removed (they exist in holds but not on the shelf); `moving`, units
/// between two parts of a split SKU (0 for any other).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Units a shopper can reserve now; `None`: not warmed.
    pub available: Option<i64>,
    /// Units in open holds.
    pub reserved: i64,
    /// Units sold in Redis and not yet taken out by the write-behind.
    pub sold_pending: i64,
    /// Units the write-behind has taken out of `sold_pending` since warm-up.
    pub settled: i64,
    /// Held units that no longer exist (a feed lowered stock under open holds).
    pub owed: i64,
    /// Feed movements Redis applied since warm-up (summed), to compare with
    /// [`Recorded::fed_recorded`]: the difference is in flight.
    pub fed: i64,
    /// Units on their way between two parts of a split SKU: neither available
    /// nor held for that moment.
    #[serde(default)]
    pub moving: i64,
    /// How many parts the SKU is split into in Redis (1: not split); a split
    /// SKU's counters are its parts' together.
    #[serde(default)]
    pub parts: u16,
    /// The SKU's parts are being changed (its stock on its way between
    /// parts): its figures are not the SKU's, and nothing is measured or
    /// corrected on them until the change is done.
    #[serde(default)]
    pub changing: bool,
}

/// What PostgreSQL has recorded for a SKU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// Units on hand.
    pub on_hand: i64,
    /// Units recorded as sold.
    pub sold_recorded: i64,
    /// Feed movements recorded (receipts and adjustments, summed).
    pub fed_recorded: i64,
}

impl Counters {
    /// What `available - owed` must be for a SKU whose system of record says `pg`.
    ///
    /// The conservation equation,
    /// `available + moving + reserved + sold_pending - owed = on_hand`
    /// (`moving`: units between two parts of a split SKU), holds once every event is written behind. With events in flight:
    /// sales PostgreSQL has recorded (lowering `on_hand`) that Redis has not yet
    /// settled out of `sold_pending` are counted twice, so they are added back
    /// (`sold_recorded - settled`); feed movements Redis applied that PostgreSQL
    /// has not recorded yet are added (`fed - fed_recorded`). A negative result is
    /// owed, never available.
    pub fn expected_available(&self, pg: &Recorded) -> i64 {
        pg.on_hand - self.reserved - self.sold_pending - self.moving
            + (pg.sold_recorded - self.settled)
            + (self.fed - pg.fed_recorded)
    }

    /// `available - owed` minus what the equation expects (positive: units that
    /// do not exist are sellable; negative: units are stranded). `None` when not
    /// warmed.
    /// `None` too while the SKU's parts are being changed.
    pub fn drift(&self, pg: &Recorded) -> Option<i64> {
        if self.changing {
            return None;
        }
        self.available
            .map(|a| a - self.owed - self.expected_available(pg))
    }

    /// What only a correction or a warm-up changes of the counters: their
    /// drift against an empty record,
    /// `available + moving + reserved + sold_pending - owed + settled - fed`.
    /// A reservation, payment, release, expiry, settle, feed or late event
    /// moves units between its terms and keeps the sum, as a sale or a feed
    /// recorded keeps PostgreSQL's side of the equation; so a drift measured
    /// ([`Counters::drift`]) still holds while this is unchanged: a
    /// correction checks it (`lua/correct.lua`), not the fields shoppers keep
    /// moving. `None` when not warmed.
    pub fn conserved(&self) -> Option<i64> {
        self.available
            .map(|a| a - self.owed - self.expected_available(&Recorded::default()))
    }
}

/// How a SKU's stock reads to a shopper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StockState {
    /// Not on sale: never warmed, or unknown to Holdfast.
    Unknown,
    /// Nothing left to reserve.
    SoldOut,
    /// At or under the SKU's low-stock threshold.
    Low,
    /// Plenty.
    InStock,
}

impl StockState {
    /// The state of a SKU with `available` units (`None`: not warmed) and a
    /// low-stock `threshold`.
    pub fn of(available: Option<i64>, threshold: i64) -> Self {
        match available {
            None => Self::Unknown,
            Some(a) if a <= 0 => Self::SoldOut,
            Some(a) if a <= threshold => Self::Low,
            Some(_) => Self::InStock,
        }
    }

    /// The name the badge API sends (`in_stock`, `low`, `sold_out`, `unknown`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::SoldOut => "sold_out",
            Self::Low => "low",
            Self::InStock => "in_stock",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(on_hand: i64, sold_recorded: i64, fed_recorded: i64) -> Recorded {
        Recorded {
            on_hand,
            sold_recorded,
            fed_recorded,
        }
    }

    #[test]
    fn equation_counts_events_in_flight_once() {
        let c = Counters {
            available: Some(5),
            reserved: 3,
            sold_pending: 2,
            ..Counters::default()
        };
        assert_eq!(c.drift(&pg(10, 0, 0)), Some(0));
        // PostgreSQL recorded the two sales (on_hand 8) before Redis settled them.
        assert_eq!(c.drift(&pg(8, 2, 0)), Some(0));
        assert_eq!(Counters::default().drift(&pg(10, 0, 0)), None);
        // A feed took on_hand to 0 under 3 held units: 3 are owed, no drift.
        let owed = Counters {
            available: Some(0),
            reserved: 3,
            owed: 3,
            ..Counters::default()
        };
        assert_eq!(owed.drift(&pg(0, 0, 0)), Some(0));
        // A receipt of 4 applied in Redis, not yet in PostgreSQL: in flight, no drift.
        let fed = Counters {
            available: Some(14),
            fed: 4,
            ..Counters::default()
        };
        assert_eq!(fed.drift(&pg(10, 0, 0)), Some(0));
        assert_eq!(fed.drift(&pg(14, 0, 4)), Some(0));
        // Two units on their way between parts of a split SKU: no drift.
        let moving = Counters {
            available: Some(8),
            moving: 2,
            parts: 4,
            ..Counters::default()
        };
        assert_eq!(moving.drift(&pg(10, 0, 0)), Some(0));
    }

    #[test]
    fn only_a_correction_changes_what_is_conserved() {
        let start = Counters {
            available: Some(10),
            ..Counters::default()
        };
        let step = |f: &dyn Fn(&mut Counters)| {
            let mut c = start;
            f(&mut c);
            c
        };
        let kept = [
            // A reservation of 3, then its payment, then the write-behind's settle.
            step(&|c| (c.available, c.reserved) = (Some(7), 3)),
            step(&|c| (c.available, c.sold_pending) = (Some(7), 3)),
            step(&|c| (c.available, c.settled) = (Some(7), 3)),
            // A feed taking 12 off under 3 held units: 0 on sale, 2 owed.
            step(&|c| (c.available, c.reserved, c.owed, c.fed) = (Some(0), 3, 5, -12)),
            // Two units leaving for another part of a split SKU.
            step(&|c| (c.available, c.moving) = (Some(8), 2)),
        ];
        for c in kept {
            assert_eq!(c.conserved(), start.conserved(), "{c:?}");
        }
        let corrected = step(&|c| c.available = Some(9));
        assert_eq!(corrected.conserved(), Some(9));
        assert_eq!(Counters::default().conserved(), None);
    }

    #[test]
    fn states() {
        assert_eq!(StockState::of(None, 5), StockState::Unknown);
        assert_eq!(StockState::of(Some(0), 5), StockState::SoldOut);
        assert_eq!(StockState::of(Some(5), 5), StockState::Low);
        assert_eq!(StockState::of(Some(6), 5), StockState::InStock);
    }
}
