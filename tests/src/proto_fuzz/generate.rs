//! proptest strategies for any protobuf message, built from its descriptor:
//! every field of every kind, scalars biased to edge values, strings from a
//! fixed list of tricky ones plus the test's own dictionary (ids of things it
//! created, so that calls reach past "not found"), enums with unknown
//! numbers, repeated fields and maps, oneofs (none or one arm) and nested
//! messages down to a depth bound.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::Union;
use prost_reflect::{
    DynamicMessage, EnumDescriptor, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    ReflectMessage, Value,
};

/// Nested messages deeper than this are left unset (lists of them empty),
/// so recursive message types still give finite strategies.
pub const MAX_DEPTH: u32 = 4;

/// How often a field (or a oneof) is set at all.
const SET_PROBABILITY: f64 = 0.75;

/// One generated request. Its `Debug` is cut short, so that a failure
/// report stays readable even when a field holds a megabyte.
#[derive(Clone)]
pub struct Case(pub DynamicMessage);

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        render_message(&self.0, &mut out);
        f.write_str(&clip(&out, 4000))
    }
}

/// `Type { field: value, … }` with the set fields only; long strings are
/// shown by their start and length.
fn render_message(message: &DynamicMessage, out: &mut String) {
    out.push_str(message.descriptor().name());
    out.push_str(" {");
    for (i, (field, value)) in message.fields().enumerate() {
        out.push_str(if i == 0 { " " } else { ", " });
        out.push_str(field.name());
        out.push_str(": ");
        render_value(value, out);
    }
    out.push_str(" }");
}

fn render_value(value: &Value, out: &mut String) {
    match value {
        Value::String(s) if s.len() > 80 => {
            let start: String = s.chars().take(16).collect();
            out.push_str(&format!(
                "{start:?}… ({} chars, {} bytes)",
                s.chars().count(),
                s.len()
            ));
        }
        Value::Message(m) => render_message(m, out),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_value(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&format!("{other:?}")),
    }
}

/// `text` cut to at most `max` bytes, on a char boundary, marked when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// Strings every service should be ready for: empty, blank, control and
/// non-ASCII characters, malformed and boundary keys and ids, JSON that is
/// valid, invalid or full of extreme numbers.
const TRICKY_STRINGS: &[&str] = &[
    "",
    " ",
    "\0",
    "a\0b",
    "\u{7f}",
    "\n",
    "\t x",
    "é",
    "😀",
    "\u{202e}",
    "\u{feff}",
    "main",
    " main",
    "main ",
    "global",
    "agent:",
    "agent:main",
    "agent:main:",
    "agent:main:main",
    "agent::x",
    "agent:-x:y",
    "agent:a b:c",
    "AGENT:Ops:thread:42",
    "current",
    "00000000-0000-0000-0000-000000000000",
    "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9",
    "not-a-uuid",
    "user",
    "assistant",
    "stop",
    "{}",
    "[]",
    "null",
    "1",
    "{",
    "\"x\"",
    r#"[{"type":"text","text":"hi"}]"#,
    r#"{"input_tokens":18446744073709551615}"#,
    r#"{"paceMs":18446744073709551615}"#,
    r#"{"chunks":18446744073709551615,"paceMs":1}"#,
    r#"{"chunks":0,"paceMs":0}"#,
    r#"{"paceMs":-1}"#,
    r#"{"a":1e999}"#,
    r#"{"fail":"boom","failKind":"rate_limit","paceMs":1}"#,
    r#"{"ignoreCancel":true,"paceMs":1}"#,
    r#"{"toolCall":true,"paceMs":1}"#,
    r#"{"temperature":1e308,"maxTokens":18446744073709551615}"#,
];

/// Lengths at and just past common limits, and far past them.
const LONG_LENGTHS: &[usize] = &[64, 65, 256, 257, 512, 513, 1024, 65_537, 1_048_577];

