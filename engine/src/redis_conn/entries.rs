//! Stream replies (`XREAD`, `XREADGROUP`, `XRANGE`, `XREVRANGE`, `XAUTOCLAIM`)
//! decoded by moving each string out of the reply.
//!
//! redis-rs's own stream types copy the whole reply before decoding it (once
//! per format they try) and put every entry's fields in a `HashMap` of
//! `Value`s. Every event is read twice (by the live feed and by the
//! write-behind), so under load that copying was about a tenth of the
//! server's CPU. Here an entry keeps its fields as written, in order, and
//! whoever reads it takes the values it wants.

use redis::{FromRedisValue, ParsingError, Value};

/// One stream entry: its id and its fields, in the order they were written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// The entry's id (`<ms>-<seq>`).
    pub id: String,
    /// Field names and raw values. Empty for an entry deleted while it was
    /// pending in a consumer group (Redis answers its fields as nil).
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    /// The value of `field` (the last one written under that name), taken out
    /// of the entry.
    pub fn take(&mut self, field: &str) -> Option<Vec<u8>> {
        self.fields
            .iter_mut()
            .rev()
            .find(|(name, _)| name == field)
            .map(|(_, value)| std::mem::take(value))
    }
}

/// One stream's entries in a read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamEntries {
    /// The stream's key.
    pub key: String,
    /// Its entries, oldest first.
    pub entries: Vec<Entry>,
}

/// An `XREAD` or `XREADGROUP` reply: the streams that had entries (none when
/// Redis answered nil).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamReads(pub Vec<StreamEntries>);

/// An `XRANGE` or `XREVRANGE` reply, in the order Redis gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryRange(pub Vec<Entry>);

/// An `XAUTOCLAIM` reply: the entries claimed, and the ids found pending but
/// gone from the stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AutoClaimed {
    /// The entries now owned by the claiming consumer.
    pub claimed: Vec<Entry>,
    /// Pending ids whose entries were deleted (trimmed).
    pub deleted: Vec<String>,
}

fn unexpected(what: &str, v: &Value) -> ParsingError {
    ParsingError::from(format!("{what} expected in a stream reply, got {v:?}"))
}

/// A string reply's bytes, moved out.
fn bytes(v: Value) -> Result<Vec<u8>, ParsingError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::VerbatimString { text, .. } => Ok(text.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        other => Err(unexpected("a string", &other)),
    }
}

/// A string reply as UTF-8 text.
fn text(v: Value) -> Result<String, ParsingError> {
    Ok(String::from_utf8(bytes(v)?)?)
}

/// An array reply's items (nil: none).
fn items(v: Value) -> Result<Vec<Value>, ParsingError> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(unexpected("an array", &other)),
    }
}

/// `[id, [field, value, …]]`.
fn entry(v: Value) -> Result<Entry, ParsingError> {
    let mut parts = items(v)?.into_iter();
    let id = text(parts.next().unwrap_or(Value::Nil))?;
    let fields = match parts.next().unwrap_or(Value::Nil) {
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(k, v)| Ok((text(k)?, bytes(v)?)))
            .collect::<Result<_, ParsingError>>()?,
        other => {
            let mut flat = items(other)?.into_iter();
            let mut fields = Vec::with_capacity(flat.len() / 2);
            while let (Some(k), Some(v)) = (flat.next(), flat.next()) {
                fields.push((text(k)?, bytes(v)?));
            }
            fields
        }
    };
    Ok(Entry { id, fields })
}

fn entries(v: Value) -> Result<Vec<Entry>, ParsingError> {
    items(v)?.into_iter().map(entry).collect()
}

