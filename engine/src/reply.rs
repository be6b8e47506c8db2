//! Reading the arrays the Lua scripts return: a tag, then positional values.

use redis::Value;

use crate::error::EngineError;
use crate::model::HoldState;

/// A script's reply: `{tag, value, value, …}`.
pub(crate) struct Reply(Vec<Value>);

impl Reply {
    pub(crate) fn new(values: Vec<Value>) -> Self {
        Self(values)
    }

    /// A replayed answer (`{'replayed', tag, …}`) as the answer itself, and
    /// whether it was one.
    pub(crate) fn unwrap_replay(self) -> (Self, bool) {
        let replayed = self.0.first().is_some_and(|v| {
            redis::from_redis_value_ref::<String>(v).is_ok_and(|t| t == "replayed")
        });
        if replayed {
            (Self(self.0.into_iter().skip(1).collect()), true)
        } else {
            (self, false)
        }
    }

    fn get(&self, i: usize) -> Result<&Value, EngineError> {
        self.0.get(i).ok_or_else(|| {
            EngineError::UnexpectedReply(format!("reply has no element {i}: {:?}", self.0))
        })
    }

    /// The first element, naming the outcome.
    pub(crate) fn tag(&self) -> Result<String, EngineError> {
        self.text(0)
    }

    /// Element `i` as text.
    /// Whether confirm's or release's script did not find the hold it was
    /// given (`unknown`, or `mismatch`: another hold under the id), so nothing
    /// moved and the caller should look the hold up.
    pub(crate) fn is_miss(&self) -> Result<bool, EngineError> {
        Ok(matches!(self.tag()?.as_str(), "unknown" | "mismatch"))
    }

    pub(crate) fn text(&self, i: usize) -> Result<String, EngineError> {
        redis::from_redis_value_ref(self.get(i)?)
            .map_err(|e| EngineError::UnexpectedReply(format!("element {i}: {e}")))
    }

    /// Element `i` as an integer (Lua numbers arrive as integers or numeric strings).
    pub(crate) fn int(&self, i: usize) -> Result<i64, EngineError> {
        redis::from_redis_value_ref(self.get(i)?)
            .map_err(|e| EngineError::UnexpectedReply(format!("element {i}: {e}")))
    }

    /// Element `i` as a hold state.
    pub(crate) fn state(&self, i: usize) -> Result<HoldState, EngineError> {
        let s = self.text(i)?;
        HoldState::parse(&s)
            .ok_or_else(|| EngineError::UnexpectedReply(format!("hold state '{s}'")))
    }
}