/// Half of the strings come from the dictionary (when there is one), so
/// that calls name what exists; the rest are tricky, id-like, arbitrary or
/// long.
fn strings(dictionary: &Arc<[String]>) -> BoxedStrategy<String> {
    let tricky: Vec<String> = TRICKY_STRINGS.iter().map(|s| (*s).to_owned()).collect();
    let long = (select(LONG_LENGTHS), select(&['x', 'é', '😀', ' '][..]))
        .prop_map(|(n, c)| std::iter::repeat_n(c, n).collect::<String>());
    let others = prop_oneof![
        3 => select(tricky),
        1 => "[a-zA-Z0-9:_.-]{1,16}",
        1 => any::<String>(),
        1 => long,
    ];
    if dictionary.is_empty() {
        return others.boxed();
    }
    prop_oneof![1 => select(dictionary.to_vec()), 1 => others].boxed()
}

fn u64s() -> BoxedStrategy<u64> {
    let edges = [
        0,
        1,
        2,
        1000,
        1001,
        60_000,
        u64::from(u32::MAX),
        u64::from(u32::MAX) + 1,
        i64::MAX as u64,
        i64::MAX as u64 + 1,
        u64::MAX - 1,
        u64::MAX,
    ];
    prop_oneof![3 => select(edges.to_vec()), 2 => 0u64..16, 1 => any::<u64>()].boxed()
}

fn i64s() -> BoxedStrategy<i64> {
    let edges = [
        0,
        1,
        -1,
        1_700_000_000_000,
        -1_700_000_000_000,
        i64::from(i32::MIN),
        i64::from(i32::MAX),
        i64::MIN,
        i64::MIN + 1,
        i64::MAX - 1,
        i64::MAX,
    ];
    prop_oneof![3 => select(edges.to_vec()), 2 => -4i64..16, 1 => any::<i64>()].boxed()
}

fn u32s() -> BoxedStrategy<u32> {
    let edges = [
        0,
        1,
        2,
        256,
        257,
        1000,
        1001,
        3_000_000,
        3_000_001,
        i32::MAX as u32,
        i32::MAX as u32 + 1,
        u32::MAX - 1,
        u32::MAX,
    ];
    prop_oneof![3 => select(edges.to_vec()), 2 => 0u32..16, 1 => any::<u32>()].boxed()
}

fn i32s() -> BoxedStrategy<i32> {
    let edges = [0, 1, -1, i32::MIN, i32::MIN + 1, i32::MAX - 1, i32::MAX];
    prop_oneof![3 => select(edges.to_vec()), 2 => -4i32..16, 1 => any::<i32>()].boxed()
}

fn f64s() -> BoxedStrategy<f64> {
    let edges = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MIN,
        f64::MAX,
        f64::MIN_POSITIVE,
    ];
    prop_oneof![3 => select(edges.to_vec()), 1 => any::<f64>()].boxed()
}

/// Every number the enum defines, plus numbers it does not.
fn enum_numbers(descriptor: &EnumDescriptor) -> BoxedStrategy<i32> {
    let known: Vec<i32> = descriptor.values().map(|v| v.number()).collect();
    let past = known.iter().max().map_or(1, |n| n.saturating_add(1));
    let unknown = vec![-1, past, 99, i32::MIN, i32::MAX];
    prop_oneof![3 => select(known), 1 => select(unknown)].boxed()
}

/// One value of `kind`; `None` for a message past the depth bound.
fn single(kind: &Kind, dictionary: &Arc<[String]>, depth: u32) -> Option<BoxedStrategy<Value>> {
    Some(match kind {
        Kind::Double => f64s().prop_map(Value::F64).boxed(),
        Kind::Float => f64s().prop_map(|v| Value::F32(v as f32)).boxed(),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => i32s().prop_map(Value::I32).boxed(),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => i64s().prop_map(Value::I64).boxed(),
        Kind::Uint32 | Kind::Fixed32 => u32s().prop_map(Value::U32).boxed(),
        Kind::Uint64 | Kind::Fixed64 => u64s().prop_map(Value::U64).boxed(),
        Kind::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        Kind::String => strings(dictionary).prop_map(Value::String).boxed(),
        Kind::Bytes => prop::collection::vec(any::<u8>(), 0..32)
            .prop_map(|b| Value::Bytes(b.into()))
            .boxed(),
        Kind::Enum(descriptor) => enum_numbers(descriptor).prop_map(Value::EnumNumber).boxed(),
        Kind::Message(descriptor) => {
            if depth >= MAX_DEPTH {
                return None;
            }
            message_at(descriptor, dictionary, depth + 1)
                .prop_map(Value::Message)
                .boxed()
        }
    })
}

