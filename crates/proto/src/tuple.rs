//! The tuple space (docs/tuples.md): tuples of typed values that programs write, read and
//! take by template, kept durably by the servers beside the files (PXFS's meta-space).
//!
//! A tuple lives on one server: the home of the hash of its first field
//! ([`Value::space_key`]), so a template must give its first field exactly, and every tuple
//! that can match it is on the server the template's first field names. Within that server
//! the oldest matching tuple is the one read or taken.

use crate::msg::Timestamp;
use serde::{Deserialize, Serialize};

/// Fields a tuple or template may have, at most.
pub const FIELDS_MAX: usize = 64;
/// Bytes of a tuple's values, at most (strings and byte strings counted by their length,
/// numbers as 8): 960 KiB, so that a tuple and its encoding stay inside a frame and a stored
/// record (1 MiB at most, `RECORD_LIMIT` in the server).
pub const TUPLE_BYTES_MAX: usize = 960 << 10;

/// One value of a tuple.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Value {
    Int(i64),
    Str(String),
    Bytes(Vec<u8>),
}

/// The type of a [`Value`], for typed wildcards (Linda's formal fields: "any integer").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ValueKind {
    Int,
    Str,
    Bytes,
}

impl Value {
    pub fn kind(&self) -> ValueKind {
        match self {
            Value::Int(_) => ValueKind::Int,
            Value::Str(_) => ValueKind::Str,
            Value::Bytes(_) => ValueKind::Bytes,
        }
    }

    /// Bytes this value counts against [`TUPLE_BYTES_MAX`].
    pub fn size(&self) -> usize {
        match self {
            Value::Int(_) => 8,
            Value::Str(s) => s.len(),
            Value::Bytes(b) => b.len(),
        }
    }

    /// The value as the bytes its placement is hashed from: a type byte then the value
    /// (an integer big-endian), so that `1` and `"1"` are different keys. **Stable
    /// forever**: stored tuples are found again only if every version places them alike.
    pub fn key_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + self.size());
        match self {
            Value::Int(n) => {
                out.push(b'i');
                out.extend_from_slice(&n.to_be_bytes());
            }
            Value::Str(s) => {
                out.push(b's');
                out.extend_from_slice(s.as_bytes());
            }
            Value::Bytes(b) => {
                out.push(b'b');
                out.extend_from_slice(b);
            }
        }
        out
    }
}

impl std::fmt::Display for Value {
    /// The CLI's notation (docs/tuples.md): integers as numbers, strings quoted when they
    /// would read back as something else, byte strings as `x:` and hex.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Str(s) if Value::parse(s) == Value::Str(s.clone()) && !s.is_empty() => write!(f, "{s}"),
            Value::Str(s) => write!(f, "s:{s}"),
            Value::Bytes(b) => {
                write!(f, "x:")?;
                b.iter().try_for_each(|x| write!(f, "{x:02x}"))
            }
        }
    }
}

impl Value {
    /// A value in the CLI's notation: `s:TEXT` a string, `x:HEX` bytes, `i:N` or a number
    /// an integer, anything else a string.
    pub fn parse(text: &str) -> Value {
        if let Some(s) = text.strip_prefix("s:") {
            return Value::Str(s.to_string());
        }
        if let Some(h) = text.strip_prefix("x:") {
            if let Some(b) = hex(h) {
                return Value::Bytes(b);
            }
        }
        let n = text.strip_prefix("i:").unwrap_or(text);
        match n.parse::<i64>() {
            Ok(n) => Value::Int(n),
            Err(_) => Value::Str(text.to_string()),
        }
    }
}

fn hex(h: &str) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok()).collect()
}

/// One field of a template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Field {
    /// Matches exactly this value.
    Is(Value),
    /// Matches any value of this type.
    AnyOf(ValueKind),
    /// Matches any value.
    Any,
}

