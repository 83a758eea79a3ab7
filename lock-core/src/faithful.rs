//! Whether JSON keeps a value faithfully: what an idempotent function stored must come back as
//! the value it returned, or not be stored at all. JSON loses two things silently, and both
//! are found here before a value is stored:
//! - a float that is not finite (NaN, ±infinity) is written as `null`, which does not read
//!   back as a float;
//! - `Some(x)` is written as `x`, so when `x` itself is written as `null` (`Some(())`,
//!   `Some(None)`, a unit struct) it reads back as `None`: another value, with no error.
//!
//! [`same_value`] then tells whether a value read back is the one that was written, as a value
//! and not as bytes: a `HashMap` or a `HashSet` read back iterates in another order.

use serde::Serialize;
use serde::ser::{self, Impossible};

/// Why a value would not come back from JSON as it went in.
#[derive(Debug)]
pub(crate) enum Unfaithful {
    /// What JSON would lose, and how.
    Lossy(String),
    /// Not an answer: [`IsNull`] met a compound value, which is never `null`.
    Compound,
}

impl std::fmt::Display for Unfaithful {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfaithful::Lossy(why) => f.write_str(why),
            Unfaithful::Compound => f.write_str("a compound value"),
        }
    }
}

impl std::error::Error for Unfaithful {}

impl ser::Error for Unfaithful {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Unfaithful::Lossy(msg.to_string())
    }
}

/// `Ok` when JSON gives `value` back as it is; else why not. Errors of `value`'s own
/// `Serialize` are left to the JSON encoder, which reports them the same way.
///
pub(crate) fn faithful<T: Serialize + ?Sized>(value: &T) -> Result<(), Unfaithful> {
    value.serialize(Probe)
}

/// Whether `a` and `b` are the same JSON value: the same scalars (`1` is not `1.0`, nor a
/// float one ULP off), maps with the same entries in any order, and lists with the same
/// elements in any order (a `HashSet` is written as a list, in its iteration order, and a set
/// read back iterates in another). Errors are the JSON encoder's (a number out of its range).
pub(crate) fn same_value<T: Serialize + ?Sized>(a: &T, b: &T) -> serde_json::Result<bool> {
    let a = Canonical::of(serde_json::to_value(a)?);
    let b = Canonical::of(serde_json::to_value(b)?);
    Ok(a == b)
}

/// A JSON value in a form where equality ignores the order of map entries and list elements.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Canonical {
    Null,
    Bool(bool),
    /// As serde_json prints it: `1` and `1.0` differ, and so do two floats one ULP apart.
    Number(String),
    String(String),
    /// Sorted.
    Array(Vec<Canonical>),
    /// Sorted by key (keys are unique).
    Object(Vec<(String, Canonical)>),
}

impl Canonical {
    fn of(value: serde_json::Value) -> Canonical {
        use serde_json::Value;
        match value {
            Value::Null => Canonical::Null,
            Value::Bool(b) => Canonical::Bool(b),
            Value::Number(n) => Canonical::Number(n.to_string()),
            Value::String(s) => Canonical::String(s),
            Value::Array(items) => {
                let mut items: Vec<_> = items.into_iter().map(Canonical::of).collect();
                items.sort_unstable();
                Canonical::Array(items)
            }
            Value::Object(map) => {
                let mut entries: Vec<_> = map
                    .into_iter()
                    .map(|(k, v)| (k, Canonical::of(v)))
                    .collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                Canonical::Object(entries)
            }
        }
    }
}

/// Whether JSON writes `value` as `null`.
fn is_null<T: Serialize + ?Sized>(value: &T) -> Result<bool, Unfaithful> {
    match value.serialize(IsNull) {
        Err(Unfaithful::Compound) => Ok(false),
        answer => answer,
    }
}

/// Walks a value as a serializer would, writing nothing.
struct Probe;

/// Whether a value is written as JSON `null` (what `Some` around it would lose).
struct IsNull;

fn finite(v: f64) -> Result<(), Unfaithful> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Unfaithful::Lossy(format!(
            "the float {v} is not finite: JSON writes it as null"
        )))
    }
}