fn map_key(value: Value) -> Option<MapKey> {
    Some(match value {
        Value::Bool(v) => MapKey::Bool(v),
        Value::I32(v) => MapKey::I32(v),
        Value::I64(v) => MapKey::I64(v),
        Value::U32(v) => MapKey::U32(v),
        Value::U64(v) => MapKey::U64(v),
        Value::String(v) => MapKey::String(v),
        _ => return None,
    })
}

/// A value for `field` as a whole: one value, a list or a map.
fn field_value(
    field: &FieldDescriptor,
    dictionary: &Arc<[String]>,
    depth: u32,
) -> Option<BoxedStrategy<Value>> {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("a map field's kind is its entry message")
        };
        let key = single(&entry.map_entry_key_field().kind(), dictionary, depth)?;
        let value = single(&entry.map_entry_value_field().kind(), dictionary, depth)?;
        let entries =
            prop::collection::vec((key.prop_filter_map("a map key", map_key), value), 0..3);
        return Some(
            entries
                .prop_map(|pairs| Value::Map(pairs.into_iter().collect::<HashMap<_, _>>()))
                .boxed(),
        );
    }
    if field.is_list() {
        return Some(match single(&field.kind(), dictionary, depth) {
            Some(element) => prop::collection::vec(element, 0..4)
                .prop_map(Value::List)
                .boxed(),
            None => Just(Value::List(Vec::new())).boxed(),
        });
    }
    single(&field.kind(), dictionary, depth)
}

type Assignments = Vec<(FieldDescriptor, Value)>;

fn message_at(
    descriptor: &MessageDescriptor,
    dictionary: &Arc<[String]>,
    depth: u32,
) -> BoxedStrategy<DynamicMessage> {
    let mut parts: Vec<BoxedStrategy<Assignments>> = Vec::new();
    // Plain fields (proto3 `optional` ones included): set or not.
    for field in descriptor.fields() {
        if field.containing_oneof().is_some_and(|o| !o.is_synthetic()) {
            continue;
        }
        let Some(value) = field_value(&field, dictionary, depth) else {
            continue;
        };
        parts.push(
            prop::option::weighted(SET_PROBABILITY, value)
                .prop_map(move |v| v.map(|v| (field.clone(), v)).into_iter().collect())
                .boxed(),
        );
    }
    // A real oneof: none of its arms, or exactly one.
    for oneof in descriptor.oneofs().filter(|o| !o.is_synthetic()) {
        let mut arms: Vec<BoxedStrategy<Assignments>> = vec![Just(Vec::new()).boxed()];
        for field in oneof.fields() {
            if let Some(value) = field_value(&field, dictionary, depth) {
                arms.push(value.prop_map(move |v| vec![(field.clone(), v)]).boxed());
            }
        }
        parts.push(Union::new(arms).boxed());
    }
    let descriptor = descriptor.clone();
    parts
        .prop_map(move |chosen| {
            let mut message = DynamicMessage::new(descriptor.clone());
            for (field, value) in chosen.into_iter().flatten() {
                message.set_field(&field, value);
            }
            message
        })
        .boxed()
}