impl Field {
    fn matches(&self, v: &Value) -> bool {
        match self {
            Field::Is(x) => x == v,
            Field::AnyOf(k) => v.kind() == *k,
            Field::Any => true,
        }
    }

    /// A field in the CLI's notation: `?` any value, `?int`, `?str`, `?bytes` any value of
    /// that type, else a value ([`Value::parse`]).
    pub fn parse(text: &str) -> Field {
        match text {
            "?" => Field::Any,
            "?int" => Field::AnyOf(ValueKind::Int),
            "?str" => Field::AnyOf(ValueKind::Str),
            "?bytes" => Field::AnyOf(ValueKind::Bytes),
            _ => Field::Is(Value::parse(text)),
        }
    }
}

/// A tuple: one or more values; the first places it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tuple(pub Vec<Value>);

impl Tuple {
    /// Why this tuple cannot be stored, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.0.is_empty() {
            return Err("a tuple needs at least one field".into());
        }
        if self.0.len() > FIELDS_MAX {
            return Err(format!("a tuple has at most {FIELDS_MAX} fields, not {}", self.0.len()));
        }
        let bytes: usize = self.0.iter().map(Value::size).sum();
        if bytes > TUPLE_BYTES_MAX {
            return Err(format!("a tuple holds at most {TUPLE_BYTES_MAX} bytes, not {bytes}"));
        }
        Ok(())
    }

    /// The first field: what places the tuple. Checked tuples have one.
    pub fn first(&self) -> Option<&Value> {
        self.0.first()
    }
}

impl std::fmt::Display for Tuple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(")?;
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{v}")?;
        }
        write!(f, ")")
    }
}

/// A template: a tuple matches when it has as many fields and each field matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template(pub Vec<Field>);

impl Template {
    /// Why this template cannot be used, if it cannot: it needs a first field given exactly
    /// (it names the server holding every tuple that can match).
    pub fn check(&self) -> Result<(), String> {
        match self.0.first() {
            None => return Err("a template needs at least one field".into()),
            Some(Field::Is(_)) => {}
            Some(_) => return Err("a template's first field must be a value, not a wildcard".into()),
        }
        if self.0.len() > FIELDS_MAX {
            return Err(format!("a template has at most {FIELDS_MAX} fields, not {}", self.0.len()));
        }
        let bytes: usize = self.0.iter().map(|f| if let Field::Is(v) = f { v.size() } else { 0 }).sum();
        if bytes > TUPLE_BYTES_MAX {
            return Err(format!("a template holds at most {TUPLE_BYTES_MAX} bytes, not {bytes}"));
        }
        Ok(())
    }

    /// The first field's value, when given exactly.
    pub fn first(&self) -> Option<&Value> {
        match self.0.first() {
            Some(Field::Is(v)) => Some(v),
            _ => None,
        }
    }

    pub fn matches(&self, t: &Tuple) -> bool {
        self.0.len() == t.0.len() && self.0.iter().zip(&t.0).all(|(f, v)| f.matches(v))
    }

    /// The template matching exactly this tuple.
    pub fn exactly(t: &Tuple) -> Template {
        Template(t.0.iter().cloned().map(Field::Is).collect())
    }
}

/// An action registered with a write (PXFS's actions, in the one form checkpoints need):
/// once the write is in, when `count` matches at least `reaches` tuples and no tuple equal
/// to `write` is there yet, `write` is written too, in the same atomic step. Both templates
/// and the tuple must have the write's first field (they live on its server).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trigger {
    pub count: Template,
    pub reaches: u32,
    pub write: Tuple,
}

impl Trigger {
    /// Why this trigger cannot go with a write of `tuple`, if it cannot.
    pub fn check(&self, tuple: &Tuple) -> Result<(), String> {
        self.count.check()?;
        self.write.check()?;
        if self.count.first() != tuple.first() || self.write.first() != tuple.first() {
            return Err("a trigger's template and tuple must have the written tuple's first field".into());
        }
        Ok(())
    }
}

/// What happened to a tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TupleEventKind {
    Written,
    Taken,
}