impl FromRedisValue for StreamReads {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        // RESP2: [[key, entries], …]; RESP3: {key: entries, …}.
        let pairs: Vec<(Value, Value)> = match v {
            Value::Map(pairs) => pairs,
            other => items(other)?
                .into_iter()
                .map(|stream| {
                    let mut kv = items(stream)?.into_iter();
                    Ok((
                        kv.next().unwrap_or(Value::Nil),
                        kv.next().unwrap_or(Value::Nil),
                    ))
                })
                .collect::<Result<_, ParsingError>>()?,
        };
        pairs
            .into_iter()
            .map(|(key, list)| {
                Ok(StreamEntries {
                    key: text(key)?,
                    entries: entries(list)?,
                })
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

impl FromRedisValue for EntryRange {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        entries(v).map(Self)
    }
}

impl FromRedisValue for AutoClaimed {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        // [next start id, [entries…], [deleted ids…]] (the last from Redis 7).
        let mut parts = items(v)?.into_iter().skip(1);
        let claimed = entries(parts.next().unwrap_or(Value::Nil))?;
        let deleted = items(parts.next().unwrap_or(Value::Nil))?
            .into_iter()
            .map(text)
            .collect::<Result<_, _>>()?;
        Ok(Self { claimed, deleted })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn raw(id: &str, fields: &[&str]) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(fields.iter().map(|f| bulk(f)).collect()),
        ])
    }

    #[test]
    fn a_read_keeps_every_stream_entry_and_field_in_order() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                bulk("s:1"),
                Value::Array(vec![
                    raw("1-0", &["kind", "reserved", "qty", "2"]),
                    raw("1-1", &["kind", "released"]),
                ]),
            ]),
            Value::Array(vec![bulk("s:2"), Value::Array(vec![raw("5-0", &[])])]),
        ]);
        let StreamReads(streams) = StreamReads::from_redis_value(reply).unwrap();
        assert_eq!(streams.len(), 2);
        assert_eq!(streams[0].key, "s:1");
        let ids: Vec<&str> = streams[0].entries.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["1-0", "1-1"]);
        assert_eq!(
            streams[0].entries[0].fields,
            [
                ("kind".to_owned(), b"reserved".to_vec()),
                ("qty".to_owned(), b"2".to_vec())
            ]
        );
        assert_eq!(streams[1].entries[0].id, "5-0");
        assert!(streams[1].entries[0].fields.is_empty());
    }

    #[test]
    fn nil_is_no_stream_and_a_deleted_pending_entry_has_no_fields() {
        assert_eq!(
            StreamReads::from_redis_value(Value::Nil).unwrap(),
            StreamReads::default()
        );
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("s"),
            Value::Array(vec![Value::Array(vec![bulk("3-0"), Value::Nil])]),
        ])]);
        let StreamReads(streams) = StreamReads::from_redis_value(reply).unwrap();
        assert_eq!(streams[0].entries[0].id, "3-0");
        assert!(streams[0].entries[0].fields.is_empty());
    }

    #[test]
    fn resp3_maps_read_like_arrays() {
        let reply = Value::Map(vec![(
            bulk("s"),
            Value::Array(vec![Value::Array(vec![
                bulk("7-0"),
                Value::Map(vec![(bulk("sku"), bulk("A"))]),
            ])]),
        )]);
        let StreamReads(streams) = StreamReads::from_redis_value(reply).unwrap();
        assert_eq!(
            streams[0].entries[0].fields,
            [("sku".to_owned(), b"A".to_vec())]
        );
    }

    #[test]
    fn the_last_value_of_a_repeated_field_is_taken_and_binary_values_stay_raw() {
        let mut e = entry(raw("1-0", &["a", "1", "a", "2"])).unwrap();
        assert_eq!(e.take("a"), Some(b"2".to_vec()));
        assert_eq!(e.take("b"), None);
        let mut binary = entry(Value::Array(vec![
            bulk("2-0"),
            Value::Array(vec![bulk("body"), Value::BulkString(vec![0xff, 0x00])]),
        ]))
        .unwrap();
        assert_eq!(binary.take("body"), Some(vec![0xff, 0x00]));
    }

    #[test]
    fn autoclaim_gives_claimed_entries_and_deleted_ids() {
        let reply = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![raw("4-0", &["kind", "confirmed"])]),
            Value::Array(vec![bulk("2-0")]),
        ]);
        let got = AutoClaimed::from_redis_value(reply).unwrap();
        assert_eq!(got.claimed[0].id, "4-0");
        assert_eq!(got.deleted, ["2-0"]);
    }

    #[test]
    fn a_malformed_reply_is_an_error_not_a_panic() {
        assert!(StreamReads::from_redis_value(Value::Int(3)).is_err());
        assert!(EntryRange::from_redis_value(Value::Array(vec![Value::Okay])).is_err());
    }
}