/// Any message of type `descriptor`; `dictionary` adds strings the test
/// knows to be meaningful to the service (ids of runs, sessions, …).
///
/// With `seeds` (valid requests of this type) half of the cases are a seed
/// with some of its top-level fields replaced by generated values or
/// cleared (each with probability 1/4): random values in every field still,
/// but next to valid ones, so calls get past the first check.
pub fn message(
    descriptor: &MessageDescriptor,
    dictionary: &[String],
    seeds: &[DynamicMessage],
) -> BoxedStrategy<Case> {
    let fresh = message_at(descriptor, &Arc::from(dictionary), 0);
    if seeds.is_empty() {
        return fresh.prop_map(Case).boxed();
    }
    let fields: Vec<FieldDescriptor> = descriptor.fields().collect();
    let mask = prop::collection::vec(prop::bool::weighted(0.25), fields.len());
    let mutated =
        (select(seeds.to_vec()), fresh.clone(), mask).prop_map(move |(mut seed, fresh, mask)| {
            for (field, replace) in fields.iter().zip(mask) {
                if !replace {
                    continue;
                }
                match fresh.has_field(field).then(|| fresh.get_field(field)) {
                    Some(value) => seed.set_field(field, value.into_owned()),
                    None => seed.clear_field(field),
                }
            }
            Case(seed)
        });
    prop_oneof![1 => fresh.prop_map(Case), 1 => mutated].boxed()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    use super::*;

    /// Full names of the fields set anywhere in `message`, nested included.
    fn set_fields(message: &DynamicMessage, into: &mut BTreeSet<String>) {
        for (field, value) in message.fields() {
            into.insert(field.full_name().to_owned());
            let mut visit = |v: &Value| {
                if let Value::Message(m) = v {
                    set_fields(m, into);
                }
            };
            match value {
                Value::List(items) => items.iter().for_each(&mut visit),
                other => visit(other),
            }
        }
    }

    fn all_fields(descriptor: &MessageDescriptor, depth: u32, into: &mut BTreeSet<String>) {
        for field in descriptor.fields() {
            into.insert(field.full_name().to_owned());
            if let Kind::Message(nested) = field.kind()
                && depth + 1 < MAX_DEPTH
            {
                all_fields(&nested, depth + 1, into);
            }
        }
    }

    #[test]
    fn every_field_of_every_request_is_generated() {
        let pool = crate::proto_fuzz::pool();
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
        );
        let mut requests = 0;
        for service in pool.services() {
            for method in service.methods() {
                requests += 1;
                let input = method.input();
                let strategy = message(&input, &["known".to_owned()], &[]);
                let mut seen = BTreeSet::new();
                for _ in 0..300 {
                    let Case(generated) = strategy.new_tree(&mut runner).unwrap().current();
                    set_fields(&generated, &mut seen);
                }
                let mut expected = BTreeSet::new();
                all_fields(&input, 0, &mut expected);
                let missing: Vec<_> = expected.difference(&seen).collect();
                assert!(
                    missing.is_empty(),
                    "{}: never set: {missing:?}",
                    method.full_name()
                );
            }
        }
        assert!(
            requests >= 21,
            "only {requests} methods in the descriptor set"
        );
    }

    #[test]
    fn enums_get_unknown_numbers_and_strings_get_extremes() {
        let pool = crate::proto_fuzz::pool();
        let mode = pool
            .get_enum_by_name("clawgate.session_store.v1.AcquireMode")
            .unwrap();
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &[9; 32]),
        );
        let numbers = enum_numbers(&mode);
        let drawn: BTreeSet<i32> = (0..200)
            .map(|_| numbers.new_tree(&mut runner).unwrap().current())
            .collect();
        assert!(drawn.contains(&0) && drawn.contains(&2) && drawn.contains(&i32::MAX));
        assert!(
            drawn.contains(&3),
            "the first number past the enum: {drawn:?}"
        );
        let texts = strings(&Arc::from(vec!["known".to_owned()]));
        let drawn: Vec<String> = (0..400)
            .map(|_| texts.new_tree(&mut runner).unwrap().current())
            .collect();
        assert!(drawn.iter().any(|s| s == "known"));
        assert!(drawn.iter().any(String::is_empty));
        assert!(drawn.iter().any(|s| s.contains('\0')));
        assert!(drawn.iter().any(|s| s.len() > 1_000_000));
    }
}
