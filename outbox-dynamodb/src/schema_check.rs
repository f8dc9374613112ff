//! An existing table checked against the one this crate would create: keys and their
//! types, every index's keys, key types and projection, no local index. A table made by
//! infrastructure code with a `due` index that leaves `pkey` out of its projection would
//! silently lose per-key order, and one without `avail_us` would make every body sweep
//! read each entry's item; such tables are refused at install, each difference named.

use aws_sdk_dynamodb::types::{
    KeyType, ProjectionType, ScalarAttributeType, StreamViewType, TableDescription,
};
use outbox_core::{Error, ErrorKind, Result};

use crate::schema::TableSpec;

/// `Ok` when `table` has the layout of `spec` (extra global indexes and projections
/// wider than needed are fine); a [`ErrorKind::Schema`] error naming every difference
/// otherwise.
pub(crate) fn check_layout(spec: &TableSpec, table: &TableDescription) -> Result<()> {
    let problems = differences(spec, table);
    if problems.is_empty() {
        return Ok(());
    }
    let layout_1 = if table.local_secondary_indexes().is_empty() {
        ""
    } else {
        "\n(local secondary indexes are those of outbox layout 1: install layout 2 into a new \
         table and drain the old one first, see the crate docs' migration note)"
    };
    Err(Error::new(
        ErrorKind::Schema,
        format!(
            "table {} exists with another layout:\n  - {}\nThis store needs:\n{}{layout_1}",
            spec.name,
            problems.join("\n  - "),
            spec.describe()
        ),
    ))
}

/// The type `table` declares for attribute `name`, if any.
fn declared<'a>(table: &'a TableDescription, name: &str) -> Option<&'a ScalarAttributeType> {
    table
        .attribute_definitions()
        .iter()
        .find(|a| a.attribute_name() == name)
        .map(|a| a.attribute_type())
}

/// The type `spec` needs for attribute `name`.
fn wanted<'a>(spec: &'a TableSpec, name: &str) -> Option<&'a ScalarAttributeType> {
    spec.attributes
        .iter()
        .find(|(a, _)| *a == name)
        .map(|(_, t)| t)
}

/// `(attribute, key type)` pairs of a key schema, in order.
fn keys(schema: &[aws_sdk_dynamodb::types::KeySchemaElement]) -> Vec<(String, KeyType)> {
    schema
        .iter()
        .map(|k| (k.attribute_name().to_owned(), k.key_type().clone()))
        .collect()
}