/// The scalar methods of a serializer, each answering `$answer` (floats and units are
/// written out where they differ).
macro_rules! scalars {
    ($answer:expr) => {
        scalars!(@each $answer; serialize_bool(bool), serialize_i8(i8), serialize_i16(i16),
            serialize_i32(i32), serialize_i64(i64), serialize_i128(i128), serialize_u8(u8),
            serialize_u16(u16), serialize_u32(u32), serialize_u64(u64), serialize_u128(u128),
            serialize_char(char), serialize_str(&str), serialize_bytes(&[u8]));
    };
    (@each $answer:expr; $($method:ident($ty:ty)),*) => {
        $(fn $method(self, _: $ty) -> Result<Self::Ok, Self::Error> { $answer })*
    };
}

/// The methods that start a compound value, each answering `$answer`.
macro_rules! compounds {
    ($answer:expr) => {
        fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Self::Error> {
            $answer
        }
        fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Self::Error> {
            $answer
        }
        fn serialize_tuple_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleStruct, Self::Error> {
            $answer
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleVariant, Self::Error> {
            $answer
        }
        fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Self::Error> {
            $answer
        }
        fn serialize_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStruct, Self::Error> {
            $answer
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStructVariant, Self::Error> {
            $answer
        }
    };
}

impl ser::Serializer for Probe {
    type Ok = ();
    type Error = Unfaithful;
    type SerializeSeq = Probe;
    type SerializeTuple = Probe;
    type SerializeTupleStruct = Probe;
    type SerializeTupleVariant = Probe;
    type SerializeMap = Probe;
    type SerializeStruct = Probe;
    type SerializeStructVariant = Probe;

    scalars!(Ok(()));

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Unfaithful> {
        Ok(())
    }

    fn serialize_f32(self, v: f32) -> Result<(), Unfaithful> {
        finite(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<(), Unfaithful> {
        finite(v)
    }

    fn serialize_none(self) -> Result<(), Unfaithful> {
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Unfaithful> {
        if is_null(value)? {
            return Err(Unfaithful::Lossy(
                "Some(x) where x is written as null (a unit, a unit struct, None): JSON reads it back as None".to_owned(),
            ));
        }
        value.serialize(Probe)
    }

    fn serialize_unit(self) -> Result<(), Unfaithful> {
        Ok(())
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), Unfaithful> {
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Unfaithful> {
        value.serialize(Probe)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), Unfaithful> {
        value.serialize(Probe)
    }

    compounds!(Ok(Probe));
}

macro_rules! each_element {
    ($($trait:ident :: $method:ident),* $(,)?) => {
        $(impl ser::$trait for Probe {
            type Ok = ();
            type Error = Unfaithful;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unfaithful> {
                value.serialize(Probe)
            }
            fn end(self) -> Result<(), Unfaithful> {
                Ok(())
            }
        })*
    };
}

each_element!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

impl ser::SerializeMap for Probe {
    type Ok = ();
    type Error = Unfaithful;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Unfaithful> {
        key.serialize(Probe)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unfaithful> {
        value.serialize(Probe)
    }
    fn end(self) -> Result<(), Unfaithful> {
        Ok(())
    }
}

macro_rules! each_field {
    ($($trait:ident),* $(,)?) => {
        $(impl ser::$trait for Probe {
            type Ok = ();
            type Error = Unfaithful;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                _: &'static str,
                value: &T,
            ) -> Result<(), Unfaithful> {
                value.serialize(Probe)
            }
            fn end(self) -> Result<(), Unfaithful> {
                Ok(())
            }
        })*
    };
}

each_field!(SerializeStruct, SerializeStructVariant);

/// Answers at the top level only: a compound value is never `null`, whatever it holds.
impl ser::Serializer for IsNull {
    type Ok = bool;
    type Error = Unfaithful;
    type SerializeSeq = Impossible<bool, Unfaithful>;
    type SerializeTuple = Impossible<bool, Unfaithful>;
    type SerializeTupleStruct = Impossible<bool, Unfaithful>;
    type SerializeTupleVariant = Impossible<bool, Unfaithful>;
    type SerializeMap = Impossible<bool, Unfaithful>;
    type SerializeStruct = Impossible<bool, Unfaithful>;
    type SerializeStructVariant = Impossible<bool, Unfaithful>;

    scalars!(Ok(false));

    fn serialize_f32(self, v: f32) -> Result<bool, Unfaithful> {
        Ok(!v.is_finite())
    }

    fn serialize_f64(self, v: f64) -> Result<bool, Unfaithful> {
        Ok(!v.is_finite())
    }

    fn serialize_none(self) -> Result<bool, Unfaithful> {
        Ok(true)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<bool, Unfaithful> {
        value.serialize(IsNull)
    }

    fn serialize_unit(self) -> Result<bool, Unfaithful> {
        Ok(true)
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<bool, Unfaithful> {
        Ok(true)
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<bool, Unfaithful> {
        Ok(false)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<bool, Unfaithful> {
        value.serialize(IsNull)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<bool, Unfaithful> {
        Ok(false)
    }

    compounds!(Err(Unfaithful::Compound));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{faithful, same_value};

    #[derive(serde::Serialize)]
    struct Unit;

    #[derive(serde::Serialize)]
    struct Receipt {
        id: u64,
        note: Option<String>,
        lines: Vec<(String, f64)>,
    }

    #[test]
    fn values_json_keeps_pass() {
        assert!(faithful(&1u32).is_ok());
        assert!(faithful(&Some(1)).is_ok());
        assert!(faithful(&None::<()>).is_ok());
        assert!(faithful(&()).is_ok());
        assert!(faithful(&Some(vec![()])).is_ok());
        assert!(faithful(&Some(Some(0))).is_ok());
        assert!(faithful(&Some(BTreeMap::<String, u8>::new())).is_ok());
        let receipt = Receipt {
            id: 7,
            note: None,
            lines: vec![("a".into(), 1.5)],
        };
        assert!(faithful(&Some(receipt)).is_ok());
    }

    #[test]
    fn values_json_would_change_are_refused() {
        assert!(faithful(&Some(())).is_err());
        assert!(faithful(&Some(None::<u32>)).is_err());
        assert!(faithful(&Some(Some(None::<u32>))).is_err());
        assert!(faithful(&Some(Unit)).is_err());
        assert!(faithful(&f64::NAN).is_err());
        assert!(faithful(&f32::INFINITY).is_err());
        assert!(faithful(&Some(f64::NEG_INFINITY)).is_err());
        assert!(faithful(&vec![Some(())]).is_err());
        let mut map = BTreeMap::new();
        map.insert("x", vec![1.0, f64::NAN]);
        assert!(faithful(&map).is_err());
    }

    #[test]
    fn same_value_ignores_the_order_of_maps_and_sets_only() {
        use std::collections::{HashMap, HashSet};
        let set: HashSet<u32> = (0..64).collect();
        let mut reversed: Vec<u32> = set.iter().copied().collect();
        reversed.reverse();
        assert!(same_value(&set.iter().collect::<Vec<_>>(), &reversed.iter().collect()).unwrap());
        let other: HashSet<u32> = reversed.into_iter().collect();
        assert!(same_value(&set, &other).unwrap());
        let map: HashMap<String, Vec<HashSet<u32>>> = (0..16)
            .map(|n| (n.to_string(), vec![set.clone()]))
            .collect();
        let mut entries: Vec<_> = map.clone().into_iter().collect();
        entries.reverse();
        let again: HashMap<String, Vec<HashSet<u32>>> = entries.into_iter().collect();
        assert!(same_value(&map, &again).unwrap());
        // Another element, another count, another number kind, one ULP off: another value.
        assert!(!same_value(&vec![1, 2], &vec![1, 3]).unwrap());
        assert!(!same_value(&vec![1, 1, 2], &vec![1, 2, 2]).unwrap());
        assert!(!same_value(&serde_json::json!(1), &serde_json::json!(1.0)).unwrap());
        let x = 0.378_050_700_362_922_76_f64;
        assert!(!same_value(&x, &f64::from_bits(x.to_bits() + 1)).unwrap());
        assert!(!same_value(&Some(1), &None).unwrap());
    }
}