/// Event kinds a watch asks for, as bits.
pub const WATCH_WRITTEN: u8 = 1;
pub const WATCH_TAKEN: u8 = 2;

impl TupleEventKind {
    pub fn bit(self) -> u8 {
        match self {
            TupleEventKind::Written => WATCH_WRITTEN,
            TupleEventKind::Taken => WATCH_TAKEN,
        }
    }
}

/// One event of a server's tuple log: `seq` counts the server's events from 1, with no gap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TupleEvent {
    pub seq: u64,
    pub kind: TupleEventKind,
    pub tuple: Tuple,
    /// Who wrote or took it.
    pub uid: u32,
    /// When, by the server's clock.
    pub at: Timestamp,
}

/// Answer to `TupleWatch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TupleEvents {
    /// Matching events after the cursor, oldest first.
    pub events: Vec<TupleEvent>,
    /// The cursor to continue from: the last event looked at (matching or not).
    pub next: u64,
    /// Events after the cursor were dropped from the server's log before they were read
    /// (it keeps the newest 65,536: docs/tuples.md): the watcher missed some.
    pub lost: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[&str]) -> Tuple {
        Tuple(v.iter().map(|s| Value::parse(s)).collect())
    }
    fn tpl(v: &[&str]) -> Template {
        Template(v.iter().map(|s| Field::parse(s)).collect())
    }

    #[test]
    fn templates_match_by_value_type_and_arity() {
        let tuple = t(&["ckpt", "7", "x:00ff", "s:12"]);
        assert_eq!(tuple.0[1], Value::Int(7));
        assert_eq!(tuple.0[2], Value::Bytes(vec![0, 255]));
        assert_eq!(tuple.0[3], Value::Str("12".into()));
        assert!(tpl(&["ckpt", "?", "?", "?"]).matches(&tuple));
        assert!(tpl(&["ckpt", "?int", "?bytes", "?str"]).matches(&tuple));
        assert!(tpl(&["ckpt", "7", "x:00ff", "s:12"]).matches(&tuple));
        assert!(!tpl(&["ckpt", "?str", "?", "?"]).matches(&tuple), "7 is an integer");
        assert!(!tpl(&["ckpt", "7", "x:00ff", "12"]).matches(&tuple), "12 is not \"12\"");
        assert!(!tpl(&["ckpt", "?", "?"]).matches(&tuple), "arity");
        assert!(!tpl(&["other", "?", "?", "?"]).matches(&tuple));
        assert!(Template::exactly(&tuple).matches(&tuple));
    }

    #[test]
    fn the_notation_reads_back() {
        for s in ["ckpt", "-3", "s:-3", "x:", "x:0a0b", "s:", "s:x:1", "s:?", "hello world"] {
            let v = Value::parse(s);
            assert_eq!(Value::parse(&v.to_string()), v, "{s}");
        }
        assert_eq!(Value::parse("x:zz"), Value::Str("x:zz".into()), "bad hex is text");
        assert_eq!(Value::parse("i:5"), Value::Int(5));
    }

    #[test]
    fn placement_keys_tell_types_apart() {
        assert_ne!(Value::Int(1).key_bytes(), Value::Str("1".into()).key_bytes());
        assert_eq!(Value::Str("ab".into()).key_bytes(), b"sab");
    }

    #[test]
    fn bad_tuples_and_templates_are_refused() {
        assert!(Tuple(vec![]).check().is_err());
        assert!(Tuple(vec![Value::Int(0); FIELDS_MAX + 1]).check().is_err());
        assert!(Tuple(vec![Value::Bytes(vec![0; TUPLE_BYTES_MAX + 1])]).check().is_err());
        assert!(tpl(&["?", "1"]).check().is_err(), "wildcard first");
        assert!(tpl(&["?int"]).check().is_err());
        assert!(Template(vec![]).check().is_err());
        assert!(tpl(&["a", "?"]).check().is_ok());
    }
}