/// What `want` (`(hash, range)` names) asks of key schema `have`, and of the types of
/// those keys; `what` names the table or index in the messages.
fn key_differences(
    spec: &TableSpec,
    table: &TableDescription,
    what: &str,
    want: (&str, Option<&str>),
    have: &[aws_sdk_dynamodb::types::KeySchemaElement],
) -> Vec<String> {
    let wanted_keys: Vec<(String, KeyType)> = std::iter::once((want.0.to_owned(), KeyType::Hash))
        .chain(want.1.map(|r| (r.to_owned(), KeyType::Range)))
        .collect();
    let have = keys(have);
    if have != wanted_keys {
        let show = |k: &[(String, KeyType)]| {
            k.iter()
                .map(|(a, t)| format!("{a} ({})", t.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return vec![format!(
            "{what} has keys [{}], not [{}]",
            show(&have),
            show(&wanted_keys)
        )];
    }
    let mut out = Vec::new();
    for (name, _) in &wanted_keys {
        let (need, got) = (wanted(spec, name), declared(table, name));
        if need != got {
            out.push(format!(
                "{what}'s key {name} is of type {}, not {}",
                got.map_or("(undeclared)", ScalarAttributeType::as_str),
                need.map_or("?", ScalarAttributeType::as_str)
            ));
        }
    }
    out
}

/// Every way `table` differs from `spec` that matters to the store.
fn differences(spec: &TableSpec, table: &TableDescription) -> Vec<String> {
    let mut out = key_differences(
        spec,
        table,
        "the table",
        (spec.hash, spec.range),
        table.key_schema(),
    );
    let local: Vec<&str> = table
        .local_secondary_indexes()
        .iter()
        .filter_map(|i| i.index_name())
        .collect();
    if !local.is_empty() {
        out.push(format!("it has local secondary indexes {local:?}"));
    }
    for (name, hash, sort, projected) in &spec.indexes {
        let Some(index) = table
            .global_secondary_indexes()
            .iter()
            .find(|i| i.index_name() == Some(*name))
        else {
            out.push(format!("global secondary index {name} is missing"));
            continue;
        };
        out.extend(key_differences(
            spec,
            table,
            &format!("index {name}"),
            (hash, Some(sort)),
            index.key_schema(),
        ));
        let projection = index.projection();
        let kind = projection.and_then(|p| p.projection_type());
        let included = projection.map_or(&[][..], |p| p.non_key_attributes());
        let missing: Vec<&str> = match (projected, kind) {
            (_, Some(ProjectionType::All)) => vec![],
            (None, _) => vec!["(all attributes)"],
            (Some(attrs), Some(ProjectionType::Include)) => attrs
                .iter()
                .copied()
                .filter(|a| !included.iter().any(|i| i == a))
                .collect(),
            (Some(attrs), _) => attrs.clone(),
        };
        if !missing.is_empty() {
            out.push(format!(
                "index {name} does not project {}",
                missing.join(", ")
            ));
        }
    }
    if spec.stream {
        let stream = table.stream_specification();
        let enabled = stream.is_some_and(|s| s.stream_enabled());
        let view = stream.and_then(|s| s.stream_view_type());
        if !enabled {
            out.push("it has no stream (enable one with view type NEW_IMAGE)".to_owned());
        } else if !matches!(
            view,
            Some(StreamViewType::NewImage | StreamViewType::NewAndOldImages)
        ) {
            out.push(format!(
                "its stream carries {} instead of new images (NEW_IMAGE)",
                view.map_or("no view type", StreamViewType::as_str)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, GlobalSecondaryIndexDescription, KeySchemaElement,
        LocalSecondaryIndexDescription, Projection,
    };

    use super::*;
    use crate::item::{
        ATTEMPTS, AVAILABLE, DEAD_ID, DEAD_INDEX, DUE, DUE_INDEX, PARTITION_KEY, PK, SHARD, SK,
    };
    use crate::schema::{dedup_table, outbox_table};

    fn key(name: &str, kind: KeyType) -> KeySchemaElement {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .unwrap()
    }

    fn projection(spec: Option<&Vec<&'static str>>) -> Projection {
        match spec {
            None => Projection::builder()
                .projection_type(ProjectionType::All)
                .build(),
            Some(a) if a.is_empty() => Projection::builder()
                .projection_type(ProjectionType::KeysOnly)
                .build(),
            Some(a) => a
                .iter()
                .fold(
                    Projection::builder().projection_type(ProjectionType::Include),
                    |p, a| p.non_key_attributes(*a),
                )
                .build(),
        }
    }

    /// The description DynamoDB gives of the table `spec` creates.
    fn described(spec: &TableSpec) -> aws_sdk_dynamodb::types::builders::TableDescriptionBuilder {
        let mut t = TableDescription::builder()
            .table_name(&spec.name)
            .key_schema(key(spec.hash, KeyType::Hash));
        if let Some(range) = spec.range {
            t = t.key_schema(key(range, KeyType::Range));
        }
        for (name, kind) in &spec.attributes {
            t = t.attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*name)
                    .attribute_type(kind.clone())
                    .build()
                    .unwrap(),
            );
        }
        for (name, hash, sort, projected) in &spec.indexes {
            t = t.global_secondary_indexes(
                GlobalSecondaryIndexDescription::builder()
                    .index_name(*name)
                    .key_schema(key(hash, KeyType::Hash))
                    .key_schema(key(sort, KeyType::Range))
                    .projection(projection(projected.as_ref()))
                    .build(),
            );
        }
        t
    }

    /// The outbox table's description with index `name` replaced by `index`.
    fn with_index(name: &str, index: GlobalSecondaryIndexDescription) -> TableDescription {
        let spec = outbox_table("t");
        let full = described(&spec).build();
        let mut t = described(&TableSpec {
            indexes: vec![],
            ..spec
        });
        for i in full.global_secondary_indexes() {
            t = t.global_secondary_indexes(if i.index_name() == Some(name) {
                index.clone()
            } else {
                i.clone()
            });
        }
        t.build()
    }

    fn due(projection: Projection) -> GlobalSecondaryIndexDescription {
        GlobalSecondaryIndexDescription::builder()
            .index_name(DUE_INDEX)
            .key_schema(key(SHARD, KeyType::Hash))
            .key_schema(key(DUE, KeyType::Range))
            .projection(projection)
            .build()
    }

    fn refused(spec: &TableSpec, table: &TableDescription) -> String {
        let e = check_layout(spec, table).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Schema);
        e.message().to_owned()
    }

    #[test]
    fn the_tables_this_crate_creates_pass() {
        for spec in [outbox_table("t"), dedup_table("d")] {
            check_layout(&spec, &described(&spec).build()).unwrap();
        }
    }

    #[test]
    fn a_table_that_needs_a_stream_of_new_images_is_checked_for_one() {
        use aws_sdk_dynamodb::types::StreamSpecification;
        let spec = TableSpec {
            stream: true,
            ..dedup_table("s")
        };
        let stream = |enabled, view: Option<StreamViewType>| {
            described(&spec)
                .stream_specification(
                    StreamSpecification::builder()
                        .stream_enabled(enabled)
                        .set_stream_view_type(view)
                        .build()
                        .unwrap(),
                )
                .build()
        };
        assert!(refused(&spec, &described(&spec).build()).contains("no stream"));
        assert!(
            refused(&spec, &stream(false, Some(StreamViewType::NewImage))).contains("no stream")
        );
        assert!(
            refused(&spec, &stream(true, Some(StreamViewType::KeysOnly))).contains("KEYS_ONLY")
        );
        check_layout(&spec, &stream(true, Some(StreamViewType::NewImage))).unwrap();
        check_layout(&spec, &stream(true, Some(StreamViewType::NewAndOldImages))).unwrap();
        assert!(spec.describe().contains("NEW_IMAGE"));
        // A table that needs no stream may have one.
        check_layout(
            &dedup_table("s"),
            &stream(true, Some(StreamViewType::KeysOnly)),
        )
        .unwrap();
    }

    #[test]
    fn wider_projections_and_extra_indexes_pass() {
        let spec = outbox_table("t");
        let all = Projection::builder()
            .projection_type(ProjectionType::All)
            .build();
        check_layout(&spec, &with_index(DUE_INDEX, due(all))).unwrap();
        let more = described(&spec)
            .global_secondary_indexes(
                GlobalSecondaryIndexDescription::builder()
                    .index_name("x")
                    .key_schema(key(SHARD, KeyType::Hash))
                    .projection(projection(None))
                    .build(),
            )
            .build();
        check_layout(&spec, &more).unwrap();
    }

    #[test]
    fn a_due_index_without_the_order_key_or_availability_is_refused() {
        let spec = outbox_table("t");
        let narrow = Projection::builder()
            .projection_type(ProjectionType::Include)
            .non_key_attributes(ATTEMPTS)
            .build();
        let message = refused(&spec, &with_index(DUE_INDEX, due(narrow)));
        let line = message
            .lines()
            .find(|l| l.contains("does not project"))
            .unwrap_or_default();
        assert_eq!(
            line,
            format!("  - index {DUE_INDEX} does not project pkey, token, created_us, avail_us"),
            "{message}"
        );
        let keys_only = Projection::builder()
            .projection_type(ProjectionType::KeysOnly)
            .build();
        let message = refused(&spec, &with_index(DUE_INDEX, due(keys_only)));
        assert!(message.contains(PARTITION_KEY), "{message}");
        // A dead index that projects less than everything.
        let message = refused(
            &spec,
            &with_index(
                DEAD_INDEX,
                GlobalSecondaryIndexDescription::builder()
                    .index_name(DEAD_INDEX)
                    .key_schema(key(SHARD, KeyType::Hash))
                    .key_schema(key(DEAD_ID, KeyType::Range))
                    .projection(projection(Some(&vec![ATTEMPTS])))
                    .build(),
            ),
        );
        assert!(
            message.contains("does not project (all attributes)"),
            "{message}"
        );
    }

    #[test]
    fn other_keys_or_key_types_are_refused() {
        let spec = outbox_table("t");
        // The index sorted by another attribute.
        let resorted = GlobalSecondaryIndexDescription::builder()
            .index_name(DUE_INDEX)
            .key_schema(key(SHARD, KeyType::Hash))
            .key_schema(key(AVAILABLE, KeyType::Range))
            .projection(projection(None))
            .build();
        let message = refused(&spec, &with_index(DUE_INDEX, resorted));
        assert!(
            message.contains(&format!(
                "index {DUE_INDEX} has keys [shard (HASH), {AVAILABLE} (RANGE)]"
            )),
            "{message}"
        );
        // `due` declared as a string: its order would be text order.
        let mut t = TableDescription::builder()
            .table_name("t")
            .key_schema(key(PK, KeyType::Hash))
            .key_schema(key(SK, KeyType::Range));
        for (name, kind) in &spec.attributes {
            let kind = if *name == DUE {
                ScalarAttributeType::S
            } else {
                kind.clone()
            };
            t = t.attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*name)
                    .attribute_type(kind)
                    .build()
                    .unwrap(),
            );
        }
        let full = described(&spec).build();
        for i in full.global_secondary_indexes() {
            t = t.global_secondary_indexes(i.clone());
        }
        let message = refused(&spec, &t.build());
        assert!(
            message.contains(&format!(
                "index {DUE_INDEX}'s key {DUE} is of type S, not N"
            )),
            "{message}"
        );
        // No sort key on the table.
        let flat = described(&dedup_table("t")).table_name("t").build();
        let message = refused(&spec, &flat);
        assert!(
            message.contains("the table has keys [pk (HASH)]"),
            "{message}"
        );
        assert!(message.contains(&format!("global secondary index {DUE_INDEX} is missing")));
        assert!(
            message.contains("This store needs:\nDynamoDB table t"),
            "{message}"
        );
    }

    #[test]
    fn a_layout_1_table_is_refused_with_the_migration_note() {
        let spec = outbox_table("t");
        let old = described(&spec)
            .local_secondary_indexes(
                LocalSecondaryIndexDescription::builder()
                    .index_name("by_due")
                    .build(),
            )
            .build();
        let message = refused(&spec, &old);
        assert!(
            message.contains("local secondary indexes [\"by_due\"]"),
            "{message}"
        );
        assert!(message.contains("migration note"), "{message}");
    }
}
